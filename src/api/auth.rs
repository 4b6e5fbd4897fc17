//! Bearer-key authentication for the platform API.

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;

use super::error::ApiError;
use crate::state::AppState;
use crate::store::Account;

/// The account that authenticated this request.
pub struct CurrentAccount(pub Account);

impl FromRequestParts<AppState> for CurrentAccount {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let header = parts.headers.get(AUTHORIZATION).ok_or_else(|| {
            ApiError::unauthorized("missing Authorization: Bearer <api key> header")
        })?;
        let key = header
            .to_str()
            .ok()
            .and_then(bearer_token)
            .map(str::trim)
            .filter(|key| !key.is_empty())
            .ok_or_else(|| {
                ApiError::unauthorized("Authorization header must be `Bearer <api key>`")
            })?;
        match state.runtime.store.account_by_api_key(key).await? {
            Some(account) => Ok(CurrentAccount(account)),
            None => Err(ApiError::unauthorized("invalid API key")),
        }
    }
}

/// The token of a `Bearer` credential; the scheme is matched without regard
/// to case (RFC 9110, section 11.1).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_bearer_scheme_is_matched_in_any_case() {
        for header in ["Bearer k1", "bearer k1", "BEARER k1"] {
            assert_eq!(super::bearer_token(header), Some("k1"), "{header}");
        }
        assert_eq!(super::bearer_token("Basic k1"), None);
        assert_eq!(super::bearer_token("Bearerk1"), None);
    }
}
