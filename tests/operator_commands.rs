//! `toolgate migrate` and `toolgate doctor` against the real binary: a fresh
//! directory is created and migrated, the doctor reads it without changing
//! it (also while a server runs on it), and a database a newer toolgate
//! migrated is refused by all three commands.

mod common;

use std::path::Path;
use std::process::Output;

use common::{SpawnOptions, spawn_with};
use serde_json::Value;

fn toolgate(args: &[&str], data_dir: &Path) -> Output {
    toolgate_on(args, data_dir, None)
}

/// Runs toolgate on `data_dir`, with `database_url` when given.
fn toolgate_on(args: &[&str], data_dir: &Path, database_url: Option<&str>) -> Output {
    common::toolgate_command(args, data_dir, database_url)
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn report(output: &Output) -> Value {
    common::doctor_report(output)
}

/// The SQLite migrations this source tree has: the version the binary knows.
fn latest_migration() -> i64 {
    latest_migration_of("sqlite")
}

/// The migrations of `backend` this source tree has.
fn latest_migration_of(backend: &str) -> i64 {
    std::fs::read_dir(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("migrations")
            .join(backend),
    )
    .unwrap()
    .filter_map(|entry| {
        let name = entry.unwrap().file_name().into_string().unwrap();
        name.split('_').next()?.parse::<i64>().ok()
    })
    .max()
    .unwrap()
}

#[test]
fn migrate_creates_the_schema_and_the_doctor_reads_it_without_changing_it() {
    let temp = tempfile::tempdir().unwrap();
    let data_dir = temp.path().join("data");
    let missing = toolgate(&["doctor"], &data_dir);
    assert_eq!(missing.status.code(), Some(1), "{}", stdout(&missing));
    assert!(
        stdout(&missing).contains("unreachable"),
        "{}",
        stdout(&missing)
    );
    assert!(
        !data_dir.join("toolgate.db").exists(),
        "the doctor created nothing"
    );

    let migrated = toolgate(&["migrate"], &data_dir);
    assert!(migrated.status.success(), "{migrated:?}");
    let latest = latest_migration();
    assert!(
        stdout(&migrated).contains(&format!("schema version {latest}; applied [1,")),
        "{}",
        stdout(&migrated)
    );
    let again = toolgate(&["migrate"], &data_dir);
    assert!(
        stdout(&again).contains("nothing to apply"),
        "{}",
        stdout(&again)
    );

    let checked = toolgate(&["doctor", "--json"], &data_dir);
    assert!(checked.status.success(), "{checked:?}");
    let report = report(&checked);
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["checkup"]["schema"]["applied_version"], latest);
    assert_eq!(report["checkup"]["schema"]["binary_version"], latest);
    assert_eq!(
        report["checkup"]["schema"]["pending"],
        serde_json::json!([])
    );
    assert_eq!(report["checkup"]["interrupted_calls"], 0);
    let text = toolgate(&["doctor"], &data_dir);
    assert!(
        stdout(&text).trim_end().ends_with("ok"),
        "{}",
        stdout(&text)
    );
}

#[tokio::test]
async fn the_doctor_reads_a_database_a_server_is_using() {
    let server = spawn_with(SpawnOptions::default()).await;
    let session = server.create_session().await;
    let call = server
        .post(
            &format!("/sessions/{session}/tool-calls"),
            serde_json::json!({"name": "get_time", "arguments": {}}),
        )
        .await;
    assert_eq!(call.body["data"]["status"], "success", "{call:?}");
    let data_dir = server.data_dir.clone();
    let url = server.database_url();
    let checked = tokio::task::spawn_blocking(move || {
        toolgate_on(&["doctor", "--json"], &data_dir, Some(&url))
    })
    .await
    .unwrap();
    assert!(checked.status.success(), "{checked:?}");
    let report = report(&checked);
    let backend = if server.on_postgres() {
        "postgres"
    } else {
        "sqlite"
    };
    assert_eq!(report["checkup"]["backend"], backend, "{report}");
    assert_eq!(
        report["checkup"]["schema"]["applied_version"],
        latest_migration_of(backend)
    );
    assert!(report["checkup"]["jobs"].is_array(), "{report}");
    let health = server.get("/healthz").await;
    assert_eq!(health.status, 200, "the server still runs");
}

/// Migrates a SQLite database in `data_dir`, then runs `sql` on it.
async fn migrated_then(data_dir: &Path, sql: &'static str) {
    assert!(toolgate(&["migrate"], data_dir).status.success());
    let url = format!("sqlite://{}", data_dir.join("toolgate.db").display());
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    sqlx::query(sql).execute(&pool).await.unwrap();
    pool.close().await;
}

#[tokio::test]
async fn a_schema_newer_than_the_binary_is_refused_by_serve_migrate_and_doctor() {
    let temp = tempfile::tempdir().unwrap();
    let data_dir = temp.path().join("data");
    // What a newer toolgate's migration leaves behind.
    migrated_then(
        &data_dir,
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (9999, 'from the future', 1, x'00', 0)",
    )
    .await;

    let doctor = toolgate(&["doctor", "--json"], &data_dir);
    assert_eq!(doctor.status.code(), Some(1), "{doctor:?}");
    let report = report(&doctor);
    assert_eq!(
        report["checkup"]["schema"]["unknown"],
        serde_json::json!([9999])
    );
    assert!(
        report["problem"]
            .as_str()
            .unwrap()
            .contains("newer than this toolgate"),
        "{report}"
    );
    let migrate = toolgate(&["migrate"], &data_dir);
    assert!(!migrate.status.success(), "{migrate:?}");
    assert!(
        String::from_utf8_lossy(&migrate.stderr).contains("newer than this toolgate"),
        "{migrate:?}"
    );
    let serve = std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data_dir)
        .env("TOOLGATE_ADMIN_TOKEN", common::ADMIN_TOKEN)
        .output()
        .expect("run serve");
    assert!(!serve.status.success(), "serve must not start: {serve:?}");
    let said = String::from_utf8_lossy(&serve.stderr);
    assert!(said.contains("newer than this toolgate"), "{said}");
}

#[tokio::test]
async fn a_migration_applied_from_another_text_is_refused_by_the_doctor_too() {
    let temp = tempfile::tempdir().unwrap();
    let data_dir = temp.path().join("data");
    migrated_then(
        &data_dir,
        "UPDATE _sqlx_migrations SET checksum = x'0102' WHERE version = 5",
    )
    .await;
    let doctor = toolgate(&["doctor", "--json"], &data_dir);
    assert_eq!(doctor.status.code(), Some(1), "{doctor:?}");
    let report = report(&doctor);
    assert_eq!(report["ok"], false, "{report}");
    assert_eq!(
        report["checkup"]["schema"]["modified"],
        serde_json::json!([5])
    );
    let migrate = toolgate(&["migrate"], &data_dir);
    assert!(!migrate.status.success(), "{migrate:?}");
    assert!(
        String::from_utf8_lossy(&migrate.stderr).contains("checksums differ"),
        "{migrate:?}"
    );
}

/// A fresh database on the machine's PostgreSQL (`TOOLGATE_TEST_POSTGRES`,
/// default `postgres://postgres@127.0.0.1:5432`); the server must answer.
fn postgres_database() -> common::database::TestDatabase {
    let server = common::database::postgres_server()
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432".to_owned());
    common::database::TestDatabase::fresh(&server)
}

#[tokio::test]
async fn migrate_and_doctor_work_on_postgres_and_never_print_the_password() {
    let database = postgres_database();
    // Trust authentication takes any password: one in the URL must not show.
    let url = database
        .url
        .replacen("://postgres@", "://postgres:hunter2-secret@", 1);
    assert_ne!(url, database.url, "the test URL names the user postgres");
    assert!(!url.contains('?'), "{url}");
    // The password may also be a parameter.
    let url = format!("{url}?password=hunter3-secret");
    let temp = tempfile::tempdir().unwrap();
    let data_dir = temp.path().join("data");
    let (dir, on) = (data_dir.clone(), url.clone());
    let missing = tokio::task::spawn_blocking(move || toolgate_on(&["doctor"], &dir, Some(&on)))
        .await
        .unwrap();
    assert_eq!(missing.status.code(), Some(1), "{missing:?}");
    let latest = latest_migration_of("postgres");
    let (dir, on) = (data_dir.clone(), url.clone());
    let migrated = tokio::task::spawn_blocking(move || toolgate_on(&["migrate"], &dir, Some(&on)))
        .await
        .unwrap();
    assert!(migrated.status.success(), "{migrated:?}");
    assert!(
        stdout(&migrated).contains(&format!("schema version {latest}; applied [")),
        "{}",
        stdout(&migrated)
    );
    let (dir, on) = (data_dir.clone(), url.clone());
    let checked =
        tokio::task::spawn_blocking(move || toolgate_on(&["doctor", "--json"], &dir, Some(&on)))
            .await
            .unwrap();
    assert!(checked.status.success(), "{checked:?}");
    let printed = stdout(&checked);
    assert!(!printed.contains("hunter2-secret"), "{printed}");
    assert!(!printed.contains("hunter3-secret"), "{printed}");
    assert!(printed.contains("password=***"), "{printed}");
    assert!(!stdout(&migrated).contains("hunter3-secret"));
    let report = report(&checked);
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["checkup"]["backend"], "postgres", "{report}");
    assert_eq!(report["checkup"]["schema"]["applied_version"], latest);
    assert_eq!(
        report["checkup"]["schema"]["pending"],
        serde_json::json!([])
    );
    assert!(report["checkup"]["jobs"].is_array(), "{report}");

    // What a newer toolgate's migration leaves behind is refused here too.
    let pool = sqlx::PgPool::connect(&database.url).await.unwrap();
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (9999, 'from the future', true, '\\x00', 0)",
    )
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
    let (dir, on) = (data_dir.clone(), url.clone());
    let refused =
        tokio::task::spawn_blocking(move || toolgate_on(&["doctor", "--json"], &dir, Some(&on)))
            .await
            .unwrap();
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    let refusal = self::report(&refused);
    assert_eq!(
        refusal["checkup"]["schema"]["unknown"],
        serde_json::json!([9999])
    );
    let serve = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&data_dir)
            .arg("--database-url")
            .arg(&url)
            .env("TOOLGATE_ADMIN_TOKEN", common::ADMIN_TOKEN)
            .output()
            .expect("run serve")
    })
    .await
    .unwrap();
    assert!(!serve.status.success(), "serve must not start: {serve:?}");
    let said = String::from_utf8_lossy(&serve.stderr);
    assert!(said.contains("newer than this toolgate"), "{said}");
}

/// Runs `toolgate doctor --json` (with `extra` flags) off the async workers.
async fn doctor_json(data_dir: &Path, database_url: &str, extra: &[&str]) -> (Output, Value) {
    let (dir, on) = (data_dir.to_owned(), database_url.to_owned());
    let mut args = vec!["doctor".to_owned(), "--json".to_owned()];
    args.extend(extra.iter().map(|arg| (*arg).to_owned()));
    let output = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        toolgate_on(&args, &dir, Some(&on))
    })
    .await
    .unwrap();
    let report = report(&output);
    (output, report)
}

#[tokio::test]
async fn the_doctor_says_whether_a_start_would_take_its_secrets_key() {
    // A new database: no check yet, and no key, which a start generates.
    let temp = tempfile::tempdir().unwrap();
    let fresh = temp.path().join("fresh");
    assert!(toolgate(&["migrate"], &fresh).status.success());
    let fresh_url = format!("sqlite://{}", fresh.join("toolgate.db").display());
    let (output, report) = doctor_json(&fresh, &fresh_url, &[]).await;
    assert!(output.status.success(), "{output:?}");
    assert_eq!(report["secrets_key"]["check"], "absent", "{report}");
    assert_eq!(report["secrets_key"]["key"], "none", "{report}");
    assert!(
        !fresh.join("secrets-key").exists(),
        "the doctor generated no key"
    );

    // A server's database and the key file it wrote: the key opens the check.
    let server = spawn_with(SpawnOptions::default()).await;
    let url = server.database_url();
    let (output, report) = doctor_json(&server.data_dir, &url, &[]).await;
    assert!(output.status.success(), "{output:?}");
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["secrets_key"]["check"], "present", "{report}");
    assert_eq!(report["secrets_key"]["key"], "file", "{report}");
    assert_eq!(report["secrets_key"]["verdict"], "opens", "{report}");

    // Another key, as an operator about to start a second instance with it.
    let other = "0f".repeat(32);
    let (output, report) = doctor_json(&server.data_dir, &url, &["--secrets-key", &other]).await;
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert_eq!(report["secrets_key"]["key"], "configured", "{report}");
    assert_eq!(report["secrets_key"]["verdict"], "mismatch", "{report}");
    let problem = report["problem"].as_str().unwrap();
    assert!(problem.contains("does not open"), "{report}");
    assert!(!stdout(&output).contains(&other), "the key is never shown");
    let text = tokio::task::spawn_blocking({
        let (dir, on, other) = (server.data_dir.clone(), url.clone(), other.clone());
        move || toolgate_on(&["doctor", "--secrets-key", &other], &dir, Some(&on))
    })
    .await
    .unwrap();
    assert_eq!(text.status.code(), Some(1), "{text:?}");
    assert!(
        stdout(&text).contains("secrets key: the configured key is not the database's"),
        "{}",
        stdout(&text)
    );

    // The same database seen from a data directory without its key file.
    let keyless = temp.path().join("keyless");
    let (output, report) = doctor_json(&keyless, &url, &[]).await;
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert_eq!(report["secrets_key"]["key"], "none", "{report}");
    assert!(
        report["problem"]
            .as_str()
            .unwrap()
            .contains("a start would generate a new key and be refused"),
        "{report}"
    );

    // A malformed key is a problem, and its text is not repeated.
    let (output, report) =
        doctor_json(&server.data_dir, &url, &["--secrets-key", "zz-not-hex"]).await;
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert_eq!(report["secrets_key"]["key"], "malformed", "{report}");
    assert!(!stdout(&output).contains("zz-not-hex"), "{output:?}");
}
