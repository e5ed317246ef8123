//! Fork as a tool: an agent's `explore` call forks the session into explorers,
//! one per task, each from this very point (the conversation and the workspace as they
//! are), and waits, durably, for their answers, which come back together as the call's
//! result. A planner tries approaches in parallel this way; a crash of any process
//! while the explorers run loses nothing (each is a session of its own, the parent a
//! session waiting on a signal).
//!
//! - The explorers are made first, each with an id derived from the call and its task,
//!   so a crash before the parent records its wait makes the same ones again.
//! - The parent's call and its wait go into the log together; each explorer's answer
//!   is a signal to the parent, sent before the explorer's turn is recorded as ended
//!   (a crash between the two sends it again; the parent counts each task once).
//! - In an explorer, the `explore` call it was forked at answers with its task; an
//!   explorer forks no explorers of its own.

pub use steadfast_journal::explore::{
    brief, explore_tool, explorer_id, tasks, EXPLORE_TOOL, MAX_EXPLORERS,
};
use steadfast_log::{explored_signal, Event, Output, ToolClass, ToolUse};

/// Checks a session's explorer bound: at most [`MAX_EXPLORERS`].
pub fn check(explorers: u32) -> Result<(), String> {
    if explorers > MAX_EXPLORERS {
        return Err(format!(
            "explorers: at most {MAX_EXPLORERS} per call, not {explorers}"
        ));
    }
    Ok(())
}

/// An explore call answered at once (in an explorer, or refused): its intent and
/// outcome.
pub(crate) fn answered(call: &ToolUse, text: String, is_error: bool) -> Vec<Event> {
    vec![
        Event::ToolCallIntent {
            call_id: call.id.clone(),
            tool: call.name.clone(),
            input: call.input.clone(),
            class: ToolClass::Read,
            snapshot_before: None,
        },
        Event::ToolCallOutcome {
            call_id: call.id.clone(),
            is_error,
            exit_code: None,
            output: Output::Inline { text },
            snapshot_after: None,
            stored_bytes: 0,
        },
    ]
}

/// The parent's call and its wait for the explorers `ids`, appended together.
pub(crate) fn waiting(call: &ToolUse, ids: &[String]) -> Vec<Event> {
    vec![
        Event::ToolCallIntent {
            call_id: call.id.clone(),
            tool: call.name.clone(),
            input: call.input.clone(),
            class: ToolClass::Read,
            snapshot_before: None,
        },
        Event::WaitStarted {
            name: explored_signal(&call.id),
            reason: format!("waiting for {} explorer(s): {}", ids.len(), ids.join(", ")),
            call_id: Some(call.id.clone()),
            before_call: None,
        },
    ]
}

impl<W: steadfast_world::World + Clone, S: steadfast_sandbox::Sandbox> crate::Harness<W, S> {
    /// Drives, here, the explorers that `parent`'s `explore` call waits for and that
    /// have not answered (one a worker holds is left to it), each to the end of its
    /// task's turn. Returns how many answered: the parent goes on once all have (a
    /// process without workers, such as `steadfast run`, drives them this way).
    pub async fn run_explorers(&self, parent: &str) -> crate::Result<usize> {
        let state = self.state(parent).await?;
        let prefix = format!("{}.", steadfast_log::EXPLORED_SIGNAL);
        let Some(call) = state
            .waiting()
            .as_ref()
            .and_then(|w| w.name.strip_prefix(&prefix))
            .map(str::to_string)
        else {
            return Ok(0);
        };
        let mut answered = 0;
        for index in 0..MAX_EXPLORERS {
            if state.explored.iter().any(|a| a.index == index) {
                continue;
            }
            let id = explorer_id(parent, &call, index);
            let mut awake = match self.wake(&id).await {
                Ok(awake) => awake,
                // Past the last explorer of the call.
                Err(crate::Error::World(steadfast_world::Error::NotFound(_))) => break,
                // A worker drives it.
                Err(crate::Error::World(steadfast_world::Error::LeaseHeld { .. })) => continue,
                Err(e) => return Err(e),
            };
            let ran = awake.run().await;
            let released = awake.release().await;
            if ran? == crate::Stop::Idle {
                answered += 1;
            }
            released?;
        }
        Ok(answered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explorers_stay_within_the_ceiling() {
        assert!(check(MAX_EXPLORERS + 1).is_err());
        assert!(check(MAX_EXPLORERS).is_ok() && check(0).is_ok());
    }
}
