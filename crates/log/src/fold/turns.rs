//! A turn's life: the message that opens it, steers, an interrupt, its end.

use super::{Folded, Next, Phase, SessionState, TurnStart};
use crate::event::{Event, INTERRUPTED_NOT_BEGUN};
use crate::message::{Block, Message, Role};

impl SessionState {
    /// A user message: the next turn opens.
    pub(super) fn user_message(&mut self, event: &Event) -> Folded {
        let Event::UserMessage {
            turn,
            text,
            inbox_id,
        } = event
        else {
            return Err("not a user message");
        };
        if !self.is_idle() {
            return Err("a turn is already open");
        }
        self.take_inbox(*inbox_id);
        if *turn != self.turn + 1 {
            return Err("turn numbers must increase by one");
        }
        self.turn = *turn;
        self.step = 0;
        self.steps_from = 0;
        self.exchanges_from = self.exchanges.len() as u32;
        self.turn_start = TurnStart {
            exchanges: self.exchanges.len() as u32,
            tools: self.wrapped_tools.len(),
            snapshot: self.last_snapshot.clone(),
            task: text.clone(),
            history: self.kept_conversation.clone(),
        };
        self.rewound_workspace = false;
        if let Some(note) = self.rewind_note.take() {
            self.turn_start.task = format!("{note}\n\n{text}");
        }
        self.external_facts.clear();
        self.phase = Phase::Running { compacting: None };
        self.conversation
            .push(Message::user_text(self.turn_start.task.clone()));
        Ok(())
    }

    /// A steer: more words from the user, taken between calls of the running turn.
    pub(super) fn steered(&mut self, event: &Event) -> Folded {
        let Event::Steered { text, inbox_id } = event else {
            return Err("not a steer");
        };
        if !self.is_running() || !matches!(self.next(), Next::CallModel { .. } | Next::EndTurn) {
            return Err("a steer is taken only between calls of a running turn");
        }
        self.take_inbox(Some(*inbox_id));
        let block = Block::Text { text: text.clone() };
        match self.conversation.last_mut() {
            Some(m) if m.role == Role::User => m.content.push(block),
            _ => self.conversation.push(Message {
                role: Role::User,
                content: vec![block],
            }),
        }
        Ok(())
    }

    /// An interrupt: taken from the inbox, and when it stopped the turn, the session
    /// is idle again.
    pub(super) fn interrupted(&mut self, event: &Event) -> Folded {
        let Event::TurnInterrupted {
            turn,
            by,
            inbox_id,
            stopped,
            not_begun,
            ..
        } = event
        else {
            return Err("not an interrupt");
        };
        self.take_inbox(Some(*inbox_id));
        if !*stopped {
            return Ok(());
        }
        let stoppable = matches!(self.phase, Phase::Running { .. } | Phase::Waiting(_));
        if *turn != self.turn || !stoppable || !self.pending_tools.is_empty() {
            return Err("an interrupt stops a running turn, after its tool outcome");
        }
        for id in not_begun {
            if !self.queued_tools.iter().any(|t| &t.id == id) {
                return Err("an interrupt names a call that is not waiting to begin");
            }
            self.push_result(id, format!("{INTERRUPTED_NOT_BEGUN} by {by}"), true);
        }
        self.pending_model = None;
        self.phase = Phase::Idle {
            interrupted_by: Some(by.clone()),
        };
        // The model learns of it with the next turn: the conversation says where its
        // work stopped, and keeps user and assistant alternating.
        self.conversation.push(Message {
            role: Role::Assistant,
            content: vec![Block::Text {
                text: format!("[This turn was interrupted by {by} before it finished.]"),
            }],
        });
        Ok(())
    }

    /// The turn's end: the session is idle until the next message.
    pub(super) fn turn_ended(&mut self, event: &Event) -> Folded {
        let Event::TurnEnded { turn, reply } = event else {
            return Err("not a turn's end");
        };
        let finished = if self.is_wrapped() {
            self.is_running()
        } else {
            self.next() == Next::EndTurn
        };
        if *turn != self.turn || !finished {
            return Err("the turn is not finished");
        }
        self.phase = Phase::Idle {
            interrupted_by: None,
        };
        self.explorer_answered |= self.explorer.is_some();
        if let Some(reply) = reply {
            self.wrapped_reply = Some(reply.clone());
            // A wrapped agent's answer joins the conversation: the history the next
            // turn's CLI is given (it keeps no memory between runs).
            if self.is_wrapped() {
                self.conversation.push(Message {
                    role: Role::Assistant,
                    content: vec![Block::Text {
                        text: reply.clone(),
                    }],
                });
            }
        }
        Ok(())
    }
}
