//! Controlling sessions from outside, for the API and the CLI alike: signals that
//! answer only the wait they are meant for; stopping, closing and deleting, where a
//! session being driven is interrupted first, wherever its driver runs, and the lease
//! taken once the driver lets go, so no turn is cut off without a record.

use std::time::{Duration, Instant};

use steadfast_log::{EndState, Event, SessionState};
use steadfast_sandbox::Sandbox;
use steadfast_world::{Holder, InboundKind, Lease, World};

use crate::harness::Harness;
use crate::{Error, Result};

/// How long closing or deleting a running session waits for its interrupt to land.
pub const STOP_WAIT: Duration = Duration::from_secs(15);

/// Which wait a signal is for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SignalTarget {
    /// Queue it for a wait on its name that has not begun yet.
    pub queue: bool,
    /// The log position of the wait it answers (refused if that wait is over).
    pub wait: Option<u64>,
}

impl<W: World + Clone, S: Sandbox> Harness<W, S> {
    /// Delivers signal `name` to `session`. A signal answers the wait in progress: one
    /// sent while nothing waits for it would sit in the inbox and answer some later
    /// wait no one has seen (a stale approval approving a call nobody was asked
    /// about), so it is refused ([`Error::NotWaiting`]) unless `target.queue`; one
    /// naming a wait that is over is refused too. Returns the inbox entry and the
    /// position of the wait it answers.
    pub async fn signal(
        &self,
        session: &str,
        name: &str,
        payload: &serde_json::Value,
        target: SignalTarget,
    ) -> Result<(u64, Option<u64>)> {
        if name == steadfast_log::INTERRUPT_SIGNAL {
            return Err(Error::Invalid(
                "name: `interrupt` is reserved; interrupt the session to stop a turn".into(),
            ));
        }
        // A compaction is asked for whenever; it answers no wait.
        let target = if name == steadfast_log::COMPACT_SIGNAL {
            if target.wait.is_some() {
                return Err(Error::Invalid(
                    "`compact` answers no wait, so it cannot name one".into(),
                ));
            }
            SignalTarget {
                queue: true,
                ..target
            }
        } else {
            target
        };
        if target.queue && target.wait.is_some() {
            return Err(Error::Invalid(
                "a queued signal answers a wait that has not begun, so it cannot name one".into(),
            ));
        }
        let mut answers = None;
        if !target.queue {
            let state = self.state(session).await?;
            let waiting = state.waiting();
            let refuse = |now: String| {
                Err(Error::NotWaiting(format!(
                    "session {session} {now}; `{name}` would answer a later wait no one has \
                     seen. Queue it (?queue=true, --queue) for the next wait on `{name}`"
                )))
            };
            match (waiting, target.wait) {
                (Some(w), Some(asked)) if w.seq != asked => {
                    return refuse(format!(
                        "no longer waits at #{asked}: it now waits at #{} for `{}`",
                        w.seq, w.name
                    ))
                }
                (Some(w), _) if w.name != name => {
                    return refuse(format!("waits for the signal `{}`", w.name))
                }
                (Some(w), _) => answers = Some(w.seq),
                (None, Some(asked)) => {
                    return refuse(format!(
                        "no longer waits at #{asked} (it is {} and waits for no signal)",
                        state.phase.status()
                    ))
                }
                (None, None) => {
                    return refuse(format!(
                        "is {} and waits for no signal",
                        state.phase.status()
                    ))
                }
            }
        }
        let id = self
            .world()
            .post(session, InboundKind::Signal, name, payload)
            .await?;
        Ok((id, answers))
    }

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

    /// Ends the session as closed ("closed by `by`": a person ended it, whether or not
    /// its work was done), interrupting a running turn first. Closing an ended session
    /// changes nothing. Returns how it ended.
    pub async fn close_session(&self, session: &str, by: &str) -> Result<steadfast_log::Status> {
        let lease = self
            .lease_stopping(session, by, Duration::from_secs(10))
            .await?;
        let state = self.state(session).await?;
        let status = if state.is_ended() {
            state.phase.status()
        } else {
            steadfast_log::Status::Closed
        };
        let ended = if state.is_ended() {
            Ok(Vec::new())
        } else {
            let reason = format!("closed by {by}");
            let closed = Event::SessionEnded {
                state: EndState::Closed,
                reason: reason.clone(),
                diff: Vec::new(),
            };
            match steadfast_journal::explore::ending(self.world(), session, &state, &reason).await {
                Ok(()) => self.world().append(&lease, &[closed]).await,
                Err(e) => Err(e),
            }
        };
        self.world().release_lease(&lease).await?;
        ended?;
        Ok(status)
    }

    /// Removes the session, interrupting a running turn first: its log, inbox and
    /// summary. Its big outputs and snapshots are shared by content with any session
    /// (of any owner) that produced the same bytes, so they are not deleted here:
    /// `steadfast gc` reclaims what no remaining log refers to. Returns its last state
    /// (the caller may own its workspace).
    pub async fn delete_session(&self, session: &str, by: &str) -> Result<SessionState> {
        // Holding the lease keeps workers off the session while it goes.
        self.lease_stopping(session, by, Duration::from_secs(30))
            .await?;
        let state = self.state(session).await?;
        let why = format!("deleted by {by}");
        steadfast_journal::explore::ending(self.world(), session, &state, &why).await?;
        self.world().delete_session(session).await?;
        Ok(state)
    }

    /// Moves a wrapped session to another CLI version or named agent (`spec`:
    /// `claude-code@2.1.332`, `reviewer`), between turns, recorded
    /// ([`Event::AgentChanged`]): its next turn runs that CLI, on a host that has it.
    /// A named agent brings its instructions; the same agent at another version keeps
    /// the session's. Refused for a native session, inside a turn, and for a model the
    /// CLI cannot speak. Returns the agent and the CLI (`package@version`).
    pub async fn change_agent(&self, session: &str, spec: &str) -> Result<(String, String)> {
        let lease = match self
            .world()
            .acquire_lease(session, &self.holder, self.options.lease_ttl)
            .await
        {
            Err(steadfast_world::Error::LeaseHeld { .. }) => {
                return Err(Error::Invalid(format!(
                    "agent: session {session} is in a turn; change its agent between turns"
                )))
            }
            other => other?,
        };
        let changed = self.change_agent_leased(&lease, spec).await;
        let _ = self.world().release_lease(&lease).await;
        changed
    }

    async fn change_agent_leased(&self, lease: &Lease, spec: &str) -> Result<(String, String)> {
        let state = self.state(&lease.session).await?;
        if !state.is_wrapped() {
            return Err(Error::Invalid(
                "agent: the session runs the native loop; only a wrapped CLI's changes".into(),
            ));
        }
        if state.is_ended() || state.phase.status() != steadfast_log::Status::Idle {
            return Err(Error::Invalid(format!(
                "agent: session {} is {}; change its agent between turns",
                lease.session,
                state.phase.status()
            )));
        }
        let (name, version) = match spec.split_once('@') {
            Some((name, version)) => (name, Some(version)),
            None => (spec, None),
        };
        if steadfast_log::agent::is_native(name) {
            return Err(Error::Invalid(
                "agent: a wrapped session cannot become the native loop's".into(),
            ));
        }
        let adapter = self
            .adapter(name)
            .map_err(|e| Error::Invalid(format!("agent: {e}")))?
            .at_version(version)
            .map_err(|e| Error::Invalid(format!("agent: {e}")))?;
        adapter
            .api_for(&state.model.provider)
            .map_err(|e| Error::Invalid(format!("agent: {e}")))?;
        let cli = format!("{}@{}", adapter.package, adapter.version);
        let instructions = match self.options.agents.named_agent(name) {
            Some(_) => self.options.agents.instructions_for(name),
            None if state.agent == name => state.instructions.clone(),
            None => None,
        };
        if state.agent == name
            && state.agent_cli.as_deref() == Some(cli.as_str())
            && state.instructions == instructions
        {
            return Ok((name.to_string(), cli));
        }
        let event = Event::AgentChanged {
            agent: name.into(),
            cli: cli.clone(),
            instructions,
        };
        self.world().append(lease, &[event]).await?;
        Ok((name.to_string(), cli))
    }
}
