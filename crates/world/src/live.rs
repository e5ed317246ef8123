//! A session's log as the process driving it holds it: the lease, and the session's
//! state folded from the log and kept current by every append made through it.
//!
//! Everything that appends while a session runs — the native loop (model calls,
//! turns), the tool journal (tool calls, steers, what the egress proxy saw), a wrapped
//! agent's driver (turns, waits, crash resolutions) and gateway (exchanges, their
//! streamed text, divergences) — appends
//! here, and the records the world returns are applied to the state by the fold, the
//! only thing that changes session state. So what the bounds, the loop breaker and
//! the replay look at is exactly what the log says, with no copy kept "in sync" by
//! hand.
//!
//! **Staged records.** A short step (a read that took a few milliseconds) need not
//! pay a commit of its own: [`LiveSession::stage`] folds an event into the state now
//! and the next append commits it first, in the same write. Until then the state is
//! ahead of the log by the staged records; if that append fails the session is out
//! of step and takes no more appends (waking it again carries on from the log, where
//! the staged step simply did not happen).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex as StdMutex, MutexGuard};

use steadfast_fault::{point, points};
use steadfast_log::{fold, Event, Record, SessionState};
use tokio::sync::Mutex;

use crate::{Error, Lease, LeaseWatch, Result, World};

/// Told of every record appended through a [`LiveSession`], in log order (a
/// progress display, a test).
pub type Observer = Box<dyn FnMut(&Record) + Send>;

/// A session's log and state under one lease. Appends are serialized (they are per
/// session in the store anyway), so records are applied in log order.
pub struct LiveSession<W> {
    world: W,
    lease: Lease,
    /// Held for each append (and each stage): one writer of the log at a time.
    appending: Mutex<()>,
    state: StdMutex<SessionState>,
    /// Events folded into the state but not yet in the log: the next append commits
    /// them first.
    staged: StdMutex<Vec<Event>>,
    /// An append failed with records staged: nothing more is appended.
    out_of_step: AtomicBool,
    observer: StdMutex<Option<Observer>>,
    /// The lease's heartbeat, once fenced by it ([`LiveSession::fence`]).
    fence: std::sync::OnceLock<LeaseWatch>,
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
            staged: StdMutex::new(Vec::new()),
            out_of_step: AtomicBool::new(false),
            observer: StdMutex::new(None),
            fence: std::sync::OnceLock::new(),
        }
    }

    /// Appends nothing more once `watch` says the lease is lost (the driver's
    /// [`crate::Heartbeat`]): a holder that cannot vouch for its lease must not record
    /// a call it could not see through.
    pub fn fence(&self, watch: LeaseWatch) {
        let _ = self.fence.set(watch);
    }

    /// Resolves once the lease is lost (never, for a session not fenced by a
    /// heartbeat): what runs under the lease stops then.
    pub async fn lease_lost(&self) {
        match self.fence.get() {
            Some(watch) => watch.lost().await,
            None => std::future::pending().await,
        }
    }

    /// [`Error::LeaseLost`] if the lease is lost: checked before every append, and
    /// before anything else that must not happen under a lost lease (restoring the
    /// workspace, which another holder may be driving already).
    pub fn ensure_lease(&self) -> Result<()> {
        match self.fence.get() {
            Some(watch) if watch.is_lost() => Err(Error::LeaseLost(self.lease.session.clone())),
            _ => Ok(()),
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

    /// Tells `observer` of every record committed from now on.
    pub fn observe(&self, observer: Observer) {
        *self.observer.lock().unwrap_or_else(|e| e.into_inner()) = Some(observer);
    }

    /// Appends `events` at the next positions, after any staged ones in the same
    /// commit (durable when it returns), and applies them to the state. Returns every
    /// record committed, the staged ones first.
    pub async fn append(&self, events: &[Event]) -> Result<Vec<Record>> {
        let _in_order = self.appending.lock().await;
        if self.out_of_step.load(Ordering::SeqCst) {
            return Err(Error::OutOfStep(self.lease.session.clone()));
        }
        self.ensure_lease()?;
        let staged = std::mem::take(&mut *lock(&self.staged));
        let held = staged.len();
        let appended = if held == 0 {
            self.world.append(&self.lease, events).await
        } else {
            let all: Vec<Event> = staged.into_iter().chain(events.iter().cloned()).collect();
            self.world.append(&self.lease, &all).await
        };
        let records = match appended {
            Ok(records) => records,
            Err(e) => {
                if held > 0 {
                    self.out_of_step.store(true, Ordering::SeqCst);
                }
                return Err(e);
            }
        };
        let first = records.first().map_or(0, |r| r.seq);
        // Where the log's own records end (the state is ahead by what was staged).
        let from = self.with(|s| s.last_seq + 1) - held as u64;
        if held > 0 && first != from {
            // Something else appended under this lease while records were staged:
            // they were folded at positions the log gave to others.
            self.out_of_step.store(true, Ordering::SeqCst);
            return Err(Error::OutOfStep(self.lease.session.clone()));
        }
        // Something else appended under this lease meanwhile (a call of an earlier run
        // of the agent finishing late): catch up from the log, in order.
        let mut missed = if from < first {
            self.world.read(&self.lease.session, from).await?
        } else {
            Vec::new()
        };
        missed.retain(|r| r.seq < first);
        {
            let mut state = lock(&self.state);
            for record in missed.iter().chain(&records[held..]) {
                if record.seq > state.last_seq {
                    state.apply(record).map_err(|e| corrupt(&self.lease, &e))?;
                }
            }
        }
        // The staged records are committed only now: their fault points are passed here.
        for record in &records[..held] {
            match record.event {
                Event::ModelCallOutcome { .. } => point(points::MODEL_OUTCOME),
                Event::ToolCallIntent { .. } => point(points::TOOL_INTENT),
                Event::ToolCallOutcome { .. } => point(points::TOOL_OUTCOME),
                _ => {}
            }
        }
        if let Some(observer) = lock(&self.observer).as_mut() {
            for record in missed.iter().chain(&records) {
                observer(record);
            }
        }
        Ok(records)
    }

    /// Folds `event` into the state now, at the position after the last, and commits
    /// it with the next append (see the module's doc).
    pub async fn stage(&self, event: Event) -> Result<()> {
        let _in_order = self.appending.lock().await;
        if self.out_of_step.load(Ordering::SeqCst) {
            return Err(Error::OutOfStep(self.lease.session.clone()));
        }
        self.ensure_lease()?;
        let mut state = lock(&self.state);
        let record = Record {
            seq: state.last_seq + 1,
            epoch: self.lease.epoch,
            at_ms: now_ms(),
            event,
        };
        state.apply(&record).map_err(|e| corrupt(&self.lease, &e))?;
        lock(&self.staged).push(record.event);
        Ok(())
    }

    /// Commits what is staged, if anything is.
    pub async fn commit_staged(&self) -> Result<()> {
        if lock(&self.staged).is_empty() {
            return Ok(());
        }
        self.append(&[]).await.map(drop)
    }

    /// Whether an append failed with records staged (see the module's doc).
    pub fn is_out_of_step(&self) -> bool {
        self.out_of_step.load(Ordering::SeqCst)
    }

    /// Looks at the state as of the last append (or stage).
    pub fn with<R>(&self, f: impl FnOnce(&SessionState) -> R) -> R {
        f(&lock(&self.state))
    }

    /// The state as of the last append (or stage), held until the guard is dropped:
    /// never across an await (an append waits for it).
    pub fn lock(&self) -> MutexGuard<'_, SessionState> {
        lock(&self.state)
    }

    /// A copy of the state as of the last append.
    pub fn state(&self) -> SessionState {
        self.with(SessionState::clone)
    }
}

fn lock<T>(m: &StdMutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn corrupt(lease: &Lease, e: &steadfast_log::FoldError) -> Error {
    Error::Corrupt {
        session: lease.session.clone(),
        seq: 0,
        detail: e.to_string(),
    }
}
