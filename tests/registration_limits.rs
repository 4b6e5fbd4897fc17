//! Black-box tests of the runtime tool limits (`--max-runtime-tools`,
//! `--max-runtime-tools-per-source`, `--max-tool-schema-bytes`), of the memory a
//! full registry takes, and of the `serve` command line (`--help`, the script
//! switch), against the real binary.

mod common;

use std::time::Instant;

use common::try_register_remote as register;
use common::{Reply, SpawnOptions, TestServer, spawn_app, spawn_with};
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};

const CALLBACK: &str = "http://127.0.0.1:9333/cb";

async fn register_ok(server: &TestServer, body: Value) {
    let reply = register(server, body).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(reply.body["ok"], true, "{reply:?}");
}

fn tool(name: &str, source: &str) -> Value {
    json!({"name": name, "source": source, "callback_url": CALLBACK})
}

/// Asserts a `limit_exceeded` refusal naming `limit = value`.
fn assert_limit(reply: &Reply, limit: &str, value: usize) {
    assert_eq!(reply.status, StatusCode::CONFLICT, "{reply:?}");
    assert_eq!(reply.code(), "limit_exceeded", "{reply:?}");
    let message = reply.body["error"]["message"].as_str().unwrap_or("");
    assert!(
        message.contains(&format!("{limit} = {value}")),
        "the message should name {limit} = {value}: {message}"
    );
}

/// `GET /api/tools`: role name -> tool names.
async fn listed_names(server: &TestServer) -> Vec<(String, Vec<String>)> {
    let reply = server.get_without_key("/api/tools").await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    reply.body["tools_by_role"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(role, tools)| {
            let names = tools
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["name"].as_str().unwrap().to_owned())
                .collect();
            (role.clone(), names)
        })
        .collect()
}

async fn create_character(server: &TestServer, name: &str) {
    let reply = server
        .post(
            "/characters",
            json!({"name": name, "description": "", "persona": ""}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
}

fn flags(args: &[&str]) -> SpawnOptions {
    SpawnOptions {
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------
// The count limits.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn the_total_limit_counts_a_tool_of_every_role_once_and_never_a_replacement() {
    let server = spawn_with(flags(&["--max-runtime-tools", "3"])).await;
    create_character(&server, "Second").await;
    create_character(&server, "Third").await;
    // Three tools for all three roles: three tools, not nine.
    for (name, source) in [("a", "plugin:x"), ("b", "plugin:x"), ("c", "plugin:y")] {
        register_ok(&server, tool(name, source)).await;
    }
    let reply = register(&server, tool("d", "plugin:z")).await;
    assert_limit(&reply, "max_runtime_tools", 3);
    // A refusal changes nothing, for any role.
    for (role, names) in listed_names(&server).await {
        assert_eq!(names, ["a", "b", "c"], "{role}");
    }
    // Replacing a same-named tool of the same source is not a new tool, for all
    // roles or for one.
    let mut replaced = tool("a", "plugin:x");
    replaced["description"] = json!("new version");
    register_ok(&server, replaced.clone()).await;
    replaced["role"] = json!("Second");
    register_ok(&server, replaced).await;
    // A tool removed from every role frees its place; removed from one only, not.
    let reply = server
        .post_without_key(
            "/api/tools/unregister",
            json!({"name": "b", "role": "Lanlan"}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_limit(
        &register(&server, tool("d", "plugin:z")).await,
        "max_runtime_tools",
        3,
    );
    let reply = server
        .post_without_key("/api/tools/clear", json!({"source": "plugin:x"}))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    register_ok(&server, tool("d", "plugin:z")).await;
    register_ok(&server, tool("e", "plugin:z")).await;
    assert_limit(
        &register(&server, tool("f", "plugin:z")).await,
        "max_runtime_tools",
        3,
    );
}

/// One name held by each role with its own content holds one declaration per
/// content in memory: the total counts those, so roles cannot multiply it.
#[tokio::test]
async fn the_total_limit_counts_each_distinct_content_a_tool_is_held_with() {
    let server = spawn_with(flags(&["--max-runtime-tools", "2"])).await;
    create_character(&server, "Second").await;
    create_character(&server, "Third").await;
    let described = |role: &str, description: &str| {
        let mut body = tool("a", "plugin:x");
        body["role"] = json!(role);
        body["description"] = json!(description);
        body
    };
    register_ok(&server, described("Lanlan", "one")).await;
    register_ok(&server, described("Second", "two")).await;
    let reply = register(&server, described("Third", "three")).await;
    assert_limit(&reply, "max_runtime_tools", 2);
    assert_eq!(
        listed_names(&server)
            .await
            .into_iter()
            .filter(|(_, names)| !names.is_empty())
            .count(),
        2,
        "the refusal registered nothing"
    );
    // Content another role already holds is shared, not another one.
    register_ok(&server, described("Third", "one")).await;
}

#[tokio::test]
async fn the_per_source_limit_comes_from_the_config_file_and_counts_each_source_apart() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("toolgate.toml");
    std::fs::write(&config, "max_runtime_tools_per_source = 2\n").unwrap();
    let server = spawn_with(flags(&["--config", config.to_str().unwrap()])).await;
    register_ok(&server, tool("a", "plugin:one")).await;
    register_ok(&server, tool("b", "plugin:one")).await;
    let reply = register(&server, tool("c", "plugin:one")).await;
    assert_limit(&reply, "max_runtime_tools_per_source", 2);
    // Another source has its own count; the same name is its own tool there.
    register_ok(&server, tool("a", "plugin:two")).await;
    register_ok(&server, tool("c", "plugin:two")).await;
    assert_limit(
        &register(&server, tool("d", "plugin:two")).await,
        "max_runtime_tools_per_source",
        2,
    );
    // plugin:two's "a" displaced plugin:one's: plugin:one has room again.
    register_ok(&server, tool("c", "plugin:one")).await;
}

#[tokio::test]
async fn concurrent_registrations_never_overshoot_the_limit() {
    const LIMIT: usize = 20;
    const ATTEMPTS: usize = 80;
    let server = spawn_with(SpawnOptions {
        env: vec![("TOOLGATE_MAX_RUNTIME_TOOLS".into(), LIMIT.to_string())],
        ..Default::default()
    })
    .await;
    create_character(&server, "Second").await;
    let statuses: Vec<StatusCode> = futures::stream::iter(0..ATTEMPTS)
        .map(|i| {
            let server = &server;
            async move {
                let reply = register(server, tool(&format!("t{i:03}"), "plugin:race")).await;
                if reply.status != StatusCode::OK {
                    assert_limit(&reply, "max_runtime_tools", LIMIT);
                }
                reply.status
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let accepted = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert_eq!(accepted, LIMIT, "{statuses:?}");
    for (role, names) in listed_names(&server).await {
        assert_eq!(names.len(), LIMIT, "{role}: {names:?}");
    }
}

// ---------------------------------------------------------------------------
// The size limit.
// ---------------------------------------------------------------------------

/// A parameters schema of about `bytes` bytes (compact JSON): an object with
/// many described properties, the shape a large real schema has. `salt` makes
/// each tool's schema its own.
fn schema_of(bytes: usize, salt: usize) -> Value {
    let mut properties = serde_json::Map::new();
    let mut size = 0;
    let mut i = 0;
    while size < bytes {
        let description = format!(
            "Field {i} of tool {salt}: what the model must put here, in a sentence or two."
        );
        let property = json!({"type": "string", "maxLength": 256, "description": description});
        size += format!("\"field_{i:05}\":{property},").len();
        properties.insert(format!("field_{i:05}"), property);
        i += 1;
    }
    json!({"type": "object", "properties": properties, "additionalProperties": false})
}

#[tokio::test]
async fn a_tool_over_the_size_limit_is_422_naming_the_limit() {
    let server = spawn_with(flags(&["--max-tool-schema-bytes", "4096"])).await;
    let parameters = json!({"type": "object", "properties": {"q": {"type": "string"}}});
    let schema_len = parameters.to_string().len();
    let fits = 4096 - schema_len;
    let with_description = |len: usize| {
        let mut body = tool("sized", "plugin:size");
        body["parameters"] = parameters.clone();
        body["description"] = json!("d".repeat(len));
        body
    };
    // Schema plus description is what counts.
    register_ok(&server, with_description(fits)).await;
    for body in [with_description(fits + 1), {
        let mut body = tool("big", "plugin:size");
        body["parameters"] = schema_of(5000, 0);
        body
    }] {
        let reply = register(&server, body).await;
        assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY, "{reply:?}");
        assert_eq!(reply.code(), "validation_error");
        let message = reply.body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("max_tool_schema_bytes = 4096"),
            "{message}"
        );
    }
    // The refused ones left the registry as it was.
    let listed = listed_names(&server).await;
    assert_eq!(listed, [("Lanlan".to_owned(), vec!["sized".to_owned()])]);
}

#[tokio::test]
async fn the_default_size_limit_is_256_kib() {
    let server = spawn_app().await;
    let mut body = tool("large", "plugin:size");
    body["parameters"] = schema_of(200 * 1024, 0);
    register_ok(&server, body.clone()).await;
    body["parameters"] = schema_of(256 * 1024 + 1, 0);
    let reply = register(&server, body).await;
    assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY, "{reply:?}");
    let message = reply.body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("max_tool_schema_bytes = 262144"),
        "{message}"
    );
}

// ---------------------------------------------------------------------------
// Memory of a full registry.
// ---------------------------------------------------------------------------

/// A field of `/proc/<pid>/status` (VmRSS, VmHWM), in bytes.
fn proc_status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let line = status
        .lines()
        .find(|line| line.starts_with(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"));
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unreadable {line:?}"));
    kib * 1024
}

const MIB: u64 = 1024 * 1024;

/// The names in a `GET /api/tools` answer, read without building its schemas.
#[derive(serde::Deserialize)]
struct Listing {
    ok: bool,
    tools_by_role: std::collections::BTreeMap<String, Vec<ListedName>>,
}

#[derive(serde::Deserialize)]
struct ListedName {
    #[allow(dead_code)]
    name: String,
}

/// Fills a registry to its limit with ~100 KB schemas, each tool registered for
/// every one of three roles, and checks that the server's resident memory
/// (VmRSS, and its peak VmHWM) stays under 1 GB and, extrapolated from the
/// memory per tool, would at the default limit of 1,000 tools (with a copy of
/// each schema per role it would not); that `GET /api/tools` still answers; and
/// that the memory of cleared tools is reused by the next ones (nothing
/// lingered). Filling 1,000 tools takes about a minute in a debug build on two
/// cores, so the limit is lowered to `TOOLS` by its flag; the schema size is
/// the real one.
#[tokio::test]
async fn a_full_registry_of_100_kb_schemas_stays_under_1_gb() {
    const TOOLS: usize = 300;
    const DEFAULT_LIMIT: u64 = 1000;
    const SCHEMA_BYTES: usize = 100 * 1000;
    const ROLES: usize = 3;
    const GB: u64 = 1000 * 1000 * 1000;
    let server = spawn_with(flags(&["--max-runtime-tools", &TOOLS.to_string()])).await;
    for i in 1..ROLES {
        create_character(&server, &format!("Role{i}")).await;
    }
    let pid = server.pid();
    let before = proc_status_bytes(pid, "VmRSS");
    let fill = |source: &'static str| {
        let server = &server;
        async move {
            let started = Instant::now();
            futures::stream::iter(0..TOOLS)
                .map(|i| async move {
                    let mut body = tool(&format!("tool_{i:04}"), source);
                    body["description"] = json!(format!("Tool {i} of the memory test."));
                    body["parameters"] = schema_of(SCHEMA_BYTES, i);
                    let reply = register(server, body).await;
                    assert_eq!(reply.status, StatusCode::OK, "tool {i}: {reply:?}");
                    assert_eq!(
                        reply.body["affected_roles"].as_array().unwrap().len(),
                        ROLES
                    );
                })
                .buffer_unordered(4)
                .collect::<Vec<()>>()
                .await;
            started.elapsed()
        }
    };
    let filled_in = fill("plugin:memory").await;
    assert_limit(
        &register(&server, tool("one_more", "plugin:other")).await,
        "max_runtime_tools",
        TOOLS,
    );
    let full = proc_status_bytes(pid, "VmRSS");

    let started = Instant::now();
    let response = server
        .client
        .get(server.url("/api/tools"))
        .send()
        .await
        .expect("list");
    assert_eq!(response.status(), StatusCode::OK);
    let listing = response.bytes().await.expect("listing body");
    let listed_in = started.elapsed();
    let listing_bytes = listing.len() as u64;
    let listing: Listing = serde_json::from_slice(&listing).expect("listing JSON");
    assert!(listing.ok);
    assert_eq!(listing.tools_by_role.len(), ROLES);
    for (role, tools) in &listing.tools_by_role {
        assert_eq!(tools.len(), TOOLS, "{role}");
    }
    let after_listing = proc_status_bytes(pid, "VmRSS");

    let reply = server
        .post_without_key("/api/tools/clear", json!({"source": "plugin:memory"}))
        .await;
    assert_eq!(reply.body["removed"], TOOLS * ROLES, "{reply:?}");
    let cleared = proc_status_bytes(pid, "VmRSS");
    let refilled_in = fill("plugin:memory-again").await;
    let refilled = proc_status_bytes(pid, "VmRSS");
    let peak = proc_status_bytes(pid, "VmHWM");

    let per_tool = full.saturating_sub(before) / TOOLS as u64;
    let at_default_limit = before + per_tool * DEFAULT_LIMIT;
    let peak_at_default_limit = peak + per_tool * (DEFAULT_LIMIT - TOOLS as u64);
    eprintln!(
        "RSS with {TOOLS} tools x {SCHEMA_BYTES} B schemas x {ROLES} roles: start {} MiB, \
         full {} MiB ({} KiB per tool), after GET /api/tools {} MiB, after clear {} MiB, \
         refilled {} MiB, peak {} MiB; extrapolated to {DEFAULT_LIMIT} tools: {} MiB, \
         peak {} MiB. Filled in {filled_in:?}, refilled in {refilled_in:?}; \
         GET /api/tools of {} MiB answered in {listed_in:?}",
        before / MIB,
        full / MIB,
        per_tool / 1024,
        after_listing / MIB,
        cleared / MIB,
        refilled / MIB,
        peak / MIB,
        at_default_limit / MIB,
        peak_at_default_limit / MIB,
        listing_bytes / MIB,
    );
    for (what, bytes) in [
        ("full registry", full),
        ("after GET /api/tools", after_listing),
        ("refilled registry", refilled),
        ("peak", peak),
        (
            "full registry extrapolated to the default limit",
            at_default_limit,
        ),
        (
            "peak extrapolated to the default limit",
            peak_at_default_limit,
        ),
    ] {
        assert!(bytes < GB, "{what}: {} MiB", bytes / MIB);
    }
    // Cleared tools left nothing behind: the next ones reuse their memory.
    assert!(
        refilled < full + full.saturating_sub(before) / 4,
        "refilling after clear took {} MiB more than the first fill",
        refilled.saturating_sub(full) / MIB
    );
}

// ---------------------------------------------------------------------------
// The command line.
// ---------------------------------------------------------------------------

#[test]
fn serve_help_states_what_each_flag_does_and_its_default() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["serve", "--help"])
        .output()
        .expect("run toolgate serve --help");
    assert!(output.status.success(), "{output:?}");
    let help = String::from_utf8(output.stdout).unwrap();
    // Each option's block: its "--flag" line and the help lines under it.
    let mut blocks: Vec<(String, String)> = Vec::new();
    for line in help.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("--") || trimmed.starts_with("-h, --") {
            let flag = trimmed
                .split(|c: char| c.is_whitespace() || c == '=')
                .find(|word| word.starts_with("--"))
                .unwrap()
                .to_owned();
            blocks.push((flag, line.to_owned()));
        } else if let Some((_, text)) = blocks.last_mut()
            && line.starts_with(' ')
        {
            text.push('\n');
            text.push_str(line);
        }
    }
    let flags: Vec<&str> = blocks.iter().map(|(flag, _)| flag.as_str()).collect();
    for expected in [
        "--listen",
        "--data-dir",
        "--database-url",
        "--admin-token",
        "--log-format",
        "--config",
        "--default-character",
        "--body-limit-bytes",
        "--callback-response-limit-bytes",
        "--job-workers",
        "--enable-unsafe-script-handler",
        "--script-timeout-ms",
        "--script-memory-limit-bytes",
        "--max-runtime-tools",
        "--max-runtime-tools-per-source",
        "--max-tool-schema-bytes",
    ] {
        assert!(
            flags.contains(&expected),
            "{expected} missing from:\n{help}"
        );
    }
    for (flag, text) in &blocks {
        if flag == "--help" {
            continue;
        }
        assert!(
            text.contains("(default: "),
            "{flag} does not state its default:\n{text}"
        );
        // What it does: some words besides the flag, the default and the env.
        let words = text
            .split("(default: ")
            .next()
            .unwrap()
            .split_whitespace()
            .filter(|word| !word.starts_with("--") && !word.starts_with('<'))
            .count();
        assert!(words >= 4, "{flag} does not say what it does:\n{text}");
    }
    let block = |flag: &str| &blocks.iter().find(|(f, _)| f == flag).unwrap().1;
    let switch = block("--enable-unsafe-script-handler");
    assert!(
        !switch.lines().next().unwrap().contains('<'),
        "the script switch takes no value:\n{switch}"
    );
    assert!(switch.contains("exactly `true`"), "{switch}");
    let workers = block("--job-workers");
    assert!(workers.contains("(default: 4)"), "{workers}");
    assert!(workers.contains("0 starts no job worker"), "{workers}");
    assert!(block("--max-runtime-tools").contains("(default: 1000)"));
    assert!(block("--max-runtime-tools-per-source").contains("(default: 1000)"));
    assert!(block("--max-tool-schema-bytes").contains("(default: 262144"));
}

#[tokio::test]
async fn the_script_switch_without_a_value_turns_scripts_on() {
    // Followed by another flag, as a switch usually is.
    let server = spawn_with(flags(&[
        "--enable-unsafe-script-handler",
        "--job-workers",
        "1",
    ]))
    .await;
    let reply = server
        .post(
            "/tools/definitions",
            json!({
                "name": "echo_name",
                "description": "echoes",
                "parameters": {"type": "object", "properties": {"name": {"type": "string"}}},
                "handler_type": "script",
                "handler": {"script": "return args.name;"}
            }),
        )
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{reply:?}");
}

#[test]
fn the_script_switch_takes_no_value() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["serve", "--enable-unsafe-script-handler=true", "--help"])
        .env_remove("ENABLE_UNSAFE_SCRIPT_HANDLER")
        .output()
        .expect("run toolgate");
    assert!(!output.status.success(), "{output:?}");
}
