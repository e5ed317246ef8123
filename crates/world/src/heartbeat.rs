//! Keeps a session's lease alive while a driver works, so a long command does not let
//! another harness take over a session that is still being driven; and says when the
//! driver can no longer count on it.
//!
//! **Self-fencing.** A lease renewed by a request sent at `t` is its holder's until at
//! least `t + ttl`: no other holder can take it before. A holder that cannot renew
//! must have stopped everything it started by then, or the next holder, restoring the
//! workspace, would find one of its commands still writing into it (and the model,
//! told the call was rolled back, would run it again: its effect twice). So the
//! heartbeat renews every third of the time to live, tries again at once after a
//! failure, and declares the lease **lost** — for good — when a renewal finds another
//! holder, or when none has succeeded for all but a quarter of the time to live. A
//! [`LeaseWatch`] tells whoever runs commands under the lease (the tool journal kills
//! them; a [`crate::LiveSession`] fenced by it appends nothing more), well before
//! anyone else may take the session over.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::{Lease, World};

/// Renews a lease in the background until dropped; see the module's doc.
pub struct Heartbeat {
    task: tokio::task::JoinHandle<()>,
    watch: LeaseWatch,
}

/// Whether a [`Heartbeat`]'s lease is lost: cheap to clone, for everything that must
/// stop when it is.
#[derive(Debug, Clone)]
pub struct LeaseWatch {
    lost: tokio::sync::watch::Receiver<bool>,
    /// Until when the lease is surely held (the last renewal's send time, plus all but
    /// the margin of the time to live): read directly, so a process that was stopped
    /// knows at once, whatever its heartbeat task has yet to notice.
    until: Arc<StdMutex<Instant>>,
}

impl Heartbeat {
    /// Starts renewing `lease` (for `ttl` each time) in the background, the first time
    /// at once. Start it as soon as the lease is taken: until it has renewed once,
    /// the lease is counted from now.
    pub fn start<W: World + Clone>(world: W, lease: Lease, ttl: Duration) -> Self {
        let (lost, watch) = tokio::sync::watch::channel(false);
        let until = Arc::new(StdMutex::new(Instant::now() + ttl - ttl / 4));
        let confirmed = until.clone();
        let task = tokio::spawn(async move {
            match keep(&world, &lease, ttl, &confirmed).await {
                Err(crate::Error::Ended(_)) => {
                    tracing::debug!(session = %lease.session, "the session has ended: its lease is not renewed")
                }
                Err(why) => {
                    tracing::error!(session = %lease.session, epoch = lease.epoch, "lease lost: {why}; this driver stops and its commands are killed")
                }
                Ok(never) => match never {},
            }
            lost.send_replace(true);
        });
        Heartbeat {
            task,
            watch: LeaseWatch { lost: watch, until },
        }
    }

    /// A watch on the lease.
    pub fn watch(&self) -> LeaseWatch {
        self.watch.clone()
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LeaseWatch {
    /// Whether the lease is lost, or past when it was surely held.
    pub fn is_lost(&self) -> bool {
        *self.lost.borrow()
            || Instant::now() >= *self.until.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How much longer the lease is surely held: nothing once it is lost. What a
    /// sandbox that outlives its holder is told, so that it ends itself (and whatever
    /// runs in it) before anyone else may take the session over.
    pub fn held_for(&self) -> Duration {
        if *self.lost.borrow() {
            return Duration::ZERO;
        }
        let until = *self.until.lock().unwrap_or_else(|e| e.into_inner());
        until.saturating_duration_since(Instant::now())
    }

    /// Resolves once the lease is lost (never, if it is kept until the heartbeat is
    /// dropped).
    pub async fn lost(&self) {
        let mut rx = self.lost.clone();
        if rx.wait_for(|lost| *lost).await.is_err() {
            // The heartbeat was dropped with the lease still held: nothing is lost.
            std::future::pending::<()>().await;
        }
    }
}

/// Renews `lease` until it cannot vouch for it any more; returns why.
async fn keep<W: World>(
    world: &W,
    lease: &Lease,
    ttl: Duration,
    until: &StdMutex<Instant>,
) -> Result<std::convert::Infallible, crate::Error> {
    let margin = ttl / 4;
    let mut confirmed = Instant::now();
    let mut next = Instant::now();
    loop {
        let deadline = confirmed + ttl - margin;
        tokio::time::sleep_until(next.min(deadline)).await;
        let sent = Instant::now();
        match tokio::time::timeout_at(deadline, world.renew_lease(lease, ttl)).await {
            Ok(Ok(())) => {
                confirmed = sent;
                *until.lock().unwrap_or_else(|e| e.into_inner()) = sent + ttl - margin;
                next = sent + ttl / 3;
            }
            Ok(Err(e @ (crate::Error::StaleFence { .. } | crate::Error::Ended(_)))) => {
                return Err(e)
            }
            Ok(Err(e)) => {
                tracing::warn!(session = %lease.session, error = %e, "lease renewal failed; trying again");
                next = Instant::now() + (ttl / 20).max(Duration::from_millis(50));
            }
            // No renewal succeeded for all but the margin of the time to live.
            Err(_) => return Err(crate::Error::LeaseLost(lease.session.clone())),
        }
    }
}
