//! A journal row's JSON written directly, for pages of the journal.
//!
//! serde_json escapes every key and string value a byte at a time, and that
//! escaping was the largest single cost of a 200-row journal page (1.55 M of
//! its 8.3 M instructions, BENCHMARKS.md "Issue 20, ninth look"). Here the
//! keys are constants and a string is checked for bytes that need escaping
//! eight at a time; only a string that has one goes through serde_json.
//!
//! The shape stays `ExecutionRecordRef`'s `Serialize` derive: [`write_row`]
//! destructures the row without `..`, so a new field does not compile until
//! it is written here, and tests compare the two byte for byte.

use serde_json::value::RawValue;

use super::ExecutionRecordRef;

/// Appends `row` to `out` as the same JSON text `serde_json::to_string(row)`
/// gives.
pub fn write_row(row: &ExecutionRecordRef<'_>, out: &mut String) {
    let ExecutionRecordRef {
        id,
        session_id,
        run_id,
        floor_id,
        page_id,
        call_id,
        caller_slot,
        provider_id,
        provider_type,
        tool_name,
        args,
        result,
        status,
        lifecycle_state,
        commit_outcome,
        side_effect_level,
        replay_safety,
        error_message,
        execution_reason_code,
        duration_ms,
        started_at,
        finished_at,
        delivery_mode,
        result_visibility,
        attempt_no,
        runtime_job_id,
        replay_parent_execution_id,
        provider_started,
        created_at,
    } = *row;
    out.reserve(estimated_len(row));
    Fields(out)
        .text("{\"id\":", id)
        .text(",\"session_id\":", session_id)
        .optional_text(",\"run_id\":", run_id)
        .optional_text(",\"floor_id\":", floor_id)
        .optional_text(",\"page_id\":", page_id)
        .text(",\"call_id\":", call_id)
        .text(",\"caller_slot\":", caller_slot)
        .text(",\"provider_id\":", provider_id)
        .text(",\"provider_type\":", provider_type)
        .text(",\"tool_name\":", tool_name)
        .raw(",\"args\":", args)
        .raw(",\"result\":", result)
        .text(",\"status\":", status.as_str())
        .text(",\"lifecycle_state\":", lifecycle_state.as_str())
        .text(",\"commit_outcome\":", commit_outcome.as_str())
        .text(",\"side_effect_level\":", side_effect_level)
        .text(",\"replay_safety\":", replay_safety)
        .optional_text(",\"error_message\":", error_message)
        .optional_text(
            ",\"execution_reason_code\":",
            execution_reason_code.map(|code| code.as_str()),
        )
        .integer(",\"duration_ms\":", duration_ms)
        .integer(",\"started_at\":", started_at)
        .optional_integer(",\"finished_at\":", finished_at)
        .text(",\"delivery_mode\":", delivery_mode)
        .text(",\"result_visibility\":", result_visibility)
        .integer(",\"attempt_no\":", attempt_no)
        .optional_text(",\"runtime_job_id\":", runtime_job_id)
        .optional_text(
            ",\"replay_parent_execution_id\":",
            replay_parent_execution_id,
        )
        .boolean(",\"provider_started\":", provider_started)
        .integer(",\"created_at\":", created_at)
        .0
        .push('}');
}

/// An object's fields appended one by one, each after its key (with the
/// comma or brace before it).
struct Fields<'a>(&'a mut String);

impl Fields<'_> {
    fn text(&mut self, key: &str, value: &str) -> &mut Self {
        self.0.push_str(key);
        string(self.0, value);
        self
    }

    fn optional_text(&mut self, key: &str, value: Option<&str>) -> &mut Self {
        self.0.push_str(key);
        match value {
            Some(value) => string(self.0, value),
            None => self.0.push_str("null"),
        }
        self
    }

    fn raw(&mut self, key: &str, value: &RawValue) -> &mut Self {
        self.0.push_str(key);
        self.0.push_str(value.get());
        self
    }

    fn integer(&mut self, key: &str, value: i64) -> &mut Self {
        self.0.push_str(key);
        self.0.push_str(itoa::Buffer::new().format(value));
        self
    }

    fn optional_integer(&mut self, key: &str, value: Option<i64>) -> &mut Self {
        match value {
            Some(value) => self.integer(key, value),
            None => {
                self.0.push_str(key);
                self.0.push_str("null");
                self
            }
        }
    }

    fn boolean(&mut self, key: &str, value: bool) -> &mut Self {
        self.0.push_str(key);
        self.0.push_str(if value { "true" } else { "false" });
        self
    }
}

/// The keys, numbers and punctuation of a row take about this many bytes;
/// its text is added to it, so that the row is written without regrowing.
const FIXED_LEN: usize = 640;

fn estimated_len(row: &ExecutionRecordRef<'_>) -> usize {
    let text = |value: Option<&str>| value.map_or(0, str::len);
    FIXED_LEN
        + row.id.len()
        + row.session_id.len()
        + text(row.run_id)
        + text(row.floor_id)
        + text(row.page_id)
        + row.call_id.len()
        + row.tool_name.len()
        + row.provider_id.len()
        + row.args.get().len()
        + row.result.get().len()
        + text(row.error_message)
}

fn string(out: &mut String, value: &str) {
    if needs_escaping(value.as_bytes()) {
        // A str always serialises; serde_json's escaping is the reference.
        out.push_str(&serde_json::to_string(value).expect("a string serialises"));
    } else {
        out.push('"');
        out.push_str(value);
        out.push('"');
    }
}

/// Whether serde_json would escape any byte of `bytes`: a control character,
/// `"` or `\` (it leaves DEL and non-ASCII as they are). Eight bytes are
/// tested at once as a word (a byte-wise loop was most of a short string's
/// cost); a string of eight bytes or more ends with its last eight, which
/// may overlap the word before, as an any-test allows.
fn needs_escaping(bytes: &[u8]) -> bool {
    let Some(last) = bytes.last_chunk::<8>() else {
        return bytes.iter().any(|&byte| escaped(byte));
    };
    let (words, _) = bytes.as_chunks::<8>();
    words
        .iter()
        .chain([last])
        .any(|&word| word_needs_escaping(word))
}

fn escaped(byte: u8) -> bool {
    byte < 0x20 || byte == b'"' || byte == b'\\'
}

/// Whether any of eight bytes is below 0x20, `"` or `\`, by the word tests
/// of "Bit Twiddling Hacks" (`hasless`, `haszero`): exact as yes-or-no
/// answers, which is all this needs.
fn word_needs_escaping(word: [u8; 8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const HIGH_BITS: u64 = ONES * 0x80;
    let word = u64::from_ne_bytes(word);
    let has_byte_below =
        |word: u64, limit: u8| word.wrapping_sub(ONES * u64::from(limit)) & !word & HIGH_BITS != 0;
    let has_byte = |byte: u8| has_byte_below(word ^ (ONES * u64::from(byte)), 1);
    has_byte_below(word, 0x20) || has_byte(b'"') || has_byte(b'\\')
}

/// A row whose free text fields are all `text` (for tests of the writer).
#[cfg(test)]
pub(crate) fn sample_row<'a>(text: &'a str, args: &'a RawValue) -> ExecutionRecordRef<'a> {
    ExecutionRecordRef {
        id: text,
        session_id: "sess_1",
        run_id: Some(text),
        floor_id: None,
        page_id: Some("page"),
        call_id: text,
        caller_slot: "narrator",
        provider_id: "plugin:x",
        provider_type: "http_callback",
        tool_name: text,
        args,
        result: super::null_json(),
        status: super::ExecutionStatus::Success,
        lifecycle_state: super::LifecycleState::Finished,
        commit_outcome: super::CommitOutcome::Committed,
        side_effect_level: "none",
        replay_safety: "safe",
        error_message: Some(text),
        execution_reason_code: None,
        duration_ms: -7,
        started_at: i64::MAX,
        finished_at: Some(i64::MIN),
        delivery_mode: "inline",
        result_visibility: "immediate",
        attempt_no: 0,
        runtime_job_id: None,
        replay_parent_execution_id: Some(text),
        provider_started: false,
        created_at: 1_700_000_000_000,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::{CommitOutcome, ExecutionStatus, LifecycleState};
    use crate::reason::ReasonCode;

    fn assert_same_as_serde(row: &ExecutionRecordRef<'_>) {
        let mut written = String::new();
        write_row(row, &mut written);
        assert_eq!(
            written,
            serde_json::to_string(row).expect("a row serialises")
        );
    }

    #[test]
    fn strings_that_need_escaping_are_escaped_like_serde() {
        let args: &RawValue = serde_json::from_str(r#"{"a": [1, "\u0000"]}"#).expect("JSON");
        let texts = [
            "",
            "plain",
            "a\"quote",
            "back\\slash",
            "line\nbreak\ttab\r",
            "\u{0}\u{1}\u{1f}\u{7f} é 漢字 🎲",
            // Each escaped byte at every place of a sixteen-byte chunk and
            // of the remainder after it.
            "0123456789abcdef0123456789abcdef\"",
            "0123456789abcde\\0123456789abcdef",
            "\u{1f}123456789abcdef0123456789abcde",
            "0123456789abcdef0123456789abcdef",
        ];
        for text in texts {
            assert_same_as_serde(&sample_row(text, args));
        }
        for position in 0..40 {
            for escaped in ['"', '\\', '\n', '\u{0}', '\u{1f}'] {
                let mut text: String = "x".repeat(40);
                text.replace_range(position..position + 1, &escaped.to_string());
                assert_same_as_serde(&sample_row(&text, args));
            }
        }
    }

    #[test]
    fn every_state_and_reason_is_written_like_serde() {
        let args = super::super::null_json();
        for status in ExecutionStatus::ALL {
            for lifecycle_state in [LifecycleState::Opened, LifecycleState::Finished] {
                let mut row = sample_row("id", args);
                row.status = status;
                row.lifecycle_state = lifecycle_state;
                row.finished_at = None;
                row.provider_started = true;
                assert_same_as_serde(&row);
            }
        }
        for commit_outcome in [
            CommitOutcome::Pending,
            CommitOutcome::Committed,
            CommitOutcome::Discarded,
            CommitOutcome::ReplayBlocked,
            CommitOutcome::Uncertain,
        ] {
            let mut row = sample_row("id", args);
            row.commit_outcome = commit_outcome;
            assert_same_as_serde(&row);
        }
        for &code in ReasonCode::ALL {
            let mut row = sample_row("id", args);
            row.execution_reason_code = Some(code);
            assert_same_as_serde(&row);
        }
    }

    #[test]
    fn random_strings_are_written_like_serde() {
        use rand::{Rng, SeedableRng};
        // Seeded, so that a failure can be repeated.
        let mut rng = rand::rngs::StdRng::seed_from_u64(20);
        let alphabet: Vec<char> = "ab\"\\\n\u{0}\u{1f}\u{7f}é漢🎲 /".chars().collect();
        let args = super::super::null_json();
        for _ in 0..2_000 {
            let len = rng.random_range(0..70);
            let text: String = (0..len)
                .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                .collect();
            assert_same_as_serde(&sample_row(&text, args));
        }
    }

    #[test]
    fn the_word_test_agrees_with_a_byte_loop() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(8);
        // Bytes next to each escaped one, so that a borrow or an off-by-one
        // in the word test would show.
        let alphabet = [
            0x00, 0x01, 0x1f, 0x20, 0x21, b'"', 0x23, 0x5b, b'\\', 0x5d, 0x7f, 0x80, 0xff, b'a',
        ];
        for _ in 0..20_000 {
            let len = rng.random_range(0..40);
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    if rng.random_range(0..16) == 0 {
                        alphabet[rng.random_range(0..alphabet.len())]
                    } else {
                        rng.random_range(0x20..0x7f)
                    }
                })
                .collect();
            assert_eq!(
                needs_escaping(&bytes),
                bytes.iter().any(|&byte| escaped(byte)),
                "{bytes:?}"
            );
        }
    }
}
