//! Keeps a session's lease alive while a driver works, so a long command does not let
//! another harness take over a session that is still being driven.

use std::time::Duration;

use crate::{Lease, World};

/// Renews the lease every third of its time to live until dropped.
pub struct Heartbeat(tokio::task::JoinHandle<()>);

impl Heartbeat {
    /// Starts renewing `lease` (for `ttl` each time) in the background.
    pub fn start<W: World + Clone>(world: W, lease: Lease, ttl: Duration) -> Self {
        Heartbeat(tokio::spawn(async move {
            let mut tick = tokio::time::interval(ttl / 3);
            tick.tick().await;
            loop {
                tick.tick().await;
                if let Err(e) = world.renew_lease(&lease, ttl).await {
                    // A stale fence means another holder took over: our next append
                    // fails too, which stops the driver. Other errors are retried.
                    tracing::warn!(session = %lease.session, error = %e, "lease renewal failed");
                    if matches!(e, crate::Error::StaleFence { .. }) {
                        return;
                    }
                }
            }
        }))
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.0.abort();
    }
}
