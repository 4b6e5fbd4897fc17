//! A change whose client hangs up once it has sent it still lands whole,
//! through the real binary: the store is written, the live model sessions are
//! sent `catalog_changed`, and the server says in its log that the change
//! finished without its caller.

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use common::events::Events;
use common::{TestServer, spawn_app};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

fn string_set(value: &Value) -> BTreeSet<String> {
    common::strings(value).into_iter().collect()
}

/// The server side of the loopback connection from `client` to `server`, as
/// `/proc/net/tcp` lists it: its TCP state and the bytes it has not read yet.
fn server_side(server: SocketAddr, client: SocketAddr) -> Option<(u8, u64)> {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp is readable");
    let local = format!(":{:04X}", server.port());
    let remote = format!(":{:04X}", client.port());
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(local_field), Some(remote_field)) = (fields.get(1), fields.get(2)) else {
            return None;
        };
        if !local_field.ends_with(&local) || !remote_field.ends_with(&remote) {
            return None;
        }
        let state = u8::from_str_radix(fields[3], 16).ok()?;
        let rx_queue = u64::from_str_radix(fields[4].split(':').nth(1)?, 16).ok()?;
        Some((state, rx_queue))
    })
}

/// `ESTABLISHED` and `CLOSE_WAIT`: the server still holds the connection.
fn held_by_the_server(state: u8) -> bool {
    matches!(state, 0x01 | 0x08)
}

/// Sends `method path` with `body` on a connection of its own, waits until
/// the server has read all of it, hangs up, and waits until the server has
/// closed its side (so a request it dropped is dropped by now).
async fn send_and_hang_up(server: &TestServer, method: &str, path: &str, body: &Value) {
    let mut stream = TcpStream::connect(server.addr).await.unwrap();
    let client = stream.local_addr().unwrap();
    let body = body.to_string();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: {}\r\nauthorization: Bearer {}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        server.addr,
        server.token,
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let addr = server.addr;
    common::wait_until(
        Duration::from_secs(10),
        "the server to read the whole request",
        || async move { matches!(server_side(addr, client), Some((0x01, 0))) },
    )
    .await;
    drop(stream);
    common::wait_until(
        Duration::from_secs(10),
        "the server to close the connection its client left",
        || async move { !server_side(addr, client).is_some_and(|(state, _)| held_by_the_server(state)) },
    )
    .await;
}

/// A write lock on what the server must write to change a session's
/// permissions: SQLite's one writer slot, or the session's row on PostgreSQL.
enum WriteLock {
    Sqlite(rusqlite::Connection),
    Postgres(sqlx::PgConnection),
}

impl WriteLock {
    async fn take(server: &TestServer, session: &str) -> Self {
        if server.on_postgres() {
            use sqlx::Connection;
            let mut connection = sqlx::PgConnection::connect(&server.database_url())
                .await
                .unwrap();
            sqlx::query("BEGIN").execute(&mut connection).await.unwrap();
            let locked: Option<i32> =
                sqlx::query_scalar("SELECT 1 FROM sessions WHERE id = $1 FOR UPDATE")
                    .bind(session)
                    .fetch_optional(&mut connection)
                    .await
                    .unwrap();
            assert_eq!(locked, Some(1), "the session's row is there to lock");
            Self::Postgres(connection)
        } else {
            let connection = rusqlite::Connection::open(server.data_dir.join("toolgate.db"))
                .expect("the server's database");
            connection.execute_batch("BEGIN IMMEDIATE").unwrap();
            Self::Sqlite(connection)
        }
    }

    async fn release(self) {
        match self {
            Self::Sqlite(connection) => connection.execute_batch("ROLLBACK").unwrap(),
            Self::Postgres(mut connection) => {
                sqlx::query("ROLLBACK")
                    .execute(&mut connection)
                    .await
                    .unwrap();
            }
        }
    }
}

#[tokio::test]
async fn a_permission_change_whose_client_hung_up_lands_and_is_offered() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let mut events = Events::open(&server, &session).await;
    assert!(
        string_set(&events.ready["tools"]).contains("roll_dice"),
        "{}",
        events.ready
    );

    // The change reaches its handler and waits there for the store while
    // its client goes away; only then may it write.
    let lock = WriteLock::take(&server, &session).await;
    let path = format!("/sessions/{session}/tool-permissions");
    let change = json!({"slot_deny_list": {"narrator": ["roll_dice"]}});
    send_and_hang_up(&server, "PUT", &path, &change).await;
    lock.release().await;

    let changed = events.changed().await;
    let offered = string_set(&changed["tools"]);
    assert!(!offered.contains("roll_dice"), "{changed}");
    assert!(offered.contains("get_time"), "{changed}");
    let stored = server.get(&path).await;
    assert_eq!(stored.status, StatusCode::OK, "{stored:?}");
    assert_eq!(
        stored.body["data"]["slot_deny_list"],
        json!({"narrator": ["roll_dice"]}),
        "{stored:?}"
    );
    // The change went on without its caller, rather than before it left.
    server
        .log_containing("the caller went away; the work finishes on its own")
        .await;
}
