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
            .and_then(|value| value.strip_prefix("Bearer "))
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
