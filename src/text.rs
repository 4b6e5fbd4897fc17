//! Text made to fit: cut to a byte size at a character boundary, and U+0000
//! written as U+FFFD where it must be stored (PostgreSQL cannot hold it in
//! text).

use std::borrow::Cow;

/// Cuts `text` to at most `max_bytes`, at a character boundary.
pub fn truncate_to_bytes(text: &mut String, max_bytes: usize) {
    let end = prefix_within(text, max_bytes).len();
    text.truncate(end);
}

/// The longest prefix of `text` of at most `max_bytes` that ends at a
/// character boundary.
pub fn prefix_within(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `text` with every U+0000 written as U+FFFD.
pub fn without_nul(text: &str) -> Cow<'_, str> {
    if text.contains('\0') {
        Cow::Owned(text.replace('\0', "\u{FFFD}"))
    } else {
        Cow::Borrowed(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_fall_on_character_boundaries() {
        assert_eq!(prefix_within("aé", 2), "a");
        assert_eq!(prefix_within("aé", 3), "aé");
        let mut text = "ééé".to_owned();
        truncate_to_bytes(&mut text, 5);
        assert_eq!(text, "éé");
    }

    #[test]
    fn nul_becomes_the_replacement_character() {
        assert_eq!(without_nul("a\0b"), "a\u{FFFD}b");
        assert!(matches!(without_nul("ab"), Cow::Borrowed("ab")));
    }
}
