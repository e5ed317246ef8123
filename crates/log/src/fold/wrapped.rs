//! A wrapped agent's record: its model exchanges as the gateway saw them, its tool
//! calls through the MCP server, the conversation it keeps between turns, and where
//! a replay of it diverged.

use super::{Exchange, Folded, SessionState, WrappedTool};
use crate::event::{
    Event, ToolResolution, INTERRUPTED_OUTCOME_UNKNOWN, INTERRUPTED_ROLLED_BACK,
    INTERRUPTED_ROLLED_BACK_BESIDE,
};

impl SessionState {
    /// A wrapped agent's tool call: its intent, outcome or resolution.
    pub(super) fn wrapped_tool(&mut self, event: &Event) -> Folded {
        match event {
            Event::ToolCallIntent {
                call_id,
                tool,
                input,
                class,
                snapshot_before,
            } => {
                if snapshot_before.is_some() {
                    self.last_snapshot = snapshot_before.clone();
                }
                self.wrapped_tools.push(WrappedTool {
                    call_id: call_id.clone(),
                    tool: tool.clone(),
                    input: input.clone(),
                    class: *class,
                    snapshot_before: snapshot_before.clone(),
                    after_exchanges: self.exchanges.len() as u32,
                    result: None,
                    snapshot_after: None,
                    done: false,
                    result_order: 0,
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
                let order = self.next_result_order();
                let t = self
                    .wrapped_tools
                    .iter_mut()
                    .find(|t| &t.call_id == call_id && t.result.is_none())
                    .ok_or("no such pending tool call")?;
                t.result = Some((output.for_model(), *is_error));
                t.result_order = order;
                t.done = true;
                t.snapshot_after = snapshot_after.clone().or_else(|| t.snapshot_before.clone());
                let unchanged = match snapshot_after {
                    None => true,
                    Some(after) => t.snapshot_before.as_ref() == Some(after),
                };
                let (tool, input) = (t.tool.clone(), t.input.clone());
                self.count_call(&tool, &input, unchanged);
                self.note_service(&tool, &input, *is_error);
                if snapshot_after.is_some() {
                    self.last_snapshot = snapshot_after.clone();
                }
            }
            Event::ToolCallInterrupted {
                call_id,
                resolution,
            } => self.wrapped_tool_resolved(call_id, resolution)?,
            _ => return Err("not a tool call"),
        }
        Ok(())
    }

    /// A wrapped call cut off by a crash, resolved: answered (rolled back, outcome
    /// unknown, or found done), or gone, to be asked again.
    fn wrapped_tool_resolved(&mut self, call_id: &str, resolution: &ToolResolution) -> Folded {
        let at = self
            .wrapped_tools
            .iter()
            .position(|t| t.call_id == call_id && t.result.is_none())
            .ok_or("no such pending tool call")?;
        let result = match resolution {
            ToolResolution::Rerun | ToolResolution::Reconciled { done: false, .. } => None,
            ToolResolution::RolledBack { snapshot } => {
                if snapshot.is_some() {
                    self.last_snapshot = snapshot.clone();
                }
                // Put back to a later point than its own start: siblings that ran
                // beside it were recorded after it began and are kept.
                let beside =
                    snapshot.is_some() && *snapshot != self.wrapped_tools[at].snapshot_before;
                let text = if beside {
                    INTERRUPTED_ROLLED_BACK_BESIDE
                } else {
                    INTERRUPTED_ROLLED_BACK
                };
                Some((text.to_string(), true))
            }
            ToolResolution::OutcomeUnknown => Some((INTERRUPTED_OUTCOME_UNKNOWN.to_string(), true)),
            ToolResolution::Reconciled {
                done: true,
                evidence,
            } => Some((evidence.clone(), false)),
        };
        let left_at = match resolution {
            ToolResolution::RolledBack { snapshot } if snapshot.is_some() => snapshot.clone(),
            _ => self.wrapped_tools[at].snapshot_before.clone(),
        };
        let order = self.next_result_order();
        match result {
            Some(r) => {
                let t = &mut self.wrapped_tools[at];
                t.result = Some(r);
                t.snapshot_after = left_at;
                t.result_order = order;
            }
            None => {
                self.wrapped_tools.remove(at);
            }
        }
        Ok(())
    }

    /// The order the next wrapped call's result is recorded in (see
    /// [`WrappedTool::result_order`]).
    fn next_result_order(&mut self) -> u32 {
        self.wrapped_results += 1;
        self.wrapped_results
    }

    /// A model request the gateway records: the next one, or one asked again after a
    /// crash cut its reply off.
    pub(super) fn exchange_intent(&mut self, event: &Event) -> Folded {
        let Event::ExchangeIntent {
            call_id,
            index,
            api,
            fingerprint,
            stream,
            snapshot,
            ..
        } = event
        else {
            return Err("not an exchange");
        };
        let exchange = Exchange {
            call_id: call_id.clone(),
            api: *api,
            fingerprint: fingerprint.clone(),
            stream: *stream,
            snapshot: snapshot.clone(),
            reply: None,
        };
        let (at, len) = (*index as usize, self.exchanges.len());
        match self.exchanges.get_mut(at) {
            None if at == len => self.exchanges.push(exchange),
            Some(old) if old.reply.is_none() => {
                self.superseded_exchanges.push(old.call_id.clone());
                *old = exchange;
            }
            _ => return Err("an exchange index must be the next one or a cut-off one"),
        }
        Ok(())
    }

    /// An exchange's reply: paid for whether or not it is used.
    pub(super) fn exchange_outcome(&mut self, event: &Event) -> Folded {
        let Event::ExchangeOutcome {
            call_id,
            status,
            content_type,
            body,
            usage,
            cost_micro_usd,
        } = event
        else {
            return Err("not an exchange's outcome");
        };
        if let Some(u) = usage {
            self.usage.add(u);
        }
        self.cost_micro_usd += cost_micro_usd;
        self.model_calls += 1;
        match self
            .exchanges
            .iter_mut()
            .find(|e| &e.call_id == call_id && e.reply.is_none())
        {
            Some(exchange) => exchange.reply = Some((*status, content_type.clone(), body.clone())),
            // A reply that finished streaming after its request was asked again (or
            // superseded by a divergence): kept, but not used.
            None if self.superseded_exchanges.contains(call_id) => {}
            None => return Err("no such pending exchange"),
        }
        Ok(())
    }

    /// The wrapped CLI's own conversation, kept for the turns after this one.
    pub(super) fn conversation_kept(&mut self, event: &Event) -> Folded {
        let Event::ConversationKept { turn, conversation } = event else {
            return Err("not a kept conversation");
        };
        if *turn != self.turn || !self.is_wrapped() {
            return Err("a wrapped agent's conversation is kept for its own turn");
        }
        self.kept_conversation = Some(conversation.clone());
        Ok(())
    }

    /// A replay asked for something else than the record at `index`: the exchanges
    /// from there, and the calls made after them, are superseded; external effects
    /// among those calls stay facts.
    pub(super) fn replay_diverged(&mut self, event: &Event) -> Folded {
        let Event::ReplayDiverged { index, snapshot } = event else {
            return Err("not a divergence");
        };
        if *index as usize > self.exchanges.len() {
            return Err("divergence past the recorded exchanges");
        }
        let cut = (*index as usize).min(self.exchanges.len());
        let gone = self.exchanges.drain(cut..).map(|e| e.call_id);
        self.superseded_exchanges.extend(gone);
        let (kept, superseded) = std::mem::take(&mut self.wrapped_tools)
            .into_iter()
            .partition(|t| t.after_exchanges <= *index);
        self.wrapped_tools = kept;
        self.external_facts
            .extend(superseded.into_iter().filter(WrappedTool::is_external_fact));
        if snapshot.is_some() {
            self.last_snapshot = snapshot.clone();
        }
        Ok(())
    }
}
