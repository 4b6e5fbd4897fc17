//! Names that must be validated before they enter the system.

use std::fmt;

use crate::error::{Error, Result};

/// A character's server-wide unique name: 1–64 characters, no control characters,
/// no leading or trailing whitespace.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CharacterName(String);

impl CharacterName {
    pub const MAX_CHARS: usize = 64;

    pub fn parse(raw: &str) -> Result<Self> {
        let count = raw.chars().count();
        if count == 0 || count > Self::MAX_CHARS {
            return Err(Error::validation(format!(
                "character name must be 1-{} characters, got {count}",
                Self::MAX_CHARS
            )));
        }
        if raw.trim() != raw {
            return Err(Error::validation(
                "character name must not start or end with whitespace",
            ));
        }
        if raw.chars().any(char::is_control) {
            return Err(Error::validation(
                "character name must not contain control characters",
            ));
        }
        if let Some(invisible) = raw.chars().find(|&c| is_invisible(c)) {
            return Err(Error::validation(format!(
                "character name must not contain invisible or text-direction characters, got U+{:04X}",
                u32::from(invisible)
            )));
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Characters that show nothing or reorder the text around them: a name
/// holding one looks like another character's name (`Lan` and `Lan` plus a
/// zero-width space) or shows in lists as something it is not (a bidi
/// override). The zero-width joiners stay allowed: scripts and emoji need them.
fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'                     // soft hyphen
            | '\u{061C}'               // Arabic letter mark
            | '\u{180E}'               // Mongolian vowel separator
            | '\u{200B}'               // zero-width space
            | '\u{200E}'..='\u{200F}' // left-to-right and right-to-left marks
            | '\u{202A}'..='\u{202E}' // bidi embeddings and overrides
            | '\u{2060}'..='\u{2064}' // word joiner and invisible operators
            | '\u{2066}'..='\u{2069}' // bidi isolates
            | '\u{FEFF}'               // zero-width no-break space
    )
}

impl fmt::Display for CharacterName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_unicode_names_up_to_64_chars() {
        assert!(CharacterName::parse("蓝蓝").is_ok());
        assert!(CharacterName::parse(&"a".repeat(64)).is_ok());
    }

    #[test]
    fn rejects_empty_long_padded_and_control_names() {
        for bad in ["", " Lan", "Lan ", "a\nb"] {
            assert!(CharacterName::parse(bad).is_err(), "{bad:?}");
        }
        assert!(CharacterName::parse(&"a".repeat(65)).is_err());
    }

    #[test]
    fn rejects_names_with_characters_that_hide_or_reorder_text() {
        for bad in [
            "Lan\u{200B}",
            "\u{202E}naL",
            "L\u{2066}an",
            "La\u{FEFF}n",
            "La\u{00AD}n",
        ] {
            let err = CharacterName::parse(bad).expect_err(bad);
            assert!(err.to_string().contains("invisible"), "{err}");
        }
        // Joiners are part of emoji and of several scripts.
        assert!(CharacterName::parse("\u{1F469}\u{200D}\u{1F52C}").is_ok());
        assert!(CharacterName::parse("\u{0645}\u{06CC}\u{200C}\u{0631}").is_ok());
    }
}
