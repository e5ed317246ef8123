//! Workers: take turns from the world's queue and drive them.
//!
//! A worker claims a session that needs driving (a turn left running by a dead
//! worker, a queued message, an awaited signal), wakes it, drives it until it is idle,
//! waiting or ended, and gives the lease back. A worker that dies loses its lease
//! (at once if it was on this host, else when the lease lapses) and another worker
//! carries on from the log.

use std::time::Duration;

use steadfast_sandbox::Sandbox;
use steadfast_world::{Holder, World};

use crate::harness::Harness;
use tracing::Instrument;

/// How long a session is held back when its failure cannot even be recorded (the
/// world itself failing), or when it needs a CLI another host has.
const COOL_DOWN: Duration = Duration::from_secs(5);
/// How soon an idle worker looks for work again unprompted; it backs off from this
/// to [`IDLE_MOST`] while nothing happens. Work is announced ([`World::changes`],
/// [`World::due`]), so these looks only catch what a world cannot announce.
const POLL: Duration = Duration::from_millis(200);
/// The longest an idle worker goes without looking at the queue.
const IDLE_MOST: Duration = Duration::from_secs(2);

impl<W: World + Clone, S: Sandbox> Harness<W, S> {
    /// Runs one worker until `shutdown` turns true. Each worker has its own lease
    /// identity, so several can run in one process.
    pub async fn work(&self, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let holder = Holder::new(format!("worker-{}", uuid::Uuid::now_v7().simple()));
        let mut changes = self.world.changes();
        let mut due = self.world.due();
        let mut idle = POLL;
        while !*shutdown.borrow() {
            let started = std::time::Instant::now();
            let claimed = self.world.claim(&holder, self.options.lease_ttl).await;
            steadfast_metrics::metrics().claimed(started.elapsed());
            match claimed {
                Ok(Some(lease)) => {
                    idle = POLL;
                    self.drive_claimed(lease, shutdown.clone()).await;
                }
                Ok(None) => {
                    tokio::select! {
                        _ = changes.changed() => idle = POLL,
                        _ = due.changed() => idle = POLL,
                        _ = tokio::time::sleep(idle) => idle = (idle * 2).min(IDLE_MOST),
                        _ = shutdown.changed() => {}
                    }
                }
                Err(e) => {
                    tracing::warn!(worker = %holder.id, error = %e, "claiming a turn failed");
                    tokio::time::sleep(POLL * 5).await;
                }
            }
        }
    }

    async fn drive_claimed(
        &self,
        lease: steadfast_world::Lease,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) {
        let span = tracing::info_span!("drive", session = %lease.session, epoch = lease.epoch);
        self.drive_claimed_inner(lease, shutdown)
            .instrument(span)
            .await
    }

    async fn drive_claimed_inner(
        &self,
        lease: steadfast_world::Lease,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut driver = match self.wake_leased(lease.clone()).await {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(session = %lease.session, error = %e, "waking the session failed");
                self.after_failure(&lease, &e).await;
                return;
            }
        };
        // Stopping, what is being paid for (a model reply streaming in, a command)
        // may finish and be recorded within the grace.
        let grace = self.options.stop_grace;
        let mut left = false;
        let ran = tokio::select! {
            ran = driver.run_until(shutdown.clone()) => ran,
            () = async {
                let _ = shutdown.wait_for(|stop| *stop).await;
                tokio::time::sleep(grace).await;
            } => {
                // Out of time: the step in hand is left as a crash leaves it, for the
                // next holder. Its command runs on in the session's sandbox, which the
                // next worker on this machine adopts and waits for; the lease is not
                // given back, so no other machine resolves the call before the sandbox
                // has ended itself (it lapses at once for this machine's workers, once
                // this process is gone).
                tracing::info!(session = %lease.session, "worker stopping; the step in hand is left to the next worker on this machine");
                left = true;
                Ok(None)
            }
        };
        if left {
            steadfast_sandbox::leave_running();
            drop(driver);
            return;
        }
        match ran {
            Ok(None) => {
                // What is held for the next commit goes in, and the lease is given
                // back so another worker carries on at once.
                tracing::info!(session = %lease.session, "worker stopping; handing the session back");
                if let Err(e) = driver.release().await {
                    tracing::warn!(session = %lease.session, error = %e, "handing the session back failed");
                }
            }
            Ok(Some(stop)) => {
                tracing::info!(session = %lease.session, ?stop, "session stopped");
                let _ = driver.release().await;
            }
            Err(e) => {
                tracing::error!(session = %lease.session, error = %e, retryable = e.is_retryable(), "driving the session failed");
                drop(driver);
                self.after_failure(&lease, &e).await;
            }
        }
    }

    /// A failure is a state, not a loop: one that retrying cannot fix (a model that
    /// cannot be called from anywhere, a log that does not fold) ends the session as
    /// failed, with the reason in its log; a retryable one is recorded with the time
    /// of the next attempt (backing off, with jitter), and the lease is given back:
    /// no worker takes the session before then.
    #[tracing::instrument(level = "debug", skip_all, fields(session = %lease.session))]
    async fn after_failure(&self, lease: &steadfast_world::Lease, e: &crate::Error) {
        if e.is_lease_lost() {
            // Not this worker's to record: the session is whoever's takes the lease
            // next (this worker's too, once it lapses).
            return;
        }
        let not_here = match e {
            crate::Error::NotHere(why) => Some(why.clone()),
            // A snapshot object this host cannot read (its store is not the shared
            // one, or its cached copy is damaged) may be readable from another host:
            // the session is left to them, said in its log, never ended for it.
            crate::Error::Drive(
                d @ (steadfast_drive::Error::NotFound(_) | steadfast_drive::Error::Corrupt(_)),
            ) => Some(format!("its workspace cannot be rebuilt here: {d}")),
            _ => None,
        };
        if let Some(why) = not_here {
            // Another host may have the CLI: hold this host's workers back only, and
            // say once, in the log, why this host leaves it (else the session looks
            // idle with nothing to tell a person that no worker can run it).
            self.say_not_here(lease, &why).await;
            return self.cool_down(lease).await;
        }
        let state = self.state(&lease.session).await.ok();
        let attempt = state.as_ref().map_or(1, |s| s.failures_in_row + 1);
        let reason = format!("the session cannot be driven: {e}");
        let mut events = Vec::new();
        let retry_at_ms = e.is_retryable().then(|| {
            let delay = self
                .options
                .retry_backoff
                .delay(attempt, crate::Backoff::jitter(&lease.session, attempt));
            steadfast_world::now_ms() + delay.as_millis() as u64
        });
        events.push(steadfast_log::Event::DriveFailed {
            reason: reason.clone(),
            attempt,
            retry_at_ms,
        });
        if retry_at_ms.is_none() {
            if let Some(state) = &state {
                if let Err(e) =
                    steadfast_journal::explore::ending(&self.world, &lease.session, state, &reason)
                        .await
                {
                    tracing::warn!(error = %e, "an explorer's parent could not be told it failed");
                }
            }
            events.push(steadfast_log::Event::SessionEnded {
                state: steadfast_log::EndState::Failed,
                reason,
                diff: Vec::new(),
            });
        }
        match self.world.append(lease, &events).await {
            Ok(_) => {
                match retry_at_ms {
                    Some(at) => tracing::warn!(
                        session = %lease.session, error = %e, attempt,
                        retry_in_ms = at.saturating_sub(steadfast_world::now_ms()),
                        "driving failed; retrying later"
                    ),
                    None => {
                        tracing::warn!(session = %lease.session, error = %e, "session ended as failed")
                    }
                }
                let _ = self.world.release_lease(lease).await;
            }
            Err(append) => {
                tracing::error!(session = %lease.session, error = %append, "could not record the failure");
                self.cool_down(lease).await;
            }
        }
    }

    /// Records why this host leaves the session (a `drive_failed` any host may retry at
    /// once), unless the log says so already.
    async fn say_not_here(&self, lease: &steadfast_world::Lease, why: &str) {
        let reason = format!("this host cannot drive the session: {why}");
        let Ok(state) = self.state(&lease.session).await else {
            return;
        };
        if state.retry.as_ref().is_some_and(|r| r.reason == reason) {
            return;
        }
        let event = steadfast_log::Event::DriveFailed {
            reason,
            attempt: state.failures_in_row + 1,
            retry_at_ms: Some(steadfast_world::now_ms()),
        };
        if let Err(e) = self.world.append(lease, &[event]).await {
            tracing::debug!(session = %lease.session, error = %e, "could not record why this host leaves the session");
        }
    }

    /// Keeps a failing session's lease for a while, so no worker retries it at once.
    async fn cool_down(&self, lease: &steadfast_world::Lease) {
        if let Err(e) = self.world.renew_lease(lease, COOL_DOWN).await {
            tracing::debug!(session = %lease.session, error = %e, "could not hold the failing session back");
        }
    }
}
