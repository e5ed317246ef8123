//! How long a session whose driving failed in a way retrying may fix is left alone:
//! exponential in the failures in a row, capped, with jitter so that sessions failing
//! together (a provider outage) do not all come back at the same instant.

use std::time::Duration;

/// The delays between attempts to drive a failing session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The delay after the first failure.
    pub first: Duration,
    /// The longest delay, however many failures.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            first: Duration::from_secs(2),
            max: Duration::from_secs(300),
        }
    }
}

impl Backoff {
    /// The delay before attempt `attempt + 1`, after `attempt` failures in a row:
    /// `first · 2^(attempt-1)` capped at `max`, then drawn from its upper half by
    /// `jitter` (any value; the same value gives the same delay).
    pub fn delay(&self, attempt: u32, jitter: u64) -> Duration {
        let doublings = attempt.saturating_sub(1).min(32);
        let full = self
            .first
            .saturating_mul(1u32 << doublings.min(31))
            .min(self.max);
        let half = full / 2;
        let spread = (full - half).as_millis() as u64;
        let extra = if spread == 0 {
            0
        } else {
            jitter % (spread + 1)
        };
        half + Duration::from_millis(extra)
    }

    /// A jitter value for `session`'s attempt: different across sessions and
    /// attempts, without a random-number crate.
    pub fn jitter(session: &str, attempt: u32) -> u64 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let mut hasher = blake3::Hasher::new();
        hasher.update(session.as_bytes());
        hasher.update(&attempt.to_le_bytes());
        hasher.update(&nanos.to_le_bytes());
        let bytes = hasher.finalize();
        u64::from_le_bytes(bytes.as_bytes()[..8].try_into().unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_and_jitter_stays_in_the_upper_half() {
        let b = Backoff {
            first: Duration::from_secs(2),
            max: Duration::from_secs(60),
        };
        let mut last_full = Duration::ZERO;
        for attempt in 1..=40 {
            let full = (Duration::from_secs(2) * 2u32.pow((attempt - 1).min(20))).min(b.max);
            assert!(full >= last_full, "never shorter after more failures");
            last_full = full;
            for jitter in [0, 1, 7, 999_999, u64::MAX, Backoff::jitter("s", attempt)] {
                let d = b.delay(attempt, jitter);
                assert!(
                    d >= full / 2 && d <= full,
                    "attempt {attempt}: {d:?} in [{:?}, {full:?}]",
                    full / 2
                );
            }
        }
        assert_eq!(b.delay(1, 0), Duration::from_secs(1));
        assert_eq!(
            b.delay(100, 30_000),
            Duration::from_secs(60),
            "the cap, at the top of its spread"
        );
        let spread: std::collections::BTreeSet<_> = (0..50)
            .map(|j| b.delay(5, Backoff::jitter(&format!("s{j}"), 5)))
            .collect();
        assert!(
            spread.len() > 10,
            "sessions failing together spread out: {spread:?}"
        );
    }
}
