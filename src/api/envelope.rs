//! Response envelopes shared by every route: `{"data": ...}` and lists with `meta`.

use serde::Serialize;

use crate::domain::Page;

/// A single resource: `{"data": ...}`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Data<T> {
    pub data: T,
}

/// Paging facts of a list response.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ListMeta {
    /// Matching rows; on journal lists exact up to 1,000 (or the page's end),
    /// past that a lower bound with `total_is_estimate` true.
    pub total: i64,
    pub limit: i64,
    pub offset: i64,
    pub has_more: bool,
    pub sort_by: String,
    pub sort_order: String,
    /// On journal lists: true when `total` is a lower bound (counting stopped
    /// at its bound). Absent on lists whose `total` is always exact.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_is_estimate: Option<bool>,
    /// On journal lists with `has_more`: pass as `cursor` (same sort, no
    /// `offset`) for the next page by keyset, which costs the same at any depth.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// A list: `{"data": [...], "meta": {...}}`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct List<T> {
    pub data: Vec<T>,
    pub meta: ListMeta,
}

impl<T> From<Page<T>> for List<T> {
    fn from(page: Page<T>) -> Self {
        let has_more = page.has_more();
        Self {
            meta: ListMeta {
                total: page.total,
                limit: page.request.limit,
                offset: page.request.offset,
                has_more,
                sort_by: page.request.sort_by.to_owned(),
                sort_order: page.request.sort_order.as_str().to_owned(),
                total_is_estimate: page.total_is_estimate,
                next_cursor: page.next_cursor,
            },
            data: page.items,
        }
    }
}

/// `limit`, `offset`, `sort_by`, `sort_order` as they arrive in a query string.
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    /// Page size, 1-200 (default 50).
    pub limit: Option<i64>,
    /// Rows to skip (default 0).
    pub offset: Option<i64>,
    pub sort_by: Option<String>,
    /// `asc` or `desc` (default `desc`).
    pub sort_order: Option<String>,
}

impl ListParams {
    pub fn page_request(
        &self,
        allowed_sorts: &[&'static str],
    ) -> crate::error::Result<crate::domain::PageRequest> {
        crate::domain::PageRequest::parse(
            self.limit,
            self.offset,
            self.sort_by.as_deref(),
            self.sort_order.as_deref(),
            allowed_sorts,
        )
    }
}
