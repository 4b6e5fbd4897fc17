//! The execution journal: one row per decided tool call, written before the
//! provider runs and finished after. Call-records are a read-time projection of it.

pub mod query;
mod row_json;

#[cfg(test)]
pub(crate) use row_json::sample_row;

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::error::{Error, Result};
use crate::reason::ReasonCode;

/// Outcome status of an execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionStatus {
    Running,
    Queued,
    Success,
    Error,
    Denied,
    Timeout,
    Uncertain,
    Blocked,
    /// Held until an operator approves or rejects it (`approval_required`).
    AwaitingApproval,
}

/// Whether the row is still waiting for its outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LifecycleState {
    Opened,
    Finished,
}

/// What became of the execution's attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CommitOutcome {
    Pending,
    Committed,
    Discarded,
    ReplayBlocked,
    Uncertain,
}

/// The five statuses the legacy call-record projection keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LegacyStatus {
    Success,
    Error,
    Denied,
    Queued,
    Running,
}

macro_rules! string_enum {
    ($ty:ty { $($variant:ident => $text:literal),+ $(,)? }) => {
        impl $ty {
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $text),+ }
            }

            pub fn parse(field: &str, raw: &str) -> Result<Self> {
                match raw {
                    $($text => Ok(Self::$variant),)+
                    other => Err(Error::validation(format!(
                        "{field} must be one of {}, got {other:?}",
                        [$($text),+].join(", ")
                    ))),
                }
            }
        }
    };
}

string_enum!(ExecutionStatus {
    Running => "running", Queued => "queued", Success => "success", Error => "error",
    Denied => "denied", Timeout => "timeout", Uncertain => "uncertain", Blocked => "blocked",
    AwaitingApproval => "awaiting_approval",
});
string_enum!(LifecycleState { Opened => "opened", Finished => "finished" });
string_enum!(CommitOutcome {
    Pending => "pending", Committed => "committed", Discarded => "discarded",
    ReplayBlocked => "replay_blocked", Uncertain => "uncertain",
});
string_enum!(LegacyStatus {
    Success => "success", Error => "error", Denied => "denied", Queued => "queued", Running => "running",
});

impl ExecutionStatus {
    pub const ALL: [ExecutionStatus; 9] = [
        ExecutionStatus::Running,
        ExecutionStatus::Queued,
        ExecutionStatus::Success,
        ExecutionStatus::Error,
        ExecutionStatus::Denied,
        ExecutionStatus::Timeout,
        ExecutionStatus::Uncertain,
        ExecutionStatus::Blocked,
        ExecutionStatus::AwaitingApproval,
    ];

    /// Whether the provider was (or may have been) started: everything but a
    /// refusal. Such executions count as steps and as replay parents.
    pub fn provider_started(self) -> bool {
        !matches!(self, ExecutionStatus::Denied | ExecutionStatus::Blocked)
    }

    /// The seed's folding: timeout/uncertain become error, blocked merges into denied.
    pub fn legacy(self) -> LegacyStatus {
        match self {
            ExecutionStatus::Success => LegacyStatus::Success,
            ExecutionStatus::Error | ExecutionStatus::Timeout | ExecutionStatus::Uncertain => {
                LegacyStatus::Error
            }
            ExecutionStatus::Denied | ExecutionStatus::Blocked => LegacyStatus::Denied,
            ExecutionStatus::Queued | ExecutionStatus::AwaitingApproval => LegacyStatus::Queued,
            ExecutionStatus::Running => LegacyStatus::Running,
        }
    }
}

/// Arguments in a canonical form (object keys sorted, no whitespace) so that two
/// calls with the same arguments compare equal whatever the model's formatting.
pub fn canonical_json(value: &serde_json::Value) -> String {
    fn write(value: &serde_json::Value, out: &mut String) {
        match value {
            serde_json::Value::Object(map) => {
                // Sorted explicitly: the map's own order depends on serde_json features.
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                out.push('{');
                for (i, key) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&serde_json::Value::String(key.clone()).to_string());
                    out.push(':');
                    write(&map[key], out);
                }
                out.push('}');
            }
            serde_json::Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(item, out);
                }
                out.push(']');
            }
            scalar => out.push_str(&scalar.to_string()),
        }
    }
    let mut out = String::new();
    write(value, &mut out);
    out
}

/// JSON as the journal stored it, answered byte for byte: a page of rows is
/// not parsed into values and serialised again on its way out (issue 20).
#[derive(Debug, Clone)]
pub struct StoredJson(Box<RawValue>);

impl StoredJson {
    /// The stored text, or `null` when there is none (or it is not JSON,
    /// which a row written by the server never is).
    pub fn from_text(text: Option<String>) -> Self {
        let raw = text
            .and_then(|text| RawValue::from_string(text).ok())
            .unwrap_or_else(|| RawValue::from_string("null".to_owned()).expect("null is JSON"));
        Self(raw)
    }

    /// The stored JSON text.
    pub fn as_str(&self) -> &str {
        self.0.get()
    }

    /// The value, parsed (for pages that show it indented).
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::from_str(self.0.get()).unwrap_or(serde_json::Value::Null)
    }

    /// Stored JSON copied from a borrowed one.
    pub fn from_raw(raw: &RawValue) -> Self {
        Self(raw.to_owned())
    }

    /// The stored JSON, borrowed.
    pub fn as_raw(&self) -> &RawValue {
        &self.0
    }
}

/// Stored JSON text borrowed as it is, or `null` when there is none or it is
/// not JSON (the same rule as [`StoredJson::from_text`], without copying).
pub fn stored_json_ref<'a>(text: Option<&'a str>) -> &'a RawValue {
    text.and_then(|text| serde_json::from_str::<&'a RawValue>(text).ok())
        .unwrap_or_else(null_json)
}

fn null_json<'a>() -> &'a RawValue {
    serde_json::from_str("null").expect("null is JSON")
}

impl Serialize for StoredJson {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

/// One journal row as the API shows it.
#[derive(Debug, Clone, utoipa::ToSchema)]
pub struct ExecutionRecord {
    pub id: String,
    pub session_id: String,
    pub run_id: Option<String>,
    pub floor_id: Option<String>,
    pub page_id: Option<String>,
    pub call_id: String,
    pub caller_slot: String,
    pub provider_id: String,
    pub provider_type: String,
    pub tool_name: String,
    #[schema(value_type = Object)]
    pub args: StoredJson,
    #[schema(value_type = Object)]
    pub result: StoredJson,
    pub status: ExecutionStatus,
    pub lifecycle_state: LifecycleState,
    pub commit_outcome: CommitOutcome,
    pub side_effect_level: String,
    pub replay_safety: String,
    pub error_message: Option<String>,
    /// Why the call did not succeed (the `ReasonCode` table); null on success,
    /// while the row is open, and on rows written before the code was recorded.
    pub execution_reason_code: Option<ReasonCode>,
    pub duration_ms: i64,
    pub started_at: i64,
    pub finished_at: Option<i64>,
    pub delivery_mode: String,
    /// `deferred_receipt` for async-job calls (the model saw a receipt), else `immediate`.
    pub result_visibility: String,
    pub attempt_no: i64,
    pub runtime_job_id: Option<String>,
    pub replay_parent_execution_id: Option<String>,
    /// Whether the provider received the call: false for refusals and for calls
    /// that never reached it (refused connection, full sandbox, a switch that is
    /// off), which count as neither steps, replay parents nor budget.
    pub provider_started: bool,
    pub created_at: i64,
}

impl Serialize for ExecutionRecord {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.borrowed().serialize(serializer)
    }
}

impl ExecutionRecord {
    /// The row borrowed, in the form that writes its JSON.
    pub fn borrowed(&self) -> ExecutionRecordRef<'_> {
        ExecutionRecordRef {
            id: &self.id,
            session_id: &self.session_id,
            run_id: self.run_id.as_deref(),
            floor_id: self.floor_id.as_deref(),
            page_id: self.page_id.as_deref(),
            call_id: &self.call_id,
            caller_slot: &self.caller_slot,
            provider_id: &self.provider_id,
            provider_type: &self.provider_type,
            tool_name: &self.tool_name,
            args: self.args.as_raw(),
            result: self.result.as_raw(),
            status: self.status,
            lifecycle_state: self.lifecycle_state,
            commit_outcome: self.commit_outcome,
            side_effect_level: &self.side_effect_level,
            replay_safety: &self.replay_safety,
            error_message: self.error_message.as_deref(),
            execution_reason_code: self.execution_reason_code,
            duration_ms: self.duration_ms,
            started_at: self.started_at,
            finished_at: self.finished_at,
            delivery_mode: &self.delivery_mode,
            result_visibility: &self.result_visibility,
            attempt_no: self.attempt_no,
            runtime_job_id: self.runtime_job_id.as_deref(),
            replay_parent_execution_id: self.replay_parent_execution_id.as_deref(),
            provider_started: self.provider_started,
            created_at: self.created_at,
        }
    }
}

/// A journal row borrowing its text: its `Serialize` derive is the one place
/// a row's JSON shape is given. [`ExecutionRecord`] serialises through it,
/// and a page read from the database is written from it straight off the
/// statement, without an owned copy of each of the row's strings (issue 20),
/// by `row_json`, which writes the same bytes as the derive.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ExecutionRecordRef<'a> {
    pub id: &'a str,
    pub session_id: &'a str,
    pub run_id: Option<&'a str>,
    pub floor_id: Option<&'a str>,
    pub page_id: Option<&'a str>,
    pub call_id: &'a str,
    pub caller_slot: &'a str,
    pub provider_id: &'a str,
    pub provider_type: &'a str,
    pub tool_name: &'a str,
    pub args: &'a RawValue,
    pub result: &'a RawValue,
    pub status: ExecutionStatus,
    pub lifecycle_state: LifecycleState,
    pub commit_outcome: CommitOutcome,
    pub side_effect_level: &'a str,
    pub replay_safety: &'a str,
    pub error_message: Option<&'a str>,
    pub execution_reason_code: Option<ReasonCode>,
    pub duration_ms: i64,
    pub started_at: i64,
    pub finished_at: Option<i64>,
    pub delivery_mode: &'a str,
    pub result_visibility: &'a str,
    pub attempt_no: i64,
    pub runtime_job_id: Option<&'a str>,
    pub replay_parent_execution_id: Option<&'a str>,
    pub provider_started: bool,
    pub created_at: i64,
}

impl ExecutionRecordRef<'_> {
    /// The row with its text copied (the reverse of [`ExecutionRecord::borrowed`]).
    pub fn to_record(&self) -> ExecutionRecord {
        let owned = |text: Option<&str>| text.map(str::to_owned);
        ExecutionRecord {
            id: self.id.to_owned(),
            session_id: self.session_id.to_owned(),
            run_id: owned(self.run_id),
            floor_id: owned(self.floor_id),
            page_id: owned(self.page_id),
            call_id: self.call_id.to_owned(),
            caller_slot: self.caller_slot.to_owned(),
            provider_id: self.provider_id.to_owned(),
            provider_type: self.provider_type.to_owned(),
            tool_name: self.tool_name.to_owned(),
            args: StoredJson::from_raw(self.args),
            result: StoredJson::from_raw(self.result),
            status: self.status,
            lifecycle_state: self.lifecycle_state,
            commit_outcome: self.commit_outcome,
            side_effect_level: self.side_effect_level.to_owned(),
            replay_safety: self.replay_safety.to_owned(),
            error_message: owned(self.error_message),
            execution_reason_code: self.execution_reason_code,
            duration_ms: self.duration_ms,
            started_at: self.started_at,
            finished_at: self.finished_at,
            delivery_mode: self.delivery_mode.to_owned(),
            result_visibility: self.result_visibility.to_owned(),
            attempt_no: self.attempt_no,
            runtime_job_id: owned(self.runtime_job_id),
            replay_parent_execution_id: owned(self.replay_parent_execution_id),
            provider_started: self.provider_started,
            created_at: self.created_at,
        }
    }

    /// `deferred_receipt` for async-job calls (the model saw a receipt), else
    /// `immediate`.
    pub fn result_visibility_of(delivery_mode: &str) -> &'static str {
        if delivery_mode == "async_job" {
            "deferred_receipt"
        } else {
            "immediate"
        }
    }

    /// The row's value of a page's sort column ([`sort_column`]).
    pub fn sort_value(&self, sort_by: &str) -> Option<i64> {
        match sort_column(sort_by) {
            "created_at" => Some(self.created_at),
            "finished_at" => self.finished_at,
            _ => Some(self.started_at),
        }
    }
}

/// The column a page sorted by `sort_by` is in the order of: `created_at`,
/// `finished_at`, else `started_at`.
pub fn sort_column(sort_by: &str) -> &'static str {
    match sort_by {
        "created_at" => "created_at",
        "finished_at" => "finished_at",
        _ => "started_at",
    }
}

/// A journal row already written as JSON, with what its page's cursor needs:
/// a page answered by the API is written on the journal reader's thread, not
/// built as records and serialised again on an async worker (issue 20).
#[derive(Debug, Clone)]
pub struct ExecutionJson {
    /// Shared: the same text may be kept for later pages.
    json: Arc<str>,
    id: String,
    sort_value: Option<i64>,
}

impl ExecutionJson {
    /// `row` written as JSON, keeping its id and its value of `sort_by`.
    pub fn new(row: &ExecutionRecordRef<'_>, sort_by: &str) -> Self {
        let mut json = String::new();
        row_json::write_row(row, &mut json);
        Self {
            json: json.into(),
            id: row.id.to_owned(),
            sort_value: row.sort_value(sort_by),
        }
    }

    /// A row written as `json` before (by [`ExecutionJson::new`]), with its
    /// id and its value of the page's sort column.
    pub fn written(json: Arc<str>, id: String, sort_value: Option<i64>) -> Self {
        Self {
            json,
            id,
            sort_value,
        }
    }

    /// The row's JSON text, shared.
    pub fn shared(&self) -> &Arc<str> {
        &self.json
    }

    /// The row's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The row's value of its page's sort column.
    pub fn sort_value(&self) -> Option<i64> {
        self.sort_value
    }

    /// The row's JSON text (an object).
    pub fn as_str(&self) -> &str {
        &self.json
    }
}

/// One legacy call-record (the projection; none of the journal-only fields).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct CallRecord {
    pub id: String,
    pub page_id: Option<String>,
    pub seq: i64,
    pub caller_slot: String,
    pub tool_name: String,
    #[schema(value_type = Object)]
    pub args: StoredJson,
    #[schema(value_type = Object)]
    pub result: StoredJson,
    pub status: LegacyStatus,
    pub duration_ms: i64,
    pub created_at: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_folding_matches_the_seed() {
        use ExecutionStatus::*;
        let folded: Vec<_> = [
            Running, Queued, Success, Error, Denied, Timeout, Uncertain, Blocked,
        ]
        .into_iter()
        .map(|s| s.legacy().as_str())
        .collect();
        assert_eq!(
            folded,
            [
                "running", "queued", "success", "error", "denied", "error", "error", "denied"
            ]
        );
    }

    #[test]
    fn canonical_json_ignores_key_order_and_spacing() {
        let a: serde_json::Value =
            serde_json::from_str(r#"{"b": 1, "a": {"d": 2, "c": 3}}"#).unwrap();
        let b: serde_json::Value = serde_json::from_str(r#"{"a":{"c":3,"d":2},"b":1}"#).unwrap();
        assert_eq!(canonical_json(&a), canonical_json(&b));
    }

    #[test]
    fn parse_rejects_unknown_values() {
        assert!(ExecutionStatus::parse("status", "exploded").is_err());
        assert_eq!(
            CommitOutcome::parse("c", "replay_blocked").unwrap(),
            CommitOutcome::ReplayBlocked
        );
    }
}
