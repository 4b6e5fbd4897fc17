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
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
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
}
