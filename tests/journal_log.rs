//! Issue 20: the journal's own log (src/store/journal_log.rs) on SQLite. A
//! call is answered once its rows are appended to the log; the table gets
//! them when the journal thread folds, a couple of milliseconds later. What
//! a client reads must not lag behind what it was answered, and a clean stop
//! must leave every row in the table.

mod common;

use std::time::Duration;

use common::metrics::scrape;
use common::{spawn_app, wait_until};

const CALLS: usize = 40;

#[tokio::test]
async fn each_call_is_in_the_journal_with_its_outcome_the_moment_it_is_answered() {
    let server = spawn_app().await;
    let session = server.create_session().await;
    calls_read_at_once(&server, &session).await;
}

/// Makes [`CALLS`] calls, reading each one's row the moment it is answered,
/// then the session's page.
async fn calls_read_at_once(server: &common::TestServer, session: &str) {
    for n in 0..CALLS {
        let data = server.roll_dice(session, &format!("c{n}")).await;
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

/// The scheduling policy of the server's journal thread, from /proc: 0 is
/// SCHED_OTHER, 5 SCHED_IDLE.
fn journal_thread_policy(pid: u32) -> Option<i64> {
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let dir = task.ok()?.path();
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
            continue;
        };
        // The kernel keeps a thread's name to 15 bytes.
        if comm.trim() == "toolgate-journa" {
            let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
            // Fields after the command's closing parenthesis start at the
            // third (state); the policy is the 41st.
            let after = &stat[stat.rfind(')')? + 2..];
            return after.split(' ').nth(38)?.parse().ok();
        }
    }
    None
}

/// Whether a thread of this user may leave SCHED_IDLE again, which the
/// server needs before it puts its journal thread there.
fn may_leave_sched_idle() -> bool {
    std::thread::spawn(|| {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `param` outlives both calls; 0 is the calling thread.
        #[allow(unsafe_code)]
        unsafe {
            libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) == 0
                && libc::sched_setscheduler(0, libc::SCHED_OTHER, &param) == 0
        }
    })
    .join()
    .unwrap()
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn folds_wait_in_the_background_class_and_reads_do_not_wait_for_them() {
    let server = spawn_app().await;
    if server.on_postgres() {
        eprintln!("SKIPPED on PostgreSQL: the journal's log is SQLite's");
        return;
    }
    let waiting_policy = if may_leave_sched_idle() {
        5
    } else {
        eprintln!(
            "NOT TESTED HERE: this user may not leave SCHED_IDLE (no CAP_SYS_NICE, RLIMIT_NICE < 20); the journal thread must stay SCHED_OTHER"
        );
        0
    };
    let pid = server.pid();
    let session = server.create_session().await;
    server.roll_dice(&session, "first").await;
    wait_until(
        Duration::from_secs(10),
        "the journal thread in its waiting class",
        || async { journal_thread_policy(pid) == Some(waiting_policy) },
    )
    .await;
    // With the thread waiting in the background, every call is still
    // readable at once: a read folds what is pending itself, or raises the
    // thread and waits for it.
    let other = server.create_session().await;
    calls_read_at_once(&server, &other).await;
    wait_until(
        Duration::from_secs(10),
        "the journal thread back in its waiting class",
        || async { journal_thread_policy(pid) == Some(waiting_policy) },
    )
    .await;
    let metrics = scrape(&server).await;
    assert!(
        metrics.contains("toolgate_journal_fold_raises_total"),
        "the raises are counted: {metrics}"
    );
}

/// Run by a user who may not leave SCHED_IDLE (no capabilities, an
/// RLIMIT_NICE of 0), the server keeps its journal thread at normal
/// priority, says why, and still serves. Needs root, to start it as
/// `nobody` through `setpriv`.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn without_the_right_to_leave_sched_idle_folds_stay_at_normal_priority() {
    use std::os::unix::fs::PermissionsExt;
    use tokio::io::AsyncBufReadExt;

    // SAFETY: no arguments, no preconditions.
    #[allow(unsafe_code)]
    let root = unsafe { libc::geteuid() } == 0;
    if !root || !std::path::Path::new("/usr/bin/setpriv").exists() {
        eprintln!(
            "SKIPPED: needs root and /usr/bin/setpriv to start the server as an unprivileged user (the test above covers that case when the suite itself runs unprivileged)"
        );
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(temp.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let log = temp.path().join("server.log");
    let mut child = tokio::process::Command::new("/usr/bin/setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(env!("CARGO_BIN_EXE_toolgate"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(temp.path().join("data"))
        .env_remove("TOOLGATE_DATABASE_URL")
        .env_remove("TOOLGATE_CONFIG")
        .env("TOOLGATE_ADMIN_TOKEN", "tg_nobody_token_0123456789abcdef")
        .env("RUST_LOG", "info,sqlx=warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .expect("setpriv starts");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let address = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(address) = line.strip_prefix("toolgate listening on ") {
                return address.trim().to_owned();
            }
        }
        panic!(
            "the server exited before listening: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    })
    .await
    .expect("listening within 60 s");
    let pid = child.id().expect("running");
    let health = reqwest::get(format!("{address}/healthz")).await.unwrap();
    assert!(health.status().is_success(), "{health:?}");
    assert_eq!(journal_thread_policy(pid), Some(0), "SCHED_OTHER");
    // Start-up says why.
    let said = common::file_containing(&log, "journal folds run at normal priority").await;
    assert!(
        !said.contains("changing the journal thread's scheduling class failed"),
        "the probe's refusal is not a failure: {said}"
    );
}
