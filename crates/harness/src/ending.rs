//! Stopping, closing and deleting sessions, for the API and the CLI alike: a session
//! being driven is interrupted first, wherever its driver runs, and the lease taken
//! once the driver lets go, so no turn is cut off without a record.

use std::time::{Duration, Instant};

use steadfast_log::{EndState, Event, Output, SessionState};
use steadfast_sandbox::Sandbox;
use steadfast_world::{Holder, InboundKind, Lease, World};

use crate::harness::Harness;
use crate::Result;

/// How long closing or deleting a running session waits for its interrupt to land.
pub const STOP_WAIT: Duration = Duration::from_secs(15);

impl<W: World + Clone, S: Sandbox> Harness<W, S> {
    /// Asks whoever drives `session` to stop its turn at once, on behalf of `by`
    /// (recorded in the log). Returns the inbox entry.
    pub async fn interrupt(&self, session: &str, by: &str) -> Result<u64> {
        Ok(self
            .world()
            .post(
                session,
                InboundKind::Signal,
                steadfast_log::INTERRUPT_SIGNAL,
                &serde_json::json!({ "by": by }),
            )
            .await?)
    }

    /// The session's lease for `ttl`. A session being driven is interrupted first (by
    /// `by`), and its lease taken once its driver lets go, within [`STOP_WAIT`].
    pub async fn lease_stopping(&self, session: &str, by: &str, ttl: Duration) -> Result<Lease> {
        let holder = Holder::new(format!("stop-{}", uuid::Uuid::now_v7().simple()));
        let deadline = Instant::now() + STOP_WAIT;
        let mut interrupted = false;
        loop {
            match self.world().acquire_lease(session, &holder, ttl).await {
                Ok(lease) => return Ok(lease),
                Err(steadfast_world::Error::LeaseHeld { .. }) if Instant::now() < deadline => {
                    if !interrupted {
                        self.interrupt(session, by).await?;
                        interrupted = true;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Ends the session as completed ("closed by `by`"), interrupting a running turn
    /// first. Closing an ended session changes nothing.
    pub async fn close_session(&self, session: &str, by: &str) -> Result<()> {
        let lease = self
            .lease_stopping(session, by, Duration::from_secs(10))
            .await?;
        let state = self.state(session).await?;
        let ended = if state.is_ended() {
            Ok(Vec::new())
        } else {
            let closed = Event::SessionEnded {
                state: EndState::Completed,
                reason: format!("closed by {by}"),
                diff: Vec::new(),
            };
            self.world().append(&lease, &[closed]).await
        };
        self.world().release_lease(&lease).await?;
        ended?;
        Ok(())
    }

    /// Removes the session, interrupting a running turn first: its log, inbox,
    /// summary and the big outputs only it refers to. Returns its last state (the
    /// caller may own its workspace).
    pub async fn delete_session(&self, session: &str, by: &str) -> Result<SessionState> {
        // Holding the lease keeps workers off the session while it goes.
        self.lease_stopping(session, by, Duration::from_secs(30))
            .await?;
        let state = self.state(session).await?;
        let records = self.world().read(session, 1).await?;
        for record in &records {
            if let Event::ToolCallOutcome {
                output: Output::Blob(b),
                ..
            } = &record.event
            {
                if let Err(e) = self.blobs().delete(&b.hash).await {
                    tracing::warn!(session, blob = %b.hash, error = %e, "could not delete a blob");
                }
            }
        }
        self.world().delete_session(session).await?;
        Ok(state)
    }
}
