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
    /// `meta.next_cursor` of the previous page: the page after it, by keyset
    /// (same sort; not with `offset`).
    pub cursor: Option<String>,
}

/// `meta.total` counts matching rows exactly up to this many (or up to the
/// page's end, when that lies further); past it, `total` is a lower bound and
/// `meta.total_is_estimate` is true, so a page of a huge session never counts
/// every row. It was 10,000 until the count of a large session was found to
/// cost twice its 50-row page (BENCHMARKS.md, issue 20, sixth pass): a
/// thousand rows is more than a pager shows, and the total turns exact again
/// on the pages that reach the end.
pub const TOTAL_EXACT_UP_TO: i64 = 1_000;

/// Where a keyset page starts: after the row with this sort value and id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// The sort column's value (`finished_at` may be null).
    pub value: Option<i64>,
    pub id: String,
}

/// Longest cursor accepted.
const MAX_CURSOR_CHARS: usize = 200;

impl Cursor {
    /// The opaque text clients pass back: the sort it belongs to, then the
    /// last row's sort value and id.
    pub fn encode(&self, page: &PageRequest) -> String {
        let value = self.value.map_or_else(|| "n".to_owned(), |v| v.to_string());
        format!(
            "{}.{}.{value}.{}",
            page.sort_by,
            page.sort_order.as_str(),
            self.id
        )
    }

    /// Reads a cursor made by [`encode`](Self::encode) for the same sort.
    pub fn decode(raw: &str, page: &PageRequest) -> Result<Self> {
        let invalid = || {
            Error::validation(
                "cursor is not one this server made for this sort_by and sort_order; pass meta.next_cursor back unchanged",
            )
        };
        if raw.len() > MAX_CURSOR_CHARS {
            return Err(invalid());
        }
        let parts: Vec<&str> = raw.split('.').collect();
        let [sort_by, order, value, id] = parts.as_slice() else {
            return Err(invalid());
        };
        let id_ok = !id.is_empty()
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if *sort_by != page.sort_by || *order != page.sort_order.as_str() || !id_ok {
            return Err(invalid());
        }
        let value = match *value {
            "n" => None,
            number => Some(number.parse::<i64>().map_err(|_| invalid())?),
        };
        Ok(Self {
            value,
            id: (*id).to_owned(),
        })
    }
}

/// Refuses an id filter given empty: `?session_id=` names nothing, and
/// counting it as given would answer an empty page instead of saying so.
fn refuse_empty_ids<const N: usize>(ids: [(&str, &Option<String>); N]) -> Result<()> {
    match ids.iter().find(|(_, value)| value.as_deref() == Some("")) {
        Some((field, _)) => Err(Error::validation(format!(
            "{field} must not be empty; leave it out instead"
        ))),
        None => Ok(()),
    }
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
    pub cursor: Option<Cursor>,
}

const PROVIDER_TYPES: [&str; 5] = ["builtin", "preset", "remote", "mcp", "unknown"];

impl ExecutionQuery {
    pub fn parse(params: ExecutionQueryParams) -> Result<Self> {
        refuse_empty_ids([
            ("session_id", &params.session_id),
            ("floor_id", &params.floor_id),
            ("run_id", &params.run_id),
        ])?;
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
        let page = PageRequest::parse(
            params.limit,
            params.offset,
            params.sort_by.as_deref(),
            params.sort_order.as_deref(),
            &["started_at", "created_at", "finished_at"],
        )?;
        let cursor = match params.cursor.as_deref() {
            None => None,
            Some(_) if page.offset > 0 => {
                return Err(Error::validation("cursor and offset cannot be combined"));
            }
            Some(raw) => Some(Cursor::decode(raw, &page)?),
        };
        Ok(Self {
            page,
            cursor,
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
    /// `meta.next_cursor` of the previous page.
    pub cursor: Option<String>,
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
            cursor: self.cursor,
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
        refuse_empty_ids([("page_id", &params.page_id), ("floor_id", &params.floor_id)])?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn page(sort_by: &str, order: &str) -> PageRequest {
        PageRequest::parse(
            None,
            None,
            Some(sort_by),
            Some(order),
            &["started_at", "finished_at"],
        )
        .unwrap()
    }

    #[test]
    fn a_cursor_reads_back_only_for_its_own_sort() {
        let desc = page("started_at", "desc");
        for value in [Some(1_735_689_600_000), None] {
            let cursor = Cursor {
                value,
                id: "texec_01abc".into(),
            };
            let raw = cursor.encode(&desc);
            assert_eq!(Cursor::decode(&raw, &desc).unwrap(), cursor);
            assert!(Cursor::decode(&raw, &page("started_at", "asc")).is_err());
            assert!(Cursor::decode(&raw, &page("finished_at", "desc")).is_err());
        }
        for forged in [
            "",
            "started_at.desc.1",
            "started_at.desc.x.id",
            "started_at.desc.1.a b",
            "started_at.desc.1.a.b",
        ] {
            assert!(Cursor::decode(forged, &desc).is_err(), "{forged}");
        }
        assert!(Cursor::decode(&"a".repeat(300), &desc).is_err());
    }
}
