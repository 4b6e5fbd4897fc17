//! Extractors whose rejections use the API's error envelope instead of axum's
//! plain-text ones. Bodies are parsed as JSON whatever their Content-Type, which
//! keeps simple plugin clients working; the body size limit still applies.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use super::error::ApiError;
use crate::state::AppState;

/// A JSON request body; errors name the offending field.
pub struct Json<T>(pub T);

/// Reads the body, answering 413 past the configured limit.
pub async fn body_bytes(req: Request, state: &AppState) -> Result<Bytes, ApiError> {
    Bytes::from_request(req, state).await.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::payload_too_large(state.runtime.settings.body_limit_bytes)
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
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|err| {
        let path = err.path().to_string();
        if path == "." || path.is_empty() {
            format!("invalid request body: {}", err.inner())
        } else {
            format!("invalid field `{path}`: {}", err.inner())
        }
    })?;
    deserializer.end().map_err(|err| {
        format!("request body must be exactly one JSON value, found more after it: {err}")
    })?;
    Ok(value)
}

impl<T: DeserializeOwned> FromRequest<AppState> for Json<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let bytes = body_bytes(req, state).await?;
        parse_json(&bytes).map(Json).map_err(ApiError::validation)
    }
}

/// Query-string parameters.
pub struct Query<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or_default();
        let deserializer =
            serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
        serde_path_to_error::deserialize(deserializer)
            .map(Query)
            .map_err(|err| {
                ApiError::validation(format!(
                    "invalid query parameter `{}`: {}",
                    err.path(),
                    err.inner()
                ))
            })
    }
}

/// Path parameters.
pub struct Path<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
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
        parse_json(&bytes)
            .map(OptionalJson)
            .map_err(ApiError::validation)
    }
}

#[cfg(test)]
mod tests {
    use super::parse_json;
    use serde_json::Value;

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
