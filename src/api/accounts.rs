//! `POST /accounts`: the admin account creates tenants.

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::CurrentAccount;
use super::envelope::Data;
use super::error::{ApiError, ApiResult};
use super::extract::Json;
use crate::state::AppState;

/// Body of `POST /accounts`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateAccount {
    pub name: String,
}

/// A new account with the only copy of its API key.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct CreatedAccount {
    pub id: String,
    pub name: String,
    pub api_key: String,
    pub created_at: i64,
}

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(create_account))
}

/// Create an account (admin only). The API key is shown only in this response.
#[utoipa::path(post, path = "/accounts", tag = "accounts", request_body = CreateAccount,
    responses((status = 201, description = "the new account, with the only copy of its API key", body = Data<CreatedAccount>),
        (status = 403, description = "`forbidden`: the caller is not the admin account"),
        (status = 409, description = "account_conflict")))]
async fn create_account(
    State(state): State<AppState>,
    CurrentAccount(caller): CurrentAccount,
    Json(body): Json<CreateAccount>,
) -> ApiResult<(StatusCode, axum::Json<Data<CreatedAccount>>)> {
    if !caller.is_admin {
        return Err(ApiError::forbidden(
            "only the admin account may create accounts",
        ));
    }
    let created = state
        .runtime
        .store
        .create_account(&body.name, false, None)
        .await?;
    Ok((
        StatusCode::CREATED,
        axum::Json(Data {
            data: CreatedAccount {
                id: created.account.id,
                name: created.account.name,
                api_key: created.api_key,
                created_at: created.account.created_at,
            },
        }),
    ))
}
