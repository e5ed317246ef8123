//! Per-session rate limits on message posts (a token bucket per session, per API
//! process).

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
        let capacity = f64::from(per_minute.max(1));
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if buckets.len() > 100_000 {
            buckets.retain(|_, (tokens, at)| {
                *tokens < capacity && now.duration_since(*at).as_secs() < 120
            });
        }
        let (tokens, at) = buckets.entry(key.to_string()).or_insert((capacity, now));
        *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * capacity / 60.0).min(capacity);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }
}
