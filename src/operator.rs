//! `toolgate migrate`, `toolgate doctor` and `toolgate forget-secrets`: what
//! an operator runs against the database outside the server.

use serde_json::json;

use crate::config::{DatabaseArgs, DoctorArgs, ForgetSecretsArgs};
use crate::secrets::SecretsKey;
use crate::store::Store;
use crate::store::schema::{self, Checkup, Location};

/// Creates the database if missing and applies this binary's migrations.
pub async fn migrate(args: DatabaseArgs) -> anyhow::Result<()> {
    let (data_dir, database_url) = args.resolve()?;
    let location = Location::of(database_url.as_deref(), &data_dir)?;
    let pool = schema::connect(&location, true).await?;
    let applied = schema::migrate(&pool).await;
    pool.close().await;
    let applied = applied?;
    let version = schema::migrator(location.backend())
        .iter()
        .map(|m| m.version)
        .max()
        .unwrap_or(0);
    if applied.is_empty() {
        println!(
            "toolgate migrate: {} is at schema version {version}; nothing to apply",
            location.describe()
        );
    } else {
        println!(
            "toolgate migrate: {} is at schema version {version}; applied {applied:?}",
            location.describe()
        );
    }
    Ok(())
}

/// Drops the stored secrets and the key check, and says which servers lost
/// their secrets (now disabled).
pub async fn forget_secrets(args: ForgetSecretsArgs) -> anyhow::Result<()> {
    let (data_dir, database_url) = args.database.resolve()?;
    // Opening the store takes the data directory's lock (a server running on
    // it refuses this) and brings the schema up to date; the key it is given
    // seals nothing and is not kept.
    let (unused_key, _) = SecretsKey::generate()?;
    let store = Store::open_with_secrets(database_url.as_deref(), &data_dir, unused_key).await?;
    let forgotten = store.forget_secrets().await;
    store.close().await;
    let forgotten = forgotten?;
    println!(
        "toolgate forget-secrets: dropped the secrets key check and the secrets of {} MCP server(s); the next start's key takes over",
        forgotten.len()
    );
    for server in &forgotten {
        println!(
            "  disabled, without its secrets: {} (account {}, name {:?}); set its env or headers again, then enable it",
            server.id, server.account_id, server.name
        );
    }
    Ok(())
}

/// Prints the report; true when toolgate can run on the database.
pub async fn doctor(args: DoctorArgs) -> anyhow::Result<bool> {
    let (data_dir, database_url) = args.database.resolve()?;
    let location = Location::of(database_url.as_deref(), &data_dir)?;
    let checked = async {
        let pool = schema::connect(&location, false).await?;
        let checkup = schema::checkup(&location, &pool).await;
        pool.close().await;
        checkup
    };
    let (ok, report) = match checked.await {
        Ok(checkup) => {
            let problem = problem(&checkup);
            let report = if args.json {
                json!({"ok": problem.is_none(), "problem": problem, "checkup": checkup}).to_string()
            } else {
                text(&checkup, problem.as_deref())
            };
            (problem.is_none(), report)
        }
        Err(err) => {
            let problem = format!("{err:#}");
            let report = if args.json {
                json!({"ok": false, "problem": problem, "database": location.describe()})
                    .to_string()
            } else {
                format!(
                    "database: {} — unreachable: {problem}\nnot ok",
                    location.describe()
                )
            };
            (false, report)
        }
    };
    println!("{report}");
    Ok(ok)
}

/// Why toolgate could not run on the database as it is, if it could not.
fn problem(checkup: &Checkup) -> Option<String> {
    if let Some(refusal) = checkup.schema.refusal() {
        return Some(refusal);
    }
    (checkup.schema.applied_version == 0).then(|| {
        "the database has no toolgate schema yet; `toolgate migrate` or `toolgate serve` creates it"
            .to_owned()
    })
}

fn text(checkup: &Checkup, problem: Option<&str>) -> String {
    let schema = &checkup.schema;
    let mut lines = vec![
        format!(
            "database: {} ({}), reachable, {:.2} ms round trip",
            checkup.database, checkup.backend, checkup.round_trip_ms
        ),
        format!(
            "schema: version {} applied, this binary knows up to {}{}",
            schema.applied_version,
            schema.binary_version,
            if schema.pending.is_empty() {
                String::new()
            } else {
                format!(
                    "; pending {:?} (applied by `toolgate migrate` or at start-up)",
                    schema.pending
                )
            }
        ),
    ];
    let jobs: Vec<String> = checkup
        .jobs
        .iter()
        .map(|(state, count)| format!("{state} {count}"))
        .collect();
    lines.push(format!(
        "runtime jobs: {}{}",
        if jobs.is_empty() {
            "none".to_owned()
        } else {
            jobs.join(", ")
        },
        checkup
            .oldest_queued_age_s
            .map(|age| format!("; the oldest claimable has waited {age:.1} s"))
            .unwrap_or_default()
    ));
    lines.push(format!(
        "interrupted calls: {} journal row(s) left opened (the next start-up marks them uncertain)",
        checkup.interrupted_calls
    ));
    lines.push(match problem {
        Some(problem) => format!("not ok: {problem}"),
        None => "ok".to_owned(),
    });
    lines.join("\n")
}
