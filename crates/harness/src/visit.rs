//! Visitors of a session's sandbox: a preview URL's requests reach the programs the
//! agent started there (a dev server, its services) without the sandbox's network
//! being opened.
//!
//! A session being driven in this process is reached through its driver's journal,
//! which starts the sandbox again if it had stopped. A session no one drives (between
//! turns, waiting for a person) has no sandbox: the first visitor wakes one. This
//! process takes the session's lease, brings the workspace to the log's last snapshot
//! as any wake does, and keeps a sandbox with the session's services started again (a
//! *visitors' hold*). The hold gives the lease back as soon as the session has work
//! (a message or a signal in its inbox, which a worker then claims), when someone asks
//! for the lease (the interrupt a close, a delete or a rewind posts first), or once no
//! visitor has used it for the sandbox's idle stop. A person in a writable shell keeps
//! it longer: work waits until they leave, and someone who asks for the lease has
//! their shells recorded and closed first (see `steadfast_journal::people`). Its only record is the one any new
//! sandbox makes, `services_restarted`.

use std::sync::Arc;
use std::time::Duration;

use steadfast_journal::reach::Reachable;
use steadfast_sandbox::Sandbox;
use steadfast_world::{Heartbeat, LiveSession, World};

use crate::harness::Harness;
use crate::{Error, Result};

/// How often a hold looks at the session's inbox (it is woken sooner by the world's
/// change notices).
const HOLD_LOOK: Duration = Duration::from_millis(500);

/// How long a visitor waits for a due turn's driver to wake the session.
const PICKED_UP_WITHIN: Duration = Duration::from_secs(10);

/// How long a hold is kept without a visitor when the harness stops idle sandboxes
/// at no time of its own.
const HOLD_IDLE_DEFAULT: Duration = Duration::from_secs(300);

/// A session's sandbox as a visitor found it.
pub struct Visit {
    /// The sandbox, through its session's journal.
    pub sandbox: Arc<dyn Reachable>,
    /// How long it took to wake, when the visit started a visitors' hold (none: a
    /// driver or a hold had it already).
    pub woke_in: Option<Duration>,
}

impl Visit {
    fn found(sandbox: Arc<dyn Reachable>) -> Self {
        Visit {
            sandbox,
            woke_in: None,
        }
    }
}

impl<W: World + Clone + 'static, S: Sandbox> Harness<W, S> {
    /// The sandbox of `session` for a visitor: its driver's in this process, or a
    /// visitors' hold this process starts (see the module's doc). Refused for an ended
    /// session, for one another process drives, and while a turn is being picked up.
    pub async fn reach(self: &Arc<Self>, session: &str) -> Result<Visit> {
        let deadline = tokio::time::Instant::now() + PICKED_UP_WITHIN;
        loop {
            if let Some(journal) = steadfast_journal::reach::find(session) {
                return Ok(Visit::found(journal));
            }
            // One hold at a time per process: a second visitor waits for the first's.
            let starting = self.holds.lock().await;
            if let Some(journal) = steadfast_journal::reach::find(session) {
                return Ok(Visit::found(journal));
            }
            let state = self.state(session).await?;
            if state.is_ended() {
                return Err(steadfast_world::Error::Ended(session.to_string()).into());
            }
            let inbox = self.world.inbox(session).await?;
            let has_work = steadfast_world::work::has_work(&state, &inbox);
            if !has_work {
                return self.start_hold(session).await;
            }
            // A turn is due: the driver that picks it up (in this process) is found
            // as soon as it has woken the session.
            drop(starting);
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::Busy(format!(
                    "session {session} has a turn that no driver in this process has picked \
                     up within {PICKED_UP_WITHIN:?}; its sandbox is reached through the host \
                     whose worker runs it"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Takes `session`'s lease for a visitors' hold and starts one (see
    /// [`Self::hold_for_visitors`]), timed.
    async fn start_hold(self: &Arc<Self>, session: &str) -> Result<Visit> {
        // A holder of its own: this process's other leases (a command-line wake, an
        // agent change) are never taken over by a hold, nor a hold by them.
        // An interrupt posted from now on asks for the lease (a close, a delete, a
        // rewind, a person's stop): the hold gives it back at once. One already in the
        // inbox asked someone before this hold, and is left to the next turn. Read
        // before the lease is taken, so none posted while the hold starts is missed.
        let asked_before = self
            .world
            .inbox(session)
            .await?
            .iter()
            .map(|i| i.id)
            .max()
            .unwrap_or(0);
        let holder =
            steadfast_world::Holder::new(format!("visitors-{}", uuid::Uuid::now_v7().simple()));
        let lease = match self
            .world
            .acquire_lease(session, &holder, self.options.lease_ttl)
            .await
        {
            Ok(lease) => lease,
            Err(steadfast_world::Error::LeaseHeld { .. }) => {
                return Err(Error::NotHere(format!(
                    "session {session} is held by another process (a worker on another host, \
                     or a command-line run): its sandbox is reached only through that host"
                )))
            }
            Err(e) => return Err(e.into()),
        };
        let started = std::time::Instant::now();
        match self.hold_for_visitors(lease.clone(), asked_before).await {
            Ok(journal) => {
                steadfast_metrics::metrics().preview_woke(started.elapsed());
                tracing::info!(
                    session,
                    ms = started.elapsed().as_millis() as u64,
                    "a visitor woke the session's sandbox"
                );
                Ok(Visit {
                    sandbox: journal,
                    woke_in: Some(started.elapsed()),
                })
            }
            Err(e) => {
                let _ = self.world.release_lease(&lease).await;
                Err(e)
            }
        }
    }

    /// Starts a visitors' hold under `lease` and returns its journal, its sandbox
    /// running with the session's services; an interrupt in the inbox after
    /// `asked_before` ends it.
    async fn hold_for_visitors(
        self: &Arc<Self>,
        lease: steadfast_world::Lease,
        asked_before: u64,
    ) -> Result<Arc<dyn Reachable>> {
        let heartbeat = Heartbeat::start(self.world.clone(), lease.clone(), self.options.lease_ttl);
        let (state, _) = self.load(&lease.session).await?;
        let adopted = self.take_over_workspace(&lease, &state).await;
        let sandbox_options = self.sandbox_options(&lease, &state, &heartbeat).await?;
        let state = self.adopt_outside_edits(&lease, state).await?;
        let workspace = self.workspace_at_wake(&state, adopted).await?;
        let live = Arc::new(LiveSession::with_state(
            self.world.clone(),
            lease.clone(),
            state,
        ));
        live.fence(heartbeat.watch());
        let journal = Arc::new(
            self.tools_journal(live, workspace, sandbox_options, None)
                .for_visitors(),
        );
        journal.reachable();
        let reach: Arc<dyn Reachable> = journal.clone();
        // Started now, so the first visitor's wait is the whole wake.
        reach.ports().await?;
        let idle = self.options.sandbox_idle_stop.unwrap_or(HOLD_IDLE_DEFAULT);
        let harness = Arc::clone(self);
        tokio::spawn(async move {
            let watch = heartbeat.watch();
            let mut changes = harness.world.changes();
            let mut people_in = journal.people_watch();
            let mut asked = false;
            let why = loop {
                tokio::select! {
                    _ = changes.changed() => {}
                    _ = people_in.changed() => {}
                    _ = tokio::time::sleep(HOLD_LOOK) => {}
                    () = watch.lost() => break "its lease was lost",
                }
                let inbox = harness.world.inbox(&lease.session).await;
                asked = asked
                    || inbox.as_ref().is_ok_and(|inbox| {
                        inbox.iter().any(|i| {
                            i.id > asked_before && steadfast_world::interrupt::is_interrupt(i)
                        })
                    });
                // People in shells keep the lease (work waits for them) until someone
                // asks for it: then their shells are recorded and closed first.
                if journal.people() > 0 {
                    if asked {
                        journal.ask_people_to_leave();
                    }
                    continue;
                }
                if asked {
                    break "someone asked for its lease";
                }
                if journal
                    .sandbox()
                    .unused_for()
                    .await
                    .is_none_or(|unused| unused >= idle)
                {
                    break "no visitor used it";
                }
                let work = inbox.map(|inbox| {
                    journal
                        .live()
                        .with(|state| steadfast_world::work::has_work(state, &inbox))
                });
                match work {
                    Ok(true) => break "the session has work for a worker",
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(session = %lease.session, error = %e, "a visitors' hold could not read the inbox");
                        break "its inbox could not be read";
                    }
                }
            };
            tracing::info!(session = %lease.session, why, "the visitors' hold ends");
            journal.close().await;
            drop(journal);
            drop(heartbeat);
            if let Err(e) = harness.world.release_lease(&lease).await {
                tracing::debug!(session = %lease.session, error = %e, "a visitors' hold could not give its lease back");
            }
        });
        Ok(reach)
    }
}
