//! A failed attempt and whether trying again can help.

use std::time::Duration;

use super::LlmError;

/// Whether a failed attempt is worth another one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Retry {
    /// The request itself is wrong (4xx, a malformed answer): the same again fails the same way.
    No,
    /// A passing fault (5xx, 429, the network): wait the next backoff step.
    Backoff,
    /// The provider said how long to wait (`Retry-After`).
    After(Duration),
}

/// One attempt's failure.
#[derive(Debug)]
pub(super) struct Failure {
    pub error: LlmError,
    pub retry: Retry,
    /// What failed, for the log: `status`, `connect`, `stream`, `answer`.
    pub kind: &'static str,
}

impl Failure {
    /// The provider answered, but not with something usable; not retried.
    pub fn answer(status: u16, message: impl Into<String>) -> Self {
        Self {
            error: LlmError {
                status: Some(status),
                message: message.into(),
            },
            retry: Retry::No,
            kind: "answer",
        }
    }

    /// The answer broke off or stalled: retried while no token was produced.
    pub fn stream(status: u16, message: impl Into<String>) -> Self {
        Self {
            error: LlmError {
                status: Some(status),
                message: message.into(),
            },
            retry: Retry::Backoff,
            kind: "stream",
        }
    }

    /// No answer arrived at all.
    pub fn unreachable(message: impl Into<String>) -> Self {
        Self {
            error: LlmError {
                status: None,
                message: message.into(),
            },
            retry: Retry::Backoff,
            kind: "connect",
        }
    }

    /// A refusal by status: 429 and 5xx pass, any other does not.
    pub fn status(status: u16, message: String, retry_after: Option<Duration>) -> Self {
        let retry = if status == 429 || (500..600).contains(&status) {
            retry_after.map_or(Retry::Backoff, Retry::After)
        } else {
            Retry::No
        };
        Self {
            error: LlmError {
                status: Some(status),
                message,
            },
            retry,
            kind: "status",
        }
    }

    /// From a transport error; its text leaves the URL out, which may carry credentials.
    pub fn from_reqwest(error: reqwest::Error) -> Self {
        Self::unreachable(chain(&error.without_url()))
    }
}

/// An error and its causes on one line.
pub(super) fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let next = cause.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = cause.source();
    }
    text
}

/// The wait before retry number `retry` (1-based): `base`, doubled each time,
/// or the provider's `Retry-After` held under `cap`.
pub(super) fn wait(retry: Retry, attempt: u32, base: Duration, cap: Duration) -> Duration {
    match retry {
        Retry::After(after) => after.min(cap),
        _ => base.saturating_mul(1 << attempt.saturating_sub(1).min(16)),
    }
}

/// `Retry-After` in seconds; the HTTP-date form is rare from model providers
/// and falls back to the backoff.
pub(super) fn parse_retry_after(value: &str) -> Option<Duration> {
    let seconds: f64 = value.trim().parse().ok()?;
    (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds.min(3600.0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_the_base_and_retry_after_is_capped() {
        let base = Duration::from_millis(500);
        let cap = Duration::from_secs(10);
        let waits: Vec<_> = (1..=3)
            .map(|n| wait(Retry::Backoff, n, base, cap))
            .collect();
        assert_eq!(waits, [500, 1000, 2000].map(Duration::from_millis).to_vec());
        let long = Retry::After(Duration::from_secs(60));
        assert_eq!(wait(long, 1, base, cap), cap);
        assert_eq!(parse_retry_after(" 2 "), Some(Duration::from_secs(2)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(parse_retry_after("-1"), None);
    }

    #[test]
    fn only_429_and_5xx_are_retried() {
        assert_eq!(Failure::status(400, String::new(), None).retry, Retry::No);
        assert_eq!(Failure::status(404, String::new(), None).retry, Retry::No);
        assert_eq!(
            Failure::status(429, String::new(), None).retry,
            Retry::Backoff
        );
        assert_eq!(
            Failure::status(503, String::new(), None).retry,
            Retry::Backoff
        );
        let after = Some(Duration::from_secs(1));
        assert_eq!(
            Failure::status(429, String::new(), after).retry,
            Retry::After(Duration::from_secs(1))
        );
    }
}
