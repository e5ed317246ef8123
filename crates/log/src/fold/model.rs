//! Model calls: their intents, streamed pieces and outcomes, and what keeps the
//! conversation within the model's context (elided outputs, compaction).

use super::{compaction_header, elided, elides, Folded, Next, PendingModel, Phase, SessionState};
use crate::event::Event;
use crate::message::{Block, Message, Role};

impl SessionState {
    /// A piece of a reply that is streaming: a native model call in flight, or a
    /// wrapped agent's exchange (or one cut off: its late pieces are kept).
    pub(super) fn model_delta(&mut self, event: &Event) -> Folded {
        let Event::ModelDelta { call_id, .. } = event else {
            return Err("not a delta");
        };
        let exchange = self.exchanges.iter().any(|e| &e.call_id == call_id)
            || self.superseded_exchanges.contains(call_id);
        if self.pending_model.as_ref().map(|p| &p.call_id) != Some(call_id) && !exchange {
            return Err("a delta of a model call that is not in flight");
        }
        Ok(())
    }

    /// A model call begins: the step due now.
    pub(super) fn model_intent(&mut self, event: &Event) -> Folded {
        let Event::ModelCallIntent { call_id, step, .. } = event else {
            return Err("not a model call");
        };
        if self.next() != (Next::CallModel { step: *step }) {
            return Err("no model call is due here");
        }
        self.model_attempts += 1;
        self.pending_model = Some(PendingModel {
            call_id: call_id.clone(),
            step: *step,
        });
        Ok(())
    }

    /// A model call's reply: paid for, added to the conversation, and its tool calls
    /// queued.
    pub(super) fn model_outcome(&mut self, event: &Event) -> Folded {
        let Event::ModelCallOutcome {
            call_id,
            content,
            usage,
            cost_micro_usd,
            ..
        } = event
        else {
            return Err("not a model call's outcome");
        };
        let pending = self
            .take_pending_model(call_id)
            .ok_or("no such pending model call")?;
        self.step = pending.step;
        self.usage.add(usage);
        self.cost_micro_usd += cost_micro_usd;
        self.model_calls += 1;
        let message = Message {
            role: Role::Assistant,
            content: content.clone(),
        };
        self.queued_tools = message.tool_uses().cloned().collect();
        self.conversation.push(message);
        Ok(())
    }

    /// A model call that ended without a reply (cut off, or failed): nothing is in
    /// flight any more, a compaction included.
    pub(super) fn model_ended_without_reply(&mut self, call_id: &str) -> Folded {
        self.take_pending_model(call_id)
            .ok_or("no such pending model call")?;
        if let Phase::Running { compacting } = &mut self.phase {
            *compacting = None;
        }
        Ok(())
    }

    /// Long tool outputs before `before` are elided from the conversation (the log
    /// keeps them).
    pub(super) fn outputs_elided(&mut self, event: &Event) -> Folded {
        let Event::OutputsElided { before, .. } = event else {
            return Err("not an elision");
        };
        if !matches!(self.next(), Next::CallModel { .. }) {
            return Err("no model call is due here");
        }
        let before = (*before as usize).min(self.conversation.len());
        for message in &mut self.conversation[..before] {
            for block in &mut message.content {
                if let Block::ToolResult {
                    content,
                    tool_use_id,
                    ..
                } = block
                {
                    if elides(content) {
                        *content = elided(content.len(), tool_use_id);
                    }
                }
            }
        }
        Ok(())
    }

    /// A compaction's summarising call begins, in place of the model call due.
    pub(super) fn compaction_intent(&mut self, event: &Event) -> Folded {
        let Event::CompactionIntent {
            call_id,
            upto,
            inbox_id,
            ..
        } = event
        else {
            return Err("not a compaction");
        };
        if !matches!(self.next(), Next::CallModel { .. }) {
            return Err("no model call is due here");
        }
        if *upto as usize > self.conversation.len() {
            return Err("compaction past the conversation's end");
        }
        self.model_attempts += 1;
        self.pending_model = Some(PendingModel {
            call_id: call_id.clone(),
            step: self.step,
        });
        self.phase = Phase::Running {
            compacting: Some(*upto),
        };
        if inbox_id.is_some() {
            self.take_inbox(*inbox_id);
            self.compact_asked = true;
        }
        Ok(())
    }

    /// A compaction's summary replaces the messages it summarises.
    pub(super) fn compacted(&mut self, event: &Event) -> Folded {
        let Event::Compacted {
            call_id,
            summary,
            usage,
            cost_micro_usd,
            ..
        } = event
        else {
            return Err("not a compaction's outcome");
        };
        self.take_pending_model(call_id)
            .ok_or("no such pending model call")?;
        let upto = match &mut self.phase {
            Phase::Running { compacting } => compacting.take(),
            _ => None,
        }
        .ok_or("no compaction pending")? as usize;
        let summarised = self.conversation[..upto]
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count() as u32;
        self.compacted_turns += summarised;
        self.compactions += 1;
        self.compact_asked = false;
        self.usage.add(usage);
        self.cost_micro_usd += cost_micro_usd;
        self.model_calls += 1;
        let text = format!("{}{summary}", compaction_header(self.compacted_turns));
        let rest = self.conversation.split_off(upto);
        self.conversation = std::iter::once(Message::user_text(text))
            .chain(rest)
            .collect();
        Ok(())
    }
}
