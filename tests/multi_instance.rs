//! Issue 19: several toolgate instances on one PostgreSQL database. Every test
//! starts two real server processes on a fresh database of the machine's
//! PostgreSQL (`TOOLGATE_TEST_POSTGRES`, default `postgres://postgres@127.0.0.1:5432`)
//! and fails, loudly, when that server cannot be reached.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::routing::post;
use common::database::TestDatabase;
use common::events::Events;
use common::{SpawnOptions, TestServer, spawn_with};
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::Row;
use tokio::sync::Notify;

const DEFAULT_POSTGRES: &str = "postgres://postgres@127.0.0.1:5432";

/// A fresh database on the suite's PostgreSQL server, which must answer.
async fn shared_database() -> TestDatabase {
    let server = common::database::postgres_server().unwrap_or_else(|| DEFAULT_POSTGRES.into());
    let admin = format!("{server}/postgres");
    sqlx::PgPool::connect(&admin)
        .await
        .unwrap_or_else(|err| panic!("the multi-instance tests need PostgreSQL at {server}: {err}"))
        .close()
        .await;
    TestDatabase::fresh(&server)
}

/// The secrets key every instance of a test shares, as the README asks:
/// an instance with another key is refused at start.
const SHARED_SECRETS_KEY: &str = "abababababababababababababababababababababababababababababababab";

/// One toolgate instance on `database`, with the shared secrets key.
async fn instance(database: &TestDatabase, env: &[(&str, &str)]) -> TestServer {
    let mut all = vec![
        ("TOOLGATE_DATABASE_URL".to_owned(), database.url.clone()),
        (
            "TOOLGATE_SECRETS_KEY".to_owned(),
            SHARED_SECRETS_KEY.to_owned(),
        ),
    ];
    all.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    spawn_with(SpawnOptions {
        env: all,
        ..Default::default()
    })
    .await
}

/// One instance on `database` whose model endpoint is `stand_in`.
async fn instance_with_model(
    database: &TestDatabase,
    stand_in: &common::model::StandIn,
) -> TestServer {
    let model = stand_in.env();
    let env: Vec<(&str, &str)> = model
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    instance(database, &env).await
}

async fn pool(database: &TestDatabase) -> sqlx::PgPool {
    sqlx::PgPool::connect(&database.url)
        .await
        .expect("connect to the test database")
}

/// The test database as the server's superuser sees it: to refuse new
/// connections to it and cut the open ones, as an outage would.
struct DatabaseAdmin {
    pool: sqlx::PgPool,
    name: String,
}

impl DatabaseAdmin {
    async fn of(database: &TestDatabase) -> Self {
        let (server, name) = database.url.rsplit_once('/').unwrap();
        let pool = sqlx::PgPool::connect(&format!("{server}/postgres"))
            .await
            .unwrap();
        Self {
            pool,
            name: name.to_owned(),
        }
    }

    async fn allow_connections(&self, on: bool) {
        let name = &self.name;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER DATABASE \"{name}\" ALLOW_CONNECTIONS {on}"
        )))
        .execute(&self.pool)
        .await
        .unwrap();
    }

    /// Ends the database's connections (only those named `application`,
    /// if given); answers how many.
    async fn cut_connections(&self, application: Option<&str>) -> usize {
        sqlx::query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = $1 AND pid <> pg_backend_pid() \
             AND ($2::text IS NULL OR application_name = $2)",
        )
        .bind(&self.name)
        .bind(application)
        .fetch_all(&self.pool)
        .await
        .unwrap()
        .len()
    }
}

/// A loopback callback server: counts calls per argument `n`; a call with
/// `"hang": true` never answers.
#[derive(Clone, Default)]
struct Callbacks {
    calls: Arc<Mutex<HashMap<i64, usize>>>,
    hanging: Arc<Mutex<usize>>,
    never: Arc<Notify>,
}

impl Callbacks {
    fn total(&self) -> usize {
        self.calls.lock().unwrap().values().sum()
    }

    fn hanging(&self) -> usize {
        *self.hanging.lock().unwrap()
    }
}

async fn start_callbacks() -> (String, Callbacks) {
    let state = Callbacks::default();
    let app = axum::Router::new()
        .route(
            "/work",
            post(
                |State(s): State<Callbacks>, Json(body): Json<Value>| async move {
                    if body["arguments"]["hang"] == true {
                        *s.hanging.lock().unwrap() += 1;
                        s.never.notified().await;
                    }
                    let n = body["arguments"]["n"].as_i64().unwrap_or(-1);
                    *s.calls.lock().unwrap().entry(n).or_default() += 1;
                    Json(json!({"output": {"n": n}, "is_error": false}))
                },
            ),
        )
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, state)
}

/// Registers the deferred `archive` tool with `server` (a plugin registers
/// with the toolgate on its own host, so with each instance).
async fn register_archive(server: &TestServer, base: &str) {
    common::register_remote(
        server,
        json!({"name": "archive", "callback_url": format!("{base}/work"), "timeout_seconds": 300,
               // Not replay-safe: a lost job of it ends uncertain, never re-run.
               "replay_safety": "confirm_on_replay",
               "async_capability": "deferred_ok", "default_delivery_mode": "async_job"}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_deferred_jobs_run_once_each_across_two_instances() {
    let database = shared_database().await;
    let a = instance(&database, &[]).await;
    let b = instance(&database, &[]).await;
    let (base, callbacks) = start_callbacks().await;
    register_archive(&a, &base).await;
    register_archive(&b, &base).await;
    let session = a.create_session().await;
    const JOBS: i64 = 500;
    let receipts: Vec<Value> = futures::stream::iter(0..JOBS)
        .map(|n| {
            let server = if n % 2 == 0 { &a } else { &b };
            let session = session.clone();
            async move {
                server
                    .tool_call(&session, json!({"name": "archive", "arguments": {"n": n}}))
                    .await
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    assert!(
        receipts
            .iter()
            .all(|r| r["output"]["runtime_job_id"].is_string())
    );
    common::wait_until(Duration::from_secs(180), "every job's callback", || async {
        callbacks.total() >= JOBS as usize
    })
    .await;
    let db = pool(&database).await;
    common::wait_until(Duration::from_secs(60), "every job to succeed", || async {
        let done: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM runtime_jobs WHERE state = 'succeeded'")
                .fetch_one(&db)
                .await
                .unwrap();
        done == JOBS
    })
    .await;
    let calls = callbacks.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), JOBS as usize, "every n was called");
    let twice: Vec<_> = calls.iter().filter(|(_, count)| **count != 1).collect();
    assert!(twice.is_empty(), "jobs run more than once: {twice:?}");
    let owners =
        sqlx::query("SELECT lease_owner, COUNT(*) AS n FROM runtime_jobs GROUP BY lease_owner")
            .fetch_all(&db)
            .await
            .unwrap();
    let owners: Vec<(Option<String>, i64)> = owners
        .iter()
        .map(|row| (row.get("lease_owner"), row.get("n")))
        .collect();
    assert_eq!(owners.len(), 2, "both instances ran jobs: {owners:?}");
    let attempts: i64 =
        sqlx::query_scalar("SELECT CAST(MAX(attempts) AS BIGINT) FROM runtime_jobs")
            .fetch_one(&db)
            .await
            .unwrap();
    assert_eq!(attempts, 1, "no job was claimed twice");
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_killed_mid_job_leaves_it_uncertain_and_the_other_finishes_the_rest() {
    let database = shared_database().await;
    // One worker slot: while A runs the hanging job it claims nothing else.
    let mut a = instance(&database, &[("TOOLGATE_JOB_WORKERS", "1")]).await;
    let (base, callbacks) = start_callbacks().await;
    register_archive(&a, &base).await;
    let session = a.create_session().await;
    let hanging = a
        .tool_call(
            &session,
            json!({"name": "archive", "arguments": {"n": 0, "hang": true}}),
        )
        .await;
    let hanging_job = hanging["output"]["runtime_job_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let hanging_execution = hanging["output"]["execution_id"]
        .as_str()
        .unwrap()
        .to_owned();
    common::wait_until(
        Duration::from_secs(30),
        "A to start the hanging job",
        || async { callbacks.hanging() == 1 },
    )
    .await;
    let b = instance(&database, &[]).await;
    register_archive(&b, &base).await;
    assert_eq!(
        b.job_state(&hanging_job).await,
        "running",
        "B's start-up left A's job alone"
    );
    let mut jobs = Vec::new();
    for n in 1..=20 {
        let receipt = b
            .tool_call(&session, json!({"name": "archive", "arguments": {"n": n}}))
            .await;
        jobs.push(
            receipt["output"]["runtime_job_id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    a.kill().await;
    let b = &b;
    common::wait_until(
        Duration::from_secs(60),
        "B to finish the other jobs",
        || {
            let jobs = jobs.clone();
            async move {
                for job in &jobs {
                    if b.job_state(job).await != "succeeded" {
                        return false;
                    }
                }
                true
            }
        },
    )
    .await;
    // The dead instance's lease runs out (30 s); B's worker then ends the job.
    common::wait_until(
        Duration::from_secs(120),
        "the hanging job to end",
        || async { b.job_state(&hanging_job).await == "uncertain" },
    )
    .await;
    let row = b
        .get(&format!("/tool-executions/{hanging_execution}"))
        .await;
    assert_eq!(row.body["data"]["status"], "uncertain", "{row:?}");
    assert_eq!(
        row.body["data"]["execution_reason_code"], "job_lease_lost",
        "{row:?}"
    );
    assert_eq!(callbacks.hanging(), 1, "the lost job was never run again");
    for n in 1..=20 {
        assert_eq!(callbacks.calls.lock().unwrap().get(&n), Some(&1), "job {n}");
    }
}

/// A `slow` call on `server` that its callback holds: the callbacks, the
/// session, and the call's answer (none if the server never answers).
async fn a_call_held_on(
    server: &TestServer,
) -> (
    Callbacks,
    String,
    tokio::task::JoinHandle<Option<(StatusCode, Value)>>,
) {
    let (base, callbacks) = start_callbacks().await;
    common::register_remote(
        server,
        json!({"name": "slow", "callback_url": format!("{base}/work"), "timeout_seconds": 300}),
    )
    .await;
    let session = server.create_session().await;
    let request = server
        .client
        .post(server.url(&format!("/sessions/{session}/tool-calls")))
        .bearer_auth(&server.token)
        .json(&json!({"name": "slow", "arguments": {"n": 1, "hang": true}}));
    let answer = tokio::spawn(async move {
        let reply = request.send().await.ok()?;
        Some((reply.status(), reply.json::<Value>().await.ok()?))
    });
    common::wait_until(
        Duration::from_secs(30),
        "the call to reach its callback",
        || async { callbacks.hanging() == 1 },
    )
    .await;
    (callbacks, session, answer)
}

/// Waits until `server` reads the execution `id` as `uncertain`.
async fn wait_for_uncertain(server: &TestServer, id: &str) {
    common::wait_until(
        Duration::from_secs(60),
        "the execution to be uncertain",
        || async {
            let row = server.get(&format!("/tool-executions/{id}")).await;
            row.body["data"]["status"] == "uncertain"
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_in_flight_on_a_live_instance_survives_anothers_start_and_is_uncertain_once_it_dies()
{
    let database = shared_database().await;
    let mut a = instance(&database, &[]).await;
    let (_callbacks, session, _answer) = a_call_held_on(&a).await;
    let b = instance(&database, &[]).await;
    let rows = b
        .get(&format!(
            "/tool-executions?session_id={session}&tool_name=slow"
        ))
        .await;
    assert_eq!(rows.status, StatusCode::OK, "{rows:?}");
    let row = rows.body["data"][0].clone();
    assert_eq!(
        row["lifecycle_state"], "opened",
        "B's start-up left A's open call alone: {row}"
    );
    let id = row["id"].as_str().unwrap().to_owned();
    a.kill().await;
    wait_for_uncertain(&b, &id).await;
    let row = b.get(&format!("/tool-executions/{id}")).await.body["data"].clone();
    assert_eq!(row["lifecycle_state"], "finished", "{row}");
    // Nothing restarted: A's heartbeat stopped, and B settled its call.
    assert_eq!(row["execution_reason_code"], "instance_lost", "{row}");
}

/// Probe J: a call whose instance was paused past its heartbeat is marked
/// `uncertain` by another instance; when the paused one resumed and the
/// provider answered, its caller was told `success` while the journal kept
/// `uncertain`. The caller is now told what the journal keeps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_answered_after_its_instance_was_taken_for_dead_answers_what_the_journal_kept() {
    let database = shared_database().await;
    let a = instance(&database, &[]).await;
    let b = instance(&database, &[]).await;
    let (callbacks, session, answer) = a_call_held_on(&a).await;
    let rows = b
        .get(&format!(
            "/tool-executions?session_id={session}&tool_name=slow"
        ))
        .await;
    let id = rows.body["data"][0]["id"].as_str().unwrap().to_owned();
    signal(&a, "STOP");
    wait_for_uncertain(&b, &id).await;
    // The provider answers while A is stopped; A reads it once resumed.
    callbacks.never.notify_waiters();
    common::wait_until(
        Duration::from_secs(30),
        "the callback to answer",
        || async { callbacks.total() == 1 },
    )
    .await;
    signal(&a, "CONT");
    let (status, body) = answer.await.unwrap().expect("A answers once resumed");
    assert_eq!(status, StatusCode::OK, "{body}");
    let row = b.get(&format!("/tool-executions/{id}")).await.body["data"].clone();
    assert_eq!(
        row["status"], "uncertain",
        "the journal keeps its outcome: {row}"
    );
    assert_eq!(
        body["data"]["status"], "uncertain",
        "the caller is told what the journal keeps: {body}"
    );
    assert_eq!(body["data"]["is_error"], true, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permission_change_on_one_instance_refuses_the_next_call_on_the_other() {
    let database = shared_database().await;
    let a = instance(&database, &[]).await;
    let b = instance(&database, &[]).await;
    let session = a.create_session().await;
    let roll = json!({"name": "roll_dice", "arguments": {"sides": 6}});
    assert_eq!(
        b.tool_call(&session, roll.clone()).await["status"],
        "success"
    );
    let reply = a
        .put(
            &format!("/sessions/{session}/tool-permissions"),
            json!({"slot_deny_list": {"narrator": ["roll_dice"]}}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let refused = b.tool_call(&session, roll).await;
    assert_eq!(refused["status"], "denied", "{refused}");
    assert_eq!(
        refused["execution_reason_code"], "permission_slot_on_deny_list",
        "{refused}"
    );
}

/// A session deleted on one instance ends its event streams on the others
/// too: they kept receiving catalog changes and held places under the
/// account's cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_deleted_on_one_instance_ends_its_event_streams_on_the_others() {
    let database = shared_database().await;
    let a = instance(&database, &[]).await;
    let b = instance(&database, &[]).await;
    let session = a.create_session().await;
    let mut events = Events::open(&b, &session).await;
    let deleted = a.delete(&format!("/sessions/{session}")).await;
    assert_eq!(deleted.status, StatusCode::OK, "{deleted:?}");
    events.until_ended(Duration::from_secs(10)).await;
}

/// A session's events reach its streams on every instance, once each: a
/// generation on A streams to B's stream of the session exactly as to A's (a
/// reply far past a notification's 8,000 bytes included), and an approval
/// asked and rejected on A reaches B's stream too. A was alone on the
/// database until B started, so relaying nothing: B's greeting at its start
/// is what makes A relay the generation that follows at once (A's heartbeat
/// would find B only within 2 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_events_reach_its_streams_on_every_instance_once() {
    let database = shared_database().await;
    let long = "x".repeat(20_000);
    let stand_in =
        common::model::StandIn::start(vec![common::model::text_answer(&["Hel", "lo ", &long])])
            .await;
    let a = instance_with_model(&database, &stand_in).await;
    let b = instance_with_model(&database, &stand_in).await;
    let session = a.create_session().await;
    let mut on_a = Events::open(&a, &session).await;
    let mut on_b = Events::open(&b, &session).await;
    // Another account's session, streamed on B, must hear none of it.
    let other_key = a.create_account("other").await;
    let other_session = a.create_session_as(&other_key, "Other").await;
    let mut other = Events::open_as(&b, &other_key, &other_session).await;
    common::model::turn(&a, &session, "hello").await;
    let here = common::model::until_run_ends(&mut on_a).await;
    let there = common::model::until_run_ends(&mut on_b).await;
    assert_eq!(
        common::model::kinds(&here),
        ["run_started", "token", "token", "token", "run_finished"]
    );
    assert_eq!(there, here, "B's stream shows the run as A's does");
    assert_eq!(
        there[4].1["content"],
        format!("Hello {long}"),
        "the whole reply"
    );

    let callbacks = common::callbacks::CountingCallbacks::start().await;
    common::register_remote(
        &a,
        json!({"name": "send_email", "callback_url": callbacks.url("/ok"), "side_effect_level": "irreversible"}),
    )
    .await;
    let held = a
        .put(
            &format!("/sessions/{session}/tool-permissions"),
            json!({"approval_required": {"side_effect_level": "irreversible"}}),
        )
        .await;
    assert_eq!(held.status, StatusCode::OK, "{held:?}");
    let call = a
        .post(
            &format!("/sessions/{session}/tool-calls"),
            json!({"name": "send_email", "arguments": {"to": "bob"}}),
        )
        .await;
    assert_eq!(call.body["data"]["status"], "awaiting_approval", "{call:?}");
    let id = call.body["data"]["execution_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let rejected = a
        .post(
            &format!("/tool-executions/{id}/reject"),
            json!({"reason": "not to Bob"}),
        )
        .await;
    assert_eq!(rejected.status, StatusCode::OK, "{rejected:?}");
    // Each stream's next session events are the approval's, once: a run's
    // events relayed twice, or back to A, would come before them.
    for (name, events) in [("A", &mut on_a), ("B", &mut on_b)] {
        let mut kinds = Vec::new();
        while kinds.len() < 2 {
            let event = events.next_within(Duration::from_secs(30)).await;
            if event.kind != "catalog_changed" {
                assert_eq!(event.data["execution_id"], id, "{name}: {event:?}");
                kinds.push(event.kind);
            }
        }
        assert_eq!(kinds, ["approval_requested", "tool_result"], "{name}");
    }
    // Everything above was published on B by now; a change of the other
    // session's own catalog is the first thing its stream hears.
    let changed = b
        .send_as(
            &other_key,
            reqwest::Method::PUT,
            &format!("/sessions/{other_session}/tool-permissions"),
            Some(json!({"enabled": false})),
        )
        .await;
    assert_eq!(changed.status, StatusCode::OK, "{changed:?}");
    let first = other.next_within(Duration::from_secs(30)).await;
    assert_eq!(first.kind, "catalog_changed", "{first:?}");
}

/// An instance alone on the database relays its sessions' events to nobody:
/// a generation with a stream open, then a clean stop (which writes every
/// event still queued for the relay), leaves no batch behind. That a second
/// instance is counted from its start, before it serves, is
/// `a_sessions_events_reach_its_streams_on_every_instance_once`: its streams
/// open and its generation runs within the first heartbeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_alone_on_the_database_relays_nothing() {
    let database = shared_database().await;
    let stand_in =
        common::model::StandIn::start(vec![common::model::text_answer(&["alone"])]).await;
    let mut a = instance_with_model(&database, &stand_in).await;
    let session = a.create_session().await;
    let mut events = Events::open(&a, &session).await;
    common::model::turn(&a, &session, "hello").await;
    let run = common::model::until_run_ends(&mut events).await;
    assert_eq!(
        common::model::kinds(&run),
        ["run_started", "token", "run_finished"]
    );
    a.terminate();
    let stopped = a.wait_exit(Duration::from_secs(30)).await;
    assert!(
        stopped.is_some_and(|status| status.success()),
        "{stopped:?}"
    );
    let batches: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM relayed_session_events")
        .fetch_one(&pool(&database).await)
        .await
        .unwrap();
    assert_eq!(batches, 0, "batches relayed with no other instance");
}

/// An instance that never heard of a deletion (its listener was
/// reconnecting when the announcement went out; here the row is deleted
/// behind both instances' backs) still closes the session's streams once it
/// finds the session gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_missed_a_sessions_deletion_still_ends_its_event_streams() {
    let database = shared_database().await;
    let a = instance(&database, &[]).await;
    let b = instance(&database, &[]).await;
    let session = a.create_session().await;
    let kept = a.create_session().await;
    let mut gone_on_a = Events::open(&a, &session).await;
    let mut gone_on_b = Events::open(&b, &session).await;
    let mut kept_on_b = Events::open(&b, &kept).await;
    sqlx::query("DELETE FROM sessions WHERE id = $1")
        .bind(&session)
        .execute(&pool(&database).await)
        .await
        .unwrap();
    gone_on_a.until_ended(Duration::from_secs(20)).await;
    gone_on_b.until_ended(Duration::from_secs(20)).await;
    // The other session's stream is untouched: it still receives its events.
    a.create_definition("lore_lookup").await;
    let changed = kept_on_b
        .next_of("catalog_changed", Duration::from_secs(10))
        .await;
    assert_eq!(changed["added"], json!(["lore_lookup"]), "{changed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_definition_disabled_on_one_instance_leaves_the_others_catalog_and_live_sessions() {
    let database = shared_database().await;
    let a = instance(&database, &[]).await;
    let b = instance(&database, &[]).await;
    let session = a.create_session().await;
    let id = a.create_definition("lore_lookup").await;
    assert!(
        catalog_names(&b, &session)
            .await
            .contains(&"lore_lookup".to_owned()),
        "B lists A's definition"
    );
    let mut events = Events::open(&b, &session).await;
    let toggled = a
        .patch(
            &format!("/tools/definitions/{id}/toggle"),
            json!({"enabled": false}),
        )
        .await;
    assert_eq!(toggled.status, StatusCode::OK, "{toggled:?}");
    // B's live model session is told, as if the change had been made on B.
    let changed = events
        .next_of("catalog_changed", Duration::from_secs(10))
        .await;
    assert_eq!(changed["removed"], json!(["lore_lookup"]), "{changed}");
    assert!(
        !strings(&changed["tools"]).contains(&"lore_lookup".to_owned()),
        "{changed}"
    );
    assert!(
        !catalog_names(&b, &session)
            .await
            .contains(&"lore_lookup".to_owned()),
        "B's catalog no longer lists it"
    );
}

/// The names in the session's runtime catalog on `server`.
async fn catalog_names(server: &TestServer, session: &str) -> Vec<String> {
    let reply = server
        .get(&format!("/sessions/{session}/tools/runtime"))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    reply.body["data"]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|tool| tool["name"].as_str().map(str::to_owned))
        .collect()
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_permission_patches_from_both_instances_lose_nothing() {
    let database = shared_database().await;
    let a = instance(&database, &[]).await;
    let b = instance(&database, &[]).await;
    let session = a.create_session().await;
    let path = format!("/sessions/{session}/tool-permissions");
    for round in 1..=25u64 {
        let tools = if round % 2 == 0 {
            json!(["roll_dice"])
        } else {
            json!(["get_time"])
        };
        let (from_a, from_b) = tokio::join!(
            a.patch(
                &path,
                json!({"slot_allow_list": {"director": tools.clone()}})
            ),
            b.patch(&path, json!({"max_calls_per_turn": round})),
        );
        assert_eq!(from_a.status, StatusCode::OK, "{from_a:?}");
        assert_eq!(from_b.status, StatusCode::OK, "{from_b:?}");
        let stored = a.get(&path).await.body["data"].clone();
        assert_eq!(
            stored["slot_allow_list"]["director"], tools,
            "round {round}: {stored}"
        );
        assert_eq!(
            stored["max_calls_per_turn"], round,
            "round {round}: {stored}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_registrations_stay_with_their_instance() {
    let database = shared_database().await;
    let a = instance(&database, &[]).await;
    let b = instance(&database, &[]).await;
    let (base, _callbacks) = start_callbacks().await;
    register_archive(&a, &base).await;
    let session = a.create_session().await;
    assert!(
        catalog_names(&a, &session)
            .await
            .contains(&"archive".to_owned())
    );
    assert!(
        !catalog_names(&b, &session)
            .await
            .contains(&"archive".to_owned()),
        "B never lists A's loopback tool"
    );
    let refused = b
        .tool_call(&session, json!({"name": "archive", "arguments": {"n": 1}}))
        .await;
    assert_eq!(refused["status"], "denied", "{refused}");
    let listed = b.get("/api/tools").await;
    assert!(!listed.text.contains("archive"), "{listed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_server_created_on_one_instance_is_attached_and_detached_on_the_other() {
    let database = shared_database().await;
    let (a, b) = (
        instance(&database, &[]).await,
        instance(&database, &[]).await,
    );
    let session = a.create_session().await;
    let server_id =
        common::mcp::create_server(&a, common::mcp::stdio_body("lore", json!({}))).await;
    let live =
        common::mcp::wait_for_source(&b, &session, &server_id, "live", Duration::from_secs(30))
            .await;
    let listed: Vec<String> = strings(&Value::Array(
        live["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|tool| tool["name"].clone())
            .collect(),
    ));
    assert!(
        listed.iter().any(|name| name.contains("echo")),
        "B offers the server's tools: {listed:?}"
    );
    let deleted = a.delete(&format!("/mcp/servers/{server_id}")).await;
    assert_eq!(deleted.status, StatusCode::OK, "{deleted:?}");
    let b = &b;
    common::wait_until(
        Duration::from_secs(10),
        "B to detach the server",
        || async {
            common::mcp::server_entry(&common::mcp::catalog(b, &session).await, &server_id)
                .is_none()
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_server_disabled_or_deleted_while_an_instance_was_not_listening_is_detached_there() {
    let database = shared_database().await;
    let (a, b) = (
        instance(&database, &[]).await,
        instance(&database, &[]).await,
    );
    let session = a.create_session().await;
    // Each instance runs its own child of each server; a child's `sleep
    // <marker>` runs while its instance keeps the server attached.
    let markers = [1, 2].map(|n| format!("{}{n}", 8_000_000 + std::process::id()));
    let disabled =
        common::mcp::create_server(&a, common::mcp::grouped_stdio_body("lore", &markers[0])).await;
    let deleted =
        common::mcp::create_server(&a, common::mcp::grouped_stdio_body("maps", &markers[1])).await;
    for server_id in [&disabled, &deleted] {
        common::mcp::wait_for_source(&b, &session, server_id, "live", Duration::from_secs(30))
            .await;
    }
    // How many instances run each server's child, waited for.
    let markers = &markers;
    let children = |count: usize, what: &'static str| {
        common::wait_until(Duration::from_secs(30), what, move || {
            let reached = markers
                .iter()
                .all(|marker| common::mcp::processes_running(&["sleep", marker]).len() == count);
            async move { reached }
        })
    };
    children(2, "both instances to attach both").await;
    // B's connections carry its instance id (application_name). All of them
    // are cut (an idle one of its pool would listen again at once), and none
    // may be opened until both changes are made: B cannot hear them
    // announced.
    let b_instance = std::fs::read_to_string(b.data_dir.join("instance.lock")).unwrap();
    // A makes both changes on connections it already holds: several
    // requests at once leave its pool a few idle ones, so that its heartbeat
    // taking one meanwhile does not leave the changes needing a new one
    // (refused below: a 500 seen once in CI).
    let warm = || a.get("/mcp/servers");
    let warmed = tokio::join!(warm(), warm(), warm(), warm());
    for reply in [warmed.0, warmed.1, warmed.2, warmed.3] {
        assert!(reply.status.is_success(), "{reply:?}");
    }
    let admin = DatabaseAdmin::of(&database).await;
    admin.allow_connections(false).await;
    let cut = admin
        .cut_connections(Some(&format!("toolgate {}", b_instance.trim())))
        .await;
    assert!(cut > 0, "B's connections are found by their name");
    let patched = a
        .patch(
            &format!("/mcp/servers/{disabled}"),
            json!({"enabled": false}),
        )
        .await;
    assert_eq!(patched.status, StatusCode::OK, "{patched:?}");
    let removed = a.delete(&format!("/mcp/servers/{deleted}")).await;
    assert_eq!(removed.status, StatusCode::OK, "{removed:?}");
    admin.allow_connections(true).await;
    // B listens again, reads what it may have missed and stops both
    // children (A stopped its own as it made the changes).
    children(0, "B to detach the disabled and the deleted server").await;
    assert!(b.get("/mcp/servers").await.status.is_success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generation_on_a_live_instance_survives_anothers_start() {
    let database = shared_database().await;
    let stand_in = common::model::StandIn::start(vec![common::model::Answer::Hang]).await;
    let a = instance_with_model(&database, &stand_in).await;
    let session = a.create_session().await;
    let started = common::model::turn(&a, &session, "hello").await;
    let run_id = started["run_id"].as_str().unwrap().to_owned();
    let db = pool(&database).await;
    let generation = |run_id: String| {
        let db = db.clone();
        async move { run_row(&db, &run_id).await.1 }
    };
    common::wait_until(Duration::from_secs(30), "A's run to generate", || {
        let generation = generation(run_id.clone());
        async move { generation.await.as_deref() == Some("running") }
    })
    .await;
    // B's start-up discards interrupted generations: A's is not one.
    let b = instance_with_model(&database, &stand_in).await;
    assert_eq!(b.get("/healthz").await.status, StatusCode::OK);
    assert_eq!(generation(run_id.clone()).await.as_deref(), Some("running"));
    // A still owns it: a second floor there is refused while it generates.
    let again = a
        .post(
            &format!("/sessions/{session}/floors"),
            json!({"content": "again"}),
        )
        .await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{again:?}");
}

/// A run's `(state, generation)` as the database holds them.
async fn run_row(db: &sqlx::PgPool, run_id: &str) -> (String, Option<String>) {
    let row = sqlx::query("SELECT state, generation FROM floor_runs WHERE id = $1")
        .bind(run_id)
        .fetch_one(db)
        .await
        .unwrap();
    (row.get("state"), row.get("generation"))
}

/// Two instances on one database, with a model that never answers (kept
/// while the instances need it).
async fn two_generating_instances(
    database: &TestDatabase,
) -> (common::model::StandIn, TestServer, TestServer) {
    let stand_in = common::model::StandIn::start(Vec::new()).await;
    stand_in.repeat(common::model::Answer::Hang);
    let a = instance_with_model(database, &stand_in).await;
    let b = instance_with_model(database, &stand_in).await;
    (stand_in, a, b)
}

async fn run_state(server: &TestServer, run_id: &str) -> String {
    let run = server.get(&format!("/runs/{run_id}")).await;
    assert_eq!(run.status, StatusCode::OK, "{run:?}");
    run.body["data"]["state"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn assert_still_generating(reply: &common::Reply, what: &str) {
    assert_eq!(reply.status, StatusCode::CONFLICT, "{what}: {reply:?}");
    assert_eq!(
        reply.body["error"]["code"], "generation_in_progress",
        "{what}: {reply:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_generates_once_across_instances_and_a_cancel_reaches_the_one_generating() {
    let database = shared_database().await;
    let (_model, a, b) = two_generating_instances(&database).await;
    let session = a.create_session().await;
    let path = format!("/sessions/{session}/floors");
    let (on_a, on_b) = tokio::join!(
        a.post(&path, json!({"content": "from a"})),
        b.post(&path, json!({"content": "from b"}))
    );
    let (winner, loser, started, refused) = match (on_a.status, on_b.status) {
        (StatusCode::ACCEPTED, StatusCode::CONFLICT) => (&a, &b, on_a, on_b),
        (StatusCode::CONFLICT, StatusCode::ACCEPTED) => (&b, &a, on_b, on_a),
        _ => panic!("one floor starts, the other is refused: {on_a:?} {on_b:?}"),
    };
    assert_still_generating(&refused, "the second floor");
    let floors = a.get(&path).await;
    assert_eq!(
        floors.body["data"].as_array().map(Vec::len),
        Some(1),
        "the refused floor was not stored: {floors:?}"
    );
    let run_id = started.body["data"]["run_id"].as_str().unwrap().to_owned();
    let page_id = started.body["data"]["page_id"].as_str().unwrap().to_owned();
    let floor_id = started.body["data"]["floor_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // Every way to close, choose or restart the run on the other instance waits.
    for (what, route, body) in [
        ("commit", format!("/runs/{run_id}/commit"), json!({})),
        ("discard", format!("/runs/{run_id}/discard"), json!({})),
        ("select", format!("/pages/{page_id}/select"), json!({})),
        (
            "regenerate",
            format!("/floors/{floor_id}/regenerate"),
            json!({}),
        ),
        ("floor", path.clone(), json!({"content": "again"})),
    ] {
        assert_still_generating(&loser.post(&route, body).await, what);
    }
    assert_eq!(run_state(winner, &run_id).await, "open");
    // The cancel is asked where the run is not generating, and ends it there.
    let cancel = loser
        .post(&format!("/runs/{run_id}/cancel"), json!({}))
        .await;
    assert_eq!(cancel.status, StatusCode::OK, "{cancel:?}");
    assert_eq!(cancel.body["data"]["cancelled"], true, "{cancel:?}");
    common::wait_until(
        Duration::from_secs(30),
        "the cancelled run to end",
        || async { run_state(winner, &run_id).await == "discarded" },
    )
    .await;
    // The session is free on every instance once the run has ended.
    common::wait_until(
        Duration::from_secs(30),
        "the session to be free",
        || async {
            loser.post(&path, json!({"content": "next"})).await.status == StatusCode::ACCEPTED
        },
    )
    .await;
    let late = loser
        .post(&format!("/runs/{run_id}/cancel"), json!({}))
        .await;
    assert_eq!(late.body["data"]["cancelled"], false, "{late:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_instances_generation_is_discarded_by_a_live_one_without_a_restart() {
    let database = shared_database().await;
    let (_model, mut a, b) = two_generating_instances(&database).await;
    let session = a.create_session().await;
    let started = common::model::turn(&a, &session, "hello").await;
    let run_id = started["run_id"].as_str().unwrap().to_owned();
    let path = format!("/sessions/{session}/floors");
    assert_still_generating(&b.post(&path, json!({"content": "b"})).await, "floor on B");
    a.kill().await;
    // A is taken for dead after its heartbeat goes stale; B's sweep discards
    // the run and B may generate in the session.
    common::wait_until(Duration::from_secs(60), "B to discard A's run", || async {
        run_state(&b, &run_id).await == "discarded"
    })
    .await;
    // Nor does A's claim of the session outlive it.
    let db = pool(&database).await;
    common::wait_until(Duration::from_secs(30), "A's claim to go", || async {
        sqlx::query("SELECT COUNT(*) AS n FROM generation_claims")
            .fetch_one(&db)
            .await
            .unwrap()
            .get::<i64, _>("n")
            == 0
    })
    .await;
    let next = b.post(&path, json!({"content": "b again"})).await;
    assert_eq!(next.status, StatusCode::ACCEPTED, "{next:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_session_on_one_instance_stops_its_generation_on_the_other() {
    let database = shared_database().await;
    let (model, a, b) = two_generating_instances(&database).await;
    let session = a.create_session().await;
    common::model::turn(&a, &session, "hello").await;
    model.wait_for_requests(1).await;
    let deleted = b.delete(&format!("/sessions/{session}")).await;
    assert_eq!(deleted.status, StatusCode::OK, "{deleted:?}");
    model.wait_for_abandoned(1).await;
}

/// A generation on A, with A stopped (SIGSTOP) while its model request
/// hangs: (model, A, B, the session, A's run).
async fn a_paused_generation(
    database: &TestDatabase,
) -> (
    common::model::StandIn,
    TestServer,
    TestServer,
    String,
    String,
) {
    let (model, a, b) = two_generating_instances(database).await;
    let session = a.create_session().await;
    let started = common::model::turn(&a, &session, "hello").await;
    let run_id = started["run_id"].as_str().unwrap().to_owned();
    model.wait_for_requests(1).await;
    signal(&a, "STOP");
    (model, a, b, session, run_id)
}

/// Sends the signal `name` (`STOP`, `CONT`) to the server's process.
fn signal(server: &TestServer, name: &str) {
    let sent = std::process::Command::new("kill")
        .arg(format!("-{name}"))
        .arg(server.pid().to_string())
        .status()
        .expect("kill(1)");
    assert!(sent.success(), "kill -{name}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_paused_past_its_heartbeat_stops_the_generation_taken_from_it() {
    let database = shared_database().await;
    let (model, a, b, session, run_id) = a_paused_generation(&database).await;
    // B takes A for dead and discards its generation; the session is B's to use.
    common::wait_until(Duration::from_secs(60), "B to discard A's run", || async {
        run_state(&b, &run_id).await == "discarded"
    })
    .await;
    let next = b
        .post(
            &format!("/sessions/{session}/floors"),
            json!({"content": "on b"}),
        )
        .await;
    assert_eq!(next.status, StatusCode::ACCEPTED, "{next:?}");
    signal(&a, "CONT");
    // A, resumed, finds itself taken for dead and stops what it generated.
    model.wait_for_abandoned(1).await;
    let db = pool(&database).await;
    let (_, generation) = run_row(&db, &run_id).await;
    assert_eq!(generation.as_deref(), Some("failed"), "B's ending stands");
}

/// Probe J: B could claim a paused instance's session (A's heartbeat stale)
/// before B's sweep discarded A's run, so the session had two generations
/// once A resumed. Taking the claim now discards the run in one step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claiming_a_paused_instances_session_discards_its_generation_in_the_same_step() {
    let database = shared_database().await;
    let (model, a, b, session, run_id) = a_paused_generation(&database).await;
    let path = format!("/sessions/{session}/floors");
    // Posted as soon as A is taken for dead, mostly before B's sweep (every
    // 5 s) would have discarded A's run on its own.
    let next = Mutex::new(None);
    common::wait_until(Duration::from_secs(60), "B to take the session", || {
        let (b, path, next) = (&b, &path, &next);
        async move {
            let reply = b.post(path, json!({"content": "on b"})).await;
            if reply.status == StatusCode::ACCEPTED {
                *next.lock().unwrap() = Some(reply);
                return true;
            }
            assert_still_generating(&reply, "a floor on B while A is live");
            false
        }
    })
    .await;
    let db = pool(&database).await;
    assert_eq!(
        run_row(&db, &run_id).await,
        ("discarded".to_owned(), Some("failed".to_owned())),
        "A's run is closed before B's generation of the session starts"
    );
    let b_run = next.into_inner().unwrap().unwrap().body["data"]["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    signal(&a, "CONT");
    // A, resumed, stops what it generated; B's generation goes on alone.
    model.wait_for_abandoned(1).await;
    assert_eq!(
        run_row(&db, &run_id).await,
        ("discarded".to_owned(), Some("failed".to_owned()))
    );
    assert_eq!(
        run_row(&db, &b_run).await,
        ("open".to_owned(), Some("running".to_owned()))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_is_logged_with_its_cause_and_so_is_its_end() {
    let database = shared_database().await;
    let server = instance(&database, &[]).await;
    // The loops whose outage lines this test reads have started.
    server.log_containing("job worker started").await;
    let admin = DatabaseAdmin::of(&database).await;
    admin.allow_connections(false).await;
    admin.cut_connections(None).await;
    // The line of a loop that tries every second or two names the loop and
    // the database's own reason, not only "database operation failed".
    let log_file = server.data_dir.join("..").join("server.log");
    let failure = |text: &str| {
        text.lines()
            .find(|line| line.contains("background work failed"))
            .map(str::to_owned)
    };
    let mut line = None;
    common::wait_until(Duration::from_secs(60), "a background failure line", || {
        line = failure(&std::fs::read_to_string(&log_file).unwrap_or_default());
        let found = line.is_some();
        async move { found }
    })
    .await;
    let line = line.unwrap();
    let cause = line.split("error=").nth(1).unwrap_or_default().trim();
    assert!(
        cause.contains("database") && cause != "database operation failed",
        "{line}"
    );
    let what = line
        .split("what=")
        .nth(1)
        .and_then(|rest| rest.split(" error=").next())
        .unwrap()
        .to_owned();
    admin.allow_connections(true).await;
    let back = format!("background work works again what={what}");
    common::wait_until(Duration::from_secs(60), &back, || {
        let text = std::fs::read_to_string(&log_file).unwrap_or_default();
        let found = text.contains(&back);
        async move { found }
    })
    .await;
}

/// A `toolgate serve` on the database at `database_url` from its own data directory: its child
/// once it listens, or its output once it exits without listening.
async fn serve_or_refusal(
    database_url: &str,
    data_dir: &std::path::Path,
    secrets_key: Option<&str>,
) -> Result<tokio::process::Child, std::process::Output> {
    use tokio::io::AsyncBufReadExt;
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_toolgate"));
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .env("TOOLGATE_DATABASE_URL", database_url)
        .env("TOOLGATE_ADMIN_TOKEN", common::ADMIN_TOKEN)
        .env_remove("TOOLGATE_SECRETS_KEY")
        .env_remove("TOOLGATE_CONFIG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    if let Some(key) = secrets_key {
        command.env("TOOLGATE_SECRETS_KEY", key);
    }
    let mut child = command.spawn().expect("spawn toolgate");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let listening = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.expect("read stdout") {
            if line.starts_with("toolgate listening on") {
                return true;
            }
        }
        false
    })
    .await
    .expect("neither listening nor refused within 60 s");
    if listening {
        return Ok(child);
    }
    Err(
        tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
            .await
            .expect("a refused start did not exit")
            .expect("wait"),
    )
}

fn assert_refused_for_its_key(output: &std::process::Output) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("does not open the secrets stored in the database"),
        "{stderr}"
    );
}

#[tokio::test]
async fn an_instance_with_another_secrets_key_is_refused_and_nothing_is_forgotten_under_a_live_one()
{
    let database = shared_database().await;
    let a = instance(&database, &[]).await;
    let server_id = common::mcp::create_server(
        &a,
        json!({"name": "keyed", "transport": "stdio",
               "stdio": {"command": "toolgate-test-no-such-mcp-server", "env": {"TOKEN": "s3cret"}}}),
    )
    .await;
    let temp = tempfile::tempdir().unwrap();
    let b_dir = temp.path().join("b");
    // Started without the shared key, B would generate its own and seal
    // what A cannot open: refused, and its generated key is not left behind.
    let refused = serve_or_refusal(&database.url, &b_dir, None)
        .await
        .expect_err("an instance with its own key started");
    assert_refused_for_its_key(&refused);
    assert!(!b_dir.join("secrets-key").exists());
    let refused = serve_or_refusal(&database.url, &b_dir, Some(&"cd".repeat(32)))
        .await
        .expect_err("an instance with another key started");
    assert_refused_for_its_key(&refused);
    // Forgetting the secrets from B's directory is refused while A runs.
    let forget =
        common::toolgate_command(&["forget-secrets", "--yes"], &b_dir, Some(&database.url));
    assert!(!forget.status.success(), "{forget:?}");
    let said = String::from_utf8_lossy(&forget.stderr);
    assert!(said.contains("running on this database"), "{said}");
    let kept = a.get(&format!("/mcp/servers/{server_id}")).await;
    assert_eq!(kept.body["data"]["secrets_error"], Value::Null, "{kept:?}");
    assert_eq!(
        kept.body["data"]["stdio"]["env_masked"],
        json!({"TOKEN": "****"})
    );
    assert_eq!(kept.body["data"]["enabled"], true);
    // With the shared key, B starts.
    let b = serve_or_refusal(&database.url, &b_dir, Some(SHARED_SECRETS_KEY)).await;
    assert!(
        b.is_ok(),
        "B with the shared key was refused: {:?}",
        b.err()
    );
}

#[tokio::test]
async fn two_instances_with_different_keys_starting_at_once_on_a_new_database_start_one() {
    for round in 0..3 {
        let database = shared_database().await;
        let temp = tempfile::tempdir().unwrap();
        let (dir_one, dir_two) = (temp.path().join("one"), temp.path().join("two"));
        let (key_one, key_two) = ("01".repeat(32), "02".repeat(32));
        let (one, two) = tokio::join!(
            serve_or_refusal(&database.url, &dir_one, Some(&key_one)),
            serve_or_refusal(&database.url, &dir_two, Some(&key_two)),
        );
        match (one, two) {
            (Ok(_), Err(refused)) | (Err(refused), Ok(_)) => assert_refused_for_its_key(&refused),
            (one, two) => panic!(
                "round {round}: not exactly one started: {:?} / {:?}",
                one.map(|_| "listening"),
                two.map(|_| "listening")
            ),
        }
    }
}

/// Waits until a backend of the test database is blocked on a lock while
/// running a statement like `statement`.
async fn wait_for_blocked(pool: &sqlx::PgPool, statement: &'static str, what: &str) {
    common::wait_until(Duration::from_secs(30), what, || async move {
        sqlx::query_scalar::<_, i64>(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock' AND query LIKE $1",
        )
        .bind(statement)
        .fetch_one(pool)
        .await
        .unwrap()
            > 0
    })
    .await;
}

#[tokio::test]
async fn an_instance_starting_while_secrets_are_forgotten_takes_over_with_its_key_alone() {
    let database = shared_database().await;
    let mut first = instance(&database, &[]).await;
    common::mcp::create_server(
        &first,
        json!({"name": "keyed", "transport": "stdio",
               "stdio": {"command": "toolgate-test-no-such-mcp-server", "env": {"TOKEN": "s3cret"}}}),
    )
    .await;
    first.stop().await;
    // Holds forget-secrets between its check that no instance is alive and
    // its commit.
    let pool = pool(&database).await;
    let mut blocker = pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE mcp_servers IN EXCLUSIVE MODE")
        .execute(&mut *blocker)
        .await
        .unwrap();
    let temp = tempfile::tempdir().unwrap();
    let forget = {
        let (dir, url) = (temp.path().join("operator"), database.url.clone());
        tokio::task::spawn_blocking(move || {
            common::toolgate_command(&["forget-secrets", "--yes"], &dir, Some(&url))
        })
    };
    wait_for_blocked(
        &pool,
        "UPDATE mcp_servers%",
        "forget-secrets to reach its update",
    )
    .await;
    // An instance with the old key starts now: its key check must wait for
    // the forgetting, not pass on the check about to be dropped.
    let starting = {
        let (url, dir) = (database.url.clone(), temp.path().join("a"));
        tokio::spawn(async move { serve_or_refusal(&url, &dir, Some(SHARED_SECRETS_KEY)).await })
    };
    wait_for_blocked(
        &pool,
        "%pg_advisory_xact_lock%",
        "the start's key check to wait",
    )
    .await;
    blocker.commit().await.unwrap();
    let forgot = forget.await.unwrap();
    assert!(forgot.status.success(), "{forgot:?}");
    let _running = starting
        .await
        .unwrap()
        .expect("the instance starting with the old key was refused");
    // That instance's key is the database's now; another is refused.
    let refused = serve_or_refusal(
        &database.url,
        &temp.path().join("c"),
        Some(&"cd".repeat(32)),
    )
    .await
    .expect_err("an instance with another key started beside it");
    assert_refused_for_its_key(&refused);
}
