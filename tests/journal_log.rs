//! Issue 20: the journal's own log (src/store/journal_log.rs) on SQLite. A
//! call is answered once its rows are appended to the log; the table gets
//! them when the journal thread folds, a couple of milliseconds later. What
//! a client reads must not lag behind what it was answered, and a clean stop
//! must leave every row in the table.

mod common;

use common::spawn_app;

const CALLS: usize = 40;

#[tokio::test]
async fn each_call_is_in_the_journal_with_its_outcome_the_moment_it_is_answered() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    for n in 0..CALLS {
        let data = server.roll_dice(&session, &format!("c{n}")).await;
        let id = data["execution_id"].as_str().expect("an execution id");
        // At once, long before the thread's fold: the read folds first.
        let row = server.get(&format!("/tool-executions/{id}")).await;
        assert_eq!(row.status, reqwest::StatusCode::OK, "call {n}: {row:?}");
        assert_eq!(row.body["data"]["lifecycle_state"], "finished", "{row:?}");
        assert_eq!(row.body["data"]["status"], "success", "{row:?}");
    }
    let page = server
        .get(&format!("/tool-executions?session_id={session}&limit=200"))
        .await;
    assert_eq!(
        page.body["data"].as_array().unwrap().len(),
        CALLS,
        "{page:?}"
    );
}

#[tokio::test]
async fn a_clean_stop_leaves_every_call_in_the_database_file() {
    let mut server = spawn_app().await;
    if server.on_postgres() {
        eprintln!("SKIPPED on PostgreSQL: the journal's log is SQLite's");
        return;
    }
    let session = server.create_session().await;
    for n in 0..CALLS {
        server.roll_dice(&session, &format!("c{n}")).await;
    }
    assert!(server.stop().await.success());
    // Read without the server: nothing of the calls may be left only in the
    // log (a later start-up would fold it, but a copy of the file taken now
    // must have them).
    let connection =
        rusqlite::Connection::open(server.data_dir.join("toolgate.db")).expect("the database");
    let finished: i64 = connection
        .query_row(
            "SELECT COUNT(*) FROM tool_execution_record WHERE session_id = ?1 AND lifecycle_state = 'finished' AND status = 'success'",
            [&session],
            |row| row.get(0),
        )
        .expect("counting rows");
    assert_eq!(finished, CALLS as i64);
}
