//! The served OpenAPI document (`GET /openapi.json`) is valid OpenAPI, checked
//! by a standard validator (`openapi-spec-validator`, from the venv that
//! `.ci/test` creates), and keeps the API's own rules: the bearer scheme is
//! declared and required on exactly the routes that take an API key, every
//! response is described, and every error answer is the error envelope.

mod common;

use std::path::PathBuf;

use common::TestServer;
use reqwest::{Method, StatusCode};
use serde_json::Value;

/// Where the tests find the validator: this variable (set by `.ci/test`), else
/// the venv `.ci/test` creates.
const VALIDATOR_ENV: &str = "TOOLGATE_OPENAPI_VALIDATOR";
const DEFAULT_VENV_VALIDATOR: &str = ".ci/.venv/bin/openapi-spec-validator";
const ERROR_BODY: &str = "#/components/schemas/ErrorBody";

/// The routes that take no API key: health, the document itself, and the
/// loopback-only runtime tools API (guarded by its peer check instead).
fn is_public(path: &str) -> bool {
    matches!(path, "/healthz" | "/openapi.json" | "/api/tools") || path.starts_with("/api/tools/")
}

async fn served_document(server: &TestServer) -> Value {
    // Fetched without a key: the document is public.
    let reply = server.get_without_key("/openapi.json").await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert!(reply.body.is_object(), "not JSON: {}", reply.text);
    reply.body
}

/// Every operation of the document as (method, path, operation).
fn operations(doc: &Value) -> Vec<(String, String, &Value)> {
    const METHODS: &[&str] = &[
        "get", "put", "post", "delete", "options", "head", "patch", "trace", "query",
    ];
    let mut found = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, operation) in item.as_object().expect("path item") {
            if METHODS.contains(&method.as_str()) {
                found.push((method.clone(), path.clone(), operation));
            }
        }
        if let Some(more) = item.get("additionalOperations").and_then(Value::as_object) {
            for (method, operation) in more {
                found.push((method.to_lowercase(), path.clone(), operation));
            }
        }
    }
    assert!(!found.is_empty(), "the document has no operations");
    found
}

/// Follows a local `$ref` (`#/components/...`) to what it names.
fn resolve<'a>(doc: &'a Value, value: &'a Value) -> &'a Value {
    match value.get("$ref").and_then(Value::as_str) {
        Some(reference) => {
            let pointer = reference
                .strip_prefix('#')
                .unwrap_or_else(|| panic!("non-local $ref {reference}"));
            resolve(
                doc,
                doc.pointer(pointer)
                    .unwrap_or_else(|| panic!("dangling $ref {reference}")),
            )
        }
        None => value,
    }
}

fn is_error_status(status: &str) -> bool {
    status == "default" || status.starts_with('4') || status.starts_with('5')
}

fn validator_path() -> PathBuf {
    let how = format!(
        "install it with `bash .ci/test` (the whole suite) or `bash .ci/openapi-validator` \
         (the validator alone): they create .ci/.venv with the pinned openapi-spec-validator \
         (.ci/openapi-validator-requirements.txt); or point {VALIDATOR_ENV} at an \
         openapi-spec-validator executable"
    );
    let path = match std::env::var_os(VALIDATOR_ENV) {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(DEFAULT_VENV_VALIDATOR),
    };
    assert!(
        path.is_file(),
        "openapi-spec-validator not found at {}: {how}",
        path.display()
    );
    path
}

#[tokio::test]
async fn the_served_document_passes_openapi_spec_validator() {
    let validator = validator_path();
    let server = common::spawn_app().await;
    let doc = served_document(&server).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("openapi.json");
    std::fs::write(&file, serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
    let output = tokio::process::Command::new(&validator)
        .arg("--validation-errors")
        .arg("all")
        .arg(&file)
        .output()
        .await
        .unwrap_or_else(|err| panic!("running {}: {err}", validator.display()));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains(": OK"),
        "openapi-spec-validator rejects the served document ({}):\n{stdout}\n{stderr}",
        output.status
    );
}

#[tokio::test]
async fn every_response_is_described_and_every_error_is_the_envelope() {
    let server = common::spawn_app().await;
    let doc = served_document(&server).await;
    let mut problems = Vec::new();
    for (method, path, operation) in operations(&doc) {
        let responses = operation["responses"].as_object();
        let Some(responses) = responses.filter(|r| !r.is_empty()) else {
            problems.push(format!("{method} {path}: no responses"));
            continue;
        };
        for (status, response) in responses {
            let response = resolve(&doc, response);
            let described = response["description"]
                .as_str()
                .is_some_and(|d| !d.trim().is_empty());
            if !described {
                problems.push(format!("{method} {path} {status}: no description"));
            }
            if is_error_status(status) {
                let schema = &response["content"]["application/json"]["schema"];
                if schema["$ref"] != ERROR_BODY {
                    problems.push(format!(
                        "{method} {path} {status}: not the error envelope ({ERROR_BODY}): {response}"
                    ));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    // The envelope's code is the error-code table.
    let schemas = &doc["components"]["schemas"];
    let detail = resolve(&doc, &schemas["ErrorBody"]["properties"]["error"]);
    let code = resolve(&doc, &detail["properties"]["code"]);
    let codes = code["enum"].as_array().expect("ErrorCode enum");
    assert!(codes.contains(&Value::from("unauthorized")), "{code}");
    let required = detail["required"].as_array().expect("required");
    assert!(required.contains(&Value::from("code")), "{detail}");
    assert!(required.contains(&Value::from("message")), "{detail}");
}

#[tokio::test]
async fn the_bearer_scheme_is_required_on_every_protected_operation() {
    let server = common::spawn_app().await;
    let doc = served_document(&server).await;
    let schemes = doc["components"]["securitySchemes"]
        .as_object()
        .expect("components.securitySchemes");
    let bearer: Vec<&String> = schemes
        .iter()
        .filter(|(_, scheme)| {
            let scheme = resolve(&doc, scheme);
            scheme["type"] == "http"
                && scheme["scheme"]
                    .as_str()
                    .is_some_and(|s| s.eq_ignore_ascii_case("bearer"))
        })
        .map(|(name, _)| name)
        .collect();
    assert_eq!(bearer.len(), 1, "one http bearer scheme: {schemes:?}");
    let bearer = bearer[0];
    // Required per operation, not document-wide (the public routes take none).
    assert!(
        doc.get("security")
            .is_none_or(|s| s.as_array().is_some_and(Vec::is_empty)),
        "document-wide security: {}",
        doc["security"]
    );

    let mut problems = Vec::new();
    for (method, path, operation) in operations(&doc) {
        let security = operation.get("security").and_then(Value::as_array);
        if is_public(&path) {
            if security.is_some_and(|s| !s.is_empty()) {
                problems.push(format!("{method} {path} is public but has security"));
            }
            continue;
        }
        let requires_bearer = security.is_some_and(|requirements| {
            !requirements.is_empty()
                && requirements
                    .iter()
                    .all(|requirement| requirement.get(bearer.as_str()).is_some())
        });
        if !requires_bearer {
            problems.push(format!(
                "{method} {path}: security does not require {bearer}: {}",
                operation["security"]
            ));
        }
        if operation["responses"].get("401").is_none() {
            problems.push(format!("{method} {path}: no 401 response"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The document requires a key exactly where the server does: each operation
/// asked without one answers 401 `unauthorized` if and only if it declares
/// `security`.
#[tokio::test]
async fn declared_security_is_what_the_server_enforces() {
    let server = common::spawn_app().await;
    let doc = served_document(&server).await;
    let placeholder = regex::Regex::new(r"\{[^}]+\}").unwrap();
    let mut problems = Vec::new();
    for (method, path, operation) in operations(&doc) {
        let declared = operation
            .get("security")
            .and_then(Value::as_array)
            .is_some_and(|s| !s.is_empty());
        let concrete = placeholder.replace_all(&path, "x");
        let method: Method = method.to_uppercase().parse().unwrap();
        let reply = common::read_reply(
            server
                .client
                .request(method.clone(), server.url(&concrete))
                .json(&serde_json::json!({}))
                .send()
                .await
                .expect("request"),
        )
        .await;
        let refused = reply.status == StatusCode::UNAUTHORIZED && reply.code() == "unauthorized";
        if declared != refused {
            problems.push(format!(
                "{method} {path}: security declared {declared}, without a key answered {} {}",
                reply.status, reply.text
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
