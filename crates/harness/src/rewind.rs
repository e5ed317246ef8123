//! Rewinding a session in place: it carries on from an earlier turn's end, with its
//! workspace as it was there and the model's context the history up to there. What
//! followed is set aside, never deleted: a fork taken at its last record holds it
//! whole. Effects that left the workspace (a push, a request) cannot be undone; they
//! stay facts, and the model is told of them.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use steadfast_log::{Event, Record, Status, ToolClass, ToolResolution};
use steadfast_world::{Rewind, World};

use crate::fork::ForkRequest;
use crate::harness::Harness;
use crate::{Error, Result};

/// What a rewind did.
#[derive(Debug, Clone, PartialEq)]
pub struct RewindReport {
    /// The position the session went back to.
    pub to: u64,
    /// The fork that holds the records set aside.
    pub branch: String,
    /// The external effects they recorded, which still stand.
    pub facts: Vec<String>,
    /// The session's status now.
    pub status: Status,
}

/// The external effects `records` hold, in words: calls classed external (or seen
/// reaching out through the egress proxy) and what came of each.
pub fn external_facts(records: &[Record]) -> Vec<String> {
    let mut reached: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in records {
        if let Event::Egress {
            call_ids,
            destination,
            admitted: true,
            ..
        } = &r.event
        {
            for id in call_ids {
                reached
                    .entry(id.clone())
                    .or_default()
                    .insert(destination.clone());
            }
        }
    }
    let mut facts = Vec::new();
    for r in records {
        let Event::ToolCallIntent {
            call_id,
            tool,
            input,
            class,
            ..
        } = &r.event
        else {
            continue;
        };
        let destinations = reached.get(call_id);
        if *class != ToolClass::External && destinations.is_none() {
            continue;
        }
        let what = match input.get("command").and_then(|c| c.as_str()) {
            Some(command) => format!("`{tool}` ran `{command}`"),
            None => format!("`{tool}` was called with {input}"),
        };
        let outcome = records.iter().find_map(|o| match &o.event {
            Event::ToolCallOutcome {
                call_id: id,
                is_error,
                exit_code,
                ..
            } if id == call_id => Some(match (is_error, exit_code) {
                (false, _) => "it completed".to_string(),
                (true, Some(code)) => format!("it exited with status {code}"),
                (true, None) => "it reported an error".to_string(),
            }),
            Event::ToolCallInterrupted {
                call_id: id,
                resolution,
            } if id == call_id => Some(match resolution {
                ToolResolution::OutcomeUnknown => {
                    "a crash cut it off: whether it took effect is unknown".to_string()
                }
                _ => "a crash cut it off".to_string(),
            }),
            _ => None,
        });
        let reached = destinations
            .map(|d| {
                format!(
                    ", reaching {}",
                    d.iter().cloned().collect::<Vec<_>>().join(", ")
                )
            })
            .unwrap_or_default();
        facts.push(format!(
            "{what}{reached}: {}",
            outcome.unwrap_or_else(|| "no outcome was recorded".to_string())
        ));
    }
    facts
}

impl<W: World + Clone, S: steadfast_sandbox::Sandbox> Harness<W, S> {
    /// Rewinds `session` to position `to`, which must be where no turn is open (a
    /// turn's end, or the session's start); a running turn is interrupted first
    /// (`by` is who asks). First a fork at the session's last record keeps what
    /// follows `to` whole; then, in one append, the session's log goes on from `to`
    /// and its workspace on this host is put back to the snapshot there (any other
    /// host's is, when it next drives the session).
    pub async fn rewind(&self, session: &str, to: u64, by: &str) -> Result<RewindReport> {
        let lease = self
            .lease_stopping(session, by, Duration::from_secs(30))
            .await?;
        let rewound = self.rewind_leased(&lease, to, by).await;
        let _ = self.world().release_lease(&lease).await;
        rewound
    }

    async fn rewind_leased(
        &self,
        lease: &steadfast_world::Lease,
        to: u64,
        by: &str,
    ) -> Result<RewindReport> {
        let session = lease.session.as_str();
        let now = self.state(session).await?;
        if to == 0 || to >= now.last_seq {
            return Err(Error::Invalid(format!(
                "to: session {session} has records 1 to {}; rewind to one from 1 to {}",
                now.last_seq,
                now.last_seq.saturating_sub(1)
            )));
        }
        let (then, _) =
            steadfast_world::load_state_at(self.world(), self.blobs(), session, to).await?;
        crate::fork::set_aside(session, "to", to, then.last_seq)?;
        if matches!(then.phase.status(), Status::Running | Status::Waiting) {
            return Err(Error::Invalid(format!(
                "to: position {to} is inside turn {} of session {session}; rewind to a turn's \
                 end (or fork there, which any position allows)",
                then.turn
            )));
        }
        let set_aside = self.world().read(session, to + 1).await?;
        let facts = external_facts(&set_aside);
        let owner = self.world().session(session).await?.owner;
        let branch = self
            .fork(&ForkRequest {
                parent: session.to_string(),
                at: Some(now.last_seq),
                count: 1,
                owner,
                title: Some(format!(
                    "set aside by a rewind of {session} to #{to} ({by})"
                )),
                model: None,
                limits: None,
                agent: None,
                instructions: None,
                held: false,
                explorer: None,
            })
            .await?
            .remove(0)
            .id;
        let event = Event::Rewound {
            to,
            branch: Some(branch.clone()),
            facts: facts.clone(),
        };
        let mut after = then.clone();
        after.apply(&Record {
            seq: now.last_seq + 1,
            epoch: lease.epoch,
            at_ms: 0,
            event: event.clone(),
        })?;
        self.world()
            .rewind_session(&Rewind {
                lease: lease.clone(),
                to,
                event,
                status: after.phase.status(),
                waiting_for: crate::fork::awaited(&after),
            })
            .await?;
        steadfast_fault::point(steadfast_fault::points::REWIND_RECORDED);
        // This host's copy of the workspace, as it was at `to`; a copy elsewhere is
        // brought there when that host next drives the session. A crash before this
        // restore is made good by the next wake (`rewound_workspace`).
        if let (Ok(dir), Some(snapshot)) = (self.workspace_dir(&after), &after.last_snapshot) {
            if dir.exists() {
                self.drive().restore_async(&dir, snapshot).await?;
            }
        }
        Ok(RewindReport {
            to,
            branch,
            facts,
            status: after.phase.status(),
        })
    }
}
