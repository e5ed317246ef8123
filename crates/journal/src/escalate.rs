//! Escalating a session to a person: the one `escalated` record for every agent, made
//! when a bound or a breaker stops a turn (the native loop's before a step, a wrapped
//! CLI's when its gateway or journal refused to go on).

use steadfast_drive::Drive;
use steadfast_log::{Breaker, Event, SessionState};
use steadfast_sandbox::Sandbox;
use steadfast_world::World;

use crate::{Journal, Result};

/// What changed in the workspace since the session began, a line per path: what a
/// person deciding about an escalated or ended session looks at first.
pub fn changes_since_start(drive: &Drive, state: &SessionState) -> Vec<String> {
    match (&state.initial_snapshot, &state.last_snapshot) {
        (Some(first), Some(last)) => drive.change_lines(first, last),
        _ => Vec::new(),
    }
}

impl<W: World + Clone, S: Sandbox> Journal<W, S> {
    /// Stops the running turn for a person: `breaker` was hit, for `reason`. The record
    /// carries what changed since the session began.
    pub async fn escalate(&self, breaker: Breaker, reason: String) -> Result<()> {
        let diff = self.live.with(|s| changes_since_start(&self.drive, s));
        self.live
            .append(&[Event::Escalated {
                breaker,
                reason,
                diff,
            }])
            .await?;
        Ok(())
    }
}
