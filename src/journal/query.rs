//! Validated journal queries: the seed's filters, sorts and paging.

use serde::Deserialize;

use super::{CommitOutcome, ExecutionStatus, LegacyStatus, LifecycleState};
use crate::domain::PageRequest;
use crate::domain::tool::Slot;
use crate::error::{Error, Result};

/// Raw `GET /tool-executions` query parameters.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ExecutionQueryParams {
    pub session_id: Option<String>,
    pub floor_id: Option<String>,
    pub run_id: Option<String>,
    /// `narrator` | `director` | `verifier` | `memory`
    pub caller_slot: Option<String>,
    pub tool_name: Option<String>,
    /// `running` | `queued` | `success` | `error` | `denied` | `timeout` | `uncertain` | `blocked`
    pub status: Option<String>,
    /// `opened` | `finished`
    pub lifecycle_state: Option<String>,
    /// `pending` | `committed` | `discarded` | `replay_blocked` | `uncertain`
    pub commit_outcome: Option<String>,
    /// `builtin` | `preset` | `remote` | `mcp` | `unknown`
    pub provider_type: Option<String>,
    /// `created_at` | `started_at` (default) | `finished_at`
    pub sort_by: Option<String>,
    /// `asc` | `desc` (default)
    pub sort_order: Option<String>,
    pub limit: Option<i64>,
    pub offset: Option<i64>,
}

/// A validated journal query, always scoped to one account.
#[derive(Debug, Clone)]
pub struct ExecutionQuery {
    pub session_id: Option<String>,
    pub floor_id: Option<String>,
    pub run_id: Option<String>,
    pub caller_slot: Option<Slot>,
    pub tool_name: Option<String>,
    pub status: Option<ExecutionStatus>,
    pub lifecycle_state: Option<LifecycleState>,
    pub commit_outcome: Option<CommitOutcome>,
    pub provider_type: Option<String>,
    pub page: PageRequest,
}

const PROVIDER_TYPES: [&str; 5] = ["builtin", "preset", "remote", "mcp", "unknown"];

impl ExecutionQuery {
    pub fn parse(params: ExecutionQueryParams) -> Result<Self> {
        if params.session_id.is_none() && params.floor_id.is_none() && params.run_id.is_none() {
            return Err(Error::validation(
                "at least one of session_id, floor_id, run_id is required",
            ));
        }
        if let Some(provider_type) = &params.provider_type
            && !PROVIDER_TYPES.contains(&provider_type.as_str())
        {
            return Err(Error::validation(format!(
                "provider_type must be one of {}, got {provider_type:?}",
                PROVIDER_TYPES.join(", ")
            )));
        }
        Ok(Self {
            page: PageRequest::parse(
                params.limit,
                params.offset,
                params.sort_by.as_deref(),
                params.sort_order.as_deref(),
                &["started_at", "created_at", "finished_at"],
            )?,
            caller_slot: params.caller_slot.as_deref().map(Slot::parse).transpose()?,
            status: params
                .status
                .as_deref()
                .map(|s| ExecutionStatus::parse("status", s))
                .transpose()?,
            lifecycle_state: params
                .lifecycle_state
                .as_deref()
                .map(|s| LifecycleState::parse("lifecycle_state", s))
                .transpose()?,
            commit_outcome: params
                .commit_outcome
                .as_deref()
                .map(|s| CommitOutcome::parse("commit_outcome", s))
                .transpose()?,
            session_id: params.session_id,
            floor_id: params.floor_id,
            run_id: params.run_id,
            tool_name: params.tool_name,
            provider_type: params.provider_type,
        })
    }
}

/// Raw `GET /floors/{id}/tool-executions` query parameters (the floor is the path).
/// A separate struct rather than `#[serde(flatten)]`: flattening makes
/// serde_urlencoded hand every value over as a string, so `limit=5` would no
/// longer parse as a number; and `deny_unknown_fields` must refuse `session_id`
/// and `floor_id` here.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct FloorExecutionQueryParams {
    pub run_id: Option<String>,
    pub caller_slot: Option<String>,
    pub tool_name: Option<String>,
    pub status: Option<String>,
    pub lifecycle_state: Option<String>,
    pub commit_outcome: Option<String>,
    pub provider_type: Option<String>,
    pub sort_by: Option<String>,
    pub sort_order: Option<String>,
    pub limit: Option<i64>,
    pub offset: Option<i64>,
}

impl FloorExecutionQueryParams {
    pub fn with_floor(self, floor_id: String) -> ExecutionQueryParams {
        ExecutionQueryParams {
            session_id: None,
            floor_id: Some(floor_id),
            run_id: self.run_id,
            caller_slot: self.caller_slot,
            tool_name: self.tool_name,
            status: self.status,
            lifecycle_state: self.lifecycle_state,
            commit_outcome: self.commit_outcome,
            provider_type: self.provider_type,
            sort_by: self.sort_by,
            sort_order: self.sort_order,
            limit: self.limit,
            offset: self.offset,
        }
    }
}

/// Raw `GET /tools/call-records` query parameters.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct CallRecordQueryParams {
    pub page_id: Option<String>,
    pub floor_id: Option<String>,
    pub caller_slot: Option<String>,
    /// `success` | `error` | `denied` | `queued` | `running`
    pub status: Option<String>,
    /// `seq` (default) | `created_at`
    pub sort_by: Option<String>,
    pub sort_order: Option<String>,
    pub limit: Option<i64>,
    pub offset: Option<i64>,
}

/// A validated call-record query.
#[derive(Debug, Clone)]
pub struct CallRecordQuery {
    pub page_id: Option<String>,
    pub floor_id: Option<String>,
    pub caller_slot: Option<Slot>,
    pub status: Option<LegacyStatus>,
    pub page: PageRequest,
}

impl CallRecordQuery {
    pub fn parse(params: CallRecordQueryParams) -> Result<Self> {
        if params.page_id.is_none() && params.floor_id.is_none() {
            return Err(Error::validation("page_id or floor_id is required"));
        }
        Ok(Self {
            page: PageRequest::parse(
                params.limit,
                params.offset,
                params.sort_by.as_deref(),
                params.sort_order.as_deref(),
                &["seq", "created_at"],
            )?,
            caller_slot: params.caller_slot.as_deref().map(Slot::parse).transpose()?,
            status: params
                .status
                .as_deref()
                .map(|s| LegacyStatus::parse("status", s))
                .transpose()?,
            page_id: params.page_id,
            floor_id: params.floor_id,
        })
    }
}
