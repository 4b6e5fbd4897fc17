//! Failed console sign-ins per client address: after `MAX_FAILURES` within
//! `WINDOW`, the address's sign-ins are refused until its window ends, so an
//! API key cannot be guessed at the speed of the network. Only failures count
//! (an operator signing in often is never slowed). A success does not clear
//! the count: whoever holds one valid key could otherwise reset it between
//! guesses at every other key.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failed sign-ins one address may make within a window.
pub const MAX_FAILURES: u32 = 10;
/// How long failures are remembered, from the first of a window.
pub const WINDOW: Duration = Duration::from_secs(300);
/// Addresses remembered at most; when full, expired windows are dropped, and
/// if none has expired the oldest window goes (an attacker cycling addresses
/// gains nothing the per-address limit did not already allow).
pub const MAX_TRACKED: usize = 10_000;

#[derive(Debug, Clone, Copy)]
struct Window {
    started: Instant,
    failures: u32,
}

/// The failure counts, per address.
#[derive(Debug, Default)]
pub struct SignInThrottle {
    windows: Mutex<HashMap<IpAddr, Window>>,
}

impl SignInThrottle {
    /// None when `address` may try to sign in now; else how long it must wait.
    #[cfg(test)]
    fn refused_for(&self, address: IpAddr, now: Instant) -> Option<Duration> {
        let windows = self.windows.lock().expect("sign-in throttle lock");
        let window = windows.get(&address)?;
        let ends = window.started + WINDOW;
        (window.failures >= MAX_FAILURES && now < ends).then(|| ends - now)
    }

    /// Takes one attempt of `address`, counted as a failure until
    /// [`refund`](Self::refund)ed, or says how long it must wait. The check
    /// and the count are one step: concurrent attempts cannot all pass a
    /// check made before any of them was counted.
    pub fn reserve(&self, address: IpAddr, now: Instant) -> Option<Duration> {
        let mut windows = self.windows.lock().expect("sign-in throttle lock");
        if let Some(window) = windows.get(&address) {
            let ends = window.started + WINDOW;
            if window.failures >= MAX_FAILURES && now < ends {
                return Some(ends - now);
            }
        }
        Self::count(&mut windows, address, now);
        None
    }

    /// Gives back a reserved attempt that signed in.
    pub fn refund(&self, address: IpAddr) {
        let mut windows = self.windows.lock().expect("sign-in throttle lock");
        if let Some(window) = windows.get_mut(&address) {
            window.failures = window.failures.saturating_sub(1);
        }
    }

    /// Counts a failed sign-in of `address`.
    #[cfg(test)]
    fn failed(&self, address: IpAddr, now: Instant) {
        let mut windows = self.windows.lock().expect("sign-in throttle lock");
        Self::count(&mut windows, address, now);
    }

    fn count(windows: &mut HashMap<IpAddr, Window>, address: IpAddr, now: Instant) {
        if windows.len() >= MAX_TRACKED && !windows.contains_key(&address) {
            windows.retain(|_, window| now < window.started + WINDOW);
            if windows.len() >= MAX_TRACKED
                && let Some(oldest) = windows
                    .iter()
                    .min_by_key(|(_, window)| window.started)
                    .map(|(address, _)| *address)
            {
                windows.remove(&oldest);
            }
        }
        let window = windows.entry(address).or_insert(Window {
            started: now,
            failures: 0,
        });
        if now >= window.started + WINDOW {
            *window = Window {
                started: now,
                failures: 0,
            };
        }
        window.failures += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOME: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    #[test]
    fn the_limit_holds_for_its_window_and_then_lifts() {
        let throttle = SignInThrottle::default();
        let start = Instant::now();
        for _ in 0..MAX_FAILURES - 1 {
            throttle.failed(HOME, start);
        }
        assert_eq!(throttle.refused_for(HOME, start), None);
        throttle.failed(HOME, start);
        assert_eq!(throttle.refused_for(HOME, start), Some(WINDOW));
        let other = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(throttle.refused_for(other, start), None, "per address");
        assert_eq!(throttle.refused_for(HOME, start + WINDOW), None);
        throttle.failed(HOME, start + WINDOW);
        assert_eq!(
            throttle.refused_for(HOME, start + WINDOW),
            None,
            "a new window"
        );
    }

    #[test]
    fn a_reservation_counts_until_refunded() {
        let throttle = SignInThrottle::default();
        let now = Instant::now();
        // Concurrent attempts: each reservation counts at once.
        for _ in 0..MAX_FAILURES {
            assert_eq!(throttle.reserve(HOME, now), None);
        }
        assert_eq!(throttle.reserve(HOME, now), Some(WINDOW));
        throttle.refund(HOME);
        assert_eq!(
            throttle.reserve(HOME, now),
            None,
            "a success gave its slot back"
        );
        assert_eq!(throttle.refused_for(HOME, now), Some(WINDOW));
    }

    #[test]
    fn the_table_stays_bounded() {
        let throttle = SignInThrottle::default();
        let now = Instant::now();
        for n in 0..(MAX_TRACKED as u32 + 5) {
            throttle.failed(IpAddr::V4(std::net::Ipv4Addr::from(n)), now);
        }
        assert!(throttle.windows.lock().unwrap().len() <= MAX_TRACKED);
    }
}
