//! The per-address request rate, as token buckets kept by each API process: it guards
//! the process itself (a flood from one address reaches one host at a time). What a
//! caller may create, upload and send is counted in the world instead
//! (`ServerState::draw`), the same for every API host of a deployment.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

#[derive(Default)]
pub(crate) struct RateLimiter {
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

impl RateLimiter {
    /// Takes one token from `key`'s bucket (`per_minute` capacity, refilled
    /// continuously). Returns false when the bucket is empty.
    pub(crate) fn allow(&self, key: &str, per_minute: u32) -> bool {
        self.take(key, 1.0, f64::from(per_minute.max(1)), 60.0)
    }

    /// Takes `amount` from `key`'s bucket, which holds `capacity` and refills it over
    /// `window_secs`; false (taking nothing) when it holds less than `amount`.
    pub(crate) fn take(&self, key: &str, amount: f64, capacity: f64, window_secs: f64) -> bool {
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if buckets.len() > 100_000 {
            buckets.retain(|_, (tokens, at)| {
                *tokens < capacity && now.duration_since(*at).as_secs() < 120
            });
        }
        let (tokens, at) = buckets.entry(key.to_string()).or_insert((capacity, now));
        *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * capacity / window_secs)
            .min(capacity);
        *at = now;
        if *tokens >= amount {
            *tokens -= amount;
            true
        } else {
            false
        }
    }
}
