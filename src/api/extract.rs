//! Extractors whose rejections use the API's error envelope instead of axum's
//! plain-text ones. Bodies are parsed as JSON whatever their Content-Type, which
//! keeps simple plugin clients working; the body size limit still applies.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::error::ApiError;
use crate::body_deadline::is_body_timeout;
use crate::error::ErrorCode;
use crate::state::AppState;

/// A JSON request body; errors name the offending field.
pub struct Json<T>(pub T);

/// Reads the body, answering 413 past the configured limit (at once when its
/// `Content-Length` says so) and 408 when it does not arrive in time.
pub async fn body_bytes(req: Request, state: &AppState) -> Result<Bytes, ApiError> {
    let limit = state.runtime.settings.body_limit_bytes;
    let declared = req
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        return Err(ApiError::payload_too_large(limit));
    }
    Bytes::from_request(req, state).await.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::payload_too_large(limit)
        } else if std::error::Error::source(&rejection).is_some_and(is_body_timeout) {
            ApiError::new(ErrorCode::RequestTimeout, rejection.body_text())
        } else {
            ApiError::validation(format!("could not read request body: {rejection}"))
        }
    })
}

/// Parses JSON, describing where it went wrong (`field: problem`). The body must
/// be exactly one JSON value: anything but whitespace after it is refused, never
/// silently ignored (`{"a":1}{"b":2}` would otherwise run the first object).
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err("request body must be a JSON object, got an empty body".into());
    }
    if has_nul_escape(bytes) {
        return Err(nul_refusal(bytes));
    }
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|err| {
        let path = err.path().to_string();
        let problem = without_string_values(&err.inner().to_string());
        if path == "." || path.is_empty() {
            format!("invalid request body: {problem}")
        } else {
            format!("invalid field `{path}`: {problem}")
        }
    })?;
    deserializer.end().map_err(|err| {
        format!("request body must be exactly one JSON value, found more after it: {err}")
    })?;
    Ok(value)
}

/// serde's message with the string values it quotes (`invalid type: string
/// "..."`) left out: the value may be a secret put in the wrong place (an MCP
/// server's `env` given as a string), and the client knows what it sent.
fn without_string_values(message: &str) -> String {
    const QUOTED: &str = "string \"";
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find(QUOTED) {
        out.push_str(&rest[..at]);
        out.push_str("string");
        let mut chars = rest[at + QUOTED.len()..].char_indices();
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    end = Some(at + QUOTED.len() + i + 1);
                    break;
                }
                _ => {}
            }
        }
        match end {
            Some(end) => rest = &rest[end..],
            // Unterminated: nothing after the opening quote is kept.
            None => return out,
        }
    }
    out.push_str(rest);
    out
}

/// Parses a body that must be a JSON object. serde would also read a struct
/// from an array (its fields by position), which no route means; the first
/// byte says what kind of value the body is, so nothing is parsed twice.
pub fn parse_json_object<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    let first = bytes.iter().find(|byte| !byte.is_ascii_whitespace());
    let kind = match first {
        Some(b'[') => Some("an array"),
        Some(b'"') => Some("a string"),
        Some(b't' | b'f') => Some("a boolean"),
        Some(b'n') => Some("null"),
        Some(b'-' | b'0'..=b'9') => Some("a number"),
        // An object, nothing, or not JSON: the parser says which.
        _ => None,
    };
    match kind {
        Some(kind) => Err(format!("request body must be a JSON object, got {kind}")),
        None => parse_json(bytes),
    }
}

impl<T: DeserializeOwned> FromRequest<AppState> for Json<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let bytes = body_bytes(req, state).await?;
        parse_json_object(&bytes)
            .map(Json)
            .map_err(ApiError::validation)
    }
}

/// Why a request string holding U+0000 is refused: PostgreSQL cannot store
/// it in text, and toolgate behaves the same on both backends.
const NUL_REFUSED: &str =
    "request strings must not contain U+0000 (NUL): the database cannot store it";

/// Whether a JSON text holds `\u0000` in a string (JSON cannot carry a raw
/// NUL byte: serde_json refuses control characters in strings). The escape
/// counts only when its backslash is not itself escaped (an odd run of
/// backslashes before the `u`).
fn has_nul_escape(json: &[u8]) -> bool {
    const ESCAPE: &[u8] = b"u0000";
    json.windows(ESCAPE.len())
        .enumerate()
        .filter(|(_, window)| *window == ESCAPE)
        .any(|(at, _)| {
            let backslashes = json[..at].iter().rev().take_while(|b| **b == b'\\').count();
            backslashes % 2 == 1
        })
}

/// The refusal of a body holding U+0000, naming the first field that does
/// (its value is never repeated: it may be a secret).
fn nul_refusal(bytes: &[u8]) -> String {
    let path = serde_json::from_slice::<serde_json::Value>(bytes)
        .ok()
        .and_then(|value| nul_path(&value, String::new()));
    match path {
        Some(path) if !path.is_empty() => format!("invalid field `{path}`: {NUL_REFUSED}"),
        _ => NUL_REFUSED.to_owned(),
    }
}

/// Where in `value` (as `a.b[2].c`) a string or key holds U+0000.
fn nul_path(value: &serde_json::Value, at: String) -> Option<String> {
    let join = |at: &str, key: &str| {
        if at.is_empty() {
            key.to_owned()
        } else {
            format!("{at}.{key}")
        }
    };
    match value {
        serde_json::Value::String(text) => text.contains('\0').then_some(at),
        serde_json::Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, item)| nul_path(item, format!("{at}[{i}]"))),
        serde_json::Value::Object(map) => map.iter().find_map(|(key, item)| {
            if key.contains('\0') {
                Some(join(&at, &key.replace('\0', "\\0")))
            } else {
                nul_path(item, join(&at, key))
            }
        }),
        _ => None,
    }
}

/// Query-string parameters.
pub struct Query<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or_default();
        if form_urlencoded::parse(query.as_bytes())
            .any(|(k, v)| k.contains('\0') || v.contains('\0'))
        {
            return Err(ApiError::validation(NUL_REFUSED));
        }
        let deserializer =
            serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
        serde_path_to_error::deserialize(deserializer)
            .map(Query)
            .map_err(|err| {
                // An error of the whole query (a parameter given twice, one
                // missing) has no path: serde_path_to_error writes it `.`.
                let path = err.path().to_string();
                if path == "." {
                    ApiError::validation(format!("invalid query: {}", err.inner()))
                } else {
                    ApiError::validation(format!(
                        "invalid query parameter `{path}`: {}",
                        err.inner()
                    ))
                }
            })
    }
}

/// Path parameters.
pub struct Path<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let raw = axum::extract::RawPathParams::from_request_parts(parts, state)
            .await
            .map_err(|rejection| ApiError::validation(format!("invalid path: {rejection}")))?;
        if raw.iter().any(|(_, value)| value.contains('\0')) {
            return Err(ApiError::validation(NUL_REFUSED));
        }
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(value)| Path(value))
            .map_err(|rejection| ApiError::validation(format!("invalid path: {rejection}")))
    }
}

/// A JSON body that may be absent: an empty body or `null` means `T::default()`.
pub struct OptionalJson<T>(pub T);

impl<T: DeserializeOwned + Default> FromRequest<AppState> for OptionalJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let bytes = body_bytes(req, state).await?;
        let trimmed = bytes.trim_ascii();
        if trimmed.is_empty() || trimmed == b"null" {
            return Ok(OptionalJson(T::default()));
        }
        parse_json_object(&bytes)
            .map(OptionalJson)
            .map_err(ApiError::validation)
    }
}

#[cfg(test)]
mod tests {
    use super::parse_json;
    use serde_json::Value;

    #[test]
    fn nul_is_refused_only_where_it_is_a_real_escape() {
        for body in [
            &br#"{"a":"x\u0000"}"#[..],
            br#"{"a\u0000":1}"#,
            br#"["\\\u0000"]"#,
        ] {
            let err = parse_json::<Value>(body).unwrap_err();
            assert!(err.contains("U+0000"), "{err}");
        }
        let named = parse_json::<Value>(br#"{"stdio":{"env":{"BAD":"a\u0000b"}}}"#).unwrap_err();
        assert!(
            named.contains("`stdio.env.BAD`") && !named.contains("a\u{0}b"),
            "{named}"
        );
        let literal: Value = parse_json(br#"{"a":"\\u0000"}"#).unwrap();
        assert_eq!(literal["a"], "\\u0000");
    }

    #[test]
    fn a_misplaced_string_is_not_repeated_in_the_refusal() {
        #[derive(serde::Deserialize, Debug)]
        struct Stdio {
            #[allow(dead_code)]
            env: std::collections::BTreeMap<String, String>,
        }
        for body in [
            &br#"{"env":"sk-live-"quoted"-secret"}"#[..],
            br#"{"env":"sk-live-secret"}"#,
        ] {
            let err = parse_json::<Stdio>(body).unwrap_err();
            assert!(
                !err.contains("sk-live") && err.contains("invalid type: string, expected a map"),
                "{err}"
            );
        }
        assert_eq!(
            super::without_string_values(r#"a string "x\"y" and string "z" end"#),
            "a string and string end"
        );
        assert_eq!(super::without_string_values(r#"string "open"#), "string");
    }

    #[test]
    fn exactly_one_value_is_accepted() {
        let value: Value = parse_json(b" {\"a\":1} \n\t\r\n").unwrap();
        assert_eq!(value["a"], 1);
        for body in [
            &b"{\"a\":1}{\"b\":2}"[..],
            b"{\"a\":1} {\"b\":2}",
            b"{\"a\":1}x",
            b"{\"a\":1},",
            b"[1] [2]",
            b"null null",
            b"{\"a\":1}\0",
        ] {
            let err = parse_json::<Value>(body).unwrap_err();
            assert!(err.contains("exactly one JSON value"), "{err}");
        }
    }
}
