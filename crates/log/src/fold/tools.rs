//! Tool calls: their intents, outcomes and resolutions after a crash, where they
//! connected out of the sandbox, the services they started, and the loop breaker's
//! count of them.

use serde_json::Value;

use super::{Folded, HeldConnection, PendingTool, ServiceRecord, SessionState};
use crate::event::{Event, ToolResolution, INTERRUPTED_OUTCOME_UNKNOWN, INTERRUPTED_ROLLED_BACK};
use crate::message::{Block, Message, Role};

impl SessionState {
    /// A tool call's intent, outcome or resolution: the native loop's, or a wrapped
    /// agent's (kept apart, see [`super::WrappedTool`]).
    pub(super) fn tool_call(&mut self, event: &Event) -> Folded {
        if self.is_wrapped() {
            return self.wrapped_tool(event);
        }
        match event {
            Event::ToolCallIntent {
                call_id,
                tool,
                input,
                class,
                snapshot_before,
            } => {
                if !self.may_begin(call_id) {
                    return Err("this tool call is not one of the running reply's");
                }
                if snapshot_before.is_some() {
                    self.last_snapshot = snapshot_before.clone();
                }
                self.pending_tools.push(PendingTool {
                    call_id: call_id.clone(),
                    tool: tool.clone(),
                    input: input.clone(),
                    class: *class,
                    snapshot_before: snapshot_before.clone(),
                    egress: Vec::new(),
                });
            }
            Event::ToolCallOutcome {
                call_id,
                is_error,
                output,
                snapshot_after,
                ..
            } => {
                let pending = self
                    .take_pending_tool(call_id)
                    .ok_or("no such pending tool call")?;
                self.count_loop(&pending, snapshot_after.as_ref());
                self.note_service(&pending.tool, &pending.input, *is_error);
                if snapshot_after.is_some() {
                    self.last_snapshot = snapshot_after.clone();
                }
                self.push_result(call_id, output.for_model(), *is_error);
            }
            Event::ToolCallInterrupted {
                call_id,
                resolution,
            } => {
                self.take_pending_tool(call_id)
                    .ok_or("no such pending tool call")?;
                match resolution {
                    ToolResolution::Rerun | ToolResolution::Reconciled { done: false, .. } => {}
                    ToolResolution::RolledBack { snapshot } => {
                        if snapshot.is_some() {
                            self.last_snapshot = snapshot.clone();
                        }
                        self.push_result(call_id, INTERRUPTED_ROLLED_BACK.to_string(), true);
                    }
                    ToolResolution::OutcomeUnknown => {
                        self.push_result(call_id, INTERRUPTED_OUTCOME_UNKNOWN.to_string(), true);
                    }
                    ToolResolution::Reconciled {
                        done: true,
                        evidence,
                    } => {
                        self.push_result(call_id, evidence.clone(), false);
                    }
                }
            }
            _ => return Err("not a tool call"),
        }
        Ok(())
    }

    /// Calls in flight connected out of the sandbox (or tried to): they are external
    /// effects from now on, and one the approval policy held back waits for a person
    /// when it is made again.
    pub(super) fn egress(&mut self, event: &Event) -> Folded {
        let Event::Egress {
            call_ids,
            destination,
            admitted,
            denied,
        } = event
        else {
            return Err("not an egress");
        };
        for id in call_ids {
            let call = if let Some(p) = self.pending_tools.iter_mut().find(|p| &p.call_id == id) {
                if *admitted && !p.egress.contains(destination) {
                    p.egress.push(destination.clone());
                }
                (p.tool.clone(), p.input.clone())
            } else if let Some(t) = self
                .wrapped_tools
                .iter_mut()
                .find(|t| &t.call_id == id && t.result.is_none())
            {
                if *admitted && !t.egress.contains(destination) {
                    t.egress.push(destination.clone());
                }
                (t.tool.clone(), t.input.clone())
            } else {
                // Its outcome was recorded a moment before (the connection came as it
                // ended): nothing is left to resolve.
                continue;
            };
            if !admitted && !denied {
                let held = HeldConnection {
                    tool: call.0.clone(),
                    input: call.1.clone(),
                    destination: destination.clone(),
                };
                if !self.held_for_approval.contains(&held) {
                    self.held_for_approval.push(held);
                }
            }
            if !self.reaches_network.contains(&call) {
                self.reaches_network.push(call);
            }
        }
        Ok(())
    }

    /// Services started again with a new sandbox; one that could not be is no longer
    /// running.
    pub(super) fn services_restarted(&mut self, event: &Event) -> Folded {
        let Event::ServicesRestarted { services, .. } = event else {
            return Err("not a services restart");
        };
        for (name, how) in services {
            match self.services.iter_mut().find(|s| &s.name == name) {
                Some(s) if how == "started" => s.restarts += 1,
                Some(_) => self.services.retain(|s| &s.name != name),
                None => {}
            }
        }
        Ok(())
    }

    /// The sandbox died under a call, which must be in flight.
    pub(super) fn sandbox_lost(&mut self, event: &Event) -> Folded {
        let Event::SandboxLost { call_id, .. } = event else {
            return Err("not a lost sandbox");
        };
        if let Some(id) = call_id {
            let native = self.pending_tool(id).is_some();
            let wrapped = self
                .wrapped_tools
                .iter()
                .any(|t| &t.call_id == id && t.result.is_none());
            if !native && !wrapped {
                return Err("the lost call is not in flight");
            }
        }
        Ok(())
    }

    /// Keeps the services current with a finished call of the `service` tool: a
    /// start that succeeded adds one, a stop removes it.
    pub(super) fn note_service(&mut self, tool: &str, input: &Value, is_error: bool) {
        if tool != "service" || is_error {
            return;
        }
        let text = |key: &str| input.get(key).and_then(Value::as_str).unwrap_or_default();
        let name = text("name").to_string();
        match text("action") {
            "start" => {
                self.services.retain(|s| s.name != name);
                self.services.push(ServiceRecord {
                    name,
                    command: text("command").to_string(),
                    port: input
                        .get("port")
                        .and_then(Value::as_u64)
                        .and_then(|p| u16::try_from(p).ok()),
                    restarts: 0,
                });
            }
            "stop" => self.services.retain(|s| s.name != name),
            _ => {}
        }
    }

    /// Counts a finished tool call towards the loop breaker.
    fn count_loop(&mut self, call: &PendingTool, snapshot_after: Option<&String>) {
        let unchanged = match snapshot_after {
            None => true,
            Some(after) => call.snapshot_before.as_ref() == Some(after),
        };
        self.count_call(&call.tool, &call.input, unchanged);
    }

    /// Counts a finished tool call (`unchanged`: it left the workspace as it was)
    /// towards the loop breaker.
    pub(super) fn count_call(&mut self, tool: &str, input: &Value, unchanged: bool) {
        let same = self
            .last_tool_call
            .as_ref()
            .is_some_and(|(name, last)| name == tool && last == input);
        self.loop_streak = match (unchanged, same) {
            (false, _) => 0,
            (true, true) => self.loop_streak + 1,
            (true, false) => 1,
        };
        self.last_tool_call = Some((tool.to_string(), input.clone()));
    }

    /// The tool-use ids of the last assistant message, in its order.
    fn tool_use_order(&self) -> Vec<String> {
        self.conversation
            .iter()
            .rev()
            .find(|m| m.role == Role::Assistant)
            .map(|m| m.tool_uses().map(|t| t.id.clone()).collect())
            .unwrap_or_default()
    }

    /// Records a tool result: removes the call from the queue and adds its result to
    /// the user message that follows the model's reply.
    /// Results stand in the order of the reply's tool uses, however the calls finished
    /// (calls of one reply may run at once): the conversation is the same whichever
    /// finished first.
    pub(super) fn push_result(&mut self, call_id: &str, content: String, is_error: bool) {
        self.queued_tools.retain(|t| t.id != call_id);
        let block = Block::ToolResult {
            tool_use_id: call_id.to_string(),
            content,
            is_error,
        };
        let order = self.tool_use_order();
        let rank = |id: &str| order.iter().position(|o| o == id).unwrap_or(usize::MAX);
        match self.conversation.last_mut() {
            Some(m)
                if m.role == Role::User
                    && matches!(m.content.first(), Some(Block::ToolResult { .. })) =>
            {
                let mine = rank(call_id);
                let at = m
                    .content
                    .iter()
                    .position(|b| match b {
                        Block::ToolResult { tool_use_id, .. } => rank(tool_use_id) > mine,
                        _ => false,
                    })
                    .unwrap_or(m.content.len());
                m.content.insert(at, block)
            }
            _ => self.conversation.push(Message {
                role: Role::User,
                content: vec![block],
            }),
        }
    }
}
