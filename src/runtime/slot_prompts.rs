//! What the optional slots are asked and how their answers are read: the
//! director writes notes for the narrator, the verifier accepts the reply or
//! rejects it with a reason, the memory slot lists facts worth keeping.
//! Plain-text protocols, so any chat model can fill a slot.

use crate::domain::tool::Slot;
use crate::store::memory::MAX_MEMORY_BYTES;
use crate::store::run_generation::MAX_MEMORIES_PER_RUN;

const DIRECTOR_PROMPT: &str = "You are the director of a role-play chat. Read the conversation and the user's latest message, then write short notes (a few sentences) on what the next reply should do: its tone, where the story goes, facts it must keep consistent. Do not write the reply itself.";
const DIRECTOR_ASK: &str =
    "Write your notes for the reply to the user's last message. Do not write the reply.";
const VERIFIER_PROMPT: &str = "You check a role-play chat reply before the user sees it. Answer with exactly ACCEPT when the reply fits the character and the conversation, or with REJECT: followed by one sentence saying what must change.";
const VERIFIER_ASK: &str =
    "Check the assistant's last reply. Answer ACCEPT, or REJECT: and what must change.";
const MEMORY_PROMPT: &str = "You keep the long-term memory of a role-play chat. From the user's latest message and the reply to it, write the facts worth remembering later (names, preferences, promises, events), one per line. Write NONE when nothing is worth keeping.";
const MEMORY_ASK: &str =
    "Write the facts to remember from the last exchange, one per line, or NONE.";

/// The system prompt of `slot`'s requests, with the character's own prompt as
/// context. The narrator's is the character's prompt alone.
pub(super) fn system_prompt(slot: Slot, character: Option<&str>) -> Option<String> {
    let role = match slot {
        Slot::Narrator => return character.map(str::to_owned),
        Slot::Director => DIRECTOR_PROMPT,
        Slot::Verifier => VERIFIER_PROMPT,
        Slot::Memory => MEMORY_PROMPT,
    };
    Some(match character {
        Some(character) => format!("{role}\n\nThe character's instructions:\n{character}"),
        None => role.to_owned(),
    })
}

/// The closing user message that asks `slot` for its answer.
pub(super) fn ask(slot: Slot) -> &'static str {
    match slot {
        Slot::Director => DIRECTOR_ASK,
        Slot::Verifier => VERIFIER_ASK,
        Slot::Memory => MEMORY_ASK,
        Slot::Narrator => "",
    }
}

/// The director's notes as the narrator is given them.
pub(super) fn director_notes(notes: &str) -> String {
    format!(
        "Notes from the director for your next reply (do not mention them):\n{}",
        notes.trim()
    )
}

/// What the narrator is told when the verifier rejected its reply.
pub(super) fn retry_request(reason: &str) -> String {
    format!("A reviewer rejected your last reply: {reason}\nWrite the reply again, fixing that.")
}

/// The verifier's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verdict {
    Accept,
    Reject(String),
}

/// Reads the verifier's answer: `REJECT` (any case, after optional markdown)
/// with a reason rejects; anything else accepts, so a confused verifier never
/// blocks a reply.
pub(super) fn verdict(answer: &str) -> Verdict {
    let text = answer.trim().trim_start_matches(['*', '_', '`', '#', ' ']);
    let Some(head) = text.get(..6) else {
        return Verdict::Accept;
    };
    if !head.eq_ignore_ascii_case("reject") {
        return Verdict::Accept;
    }
    let reason = text[6..]
        .trim_start_matches(['*', '_', '`', ':', '-', ' '])
        .trim();
    if reason.is_empty() {
        Verdict::Reject("the verifier gave no reason".to_owned())
    } else {
        Verdict::Reject(reason.to_owned())
    }
}

/// Reads the memory slot's answer: one fact per line, list markers dropped,
/// `NONE` and blank lines skipped, each cut to the largest memory, at most
/// [`MAX_MEMORIES_PER_RUN`].
pub(super) fn memory_notes(answer: &str) -> Vec<String> {
    answer
        .lines()
        .map(|line| {
            line.trim()
                .trim_start_matches(|c: char| c.is_ascii_digit())
                .trim_start_matches(['-', '*', '•', '.', ')', ' '])
                .trim()
        })
        .filter(|line| !line.is_empty() && !line.eq_ignore_ascii_case("none"))
        .map(|line| cut_to_bytes(line, MAX_MEMORY_BYTES))
        .take(MAX_MEMORIES_PER_RUN)
        .collect()
}

fn cut_to_bytes(text: &str, max: usize) -> String {
    crate::text::prefix_within(text, max).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verdict_rejects_only_with_reject() {
        assert_eq!(verdict("ACCEPT"), Verdict::Accept);
        assert_eq!(verdict("Looks fine."), Verdict::Accept);
        assert_eq!(verdict(""), Verdict::Accept);
        assert_eq!(
            verdict("REJECT: the character would never swear"),
            Verdict::Reject("the character would never swear".into())
        );
        assert_eq!(
            verdict("**Reject** - too long"),
            Verdict::Reject("too long".into())
        );
        assert_eq!(
            verdict("reject"),
            Verdict::Reject("the verifier gave no reason".into())
        );
        assert_eq!(
            verdict("réjection"),
            Verdict::Accept,
            "not a byte-boundary panic"
        );
    }

    #[test]
    fn memory_notes_are_lines_without_markers() {
        let notes = memory_notes(
            "1. The user is called Mio\n- likes tea\n\n* NONE\nNONE\n  •  owns a cat ",
        );
        assert_eq!(notes, ["The user is called Mio", "likes tea", "owns a cat"]);
        assert!(memory_notes("NONE").is_empty());
        let many = "fact\n".repeat(40);
        assert_eq!(memory_notes(&many).len(), MAX_MEMORIES_PER_RUN);
        let long = "é".repeat(MAX_MEMORY_BYTES);
        assert!(memory_notes(&long)[0].len() <= MAX_MEMORY_BYTES);
    }

    #[test]
    fn slot_prompts_carry_the_character() {
        assert_eq!(system_prompt(Slot::Narrator, None), None);
        assert_eq!(
            system_prompt(Slot::Narrator, Some("Be Lanlan")).as_deref(),
            Some("Be Lanlan")
        );
        let director = system_prompt(Slot::Director, Some("Be Lanlan")).unwrap();
        assert!(director.starts_with(DIRECTOR_PROMPT) && director.ends_with("Be Lanlan"));
    }
}
