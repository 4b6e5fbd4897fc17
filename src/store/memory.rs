//! Session memory: stored memories, and full-text search (SQLite FTS5, bm25;
//! PostgreSQL a `tsvector` column, ts_rank) over a session's floors, active reply
//! pages and memories. The index is kept in sync by triggers (migration 0002), so
//! every write path is covered.

use serde::Serialize;
use sqlx::AssertSqlSafe;

use super::Store;
use super::backend::{Backend, Record, sql};
use crate::error::{Error, Result};
use crate::ids::{new_id, now_ms};

/// Largest memory, in bytes.
pub const MAX_MEMORY_BYTES: usize = 16 * 1024;
/// Most memories one session may hold.
pub const MAX_MEMORIES_PER_SESSION: i64 = 1000;
/// Most words of a search query that are used.
pub const MAX_QUERY_TERMS: usize = 32;
/// Longest text returned per search hit, in characters.
const MAX_HIT_CHARS: usize = 1000;

/// A remembered fact about a session.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Memory {
    pub id: String,
    pub session_id: String,
    pub content: String,
    pub created_at: i64,
}

/// One search result, best first.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryHit {
    /// `floor` (a user message), `page` (an active reply) or `memory`.
    pub source: String,
    /// Id of the floor, page or memory.
    pub id: String,
    pub floor_id: Option<String>,
    /// Sequence number of the floor, when the hit belongs to one.
    pub floor_seq: Option<i64>,
    /// The text, cut to a bounded length.
    pub content: String,
    /// The matching passage with matched words in [brackets].
    pub snippet: String,
    /// Relevance: higher is better (the negated bm25 rank; on PostgreSQL, ts_rank).
    pub score: f64,
}

/// The distinct words of `text`, lowercased, in order, at most
/// [`MAX_QUERY_TERMS`]: a word is a run of alphanumeric characters.
fn query_words(text: &str) -> Vec<String> {
    let mut words: Vec<String> = Vec::new();
    for word in text.split(|c: char| !c.is_alphanumeric()) {
        if word.is_empty() {
            continue;
        }
        let word = word.to_lowercase();
        if !words.contains(&word) {
            words.push(word);
        }
        if words.len() == MAX_QUERY_TERMS {
            break;
        }
    }
    words
}

/// Turns free text into an FTS5 query: every word quoted (so FTS5 operators in
/// the input are plain words) and joined by OR, so bm25 ranks texts matching more
/// and rarer words higher. `None` when the text has no word.
pub fn fts_query(text: &str) -> Option<String> {
    let terms: Vec<String> = query_words(text)
        .iter()
        .map(|word| format!("\"{word}\""))
        .collect();
    (!terms.is_empty()).then(|| terms.join(" OR "))
}

/// The same words as [`fts_query`], as the text of a PostgreSQL tsquery for
/// `to_tsquery('english', ...)`: every word a quoted lexeme, joined by `|` (OR),
/// so ts_rank ranks texts matching more of them higher. Words are alphanumeric,
/// so they hold no tsquery syntax; the quoting (quotes and backslashes doubled)
/// keeps it so should the word rule ever change. `None` when the text has no word.
pub fn tsquery(text: &str) -> Option<String> {
    let terms: Vec<String> = query_words(text)
        .iter()
        .map(|word| format!("'{}'", word.replace('\\', "\\\\").replace('\'', "''")))
        .collect();
    (!terms.is_empty()).then(|| terms.join(" | "))
}

/// The search of `search_session_text` on SQLite: FTS5's bm25 ranks every
/// match of the session in `ranked`, and only the rows kept by the limit are
/// read whole and marked. FTS5's own `snippet()` is not used: it scores a
/// window at every match against every other match of the text, so one long
/// text repeating a searched word cost minutes of CPU (probe I: 33 s for a
/// 256 KiB floor of "the the …"), and run before the limit it did so for
/// every match. `highlight()` is linear; [`snippet_of`] cuts the passage.
/// Binds the FTS5 query, the session and the limit (numbered: the query is
/// used twice).
const SQLITE_SEARCH: &str = "WITH ranked AS ( \
        SELECT t.id AS text_id, bm25(session_texts_fts) AS rank \
        FROM session_texts_fts \
        JOIN session_texts t ON t.id = session_texts_fts.rowid \
        WHERE session_texts_fts MATCH ?1 AND t.session_id = ?2 \
          AND (t.source <> 'page' OR t.ref_id IN \
               (SELECT active_page_id FROM floors WHERE session_id = ?2 AND active_page_id IS NOT NULL)) \
        ORDER BY rank, t.id DESC LIMIT ?3) \
    SELECT t.source, t.ref_id, t.floor_id, f.seq AS floor_seq, \
        substr(t.content, 1, 1001) AS content, \
        highlight(session_texts_fts, 0, char(57344), char(57345)) AS marked, r.rank \
    FROM ranked r \
    JOIN session_texts_fts ON session_texts_fts.rowid = r.text_id AND session_texts_fts MATCH ?1 \
    JOIN session_texts t ON t.id = r.text_id \
    LEFT JOIN floors f ON f.id = t.floor_id \
    ORDER BY r.rank, t.id DESC";

/// Where `highlight()` (in [`SQLITE_SEARCH`]) opens and closes a match:
/// characters of Unicode's private use area, which texts do not carry.
const MARK_OPEN: char = '\u{E000}';
const MARK_CLOSE: char = '\u{E001}';
/// Characters of a snippet before its first match, and in all.
const SNIPPET_LEAD_CHARS: usize = 60;
const SNIPPET_CHARS: usize = 200;

/// The passage of a `highlight()`ed text around its first match, with matches
/// in [brackets] and `…` where the text goes on, cut at spaces where it has
/// them: what FTS5's `snippet()` gave, in time linear in the text.
fn snippet_of(marked: &str) -> String {
    let chars: Vec<char> = marked.chars().collect();
    let first = chars.iter().position(|&c| c == MARK_OPEN).unwrap_or(0);
    let mut start = first.saturating_sub(SNIPPET_LEAD_CHARS);
    if start > 0
        && !chars[start - 1].is_whitespace()
        && let Some(space) = chars[start..first].iter().position(|c| c.is_whitespace())
    {
        start += space + 1;
    }
    let mut end = (start + SNIPPET_CHARS).min(chars.len());
    if end < chars.len()
        && let Some(space) = chars[first..end].iter().rposition(|c| c.is_whitespace())
    {
        end = first + space;
    }
    let mut snippet = String::new();
    if start > 0 {
        snippet.push('…');
    }
    let mut open = false;
    for &c in &chars[start..end] {
        match c {
            MARK_OPEN => {
                open = true;
                snippet.push('[');
            }
            MARK_CLOSE => {
                open = false;
                snippet.push(']');
            }
            c => snippet.push(c),
        }
    }
    if open {
        snippet.push(']');
    }
    if end < chars.len() {
        snippet.push('…');
    }
    snippet
}

/// The same search on PostgreSQL, over `session_texts.content_tsv` (there is no
/// FTS5 table): ts_rank negated, so that, like bm25, lower ranks first.
/// `'english'` is the configuration `content_tsv` is made with
/// (migrations/postgres/0015_schema.sql, stemming like the FTS5 index's porter
/// tokenizer): the query and the headline must use the same one, or a stemmed
/// word never matches. Binds the tsquery text, the session twice and the limit.
const POSTGRES_SEARCH: &str = "SELECT t.source, t.ref_id, t.floor_id, f.seq AS floor_seq, t.content, \
        ts_headline('english', t.content, q.query, \
            'StartSel=[, StopSel=], MaxWords=24, MinWords=5, HighlightAll=false') AS snippet, \
        CAST(-ts_rank(t.content_tsv, q.query) AS DOUBLE PRECISION) AS rank \
    FROM session_texts t \
    CROSS JOIN (SELECT to_tsquery('english', ?) AS query) AS q \
    LEFT JOIN floors f ON f.id = t.floor_id \
    WHERE t.content_tsv @@ q.query AND t.session_id = ? \
      AND (t.source <> 'page' OR t.ref_id IN \
           (SELECT active_page_id FROM floors WHERE session_id = ? AND active_page_id IS NOT NULL)) \
    ORDER BY rank, t.id DESC LIMIT ?";

fn truncate_chars(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

impl Store {
    /// Stores a memory for the account's session.
    pub async fn add_memory(
        &self,
        account_id: &str,
        session_id: &str,
        content: &str,
    ) -> Result<Memory> {
        if content.trim().is_empty() || content.len() > MAX_MEMORY_BYTES {
            return Err(Error::validation(format!(
                "memory content must be 1-{MAX_MEMORY_BYTES} bytes and not blank"
            )));
        }
        let session = self.session(account_id, session_id).await?;
        let memory = Memory {
            id: new_id("mem"),
            session_id: session.id,
            content: content.to_owned(),
            created_at: now_ms(),
        };
        // Checked and written under the write lock, so concurrent adds cannot
        // overshoot the limit (PostgreSQL would run two counts side by side).
        let mut tx = self.begin_write().await?;
        let written = sql!(tx, c => query(
            "INSERT INTO session_memories (id, session_id, content, created_at) SELECT ?, ?, ?, ? \
             WHERE (SELECT COUNT(*) FROM session_memories WHERE session_id = ?) < ?",
        )
        .bind(&memory.id)
        .bind(&memory.session_id)
        .bind(&memory.content)
        .bind(memory.created_at)
        .bind(&memory.session_id)
        .bind(MAX_MEMORIES_PER_SESSION)
        .execute(c)
        .await?
        .rows_affected());
        tx.commit().await?;
        if written == 0 {
            return Err(Error::validation(format!(
                "the session already holds the maximum of {MAX_MEMORIES_PER_SESSION} memories"
            )));
        }
        Ok(memory)
    }

    /// A page of the account's session's memories (`range`), and how many it has.
    pub async fn list_memories(
        &self,
        account_id: &str,
        session_id: &str,
        range: &crate::domain::PageRequest,
    ) -> Result<(Vec<Memory>, i64)> {
        let session = self.session(account_id, session_id).await?;
        let order = range.sort_order.sql();
        let sql = format!(
            "SELECT id, session_id, content, created_at FROM session_memories \
             WHERE session_id = ? ORDER BY created_at {order}, id {order} LIMIT ? OFFSET ?"
        );
        let mut conn = self.conn().await?;
        let memories = sql!(conn, c => query(AssertSqlSafe(sql))
            .bind(&session.id)
            .bind(range.limit)
            .bind(range.offset)
            .fetch_all(c)
            .await?
            .iter()
            .map(|row| Memory {
                id: row.get("id"),
                session_id: row.get("session_id"),
                content: row.get("content"),
                created_at: row.get("created_at"),
            })
            .collect::<Vec<_>>());
        let total = sql!(conn, c => query_scalar::<i64>(
            "SELECT COUNT(*) FROM session_memories WHERE session_id = ?",
        )
        .bind(&session.id)
        .fetch_one(c)
        .await?);
        Ok((memories, total))
    }

    /// Full-text search over one session's text, best match first. Reply pages
    /// count only while they are their floor's active page.
    pub async fn search_session_text(
        &self,
        session_id: &str,
        text: &str,
        limit: i64,
    ) -> Result<Vec<MemoryHit>> {
        let words = if self.backend() == Backend::Postgres {
            tsquery(text)
        } else {
            fts_query(text)
        }
        .ok_or_else(|| Error::validation("the query contains no word to search for"))?;
        let hits = sql!(self.conn().await?, c => {
            let search = if POSTGRES {
                query(POSTGRES_SEARCH)
                    .bind(&words)
                    .bind(session_id)
                    .bind(session_id)
            } else {
                query(SQLITE_SEARCH).bind(&words).bind(session_id)
            };
            search
                .bind(limit)
                .fetch_all(c)
                .await?
                .iter()
                .map(|row| hit_from_row(row, POSTGRES))
                .collect::<Vec<_>>()
        });
        Ok(hits)
    }
}

/// A hit from a search's row: PostgreSQL's rows carry the passage
/// `ts_headline` cut (`cut_by_database`), SQLite's the whole text marked
/// ([`SQLITE_SEARCH`]).
fn hit_from_row(row: &impl Record, cut_by_database: bool) -> MemoryHit {
    let content: String = row.get("content");
    let rank: f64 = row.get("rank");
    MemoryHit {
        source: row.get("source"),
        id: row.get("ref_id"),
        floor_id: row.get("floor_id"),
        floor_seq: row.get("floor_seq"),
        content: truncate_chars(&content, MAX_HIT_CHARS),
        snippet: if cut_by_database {
            row.get("snippet")
        } else {
            snippet_of(row.text("marked"))
        },
        score: -rank,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `highlight()`'s marks as [`SQLITE_SEARCH`] asks for them.
    fn marked(text: &str) -> String {
        text.replace('[', &MARK_OPEN.to_string())
            .replace(']', &MARK_CLOSE.to_string())
    }

    #[test]
    fn a_snippet_is_the_passage_around_the_first_match_cut_at_spaces() {
        assert_eq!(
            snippet_of(&marked("the [dragon] sleeps")),
            "the [dragon] sleeps"
        );
        let before = "lead ".repeat(100);
        let after = "tail ".repeat(100);
        let snippet = snippet_of(&marked(&format!("{before}[dragon] {after}")));
        assert!(snippet.starts_with("…lead "), "{snippet}");
        assert!(snippet.contains(" [dragon] tail "), "{snippet}");
        assert!(snippet.ends_with(" tail…"), "{snippet}");
        assert!(snippet.chars().count() <= SNIPPET_CHARS + 2, "{snippet}");
        assert_eq!(
            snippet.find("[dragon]").unwrap(),
            "…".len() + "lead ".len() * 12,
            "{snippet}"
        );
        // A text without spaces is cut by characters, and a match the cut
        // goes through is still closed.
        let unbroken = format!("{}[{}]", "x".repeat(10), "y".repeat(400));
        let snippet = snippet_of(&marked(&unbroken));
        assert!(snippet.starts_with("xxxxxxxxxx[yyy"), "{snippet}");
        assert!(snippet.ends_with("y]…"), "{snippet}");
        // Only a text with no mark at all (no such row is selected) starts at
        // its beginning.
        assert_eq!(snippet_of("plain text"), "plain text");
    }

    #[test]
    fn queries_quote_every_word() {
        assert_eq!(
            fts_query("the dragon's cave?").as_deref(),
            Some("\"the\" OR \"dragon\" OR \"s\" OR \"cave\"")
        );
        assert_eq!(
            fts_query("NEAR(a b) OR \"x\"").as_deref(),
            Some("\"near\" OR \"a\" OR \"b\" OR \"or\" OR \"x\"")
        );
        assert_eq!(fts_query(" ,.;!? "), None);
        assert_eq!(fts_query("Dragon dragon").as_deref(), Some("\"dragon\""));
    }

    #[test]
    fn tsqueries_quote_every_word_as_a_lexeme() {
        assert_eq!(
            tsquery("the dragon's cave?").as_deref(),
            Some("'the' | 'dragon' | 's' | 'cave'")
        );
        // tsquery operators in the input are separators, never operators.
        assert_eq!(
            tsquery("!a & (b | c:*) <-> 'd'").as_deref(),
            Some("'a' | 'b' | 'c' | 'd'")
        );
        assert_eq!(tsquery(" ,.;!? "), None);
        assert_eq!(tsquery("Dragon dragon").as_deref(), Some("'dragon'"));
        assert_eq!(
            tsquery("好感度 Ünïcode").as_deref(),
            Some("'好感度' | 'ünïcode'")
        );
        let many: String = (0..40).map(|n| format!("w{n} ")).collect();
        assert_eq!(
            tsquery(&many).map(|q| q.split(" | ").count()),
            Some(MAX_QUERY_TERMS)
        );
    }

    async fn store_with_session() -> (tempfile::TempDir, Store, String, String) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(None, dir.path()).await.unwrap();
        let account = store.create_account("a", true, None).await.unwrap().account;
        let name = crate::domain::CharacterName::parse("Mira").unwrap();
        store
            .create_character(&account.id, &name, "", "")
            .await
            .unwrap();
        let session = store.create_session(&account.id, "Mira", "").await.unwrap();
        (dir, store, account.id, session.id)
    }

    /// Rows of the index's content table, after FTS5 has checked that its index
    /// matches them exactly (a stale index entry fails the integrity check).
    async fn indexed_rows(store: &Store) -> i64 {
        sql!(store.conn().await.unwrap(), c => {
            // PostgreSQL's index is a generated column: nothing to go stale.
            if !POSTGRES {
                query(
                    "INSERT INTO session_texts_fts (session_texts_fts, rank) VALUES ('integrity-check', 1)",
                )
                .execute(&mut *c)
                .await
                .expect("the full-text index matches its content");
            }
            query_scalar::<i64>("SELECT COUNT(*) FROM session_texts")
                .fetch_one(&mut *c)
                .await
                .unwrap()
        })
    }

    #[tokio::test]
    async fn only_active_pages_are_found_and_deletes_leave_the_index() {
        let (_dir, store, account, session) = store_with_session().await;
        let floor = store
            .append_floor(&account, &session, "Tell me a story")
            .await
            .unwrap();
        for (id, no, text) in [
            ("page_a", 1, "a story about a griffin"),
            ("page_b", 2, "a story about a kraken"),
        ] {
            sql!(store.conn().await.unwrap(), c => query(
                "INSERT INTO pages (id, floor_id, page_no, content, created_at) VALUES (?, ?, ?, ?, 0)",
            )
            .bind(id)
            .bind(&floor.id)
            .bind(no as i64)
            .bind(text)
            .execute(c)
            .await
            .map(|_| ())
            .unwrap());
        }
        let search = |word: &'static str| {
            let store = store.clone();
            let session = session.clone();
            async move {
                store
                    .search_session_text(&session, word, 10)
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|hit| hit.id)
                    .collect::<Vec<_>>()
            }
        };
        assert!(search("griffin").await.is_empty(), "no page is active yet");
        sql!(store.conn().await.unwrap(), c => query(
            "UPDATE floors SET active_page_id = 'page_b' WHERE id = ?",
        )
        .bind(&floor.id)
        .execute(c)
        .await
        .map(|_| ())
        .unwrap());
        assert_eq!(search("kraken").await, ["page_b"]);
        assert!(search("griffin").await.is_empty());
        // Edits are re-indexed.
        sql!(store.conn().await.unwrap(), c => query(
            "UPDATE pages SET content = 'a story about a phoenix' WHERE id = 'page_b'",
        )
        .execute(c)
        .await
        .map(|_| ())
        .unwrap());
        assert!(search("kraken").await.is_empty());
        assert_eq!(search("phoenix").await, ["page_b"]);
        store
            .add_memory(&account, &session, "The user loves phoenixes")
            .await
            .unwrap();
        assert_eq!(search("phoenix").await.len(), 2);
        assert_eq!(indexed_rows(&store).await, 4);
        // Deleting the session cascades through floors, pages and memories, and
        // the triggers take every text out of the index.
        store.delete_session(&account, &session).await.unwrap();
        assert_eq!(indexed_rows(&store).await, 0);
    }

    #[test]
    fn hits_are_cut_on_char_boundaries() {
        assert_eq!(truncate_chars("蓝蓝蓝", 2), "蓝蓝…");
        assert_eq!(truncate_chars("ab", 2), "ab");
    }
}
