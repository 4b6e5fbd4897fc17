//! Character CRUD, scoped to the calling account.

use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::auth::CurrentAccount;
use super::envelope::{Data, List, ListParams};
use super::error::{ApiError, ApiResult};
use super::extract::{Json, Path, Query};
use crate::domain::CharacterName;
use crate::domain::tool::Slot;
use crate::state::AppState;
use crate::store::{Character, CharacterPatch};

const MAX_TEXT_BYTES: usize = 64 * 1024;

/// Body of `POST /characters`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateCharacter {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub persona: String,
    /// The model the generation loop asks for this character (default: `TOOLGATE_LLM_MODEL`).
    pub model: Option<String>,
    /// Sampling temperature, 0–2 (default: the model's).
    pub temperature: Option<f64>,
    /// The system prompt of its turns (default: the persona).
    pub system_prompt: Option<String>,
    /// Slots its turns pass through besides the narrator: any of `director`,
    /// `verifier`, `memory` (default: none, only the narrator).
    pub slots: Option<Vec<Slot>>,
}

/// Body of `PATCH /characters/{name}`: at least one field; `null` resets
/// `model`, `temperature` or `system_prompt` to the default.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateCharacter {
    pub name: Option<String>,
    pub description: Option<String>,
    pub persona: Option<String>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>, nullable)]
    pub model: Option<Option<String>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<f64>, nullable)]
    pub temperature: Option<Option<f64>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>, nullable)]
    pub system_prompt: Option<Option<String>>,
    /// Replaces the enabled slots; `null` or `[]` leaves only the narrator.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<Vec<Slot>>, nullable)]
    pub slots: Option<Option<Vec<Slot>>>,
}

/// A field that was present in the body, possibly as null.
fn present<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer).map(Some)
}

fn check_text(field: &str, value: &str) -> Result<(), ApiError> {
    if value.len() > MAX_TEXT_BYTES {
        return Err(ApiError::validation(format!(
            "{field} must be at most {MAX_TEXT_BYTES} bytes"
        )));
    }
    Ok(())
}

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_character, list_characters))
        .routes(routes!(get_character, update_character, delete_character))
}

/// Create a character; names are unique across the server.
#[utoipa::path(post, path = "/characters", tag = "characters", request_body = CreateCharacter,
    responses((status = 201, description = "the created character", body = Data<Character>),
        (status = 409, description = "character_conflict")))]
async fn create_character(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Json(body): Json<CreateCharacter>,
) -> ApiResult<(StatusCode, axum::Json<Data<Character>>)> {
    let name = CharacterName::parse(&body.name)?;
    check_text("description", &body.description)?;
    check_text("persona", &body.persona)?;
    let overrides = crate::domain::model_overrides::ModelOverrides {
        model: body.model,
        temperature: body.temperature,
        system_prompt: body.system_prompt,
        slots: body.slots.clone().unwrap_or_default(),
    };
    overrides.check()?;
    let store = &state.runtime.store;
    let mut character = store
        .create_character(&account.id, &name, &body.description, &body.persona)
        .await?;
    if overrides != Default::default() {
        let patch = CharacterPatch {
            model: Some(overrides.model),
            temperature: Some(overrides.temperature),
            system_prompt: Some(overrides.system_prompt),
            slots: body.slots,
            ..Default::default()
        };
        character = store
            .update_character(&account.id, &character.name, patch)
            .await?;
    }
    Ok((StatusCode::CREATED, axum::Json(Data { data: character })))
}

/// List the account's characters (sort_by `created_at` | `name`).
#[utoipa::path(get, path = "/characters", tag = "characters", params(ListParams),
    responses((status = 200, description = "a page of the account's characters", body = List<Character>)))]
async fn list_characters(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Query(params): Query<ListParams>,
) -> ApiResult<axum::Json<List<Character>>> {
    let page = params.page_request(&["created_at", "name"])?;
    let page = state
        .runtime
        .store
        .list_characters(&account.id, page)
        .await?;
    Ok(axum::Json(page.into()))
}

/// Get one of the account's characters by name.
#[utoipa::path(get, path = "/characters/{name}", tag = "characters",
    params(("name" = String, Path)),
    responses((status = 200, description = "the character", body = Data<Character>), (status = 404)))]
async fn get_character(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(name): Path<String>,
) -> ApiResult<axum::Json<Data<Character>>> {
    let character = state.runtime.store.character(&account.id, &name).await?;
    Ok(axum::Json(Data { data: character }))
}

/// Change a character's name, description or persona.
#[utoipa::path(patch, path = "/characters/{name}", tag = "characters", request_body = UpdateCharacter,
    params(("name" = String, Path)),
    responses((status = 200, description = "the changed character", body = Data<Character>), (status = 404),
        (status = 409, description = "character_conflict")))]
async fn update_character(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(name): Path<String>,
    Json(body): Json<UpdateCharacter>,
) -> ApiResult<axum::Json<Data<Character>>> {
    let overrides = crate::domain::model_overrides::ModelOverrides {
        model: body.model.clone().flatten(),
        temperature: body.temperature.flatten(),
        system_prompt: body.system_prompt.clone().flatten(),
        slots: Vec::new(),
    };
    overrides.check()?;
    let patch = CharacterPatch {
        name: body.name.as_deref().map(CharacterName::parse).transpose()?,
        description: body.description,
        persona: body.persona,
        model: body.model,
        temperature: body.temperature,
        system_prompt: body.system_prompt,
        slots: body.slots.map(Option::unwrap_or_default),
    };
    if patch.name.is_none()
        && patch.description.is_none()
        && patch.persona.is_none()
        && patch.model.is_none()
        && patch.temperature.is_none()
        && patch.system_prompt.is_none()
        && patch.slots.is_none()
    {
        return Err(ApiError::validation(
            "PATCH needs at least one of name, description, persona, model, temperature, system_prompt, slots",
        ));
    }
    if let Some(text) = &patch.description {
        check_text("description", text)?;
    }
    if let Some(text) = &patch.persona {
        check_text("persona", text)?;
    }
    let character = state
        .runtime
        .store
        .update_character(&account.id, &name, patch)
        .await?;
    Ok(axum::Json(Data { data: character }))
}

/// Delete a character together with its sessions.
#[utoipa::path(delete, path = "/characters/{name}", tag = "characters",
    params(("name" = String, Path)),
    responses((status = 200, description = "deleted with its sessions: `{\"data\": {id, name, deleted: true}}`"), (status = 404)))]
async fn delete_character(
    State(state): State<AppState>,
    CurrentAccount(account): CurrentAccount,
    Path(name): Path<String>,
) -> ApiResult<axum::Json<Data<serde_json::Value>>> {
    let character = state
        .runtime
        .store
        .delete_character(&account.id, &name)
        .await?;
    Ok(axum::Json(Data {
        data: serde_json::json!({ "id": character.id, "name": character.name, "deleted": true }),
    }))
}
