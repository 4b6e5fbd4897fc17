//! The database a test server runs on. By default each server has the
//! embedded SQLite file in its own data directory. With
//! `TOOLGATE_TEST_POSTGRES` set to a PostgreSQL server URL (no database, e.g.
//! `postgres://postgres@127.0.0.1:5432`), each server gets a fresh database
//! of its own there, with a unique name, dropped when the server is dropped:
//! the whole black-box suite runs against PostgreSQL that way (`.ci/test`).

use sqlx::migrate::MigrateDatabase;

/// The PostgreSQL server the suite runs against, if it does.
pub fn postgres_server() -> Option<String> {
    std::env::var("TOOLGATE_TEST_POSTGRES")
        .ok()
        .map(|url| url.trim_end_matches('/').to_owned())
        .filter(|url| !url.is_empty())
}

/// A database made for one test; dropped (connections and all) on drop.
pub struct TestDatabase {
    pub url: String,
}

impl TestDatabase {
    /// A fresh, uniquely named database on `server` (created by the server
    /// that first opens it).
    pub fn fresh(server: &str) -> Self {
        let name = format!("tg_test_{}_{:x}", std::process::id(), rand_suffix());
        Self {
            url: format!("{server}/{name}"),
        }
    }
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    hasher.finish()
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let url = self.url.clone();
        // Drop runs inside the test's runtime: a thread of its own blocks on
        // its own runtime instead.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                if sqlx::Postgres::database_exists(&url).await.unwrap_or(false) {
                    sqlx::Postgres::force_drop_database(&url).await
                } else {
                    Ok(())
                }
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("note: could not drop the test database {}", self.url);
        }
    }
}
