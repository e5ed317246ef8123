//! Pauses and what ends them: waits, the signals that answer them, escalation by a
//! bound, and the explorers' answers to an `explore` call.

use serde_json::Value;

use super::{ExploredAnswer, Folded, Phase, SessionState, Wait};
use crate::event::{Event, DENIED, RESUME_SIGNAL};

impl SessionState {
    /// A wait begins: the running turn pauses until its signal.
    pub(super) fn wait_started(&mut self, seq: u64, event: &Event) -> Folded {
        let Event::WaitStarted {
            name,
            reason,
            call_id,
            before_call,
        } = event
        else {
            return Err("not a wait");
        };
        if !self.is_running() {
            return Err("only a running turn can start a wait");
        }
        if call_id
            .as_ref()
            .is_some_and(|id| self.pending_tool(id).is_none())
        {
            return Err("the waiting tool call is not in flight");
        }
        self.explored.clear();
        self.phase = Phase::Waiting(Wait {
            seq,
            name: name.clone(),
            reason: reason.clone(),
            call_id: call_id.clone(),
            before_call: before_call.clone(),
        });
        Ok(())
    }

    /// A bound stopped the running turn: it waits for a person's `resume`.
    pub(super) fn escalated(&mut self, seq: u64, event: &Event) -> Folded {
        let Event::Escalated {
            breaker, reason, ..
        } = event
        else {
            return Err("not an escalation");
        };
        if !self.is_running() {
            return Err("only a running turn can be escalated");
        }
        self.phase = Phase::Escalated {
            breaker: *breaker,
            wait: Wait {
                seq,
                name: RESUME_SIGNAL.to_string(),
                reason: reason.clone(),
                call_id: None,
                before_call: None,
            },
        };
        Ok(())
    }

    /// A signal answers the wait in force.
    pub(super) fn signal_received(&mut self, event: &Event) -> Folded {
        let Event::SignalReceived {
            name,
            payload,
            inbox_id,
        } = event
        else {
            return Err("not a signal");
        };
        let wait = match self.waiting() {
            Some(w) if &w.name == name => w.clone(),
            _ => return Err("no wait for this signal"),
        };
        self.take_inbox(Some(*inbox_id));
        if name.starts_with(&format!("{}.", crate::EXPLORED_SIGNAL)) {
            return self.explorer_answered(&wait, payload);
        }
        let escalated = self.escalated_by();
        self.phase = Phase::Running { compacting: None };
        if let Some(breaker) = escalated {
            self.resume(breaker, payload);
        }
        let denied = payload.get("approved").and_then(Value::as_bool) == Some(false);
        if let Some(call_id) = &wait.call_id {
            self.take_pending_tool(call_id)
                .ok_or("the waiting tool call is not in flight")?;
            if *name == crate::tool_result_signal(call_id) {
                // A client tool's result is the client's content, as it sent it.
                let content = match payload.get("content") {
                    Some(Value::String(text)) => text.clone(),
                    Some(other) => other.to_string(),
                    None => String::new(),
                };
                let is_error = payload.get("is_error").and_then(Value::as_bool);
                self.push_result(call_id, content, is_error == Some(true));
            } else {
                self.push_result(call_id, format!("signal {name} arrived: {payload}"), false);
            }
        }
        if let Some(call_id) = &wait.before_call {
            if denied {
                let message = match payload.get("message").and_then(Value::as_str) {
                    Some(m) => format!("{DENIED} They said: {m}"),
                    None => DENIED.to_string(),
                };
                if !self.is_wrapped() {
                    self.push_result(call_id, message.clone(), true);
                }
                self.refused.push((call_id.clone(), message));
            } else {
                self.approved.push(call_id.clone());
            }
        }
        Ok(())
    }

    /// One explorer's answer: the `explore` call waits on until every task has one
    /// (an answer sent twice counts once), then has them all as its result.
    fn explorer_answered(&mut self, wait: &Wait, payload: &Value) -> Folded {
        let answer: ExploredAnswer = serde_json::from_value(payload.clone())
            .map_err(|_| "an explorer's answer without its fields")?;
        if answer.index < answer.of && !self.explored.iter().any(|a| a.index == answer.index) {
            self.explored.push(answer.clone());
        }
        if self.explored.len() < answer.of as usize {
            return Ok(());
        }
        self.phase = Phase::Running { compacting: None };
        let answers = std::mem::take(&mut self.explored);
        for a in &answers {
            self.cost_micro_usd += a.cost_micro_usd;
            self.usage.input_tokens += a.tokens;
        }
        let result = explored_result(&answers);
        match (&wait.call_id, &wait.before_call) {
            (Some(call_id), _) => {
                self.take_pending_tool(call_id)
                    .ok_or("the waiting tool call is not in flight")?;
                self.push_result(call_id, result, false);
            }
            (None, Some(key)) => self.explored_done.push((key.clone(), result)),
            (None, None) => return Err("an explore wait names no call"),
        }
        Ok(())
    }
}

/// The `explore` call's result once every explorer has answered: each task with its
/// explorer's session and answer.
fn explored_result(answers: &[ExploredAnswer]) -> String {
    let mut answers = answers.to_vec();
    answers.sort_by_key(|a| a.index);
    let mut out = format!("{} explorer(s) finished.\n", answers.len());
    for a in &answers {
        out.push_str(&format!(
            "\n## Explorer {} ({})\nTask: {}\nAnswer:\n{}\n",
            a.index + 1,
            a.session,
            a.task,
            a.answer.trim()
        ));
    }
    out
}
