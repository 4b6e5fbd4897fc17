//! Characters: personas with server-wide unique names, owned by one account.

use serde::Serialize;
use std::sync::Arc;

use sqlx::AssertSqlSafe;

use super::Store;
use super::backend::{Record, sql};
use super::page_bytes::{row_bytes, take_within};
use crate::domain::{CharacterName, Page, PageRequest};
use crate::error::{Error, Result};
use crate::ids::{new_id, now_ms};

/// A persona the user chats with (a "role" in `/api/tools`).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Character {
    pub id: String,
    #[serde(skip)]
    pub account_id: String,
    pub name: String,
    pub description: String,
    pub persona: String,
    /// The generation loop's settings for this character.
    #[serde(flatten)]
    pub overrides: crate::domain::model_overrides::ModelOverrides,
    pub created_at: i64,
    pub updated_at: i64,
}

/// A character as a role of `/api/tools`: what the registry and the
/// metrics need of every character, without its texts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CharacterRole {
    pub id: String,
    pub account_id: String,
    pub name: String,
}

/// Fields a PATCH may change; `None` leaves a field as it is.
#[derive(Debug, Default, Clone)]
pub struct CharacterPatch {
    pub name: Option<CharacterName>,
    pub description: Option<String>,
    pub persona: Option<String>,
    /// `Some(None)` resets a value to the default.
    pub model: Option<Option<String>>,
    pub temperature: Option<Option<f64>>,
    pub system_prompt: Option<Option<String>>,
    /// The optional slots to enable (replacing the current set).
    pub slots: Option<Vec<crate::domain::tool::Slot>>,
}

const COLUMNS: &str = "id, account_id, name, description, persona, model, temperature, system_prompt, slots, created_at, updated_at";

/// The stored slot list (a JSON array of names); unreadable text counts as none.
fn slots_from_column(raw: Option<String>) -> Vec<crate::domain::tool::Slot> {
    let slots: Vec<crate::domain::tool::Slot> = raw
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_default();
    crate::domain::model_overrides::normalize_slots(&slots)
}

fn from_row(row: &impl Record) -> Character {
    Character {
        id: row.get("id"),
        account_id: row.get("account_id"),
        name: row.get("name"),
        description: row.get("description"),
        persona: row.get("persona"),
        overrides: crate::domain::model_overrides::ModelOverrides {
            model: row.get("model"),
            temperature: row.get("temperature"),
            system_prompt: row.get("system_prompt"),
            slots: slots_from_column(row.get("slots")),
        },
        created_at: row.get("created_at"),
        updated_at: row.get("updated_at"),
    }
}

fn name_conflict(name: &str) -> Error {
    Error::Refused {
        code: crate::error::ErrorCode::CharacterConflict,
        message: format!("a character named {name:?} already exists"),
    }
}

/// Most characters one account holds: each is a role of `/api/tools`, and
/// its description and persona may be 64 KiB each.
pub const MAX_CHARACTERS_PER_ACCOUNT: i64 = 1000;

impl Store {
    /// Stores a new character of the account; refused past
    /// [`MAX_CHARACTERS_PER_ACCOUNT`] and for a name any account uses.
    pub async fn create_character(
        &self,
        account_id: &str,
        name: &CharacterName,
        description: &str,
        persona: &str,
    ) -> Result<Character> {
        let now = now_ms();
        let character = Character {
            id: new_id("char"),
            account_id: account_id.to_owned(),
            name: name.as_str().to_owned(),
            description: description.to_owned(),
            persona: persona.to_owned(),
            overrides: Default::default(),
            created_at: now,
            updated_at: now,
        };
        // Counted and inserted by one statement under the write lock: two
        // creates at the cap cannot both pass it.
        let mut tx = self.begin_write().await?;
        let result = sql!(tx, c => query(
            "INSERT INTO characters (id, account_id, name, description, persona, created_at, updated_at) \
             SELECT ?, ?, ?, ?, ?, ?, ? WHERE (SELECT COUNT(*) FROM characters WHERE account_id = ?) < ?",
        )
        .bind(&character.id)
        .bind(&character.account_id)
        .bind(&character.name)
        .bind(&character.description)
        .bind(&character.persona)
        .bind(now)
        .bind(now)
        .bind(&character.account_id)
        .bind(MAX_CHARACTERS_PER_ACCOUNT)
        .execute(c)
        .await
        .map(|done| done.rows_affected()));
        let result = match result {
            Ok(inserted) => tx.commit().await.map(|()| inserted),
            Err(err) => Err(err),
        };
        self.characters_changed().await;
        match result {
            Ok(0) => Err(Error::refused(
                crate::error::ErrorCode::LimitExceeded,
                format!(
                    "the account holds {MAX_CHARACTERS_PER_ACCOUNT} characters, the most it may (MAX_CHARACTERS_PER_ACCOUNT); delete some first"
                ),
            )),
            Ok(_) => Ok(character),
            Err(err) if super::is_unique_violation(&err) => Err(name_conflict(name.as_str())),
            Err(err) => Err(err.into()),
        }
    }

    /// The account's character of that name; another account's is "not found".
    pub async fn character(&self, account_id: &str, name: &str) -> Result<Character> {
        self.character_where(account_id, "name", name)
            .await?
            .ok_or_else(|| Error::not_found(format!("character {name:?}")))
    }

    /// The account's character whose `column` (a key: name or id) is `value`.
    async fn character_where(
        &self,
        account_id: &str,
        column: &'static str,
        value: &str,
    ) -> Result<Option<Character>> {
        let sql = format!("SELECT {COLUMNS} FROM characters WHERE {column} = ? AND account_id = ?");
        Ok(sql!(self.conn().await?, c => query(AssertSqlSafe(sql))
            .bind(value)
            .bind(account_id)
            .fetch_optional(c)
            .await?
            .as_ref()
            .map(from_row)))
    }

    /// A character by name regardless of owner: for the loopback-only
    /// `/api/tools`. Read from the cached list of every character's role.
    pub async fn character_any_account(&self, name: &str) -> Result<Option<CharacterRole>> {
        Ok(self
            .all_characters()
            .await?
            .iter()
            .find(|character| character.name == name)
            .cloned())
    }

    /// The account's character with that id, if it has one.
    pub async fn character_by_id(&self, account_id: &str, id: &str) -> Result<Option<Character>> {
        self.character_where(account_id, "id", id).await
    }

    /// Every character of every account, by name, as roles (id, owner and
    /// name only): the roles of `/api/tools`. Cached: every write of a
    /// character invalidates before it answers, so a read that starts after
    /// a character was created sees it. Descriptions and personas are left
    /// out: with them, each load of 1,500 characters took +932 MB (probe I).
    pub async fn all_characters(&self) -> Result<Arc<Vec<CharacterRole>>> {
        const KEY: &str = "all";
        if let Some(all) = self.character_cache.get(KEY) {
            return Ok(all);
        }
        let generation = self.character_cache.generation();
        let all = sql!(self.conn().await?, c => query(
            "SELECT id, account_id, name FROM characters ORDER BY name",
        )
        .fetch_all(c)
        .await?
        .iter()
        .map(|row| CharacterRole {
            id: row.get("id"),
            account_id: row.get("account_id"),
            name: row.get("name"),
        })
        .collect::<Vec<_>>());
        let all: Arc<Vec<CharacterRole>> = Arc::new(all);
        self.character_cache.put(KEY, generation, all.clone());
        Ok(all)
    }

    pub async fn list_characters(
        &self,
        account_id: &str,
        page: PageRequest,
    ) -> Result<Page<Character>> {
        let total = sql!(self.conn().await?, c => query_scalar::<i64>(
            "SELECT COUNT(*) FROM characters WHERE account_id = ?",
        )
        .bind(account_id)
        .fetch_one(c)
        .await?);
        // sort_by comes from a closed list validated by PageRequest, never from input.
        // A character's size is its texts': the page ends early past
        // `MAX_PAGE_BYTES`, `has_more` true.
        let sql = format!(
            "SELECT {COLUMNS}, CAST(COALESCE(octet_length(description), 0) \
             + COALESCE(octet_length(persona), 0) + COALESCE(octet_length(system_prompt), 0) \
             AS BIGINT) AS character_bytes \
             FROM characters WHERE account_id = ? ORDER BY {} {}, id {} LIMIT ? OFFSET ?",
            page.sort_by,
            page.sort_order.sql(),
            page.sort_order.sql()
        );
        let (characters, _) = sql!(self.conn().await?, c => take_within(
            query(AssertSqlSafe(sql))
                .bind(account_id)
                .bind(page.limit)
                .bind(page.offset)
                .fetch(c),
            |row| (from_row(&row), row_bytes(&row, "character_bytes")),
        )
        .await?);
        Ok(Page::new(characters, total, page))
    }

    pub async fn update_character(
        &self,
        account_id: &str,
        name: &str,
        patch: CharacterPatch,
    ) -> Result<Character> {
        // Read, merge and write in one write transaction: two PATCHes of
        // different fields never lose each other's change.
        let mut tx = self.begin_write().await?;
        let sql = format!("SELECT {COLUMNS} FROM characters WHERE name = ? AND account_id = ?");
        let mut character = sql!(tx, c => query(AssertSqlSafe(sql))
            .bind(name)
            .bind(account_id)
            .fetch_optional(c)
            .await?
            .as_ref()
            .map(from_row))
        .ok_or_else(|| Error::not_found(format!("character {name:?}")))?;
        if let Some(new_name) = patch.name {
            character.name = new_name.as_str().to_owned();
        }
        if let Some(description) = patch.description {
            character.description = description;
        }
        if let Some(persona) = patch.persona {
            character.persona = persona;
        }
        let overrides = &mut character.overrides;
        if let Some(model) = patch.model {
            overrides.model = model;
        }
        if let Some(temperature) = patch.temperature {
            overrides.temperature = temperature;
        }
        if let Some(system_prompt) = patch.system_prompt {
            overrides.system_prompt = system_prompt;
        }
        if let Some(slots) = patch.slots {
            overrides.slots = crate::domain::model_overrides::normalize_slots(&slots);
        }
        let slots = (!overrides.slots.is_empty())
            .then(|| serde_json::to_string(&overrides.slots).unwrap_or_else(|_| "[]".into()));
        character.updated_at = now_ms();
        let result = sql!(tx, c => query(
            "UPDATE characters SET name = ?, description = ?, persona = ?, model = ?, temperature = ?, system_prompt = ?, slots = ?, updated_at = ? WHERE id = ?",
        )
        .bind(&character.name)
        .bind(&character.description)
        .bind(&character.persona)
        .bind(&character.overrides.model)
        .bind(character.overrides.temperature)
        .bind(&character.overrides.system_prompt)
        .bind(slots)
        .bind(character.updated_at)
        .bind(&character.id)
        .execute(c)
        .await
        .map(|_| ()));
        let result = match result {
            Ok(()) => tx.commit().await,
            Err(err) => Err(err),
        };
        self.sessions_changed().await;
        self.characters_changed().await;
        match result {
            Ok(_) => Ok(character),
            Err(err) if super::is_unique_violation(&err) => Err(name_conflict(&character.name)),
            Err(err) => Err(err.into()),
        }
    }

    /// Deletes the character with its sessions (and everything under them).
    pub async fn delete_character(&self, account_id: &str, name: &str) -> Result<Character> {
        let character = self.character(account_id, name).await?;
        let deleted = sql!(self.conn().await?, c => query("DELETE FROM characters WHERE id = ?")
            .bind(&character.id)
            .execute(c)
            .await
            .map(|done| done.rows_affected()));
        self.sessions_changed().await;
        self.characters_changed().await;
        // Of two deletes that both read the row, only the one that removed
        // it answers that it did.
        if deleted? == 0 {
            return Err(Error::not_found(format!("character {name:?}")));
        }
        Ok(character)
    }
}
