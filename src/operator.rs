//! `toolgate migrate`, `toolgate doctor` and `toolgate forget-secrets`: what
//! an operator runs against the database outside the server.

use serde_json::json;

use crate::config::{DatabaseArgs, DoctorArgs, ForgetSecretsArgs};
use crate::secrets::{KEY_ENV, KEY_FILE, KeySource, SecretsKey};
use crate::store::schema::{self, Checkup, Location};
use crate::store::{KeyVerdict, SecretsKeyMismatch, Store, StoredKeyCheck};

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
    let settings = args.database.settings(args.secrets_key)?;
    let location = Location::of(settings.database_url.as_deref(), &settings.data_dir)?;
    let key = SecretsKey::find(
        settings.secrets_key.as_ref().map(|k| k.expose()),
        &settings.data_dir,
    );
    let checked = async {
        let pool = schema::connect(&location, false).await?;
        let checkup = schema::checkup(&location, &pool).await;
        pool.close().await;
        checkup
    };
    let (ok, report) = match checked.await {
        Ok(checkup) => {
            let key = KeyReport::of(key, checkup.stored_key_check.as_ref());
            let problem = problem(&checkup).or_else(|| key.problem.clone());
            let report = if args.json {
                json!({"ok": problem.is_none(), "problem": problem, "checkup": checkup, "secrets_key": key})
                    .to_string()
            } else {
                text(&checkup, &key, problem.as_deref())
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

/// What a start would make of its secrets key on this database.
#[derive(serde::Serialize)]
struct KeyReport {
    /// `present`, `absent`, or `not_in_schema` (before the check's migration).
    check: &'static str,
    /// Where the key a start would use is: `configured`, `file`, `none` (a
    /// start generates one) or `malformed`.
    key: &'static str,
    /// What a start with that key does (None without a key or a check table).
    verdict: Option<KeyVerdict>,
    #[serde(skip)]
    line: String,
    #[serde(skip)]
    problem: Option<String>,
}

impl KeyReport {
    fn of(
        key: anyhow::Result<Option<(SecretsKey, KeySource)>>,
        stored: Option<&StoredKeyCheck>,
    ) -> Self {
        let check = match stored {
            None => "not_in_schema",
            Some(stored) if stored.present() => "present",
            Some(_) => "absent",
        };
        let mut report = Self {
            check,
            key: "none",
            verdict: None,
            line: String::new(),
            problem: None,
        };
        let (key, source) = match key {
            Err(err) => {
                report.key = "malformed";
                report.line = "the key a start would use is malformed".to_owned();
                report.problem = Some(format!("{err:#}"));
                return report;
            }
            Ok(None) => {
                report.unkeyed(stored);
                return report;
            }
            Ok(Some(found)) => found,
        };
        let from = match &source {
            KeySource::Configured => {
                report.key = "configured";
                "the configured key".to_owned()
            }
            KeySource::File { path, .. } => {
                report.key = "file";
                format!("the key in {}", path.display())
            }
        };
        let Some(stored) = stored else {
            report.line =
                format!("{from}; the database has no key check yet (its migration is pending)");
            return report;
        };
        let verdict = stored.verdict(&key);
        report.verdict = Some(verdict);
        report.line = match verdict {
            KeyVerdict::Opens => format!("{from} opens the database's key check"),
            KeyVerdict::WritesCheck => {
                format!("{from}; no key check yet, the next start writes one with it")
            }
            KeyVerdict::RewritesDamagedCheck => format!(
                "{from} opens the stored secrets but not the key check, which is damaged: the next start writes it again"
            ),
            KeyVerdict::Mismatch => {
                format!("{from} is not the database's: a start with it is refused")
            }
        };
        if verdict == KeyVerdict::Mismatch {
            report.problem = Some(SecretsKeyMismatch.to_string());
        }
        report
    }

    /// No key is configured and the data directory has no key file: a start
    /// would generate one, which a database that holds a check or sealed
    /// secrets refuses.
    fn unkeyed(&mut self, stored: Option<&StoredKeyCheck>) {
        if stored.is_some_and(StoredKeyCheck::binds_a_key) {
            self.line = "no key is configured and the data directory has no key file".to_owned();
            self.problem = Some(format!(
                "no secrets key is configured ({KEY_ENV}, --secrets-key or secrets_key) and the data directory has no {KEY_FILE} file, but the database was sealed with a key (its key check or stored secrets): a start would generate a new key and be refused; give it the database's key"
            ));
        } else {
            self.line = "none configured; the first start generates one into the data directory's key file and writes the database's key check".to_owned();
        }
    }
}

fn text(checkup: &Checkup, key: &KeyReport, problem: Option<&str>) -> String {
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
    lines.push(format!("secrets key: {}", key.line));
    lines.push(match problem {
        Some(problem) => format!("not ok: {problem}"),
        None => "ok".to_owned(),
    });
    lines.join("\n")
}
