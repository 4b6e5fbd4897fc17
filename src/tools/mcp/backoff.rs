//! The per-server circuit breaker: after each failed connection the next
//! attempt waits longer (doubling from half a second, capped at 15 s, with
//! jitter so that servers that failed together do not retry together); one
//! success closes it again. A dead server therefore costs one attempt per 15 s,
//! and a server that comes back is live again within about 20 s.

use std::time::Duration;

use rand::Rng;

/// First wait after a failure.
const FIRST_DELAY: Duration = Duration::from_millis(500);
/// Longest wait (the breaker's open time).
pub const MAX_DELAY: Duration = Duration::from_secs(15);
/// Failures in a row after which the breaker counts as open (logged once).
const OPEN_AFTER: u32 = 4;

/// Consecutive failures of one server's connection.
#[derive(Debug, Default)]
pub struct Breaker {
    failures: u32,
}

impl Breaker {
    /// A connection was established.
    pub fn success(&mut self) {
        self.failures = 0;
    }

    /// An attempt of server `server_id` failed (or its connection was lost);
    /// answers how long to wait before the next one.
    pub fn failure(&mut self, server_id: &str) -> Duration {
        self.failures = self.failures.saturating_add(1);
        if self.failures == OPEN_AFTER {
            tracing::warn!(
                server_id,
                failures = self.failures,
                "an MCP server keeps failing; retrying at most every {} s",
                MAX_DELAY.as_secs()
            );
        }
        let exponent = (self.failures - 1).min(10);
        let delay = FIRST_DELAY.saturating_mul(1 << exponent).min(MAX_DELAY);
        // ±20 %, never above the cap.
        let jitter = rand::rng().random_range(0.8..1.2);
        delay.mul_f64(jitter).min(MAX_DELAY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_and_resets() {
        let mut breaker = Breaker::default();
        let first = breaker.failure("mcp_test");
        assert!(first >= Duration::from_millis(400) && first <= Duration::from_millis(600));
        for _ in 0..20 {
            assert!(breaker.failure("mcp_test") <= MAX_DELAY);
        }
        assert!(breaker.failure("mcp_test") >= MAX_DELAY.mul_f64(0.8));
        breaker.success();
        assert!(breaker.failure("mcp_test") <= Duration::from_millis(600));
    }
}
