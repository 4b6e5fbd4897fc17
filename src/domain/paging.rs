//! Paging and sorting shared by every list endpoint.

use serde::Serialize;

use crate::error::{Error, Result};

/// Sort direction of a list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SortOrder {
    Asc,
    Desc,
}

impl SortOrder {
    pub fn parse(raw: Option<&str>) -> Result<Self> {
        match raw {
            None | Some("desc") => Ok(SortOrder::Desc),
            Some("asc") => Ok(SortOrder::Asc),
            Some(other) => Err(Error::validation(format!(
                "sort_order must be asc or desc, got {other:?}"
            ))),
        }
    }

    pub fn sql(self) -> &'static str {
        match self {
            SortOrder::Asc => "ASC",
            SortOrder::Desc => "DESC",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SortOrder::Asc => "asc",
            SortOrder::Desc => "desc",
        }
    }
}

/// A validated page request: `limit` 1..=200 (default 50), `offset` >= 0, a sort
/// column chosen from the list's own allowed set, and a direction.
#[derive(Debug, Clone)]
pub struct PageRequest {
    pub limit: i64,
    pub offset: i64,
    pub sort_by: &'static str,
    pub sort_order: SortOrder,
}

impl PageRequest {
    pub const DEFAULT_LIMIT: i64 = 50;
    pub const MAX_LIMIT: i64 = 200;

    /// Validates raw query values. `allowed_sorts` is the list's closed set of sort
    /// columns; the first one is the default.
    pub fn parse(
        limit: Option<i64>,
        offset: Option<i64>,
        sort_by: Option<&str>,
        sort_order: Option<&str>,
        allowed_sorts: &[&'static str],
    ) -> Result<Self> {
        let limit = limit.unwrap_or(Self::DEFAULT_LIMIT);
        if !(1..=Self::MAX_LIMIT).contains(&limit) {
            return Err(Error::validation(format!(
                "limit must be between 1 and {}, got {limit}",
                Self::MAX_LIMIT
            )));
        }
        let offset = offset.unwrap_or(0);
        if offset < 0 {
            return Err(Error::validation(format!(
                "offset must not be negative, got {offset}"
            )));
        }
        let sort_by = match sort_by {
            None => allowed_sorts[0],
            Some(raw) => allowed_sorts
                .iter()
                .copied()
                .find(|allowed| *allowed == raw)
                .ok_or_else(|| {
                    Error::validation(format!(
                        "sort_by must be one of {}, got {raw:?}",
                        allowed_sorts.join(", ")
                    ))
                })?,
        };
        Ok(Self {
            limit,
            offset,
            sort_by,
            sort_order: SortOrder::parse(sort_order)?,
        })
    }
}

/// One page of results plus the total count that matched.
#[derive(Debug, Clone)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub total: i64,
    pub request: PageRequest,
    /// For lists whose count stops at a bound (the journal's; see
    /// `journal::query::TOTAL_EXACT_UP_TO`): whether it stopped, so that
    /// `total` is a lower bound. None: `total` is always exact.
    pub total_is_estimate: Option<bool>,
    /// Where the next page starts, for lists that page by keyset (`cursor`).
    pub next_cursor: Option<String>,
    /// Whether rows follow this page, when the store knows it without `total`.
    pub more: Option<bool>,
}

impl<T> Page<T> {
    /// A page with an exact total.
    pub fn new(items: Vec<T>, total: i64, request: PageRequest) -> Self {
        Self {
            items,
            total,
            request,
            total_is_estimate: None,
            next_cursor: None,
            more: None,
        }
    }

    pub fn has_more(&self) -> bool {
        self.more
            .unwrap_or(self.request.offset + (self.items.len() as i64) < self.total)
    }

    pub fn map<U>(self, f: impl FnMut(T) -> U) -> Page<U> {
        Page {
            items: self.items.into_iter().map(f).collect(),
            total: self.total,
            request: self.request,
            total_is_estimate: self.total_is_estimate,
            next_cursor: self.next_cursor,
            more: self.more,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_bounds() {
        let req = PageRequest::parse(None, None, None, None, &["created_at", "name"]).unwrap();
        assert_eq!((req.limit, req.offset, req.sort_by), (50, 0, "created_at"));
        assert_eq!(req.sort_order, SortOrder::Desc);
        assert!(PageRequest::parse(Some(0), None, None, None, &["a"]).is_err());
        assert!(PageRequest::parse(Some(201), None, None, None, &["a"]).is_err());
        assert!(PageRequest::parse(None, Some(-1), None, None, &["a"]).is_err());
        assert!(PageRequest::parse(None, None, Some("x"), None, &["a"]).is_err());
        assert!(PageRequest::parse(None, None, None, Some("up"), &["a"]).is_err());
    }
}
