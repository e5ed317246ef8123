//! Rate buckets kept in the world: what an API server's per-caller limits count
//! against, so a caller gets the same rate from one API host as from ten (each host
//! keeping its own count would multiply every limit by the number of hosts).
//!
//! A bucket holds at most `capacity` tokens and refills continuously, `capacity` over
//! `window_ms`; a draw takes `amount` or, when the bucket holds less, nothing. A bucket
//! untouched for its whole window is full again, exactly as one that was never drawn
//! on, so old rows are pruned as if absent.

use std::sync::atomic::{AtomicU64, Ordering};

/// One draw on a rate bucket ([`crate::World::take_tokens`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Draw {
    /// The bucket: what is limited, and for whom (`create/alice`).
    pub key: String,
    /// What this draw takes (one request, or an upload's bytes).
    pub amount: f64,
    /// The most the bucket holds: the burst a caller may make at once.
    pub capacity: f64,
    /// How long an empty bucket takes to fill again, in milliseconds.
    pub window_ms: u64,
}

impl Draw {
    /// What a bucket holding `tokens` at `at_ms` holds at `now_ms`: the one refill
    /// rule, for buckets kept in the world and in a process alike.
    pub fn refilled(&self, tokens: f64, at_ms: u64, now_ms: u64) -> f64 {
        let elapsed = now_ms.saturating_sub(at_ms) as f64;
        (tokens + elapsed * self.capacity / self.window_ms.max(1) as f64).min(self.capacity)
    }
}

/// Rows untouched this long are pruned (no window is longer).
pub(crate) const PRUNE_AFTER_MS: u64 = 24 * 3600 * 1000;

/// Whether this draw should also prune old rows: one in a thousand, per process.
pub(crate) fn prune_due() -> bool {
    static DRAWS: AtomicU64 = AtomicU64::new(0);
    DRAWS.fetch_add(1, Ordering::Relaxed) % 1000 == 999
}
