//! The provider-neutral conversation: what the model has said and been told.

use serde::{Deserialize, Serialize};

/// Who spoke a [`Message`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The user, or the harness reporting tool results on the user's side.
    User,
    /// The model.
    Assistant,
}

/// One piece of a message. Model clients translate these to and from each wire format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Block {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// A tool call the model asked for.
    ToolUse(ToolUse),
    /// The result of a tool call, sent back to the model.
    ToolResult {
        /// The id of the [`ToolUse`] this answers.
        tool_use_id: String,
        /// What the model is shown.
        content: String,
        /// Whether the call failed.
        is_error: bool,
    },
}

/// A tool call requested by the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolUse {
    /// The provider's id for the call; tool results refer to it.
    pub id: String,
    /// The tool's name (`bash`, `read`, ...).
    pub name: String,
    /// The tool's JSON input.
    pub input: serde_json::Value,
}

/// One message of the conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Who spoke.
    pub role: Role,
    /// What was said, in order.
    pub content: Vec<Block>,
}

impl Message {
    /// A user message holding one text block.
    pub fn user_text(text: impl Into<String>) -> Self {
        Message {
            role: Role::User,
            content: vec![Block::Text { text: text.into() }],
        }
    }

    /// The tool calls in this message, in order.
    pub fn tool_uses(&self) -> impl Iterator<Item = &ToolUse> {
        self.content.iter().filter_map(|b| match b {
            Block::ToolUse(t) => Some(t),
            _ => None,
        })
    }

    /// The concatenated text blocks of this message.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for block in &self.content {
            if let Block::Text { text } = block {
                out.push_str(text);
            }
        }
        out
    }
}
