//! The per-address request rate, as token buckets kept by each API process: it guards
//! the process itself (a flood from one address reaches one host at a time). What a
//! caller may create, upload and send is counted in the world instead
//! (`ServerState::draw`), the same for every API host of a deployment.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use steadfast_world::rate::Draw;

#[derive(Default)]
pub(crate) struct RateLimiter {
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

impl RateLimiter {
    /// Takes one token from `key`'s bucket (`per_minute` capacity, refilled
    /// continuously, by the world's rule: [`Draw::refilled`]). Returns false when the
    /// bucket is empty.
    pub(crate) fn allow(&self, key: &str, per_minute: u32) -> bool {
        let draw = Draw {
            key: key.to_string(),
            amount: 1.0,
            capacity: f64::from(per_minute.max(1)),
            window_ms: 60_000,
        };
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if buckets.len() > 100_000 {
            buckets.retain(|_, (tokens, at)| {
                *tokens < draw.capacity && now.duration_since(*at).as_secs() < 120
            });
        }
        let (tokens, at) = buckets
            .entry(draw.key.clone())
            .or_insert((draw.capacity, now));
        let elapsed_ms = now.duration_since(*at).as_millis() as u64;
        *tokens = draw.refilled(*tokens, 0, elapsed_ms);
        // Advanced by whole milliseconds only, so the fraction left counts next time.
        *at += std::time::Duration::from_millis(elapsed_ms);
        if *tokens >= draw.amount {
            *tokens -= draw.amount;
            true
        } else {
            false
        }
    }
}
