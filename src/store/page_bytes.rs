//! The byte bound of a page of any list whose rows can be large (journal
//! rows, call records, delivered results, floors, tool definitions,
//! characters): read a row at a time, a
//! page ends early once its rows pass [`MAX_PAGE_BYTES`], with `has_more`
//! true. A bound on the row count alone let one request of 200 rows with
//! 1 MB arguments take the server 531 MB.

use futures::{Stream, TryStreamExt};

use super::backend::Record;

/// Bytes of rows past which a page ends (it always holds its first row).
pub const MAX_PAGE_BYTES: usize = 8 * 1024 * 1024;

/// A size the statement computed (`octet_length` of the texts that make a
/// row large, which both backends know without reading the text).
pub(super) fn row_bytes(row: &impl Record, column: &'static str) -> usize {
    usize::try_from(row.get::<i64>(column)).unwrap_or(0)
}

/// The rows of `rows`, each made an item and its size by `item`, up to the
/// first that would take the page past [`MAX_PAGE_BYTES`] (the first row is
/// always taken); and whether one was left there. The rows after it are
/// never fetched.
pub(super) async fn take_within<R, T, E>(
    rows: impl Stream<Item = Result<R, E>>,
    mut item: impl FnMut(R) -> (T, usize),
) -> Result<(Vec<T>, bool), E> {
    let mut rows = std::pin::pin!(rows);
    let mut page = Page::default();
    while let Some(row) = rows.try_next().await? {
        if !page.take(item(row)) {
            return Ok((page.items, true));
        }
    }
    Ok((page.items, false))
}

/// [`take_within`] of rows read by a blocking statement (the journal
/// reader's).
pub(super) fn take_within_blocking<R, T, E>(
    rows: impl IntoIterator<Item = Result<R, E>>,
    mut item: impl FnMut(R) -> (T, usize),
) -> Result<(Vec<T>, bool), E> {
    let mut page = Page::default();
    for row in rows {
        if !page.take(item(row?)) {
            return Ok((page.items, true));
        }
    }
    Ok((page.items, false))
}

/// The items of a page being read, and the bytes they take.
struct Page<T> {
    items: Vec<T>,
    bytes: usize,
}

impl<T> Default for Page<T> {
    fn default() -> Self {
        Self {
            items: Vec::new(),
            bytes: 0,
        }
    }
}

impl<T> Page<T> {
    /// Takes an item of `bytes` unless it would pass the bound of a page
    /// that already holds one; whether it took it.
    fn take(&mut self, (item, bytes): (T, usize)) -> bool {
        self.bytes = self.bytes.saturating_add(bytes);
        if self.bytes > MAX_PAGE_BYTES && !self.items.is_empty() {
            return false;
        }
        self.items.push(item);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(rows: &[usize]) -> (Vec<usize>, bool) {
        let stream = futures::stream::iter(rows.iter().map(|&n| Ok::<_, ()>(n)));
        let streamed = futures::executor::block_on(take_within(stream, |n| (n, n))).unwrap();
        let blocking = take_within_blocking(rows.iter().map(|&n| Ok::<_, ()>(n)), |n| (n, n));
        assert_eq!(blocking.unwrap(), streamed);
        streamed
    }

    #[test]
    fn a_page_ends_before_the_row_that_would_pass_the_bound() {
        let half = MAX_PAGE_BYTES / 2;
        assert_eq!(sizes(&[half, half, 1, 1]), (vec![half, half], true));
        assert_eq!(sizes(&[half, half]), (vec![half, half], false));
        assert_eq!(sizes(&[1, 2, 3]), (vec![1, 2, 3], false));
        // The first row is taken whatever its size.
        assert_eq!(
            sizes(&[MAX_PAGE_BYTES * 2, 1]),
            (vec![MAX_PAGE_BYTES * 2], true)
        );
        assert_eq!(sizes(&[]), (vec![], false));
    }
}
