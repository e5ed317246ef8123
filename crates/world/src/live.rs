//! A session's log as the process driving it holds it: the lease, and the session's
//! state folded from the log and kept current by every append made through it.
//!
//! Everything that appends while a wrapped agent runs — the gateway (exchanges, their
//! streamed text, divergences), the tool journal (tool calls, steers) — appends here,
//! and the records the world returns are applied to the state by the fold, the only
//! thing that changes session state. So what the bounds, the loop breaker and the
//! replay look at is exactly what the log says, with no copy kept "in sync" by hand.

use std::sync::Mutex as StdMutex;

use steadfast_log::{fold, Event, Record, SessionState};
use tokio::sync::Mutex;

use crate::{Error, Lease, Result, World};

/// A session's log and state under one lease. Appends are serialized (they are per
/// session in the store anyway), so records are applied in log order.
pub struct LiveSession<W> {
    world: W,
    lease: Lease,
    appending: Mutex<()>,
    state: StdMutex<SessionState>,
}

impl<W: World> LiveSession<W> {
    /// Reads and folds the session's log under `lease`.
    pub async fn open(world: W, lease: Lease) -> Result<Self> {
        let records = world.read(&lease.session, 1).await?;
        let state = fold(&records).map_err(|e| corrupt(&lease, &e))?;
        Ok(Self::with_state(world, lease, state))
    }

    /// The session under `lease` whose state, as of its last record, is `state`
    /// (loaded already, e.g. from a checkpoint by [`crate::load_state`]).
    pub fn with_state(world: W, lease: Lease, state: SessionState) -> Self {
        LiveSession {
            world,
            lease,
            appending: Mutex::new(()),
            state: StdMutex::new(state),
        }
    }

    /// The world.
    pub fn world(&self) -> &W {
        &self.world
    }

    /// The lease appends are made under.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Appends `events` at the next positions (durable when it returns) and applies the
    /// records to the state.
    pub async fn append(&self, events: &[Event]) -> Result<Vec<Record>> {
        let _in_order = self.appending.lock().await;
        let records = self.world.append(&self.lease, events).await?;
        let first = records.first().map_or(0, |r| r.seq);
        let from = self.with(|s| s.last_seq + 1);
        // Something else appended under this lease meanwhile (a call of an earlier run
        // of the agent finishing late): catch up from the log, in order.
        let mut missed = if from < first {
            self.world.read(&self.lease.session, from).await?
        } else {
            Vec::new()
        };
        missed.retain(|r| r.seq < first);
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        for record in missed.iter().chain(&records) {
            if record.seq > state.last_seq {
                state.apply(record).map_err(|e| corrupt(&self.lease, &e))?;
            }
        }
        Ok(records)
    }

    /// Looks at the state as of the last append.
    pub fn with<R>(&self, f: impl FnOnce(&SessionState) -> R) -> R {
        f(&self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// A copy of the state as of the last append.
    pub fn state(&self) -> SessionState {
        self.with(SessionState::clone)
    }
}

fn corrupt(lease: &Lease, e: &steadfast_log::FoldError) -> Error {
    Error::Corrupt {
        session: lease.session.clone(),
        seq: 0,
        detail: e.to_string(),
    }
}
