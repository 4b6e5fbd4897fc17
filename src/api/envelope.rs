//! Response envelopes shared by every route: `{"data": ...}` and lists with `meta`.

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::error::ApiError;
use crate::domain::Page;
use crate::error::Error;
use crate::journal::ExecutionJson;

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

/// A list of journal rows already written as JSON: the body is their text
/// joined into the list's envelope, without parsing or escaping them again
/// (issue 20). Its JSON is the same as a `List` of the rows' records.
#[derive(Debug)]
pub struct WrittenList(pub List<ExecutionJson>);

impl From<Page<ExecutionJson>> for WrittenList {
    fn from(page: Page<ExecutionJson>) -> Self {
        Self(page.into())
    }
}

impl WrittenList {
    fn body(&self) -> serde_json::Result<Vec<u8>> {
        let List { data, meta } = &self.0;
        let rows_len: usize = data.iter().map(|row| row.as_str().len() + 1).sum();
        let mut body = Vec::with_capacity(rows_len + 256);
        body.extend_from_slice(b"{\"data\":[");
        for (index, row) in data.iter().enumerate() {
            if index > 0 {
                body.push(b',');
            }
            body.extend_from_slice(row.as_str().as_bytes());
        }
        body.extend_from_slice(b"],\"meta\":");
        serde_json::to_writer(&mut body, meta)?;
        body.push(b'}');
        Ok(body)
    }
}

impl IntoResponse for WrittenList {
    fn into_response(self) -> Response {
        match self.body() {
            Ok(body) => (
                [(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                )],
                body,
            )
                .into_response(),
            Err(err) => ApiError::from(Error::Internal(
                anyhow::Error::new(err).context("writing a journal page"),
            ))
            .into_response(),
        }
    }
}

/// `limit`, `offset`, `sort_by`, `sort_order` as they arrive in a query string.
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
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
        self.parse(allowed_sorts, self.sort_order.as_deref())
    }

    /// [`ListParams::page_request`] of a list that reads as a conversation
    /// (a session's floors, its delivered results): oldest first unless
    /// `sort_order=desc`.
    pub fn oldest_first(
        &self,
        allowed_sorts: &[&'static str],
    ) -> crate::error::Result<crate::domain::PageRequest> {
        self.parse(
            allowed_sorts,
            Some(self.sort_order.as_deref().unwrap_or("asc")),
        )
    }

    fn parse(
        &self,
        allowed_sorts: &[&'static str],
        sort_order: Option<&str>,
    ) -> crate::error::Result<crate::domain::PageRequest> {
        crate::domain::PageRequest::parse(
            self.limit,
            self.offset,
            self.sort_by.as_deref(),
            sort_order,
            allowed_sorts,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{ExecutionRecord, sample_row};

    fn meta(total: i64) -> ListMeta {
        ListMeta {
            total,
            limit: 50,
            offset: 0,
            has_more: true,
            sort_by: "started_at".to_owned(),
            sort_order: "desc".to_owned(),
            total_is_estimate: Some(false),
            next_cursor: Some("c\"ursor".to_owned()),
        }
    }

    #[test]
    fn a_written_list_is_the_list_of_its_records() {
        let args: &serde_json::value::RawValue =
            serde_json::from_str(r#"{"q": "a\"b"}"#).expect("JSON");
        for texts in [vec![], vec!["one"], vec!["one", "t\"wo", "three\n"]] {
            let records: Vec<ExecutionRecord> = texts
                .iter()
                .map(|text| sample_row(text, args).to_record())
                .collect();
            let rows = records
                .iter()
                .map(|record| ExecutionJson::new(&record.borrowed(), "started_at"))
                .collect();
            let written = WrittenList(List {
                data: rows,
                meta: meta(7),
            })
            .body()
            .expect("a page is written");
            let expected = serde_json::to_vec(&List {
                data: records,
                meta: meta(7),
            })
            .expect("a list serialises");
            assert_eq!(
                String::from_utf8(written).expect("UTF-8"),
                String::from_utf8(expected).expect("UTF-8")
            );
        }
    }
}
