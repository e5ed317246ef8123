//! The session's life around its turns: forks, rewinds, failures to drive it, a
//! wrapped agent's change of CLI, and its end.

use serde_json::Value;

use super::{Folded, Phase, SessionState};
use crate::event::{Breaker, Event, Limits, ModelSpec};
use crate::is_workspace_id;

impl SessionState {
    /// A fork's first record: the parent's state becomes the fork's.
    pub(super) fn forked(&mut self, event: &Event) -> Folded {
        let Event::Forked {
            workspace,
            model,
            limits,
            agent,
            instructions,
            explorer,
            ..
        } = event
        else {
            return Err("not a fork");
        };
        if let Some(explorer) = explorer {
            let pending =
                self.is_wrapped() || self.queued_tools.iter().any(|t| t.id == explorer.call_id);
            if !pending {
                return Err("an explorer is forked where its `explore` call is due");
            }
            self.explorer = Some(explorer.clone());
        }
        self.fork(workspace, model.as_ref())?;
        if let Some(limits) = limits {
            self.limits = *limits;
        }
        if let Some((agent, cli)) = agent {
            if !self.is_wrapped() {
                return Err("only a wrapped agent's session can change its CLI");
            }
            self.agent = agent.clone();
            self.agent_cli = Some(cli.clone());
        }
        if let Some(instructions) = instructions {
            if !self.is_wrapped() {
                return Err("only a wrapped agent's session is given instructions");
            }
            self.instructions = Some(instructions.clone()).filter(|i| !i.is_empty());
        }
        Ok(())
    }

    /// Becomes a fork of this state in its own logical `workspace` (and speaking to
    /// `model`, if given): open again if it had ended; a turn in progress stays in
    /// progress, for a wake to resolve its cut-off calls.
    fn fork(&mut self, workspace: &str, model: Option<&ModelSpec>) -> Folded {
        if !is_workspace_id(workspace) {
            return Err("a fork works in a logical workspace of its own");
        }
        if workspace == self.workspace || self.former_workspaces.iter().any(|w| w == workspace) {
            return Err("a fork's workspace is one its history already used");
        }
        if !is_workspace_id(&self.workspace) {
            // The native prompt named the parent's directory; a logical workspace is
            // wherever the sandbox puts it, as in a session begun in one.
            self.system = self.system.replace(
                &format!("the directory {}", self.workspace),
                "the current directory",
            );
        }
        self.former_workspaces.push(std::mem::replace(
            &mut self.workspace,
            workspace.to_string(),
        ));
        self.workspace_host = None;
        if let Some(model) = model {
            self.model = model.clone();
        }
        if self.is_ended() {
            self.phase = Phase::Idle {
                interrupted_by: None,
            };
        }
        self.retry = None;
        self.failures_in_row = 0;
        Ok(())
    }

    /// Becomes the state at a rewind's point again (it is already: the records set
    /// aside were never folded here); the external effects they recorded are told to
    /// the model with the next user message.
    pub(super) fn rewind(&mut self, facts: &[String]) {
        self.retry = None;
        self.failures_in_row = 0;
        self.rewound_workspace = true;
        if !facts.is_empty() {
            let mut note = String::from(
                "[steadfast] This session was rewound to an earlier point: the work that \
                 followed it was set aside and the workspace is as it was then. These \
                 external effects had already happened after that point and still stand:",
            );
            for fact in facts {
                note.push_str(&format!("\n- {fact}"));
            }
            self.note_for_next_turn(&note);
        }
    }

    /// A worker's failure to drive the session, and the retry it scheduled.
    pub(super) fn drive_failed(&mut self, event: &Event) -> Folded {
        let Event::DriveFailed {
            reason,
            attempt,
            retry_at_ms,
        } = event
        else {
            return Err("not a drive failure");
        };
        self.failures_in_row = *attempt;
        self.retry = retry_at_ms.map(|at_ms| super::Retry {
            attempt: *attempt,
            reason: reason.clone(),
            at_ms,
        });
        Ok(())
    }

    /// A wrapped session's CLI changed between turns.
    pub(super) fn agent_changed(&mut self, event: &Event) -> Folded {
        let Event::AgentChanged {
            agent,
            cli,
            instructions,
        } = event
        else {
            return Err("not an agent change");
        };
        if !self.is_wrapped() || !self.is_idle() {
            return Err("a wrapped session's agent is changed between turns");
        }
        self.agent = agent.clone();
        self.agent_cli = Some(cli.clone());
        self.instructions = instructions.clone();
        Ok(())
    }

    /// Applies a `resume` signal's payload after `breaker` stopped the session.
    pub(super) fn resume(&mut self, breaker: Breaker, payload: &Value) {
        let (raise, _) = Limits::from_resume(payload);
        self.limits = self.limits.raised(&raise);
        match breaker {
            Breaker::Loop => self.loop_streak = 0,
            Breaker::Steps => {
                self.steps_from = self.step;
                self.exchanges_from = self.exchanges.len() as u32;
            }
            _ => {}
        }
    }

    /// The session's end: nothing is pending any more.
    pub(super) fn ended(&mut self, event: &Event) -> Folded {
        let Event::SessionEnded { state, reason, .. } = event else {
            return Err("not the end");
        };
        self.phase = Phase::Ended {
            state: *state,
            reason: reason.clone(),
        };
        self.pending_model = None;
        self.pending_tools.clear();
        Ok(())
    }
}
