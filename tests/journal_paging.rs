//! Journal pages of large sessions (issue 20): keyset pages by `cursor`
//! alongside `offset`, and a `meta.total` counted exactly only up to a bound
//! (then a lower bound with `total_is_estimate`), through the real server.

mod common;

use std::collections::HashSet;

use common::{TestServer, spawn_app};
use serde_json::{Value, json};

async fn calls(server: &TestServer, session: &str, count: usize) {
    for _ in 0..count {
        let call = server
            .post(
                &format!("/sessions/{session}/tool-calls"),
                json!({"name": "roll_dice", "arguments": {"sides": 6}}),
            )
            .await;
        assert_eq!(call.body["data"]["status"], "success", "{call:?}");
    }
}

fn ids(page: &Value) -> Vec<String> {
    page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn cursors_walk_the_same_rows_as_offsets_in_the_same_order() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    calls(&server, &session, 20).await;
    // Rows still running have no finished_at: the keyset must place them as
    // the offset order does (first ascending, last descending).
    let first = server
        .get(&format!("/tool-executions?session_id={session}&limit=1"))
        .await
        .body;
    copy_row(&server, first["data"][0]["id"].as_str().unwrap(), 3, true).await;
    // The page's body is joined from rows written beforehand, not by a JSON
    // extractor: it still says what it is.
    let response = server
        .client
        .get(server.url(&format!("/tool-executions?session_id={session}")))
        .bearer_auth(&server.token)
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/json");
    for sort in [
        "sort_by=started_at&sort_order=desc",
        "sort_by=created_at&sort_order=asc",
        "sort_by=finished_at&sort_order=asc",
        "sort_by=finished_at&sort_order=desc",
    ] {
        // Pages of 2: some page boundaries fall among the rows without
        // finished_at, so cursors with and without a sort value are both used.
        let base = format!("/tool-executions?session_id={session}&limit=2&{sort}");
        let mut by_offset = Vec::new();
        for offset in (0..24).step_by(2) {
            by_offset.extend(ids(&server
                .get(&format!("{base}&offset={offset}"))
                .await
                .body));
        }
        let mut by_cursor = Vec::new();
        let mut page = server.get(&base).await.body;
        loop {
            assert_eq!(page["meta"]["total"], 23, "{page}");
            assert_eq!(page["meta"]["total_is_estimate"], false);
            by_cursor.extend(ids(&page));
            let Some(cursor) = page["meta"]["next_cursor"].as_str() else {
                assert_eq!(page["meta"]["has_more"], false, "{page}");
                break;
            };
            assert_eq!(page["meta"]["has_more"], true, "{page}");
            let next = format!("{base}&cursor={}", urlencode(cursor));
            page = server.get(&next).await.body;
        }
        assert_eq!(by_cursor.len(), 23, "{sort}");
        assert_eq!(
            by_cursor.iter().collect::<HashSet<_>>().len(),
            23,
            "no row twice"
        );
        assert_eq!(
            by_cursor, by_offset,
            "{sort}: the same rows in the same order"
        );
    }
}

fn urlencode(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

#[tokio::test]
async fn a_cursor_is_refused_with_an_offset_another_sort_or_forged() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    calls(&server, &session, 3).await;
    let base = format!("/tool-executions?session_id={session}&limit=1");
    let first = server.get(&base).await.body;
    let cursor = urlencode(first["meta"]["next_cursor"].as_str().expect("a cursor"));
    for query in [
        format!("{base}&cursor={cursor}&offset=1"),
        format!("{base}&cursor={cursor}&sort_order=asc"),
        format!("{base}&cursor={cursor}&sort_by=created_at"),
        format!("{base}&cursor=started_at.desc.1.x%27%20OR%201%3D1"),
        format!("{base}&cursor={}", "a".repeat(500)),
    ] {
        let reply = server.get(&query).await;
        assert_eq!(reply.status, 400, "{query}: {reply:?}");
        assert_eq!(reply.body["error"]["code"], "validation_error", "{reply:?}");
    }
}

/// A server with a session of `rows` journal rows: one call, copied.
async fn session_of_rows(rows: i64) -> (TestServer, String) {
    let server = spawn_app().await;
    let session = server.create_session().await;
    calls(&server, &session, 1).await;
    let first = server
        .get(&format!("/tool-executions?session_id={session}"))
        .await
        .body;
    let row = first["data"][0]["id"].as_str().unwrap().to_owned();
    copy_row(&server, &row, rows - 1, false).await;
    (server, session)
}

/// Copies one journal row `copies` times straight into the database (the
/// journal has no cache to miss them), each a millisecond later; `running`
/// copies have no `finished_at` yet.
async fn copy_row(server: &TestServer, row_id: &str, copies: i64, running: bool) {
    if server.on_postgres() {
        let pool = sqlx::PgPool::connect(&server.database_url()).await.unwrap();
        let columns: Vec<String> = sqlx::query_scalar(
            "SELECT column_name::text FROM information_schema.columns \
             WHERE table_name = 'tool_execution_record' ORDER BY ordinal_position",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        let sql = copy_sql(&columns, running)
            .replace("i < ?", "i < $1")
            .replace("t.id = ?", "t.id = $2");
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(copies)
            .bind(row_id)
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
        return;
    }
    let url = format!("sqlite://{}", server.data_dir.join("toolgate.db").display());
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    let columns: Vec<String> =
        sqlx::query_scalar("SELECT name FROM pragma_table_info('tool_execution_record')")
            .fetch_all(&pool)
            .await
            .unwrap();
    let sql = copy_sql(&columns, running);
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(copies)
        .bind(row_id)
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
}

/// The statement copying a row `?` times, for the table's `columns`.
fn copy_sql(columns: &[String], running: bool) -> String {
    let copied: Vec<String> = columns
        .iter()
        .map(|column| match column.as_str() {
            "id" => "t.id || '_' || n.i".to_owned(),
            "started_at" | "created_at" => format!("t.{column} + n.i"),
            "finished_at" if running => "CAST(NULL AS BIGINT)".to_owned(),
            other => format!("t.{other}"),
        })
        .collect();
    format!(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) \
         INSERT INTO tool_execution_record ({}) SELECT {} FROM tool_execution_record t, n WHERE t.id = ?",
        columns.join(", "),
        copied.join(", ")
    )
}

#[tokio::test]
async fn a_huge_sessions_total_is_a_flagged_lower_bound_past_a_thousand() {
    let (server, session) = session_of_rows(1_049 + 1).await;

    let page = server
        .get(&format!("/tool-executions?session_id={session}&limit=50"))
        .await
        .body;
    assert_eq!(page["meta"]["total_is_estimate"], true, "{}", page["meta"]);
    assert_eq!(
        page["meta"]["total"], 1_001,
        "a lower bound: {}",
        page["meta"]
    );
    assert_eq!(page["meta"]["has_more"], true);
    assert_eq!(page["data"].as_array().unwrap().len(), 50);

    // The console's pager says so too.
    let console = common::console::ConsoleClient::sign_in(&server, &server.token).await;
    let (status, html) = console.get(&format!("/console/sessions/{session}")).await;
    assert_eq!(status, 200);
    assert!(html.contains("of at least 1001"), "the pager: {html}");
    // Any offset is a request like another, the largest included.
    let (status, html) = console
        .get(&format!("/console/sessions/{session}?offset={}", i64::MAX))
        .await;
    assert_eq!(status, 200, "{html}");
    assert!(html.contains("1050 in all"), "the pager: {html}");

    // A page past the bound counts to its end: exact again.
    let deep = server
        .get(&format!(
            "/tool-executions?session_id={session}&limit=100&offset=1000"
        ))
        .await
        .body;
    assert_eq!(deep["meta"]["total_is_estimate"], false, "{}", deep["meta"]);
    assert_eq!(deep["meta"]["total"], 1_050);
    assert_eq!(deep["meta"]["has_more"], false);
    assert_eq!(deep["data"].as_array().unwrap().len(), 50);

    // Pages ending at or past the bound take their total from their own
    // rows (no count beside them): the same totals as a count would give.
    for (offset, limit, rows, total, estimate, more) in [
        (900, 100, 100, 1_001, true, true),
        (950, 100, 100, 1_050, false, false),
        (1_000, 50, 50, 1_050, false, false),
        (1_049, 200, 1, 1_050, false, false),
        (1_050, 10, 0, 1_050, false, false),
        (5_000, 200, 0, 1_050, false, false),
        (i64::MAX, 200, 0, 1_050, false, false),
    ] {
        let page = server
            .get(&format!(
                "/tool-executions?session_id={session}&limit={limit}&offset={offset}"
            ))
            .await
            .body;
        let meta = &page["meta"];
        assert_eq!(
            (
                page["data"].as_array().unwrap().len(),
                meta["total"].as_i64(),
                meta["total_is_estimate"].as_bool(),
                meta["has_more"].as_bool()
            ),
            (rows, Some(total), Some(estimate), Some(more)),
            "offset {offset}, limit {limit}: {meta}"
        );
    }

    // Filtered queries under the bound stay exact.
    let errors = server
        .get(&format!(
            "/tool-executions?session_id={session}&status=error"
        ))
        .await
        .body;
    assert_eq!(
        (
            errors["meta"]["total"].as_i64(),
            errors["meta"]["total_is_estimate"].as_bool()
        ),
        (Some(0), Some(false))
    );
}

/// Gives the rows at `offset`.. of `session`'s journal (oldest first) 1 MB
/// arguments, straight in the database.
async fn make_rows_large(server: &TestServer, session: &str, offset: i64, count: i64) {
    let megabyte = if server.on_postgres() {
        "repeat('a', 1000000)"
    } else {
        "replace(hex(zeroblob(500000)), '0', 'a')"
    };
    server
        .execute_sql(format!(
            "UPDATE tool_execution_record SET args_json = '{{\"x\":\"' || {megabyte} || '\"}}' \
             WHERE id IN (SELECT id FROM tool_execution_record WHERE session_id = '{session}' \
             ORDER BY started_at ASC, id ASC LIMIT {count} OFFSET {offset})"
        ))
        .await;
}

#[tokio::test]
async fn a_page_of_large_rows_ends_at_its_byte_bound_and_the_next_starts_after_it() {
    let (server, session) = session_of_rows(1_029 + 1).await;
    // The 30 newest of 1,030 rows carry 1 MB each: 30 MB in all.
    make_rows_large(&server, &session, 1_000, 30).await;
    let large = |page: &Value| {
        page["data"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|row| {
                row["args"]["x"]
                    .as_str()
                    .is_some_and(|x| x.len() == 1_000_000)
            })
            .count()
    };

    // Newest first: a page of 200 ends after 8 of them (8 MiB), says more
    // follow and where, and its total is still the bounded count.
    let base = format!("/tool-executions?session_id={session}&sort_by=started_at&limit=200");
    let mut page = server.get(&format!("{base}&sort_order=desc")).await.body;
    assert_eq!(ids(&page).len(), 8, "{}", page["meta"]);
    assert_eq!(large(&page), 8);
    assert_eq!(page["meta"]["has_more"], true);
    assert_eq!(page["meta"]["total"], 1_001);
    assert_eq!(page["meta"]["total_is_estimate"], true);
    // Following the cursors reads every row once, no page past the bound.
    let mut seen: Vec<String> = ids(&page);
    let mut pages = 1;
    while page["meta"]["has_more"] == true {
        let cursor = page["meta"]["next_cursor"]
            .as_str()
            .expect("a cursor")
            .to_owned();
        page = server
            .get(&format!("{base}&sort_order=desc&cursor={cursor}"))
            .await
            .body;
        assert!(large(&page) <= 8, "{}", page["meta"]);
        seen.extend(ids(&page));
        pages += 1;
    }
    assert_eq!(seen.len(), 1_030);
    assert_eq!(
        seen.iter().collect::<HashSet<_>>().len(),
        1_030,
        "a row twice"
    );
    // 30 large rows take four pages of at most 8; the 1,000 small ones five.
    assert_eq!(pages, 9);

    // An offset page reaching past the count's bound, cut short: its total
    // is counted, not guessed from the rows it holds.
    let cut = server
        .get(&format!(
            "/tool-executions?session_id={session}&sort_by=started_at&sort_order=asc\
             &limit=100&offset=995"
        ))
        .await
        .body;
    assert_eq!((ids(&cut).len(), large(&cut)), (13, 8), "{}", cut["meta"]);
    assert_eq!(cut["meta"]["has_more"], true);
    assert_eq!(cut["meta"]["total"], 1_030);
    assert_eq!(cut["meta"]["total_is_estimate"], false);
    // The next offset is this one's plus the rows received.
    let next = server
        .get(&format!(
            "/tool-executions?session_id={session}&sort_by=started_at&sort_order=asc\
             &limit=100&offset=1008"
        ))
        .await
        .body;
    // (`seen` is newest first: the row at ascending offset n is seen[1029 - n].)
    assert_eq!(cut["data"][12]["id"], seen[1_029 - 1_007].as_str());
    assert_eq!(next["data"][0]["id"], seen[1_029 - 1_008].as_str());

    // The console's pager steps past the rows it shows.
    let console = common::console::ConsoleClient::sign_in(&server, &server.token).await;
    let (status, html) = console
        .get(&format!("/console/sessions/{session}?offset=0"))
        .await;
    assert_eq!(status, 200);
    assert!(
        html.contains("Rows 1–8 of at least 1001"),
        "the pager: {html:.2000}"
    );
    assert!(
        html.contains("offset=8\""),
        "older starts after the rows shown"
    );
}

#[tokio::test]
async fn a_page_of_large_call_records_ends_at_the_journals_byte_bound() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    let floor = server
        .post(
            &format!("/sessions/{session}/floors"),
            json!({"content": "hi"}),
        )
        .await
        .body["data"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let call = server
        .post(
            &format!("/sessions/{session}/tool-calls"),
            json!({"name": "roll_dice", "arguments": {"sides": 6}, "floor_id": floor}),
        )
        .await;
    assert_eq!(call.body["data"]["status"], "success", "{call:?}");
    let row = call.body["data"]["execution_id"]
        .as_str()
        .expect("the call's journal row")
        .to_owned();
    copy_row(&server, &row, 11, false).await;
    make_rows_large(&server, &session, 0, 12).await;

    let base = format!("/tools/call-records?floor_id={floor}&sort_order=asc&limit=50");
    let first = server.get(&base).await.body;
    assert_eq!(
        first["data"].as_array().unwrap().len(),
        8,
        "{}",
        first["meta"]
    );
    assert_eq!(first["meta"]["total"], 12);
    assert_eq!(first["meta"]["has_more"], true);
    let rest = server.get(&format!("{base}&offset=8")).await.body;
    assert_eq!(
        rest["data"].as_array().unwrap().len(),
        4,
        "{}",
        rest["meta"]
    );
    assert_eq!(rest["meta"]["has_more"], false);
    let seen: HashSet<&str> = first["data"]
        .as_array()
        .unwrap()
        .iter()
        .chain(rest["data"].as_array().unwrap())
        .map(|record| record["id"].as_str().unwrap())
        .collect();
    assert_eq!(seen.len(), 12);
}
