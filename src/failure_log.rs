//! The log of a background loop's failures (the job worker, the approval
//! sweeper, the cluster heartbeat and listener): an outage such as the
//! database going away is one line when it begins, naming its cause, then at
//! most one a minute saying how many attempts failed meanwhile, and one line
//! when the loop works again, instead of a line per attempt.

use std::fmt::Display;
use std::time::{Duration, Instant};

/// How often a failure that goes on is logged again.
const REPEAT_AFTER: Duration = Duration::from_secs(60);

/// One background loop's failures.
#[derive(Debug)]
pub struct FailureLog {
    what: &'static str,
    failing_since: Option<Instant>,
    last_logged: Option<Instant>,
    unlogged: u64,
}

impl FailureLog {
    /// The log of the loop doing `what` (e.g. "claiming jobs").
    pub const fn new(what: &'static str) -> Self {
        Self {
            what,
            failing_since: None,
            last_logged: None,
            unlogged: 0,
        }
    }

    /// An attempt failed with `error`, logged with its whole chain of causes.
    pub fn failed(&mut self, error: &dyn Display) {
        let now = Instant::now();
        let since = *self.failing_since.get_or_insert(now);
        let due = self
            .last_logged
            .is_none_or(|at| now.duration_since(at) >= REPEAT_AFTER);
        if !due {
            self.unlogged += 1;
            return;
        }
        let error = format!("{error:#}");
        if self.last_logged.is_none() {
            tracing::error!(what = self.what, %error, "background work failed");
        } else {
            tracing::error!(
                what = self.what,
                %error,
                failed_for_s = now.duration_since(since).as_secs(),
                failures_since_last_line = self.unlogged + 1,
                "background work still failing"
            );
        }
        self.last_logged = Some(now);
        self.unlogged = 0;
    }

    /// An attempt succeeded: logged once if the loop had been failing.
    pub fn succeeded(&mut self) {
        if let Some(since) = self.failing_since.take() {
            tracing::info!(
                what = self.what,
                failed_for_s = since.elapsed().as_secs(),
                unlogged_failures = self.unlogged,
                "background work works again"
            );
        }
        self.last_logged = None;
        self.unlogged = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_that_goes_on_is_logged_once_until_it_is_due_again() {
        let mut log = FailureLog::new("testing");
        log.failed(&"first");
        for _ in 0..10 {
            log.failed(&"again");
        }
        assert_eq!(log.unlogged, 10);
        assert!(log.failing_since.is_some());
        log.succeeded();
        assert!(log.failing_since.is_none());
        assert_eq!(log.unlogged, 0);
        // A new outage is logged at once.
        log.failed(&"second outage");
        assert_eq!(log.unlogged, 0);
    }
}
