//! Names of session state (variables, resources): the one rule both share.

use crate::error::{Error, Result};

/// Checks a variable or resource name: 1..=`max_chars` characters, no control
/// characters, no leading or trailing whitespace (which would make two names look
/// alike to a person reading them).
pub(crate) fn check_state_name(what: &str, raw: &str, max_chars: usize) -> Result<()> {
    let count = raw.chars().count();
    if count == 0 || count > max_chars {
        return Err(Error::validation(format!(
            "{what} name must be 1-{max_chars} characters, got {count}"
        )));
    }
    if raw.trim() != raw {
        return Err(Error::validation(format!(
            "{what} name must not start or end with whitespace"
        )));
    }
    if raw.chars().any(char::is_control) {
        return Err(Error::validation(format!(
            "{what} name must not contain control characters"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_bounded_and_clean() {
        assert!(check_state_name("variable", "hp", 64).is_ok());
        assert!(check_state_name("variable", "好感度", 64).is_ok());
        for bad in ["", " hp", "hp ", "a\tb"] {
            assert!(check_state_name("variable", bad, 64).is_err(), "{bad:?}");
        }
        assert!(check_state_name("variable", &"a".repeat(65), 64).is_err());
    }
}
