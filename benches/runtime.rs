//! In-process costs of the tool runtime, measured through the library's own APIs:
//! catalog assembly, the permission policy, argument validation and the journal.
//!
//! Run with `cargo bench --bench runtime`. Each group keeps its measurement
//! short so that the whole suite stays within a few minutes on 2 cores.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};
use tokio::runtime::Runtime;

use toolgate::config::Settings;
use toolgate::domain::tool::{SideEffectLevel, Slot, ToolMetadata};
use toolgate::ids::{new_id, now_ms};
use toolgate::journal::query::{ExecutionQuery, ExecutionQueryParams};
use toolgate::journal::{CommitOutcome, ExecutionStatus, LifecycleState, canonical_json};
use toolgate::permissions::ToolPermissions;
use toolgate::runtime::ToolRuntime;
use toolgate::store::{ExecutionFinish, NewExecution, Session, Store};
use toolgate::tools::remote::{NewRemoteTool, RegistrationInput, Role};

/// A database and a runtime on a temporary directory, as the server builds them.
struct Fixture {
    _dir: tempfile::TempDir,
    rt: Runtime,
    runtime: ToolRuntime,
    account_id: String,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let settings = Settings::for_data_dir(dir.path());
        let store = rt
            .block_on(Store::open(None, dir.path()))
            .expect("open store");
        let account_id = rt
            .block_on(store.create_account("bench", true, None))
            .expect("account")
            .account
            .id;
        let runtime = ToolRuntime::new(store, Arc::new(settings)).expect("runtime");
        Self {
            _dir: dir,
            rt,
            runtime,
            account_id,
        }
    }
}

fn weather_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "location": {"type": "string", "minLength": 1, "maxLength": 128},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 14}
        },
        "required": ["location"],
        "additionalProperties": false
    })
}

fn remote_tool(name: &str) -> NewRemoteTool {
    NewRemoteTool::validate(RegistrationInput {
        name: name.to_owned(),
        description: Some(format!("Bench tool {name}")),
        parameters: Some(weather_schema()),
        callback_url: "http://127.0.0.1:9/callback".to_owned(),
        source: Some(format!("plugin:bench{}", name.len() % 3)),
        ..Default::default()
    })
    .expect("valid registration")
}

fn session(character_id: &str, metadata: Value) -> Session {
    Session {
        id: new_id("sess"),
        account_id: "acct_bench".to_owned(),
        character_id: character_id.to_owned(),
        character: "Bench".to_owned(),
        title: String::new(),
        metadata,
        created_at: now_ms(),
        updated_at: now_ms(),
    }
}

/// `ToolRuntime::catalog`: the builtins plus N remote tools of the character,
/// assembled with conflict detection, as every call and every model-session sync
/// does it; and the same catalog rendered as the seed's JSON.
fn catalog(c: &mut Criterion) {
    let fixture = Fixture::new();
    let mut group = c.benchmark_group("catalog");
    group
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1))
        .sample_size(30);
    for tools in [10usize, 100, 1000] {
        let character_id = format!("char_{tools}");
        for i in 0..tools {
            let tool = remote_tool(&format!("tool_{i:04}"));
            let role = Role {
                character_id: character_id.clone(),
                name: "Bench".to_owned(),
            };
            fixture
                .runtime
                .remote
                .register(&[role], &tool)
                .expect("under the limits");
        }
        let session = session(&character_id, json!({}));
        group.bench_with_input(BenchmarkId::new("build", tools), &session, |b, session| {
            b.iter(|| {
                fixture
                    .rt
                    .block_on(fixture.runtime.catalog(black_box(session)))
                    .expect("catalog")
            })
        });
        let built = fixture
            .rt
            .block_on(fixture.runtime.catalog(&session))
            .expect("catalog");
        group.bench_with_input(BenchmarkId::new("to_json", tools), &built, |b, built| {
            b.iter(|| {
                built
                    .entries
                    .iter()
                    .map(|entry| entry.to_json())
                    .collect::<Vec<_>>()
            })
        });
    }
    group.finish();
}

/// The permission policy of one call: parse the session's stored permissions and
/// run the rules, with default permissions and with slot lists of 100 names.
fn permissions(c: &mut Criterion) {
    let mut group = c.benchmark_group("permissions");
    group
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1))
        .sample_size(30);
    let metadata = ToolMetadata::declared(SideEffectLevel::Sandbox, vec![], None);
    let names: Vec<String> = (0..100).map(|i| format!("tool_{i:03}")).collect();
    let cases = [
        ("defaults", json!({})),
        (
            "slot_lists_100",
            json!({"tool_permissions": {
                "enabled": true,
                "max_calls_per_turn": 20,
                "slot_allow_list": {"narrator": names, "director": names},
                "slot_deny_list": {"verifier": names},
            }}),
        ),
    ];
    for (label, session_metadata) in cases {
        group.bench_function(BenchmarkId::new("parse_and_check", label), |b| {
            b.iter(|| {
                let permissions =
                    ToolPermissions::from_metadata(black_box(&session_metadata)).expect("parse");
                permissions.check(black_box("tool_099"), &metadata, Slot::Narrator)
            })
        });
        let parsed = ToolPermissions::from_metadata(&session_metadata).expect("parse");
        group.bench_function(BenchmarkId::new("check", label), |b| {
            b.iter(|| parsed.check(black_box("tool_099"), &metadata, Slot::Narrator))
        });
    }
    group.finish();
}

/// `schema::validate_arguments` on a typical tool schema, valid and invalid input.
fn validation(c: &mut Criterion) {
    let mut group = c.benchmark_group("validate_arguments");
    group
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1))
        .sample_size(30);
    let schema = weather_schema();
    let valid = json!({"location": "Shanghai", "unit": "celsius", "days": 3});
    let invalid = json!({"location": "", "unit": "kelvin", "days": 99, "extra": true});
    group.bench_function("valid", |b| {
        b.iter(|| toolgate::schema::validate_arguments(black_box(&schema), black_box(&valid)))
    });
    // What every call paid before compiled validators were cached.
    group.bench_function("compile_schema", |b| {
        b.iter(|| jsonschema::validator_for(black_box(&schema)).expect("valid schema"))
    });
    group.bench_function("invalid", |b| {
        b.iter(|| toolgate::schema::validate_arguments(black_box(&schema), black_box(&invalid)))
    });
    group.finish();
}

fn execution_row(account_id: &str, session_id: &str, floor_id: &str, n: usize) -> NewExecution {
    let args = json!({"sides": 20, "count": (n % 5) + 1});
    NewExecution {
        id: new_id("texec"),
        account_id: account_id.to_owned(),
        session_id: session_id.to_owned(),
        run_id: None,
        floor_id: Some(floor_id.to_owned()),
        page_id: Some(format!("{floor_id}_page")),
        call_id: new_id("call"),
        caller_slot: "narrator".to_owned(),
        provider_id: "builtin".to_owned(),
        provider_type: "builtin".to_owned(),
        tool_name: "roll_dice".to_owned(),
        args_canonical: canonical_json(&args),
        args,
        status: ExecutionStatus::Running,
        lifecycle_state: LifecycleState::Opened,
        commit_outcome: CommitOutcome::Pending,
        side_effect_level: "none".to_owned(),
        replay_safety: "safe".to_owned(),
        delivery_mode: "inline".to_owned(),
        attempt_no: 1,
        runtime_job_id: None,
        replay_parent_execution_id: None,
        result: None,
        error_message: None,
        reason_code: None,
        started_at: now_ms(),
        step_key: None,
        provider_started: true,
        admission: toolgate::store::Admission {
            step_limit: None,
            call_limit: Some(1000),
        },
    }
}

/// One call's journal work (open the row, then finish it), and the journal query
/// of `GET /tool-executions` on a session holding 10,000 rows.
fn journal(c: &mut Criterion) {
    let fixture = Fixture::new();
    let store = &fixture.runtime.store;
    let account = fixture.account_id.clone();
    let mut group = c.benchmark_group("journal");
    group
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1))
        .sample_size(30);
    let finish = ExecutionFinish {
        status: ExecutionStatus::Success,
        provider_started: true,
        result: json!({"rolls": [4, 17], "total": 21}),
        error_message: None,
        reason_code: None,
        commit_outcome: None,
    };
    let mut n = 0usize;
    group.bench_function("write_open_and_finish", |b| {
        b.iter(|| {
            n += 1;
            let row = execution_row(&account, "sess_write", &format!("floor_{}", n / 10), n);
            fixture.rt.block_on(async {
                store.insert_execution(&row).await.expect("insert");
                store
                    .finish_execution(&row.id, &finish)
                    .await
                    .expect("finish");
            })
        })
    });
    // A session with 10,000 finished rows over 1,000 floors.
    fixture.rt.block_on(async {
        for i in 0..10_000 {
            let mut row = execution_row(&account, "sess_read", &format!("rfloor_{}", i / 10), i);
            row.lifecycle_state = LifecycleState::Finished;
            row.status = if i % 10 == 0 {
                ExecutionStatus::Error
            } else {
                ExecutionStatus::Success
            };
            store.insert_execution(&row).await.expect("seed");
        }
    });
    let queries: [(&str, ExecutionQueryParams); 3] = [
        (
            "session_first_page",
            ExecutionQueryParams {
                session_id: Some("sess_read".into()),
                ..Default::default()
            },
        ),
        (
            "session_status_error",
            ExecutionQueryParams {
                session_id: Some("sess_read".into()),
                status: Some("error".into()),
                ..Default::default()
            },
        ),
        (
            "floor",
            ExecutionQueryParams {
                floor_id: Some("rfloor_500".into()),
                ..Default::default()
            },
        ),
    ];
    for (label, params) in queries {
        let query = ExecutionQuery::parse(params).expect("valid query");
        group.bench_function(BenchmarkId::new("read", label), |b| {
            b.iter(|| {
                fixture
                    .rt
                    .block_on(store.query_executions(&account, query.clone()))
                    .expect("query")
            })
        });
    }
    group.finish();
}

/// A registration into every role with one live model session per character
/// (`POST /api/tools/register` with `role: null` without the HTTP): the
/// catalog mutation and the sync of every live session, then the
/// unregistration, at 1, 10 and 100 characters.
fn fan_out(c: &mut Criterion) {
    use futures::FutureExt;
    use futures::StreamExt;
    use toolgate::domain::names::CharacterName;
    use toolgate::model_sessions::ModelProvider;
    use toolgate::tools::remote::Target;

    let fixture = Fixture::new();
    let runtime = &fixture.runtime;
    let store = &runtime.store;
    let mut group = c.benchmark_group("fan_out");
    group
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1))
        .sample_size(30);
    let mut subscriptions = Vec::new();
    for characters in [1usize, 10, 100] {
        fixture.rt.block_on(async {
            while subscriptions.len() < characters {
                let name = format!("Fan{:03}", subscriptions.len());
                let parsed = CharacterName::parse(&name).expect("character name");
                store
                    .create_character(&fixture.account_id, &parsed, "", "")
                    .await
                    .expect("character");
                let session = store
                    .create_session(&fixture.account_id, &name, "bench")
                    .await
                    .expect("session");
                let subscription = runtime
                    .model_sessions
                    .open(
                        runtime,
                        session,
                        Slot::Narrator,
                        ModelProvider::OpenAiCompatible,
                        None,
                    )
                    .await
                    .expect("model session");
                subscriptions.push(subscription);
            }
        });
        let tool = remote_tool("fan_out_tool");
        group.bench_function(BenchmarkId::new("register_unregister", characters), |b| {
            b.iter(|| {
                fixture.rt.block_on(async {
                    let remote = &runtime.remote;
                    remote
                        .register_into(runtime, store, Target::AllRoles, tool.clone())
                        .await
                        .expect("registered");
                    remote
                        .unregister_from(runtime, store, Target::AllRoles, "fan_out_tool")
                        .await
                        .expect("unregistered");
                });
                // Each stream read, as its subscriber would, so none fills up.
                for subscription in subscriptions.iter_mut() {
                    while let Some(Some(_)) = subscription.next().now_or_never() {}
                }
            });
        });
    }
    group.finish();
}

criterion_group!(benches, catalog, permissions, validation, journal, fan_out);
criterion_main!(benches);
