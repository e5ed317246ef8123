//! Context compaction for the native agent: a session that runs for days outgrows any
//! model's context window, so before a request would pass a share of the window the
//! harness makes room. First, old tool outputs are elided (they stay in the log); if
//! that is not enough, a journaled model call summarises the older messages, and the
//! summary stands for them from then on ([`steadfast_log::Event::Compacted`]). Replay
//! folds the records, never asks again; the full log stays, so a session can be
//! inspected (or forked) from before any compaction.

use steadfast_log::fold::ELIDE_OVER;
pub use steadfast_log::fold::SUMMARY_PROMPT;
use steadfast_log::{Block, Message, Role};
use steadfast_model::ModelRequest;

/// When and how much the harness compacts.
#[derive(Debug, Clone, PartialEq)]
pub struct CompactionPolicy {
    /// The context window, tokens, for every model; `None`: by model, from
    /// [`context_window`].
    pub window: Option<u64>,
    /// Compact when a request would pass this share of the window.
    pub at_share: f64,
    /// Keep this share of the window as recent messages, verbatim.
    pub keep_share: f64,
    /// Compaction is off (a request too large for the model then fails).
    pub off: bool,
}

impl Default for CompactionPolicy {
    fn default() -> Self {
        CompactionPolicy {
            window: None,
            at_share: 0.8,
            keep_share: 0.35,
            off: false,
        }
    }
}

impl CompactionPolicy {
    /// The window for `model`: the policy's, or the table's.
    pub fn window_for(&self, model: &str) -> u64 {
        self.window.unwrap_or_else(|| context_window(model))
    }
}

/// Context windows by model-name prefix (the longest prefix that matches wins), tokens.
const WINDOWS: &[(&str, u64)] = &[
    ("claude-", 200_000),
    ("gpt-5", 400_000),
    ("gpt-4.1", 1_047_576),
    ("gpt-4o", 128_000),
    ("o3", 200_000),
    ("o4", 200_000),
];

/// The context window of `model` (a model without an entry: 128k, a common floor).
pub fn context_window(model: &str) -> u64 {
    WINDOWS
        .iter()
        .filter(|(prefix, _)| model.starts_with(prefix))
        .max_by_key(|(prefix, _)| prefix.len())
        .map_or(128_000, |(_, window)| *window)
}

/// A request's size in tokens, estimated from its JSON (4 bytes a token, a little
/// high for English and code, so the estimate errs towards compacting early).
pub fn estimate_tokens(request: &ModelRequest) -> u64 {
    let bytes = serde_json::to_vec(request).map_or(0, |b| b.len());
    (bytes / 4) as u64 + 1
}

fn message_tokens(message: &Message) -> u64 {
    (serde_json::to_vec(message).map_or(0, |b| b.len()) / 4) as u64 + 1
}

/// What to do before the next model call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// The request fits.
    Nothing,
    /// Elide the tool outputs of the messages before this position.
    Elide(u32),
    /// Summarise the messages before this position (an assistant message's).
    Summarise(u32),
}

/// What a compaction someone asked for (the `compact` signal) does, whatever the
/// request's size: summarise every message before the last reply of the model.
pub fn plan_asked(request: &ModelRequest) -> Plan {
    let messages = &request.messages;
    match (1..messages.len())
        .rev()
        .find(|&i| messages[i].role == Role::Assistant)
    {
        Some(upto) if upto >= 1 => Plan::Summarise(upto as u32),
        _ => Plan::Nothing,
    }
}

/// Whether a request whose canonical JSON is `bytes` long passes the share of
/// `window` at which `policy` compacts.
pub fn over_share(policy: &CompactionPolicy, window: u64, bytes: usize) -> bool {
    // The request's JSON length, 4 bytes a token (as [`estimate_tokens`] counts).
    let tokens = (bytes / 4) as u64 + 1;
    !policy.off && tokens as f64 > window as f64 * policy.at_share
}

/// What the next request needs, by `policy`, for a model with `window` tokens.
pub fn plan(policy: &CompactionPolicy, window: u64, request: &ModelRequest, bytes: usize) -> Plan {
    if !over_share(policy, window, bytes) {
        return Plan::Nothing;
    }
    let messages = &request.messages;
    // The recent messages kept verbatim: from the end, within the keep share.
    let keep = (window as f64 * policy.keep_share) as u64;
    let mut kept = 0u64;
    let mut start = messages.len();
    while start > 0 {
        let next = kept + message_tokens(&messages[start - 1]);
        if next > keep {
            break;
        }
        kept = next;
        start -= 1;
    }
    let long_output = messages[..start].iter().any(|m| {
        m.content
            .iter()
            .any(|b| matches!(b, Block::ToolResult { content, .. } if content.len() > ELIDE_OVER))
    });
    if long_output {
        return Plan::Elide(start as u32);
    }
    // Summarise up to an assistant message, so the summary (a user message) is
    // followed by one, and no tool result is parted from its call.
    let upto = (start..messages.len())
        .find(|&i| messages[i].role == Role::Assistant)
        .or_else(|| {
            (1..start)
                .rev()
                .find(|&i| messages[i].role == Role::Assistant)
        });
    match upto {
        Some(upto) if upto >= 2 => Plan::Summarise(upto as u32),
        _ => Plan::Nothing,
    }
}

/// The summarising request: the session's own (system prompt and tools, which the
/// providers need to read tool calls in the history) over the messages before `upto`.
pub fn summary_request(request: &ModelRequest, upto: u32) -> ModelRequest {
    let mut messages = request.messages[..upto as usize].to_vec();
    messages.push(Message::user_text(SUMMARY_PROMPT));
    ModelRequest {
        messages,
        ..request.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use steadfast_log::ToolUse;

    fn request(steps: usize, output: usize) -> ModelRequest {
        let mut messages = vec![Message::user_text("do the work")];
        for i in 0..steps {
            messages.push(Message {
                role: Role::Assistant,
                content: vec![Block::ToolUse(ToolUse {
                    id: format!("t{i}"),
                    name: "read".into(),
                    input: serde_json::json!({"path": "a"}),
                })],
            });
            messages.push(Message {
                role: Role::User,
                content: vec![Block::ToolResult {
                    tool_use_id: format!("t{i}"),
                    content: "x".repeat(output),
                    is_error: false,
                }],
            });
        }
        ModelRequest {
            model: "claude-sonnet-4-5".into(),
            system: "sys".into(),
            messages,
            tools: Vec::new(),
            max_tokens: 1000,
        }
    }

    fn len(request: &ModelRequest) -> usize {
        serde_json::to_vec(request).unwrap().len()
    }

    #[test]
    fn windows_come_from_the_longest_prefix_or_the_policy() {
        assert_eq!(context_window("claude-sonnet-4-5"), 200_000);
        assert_eq!(context_window("gpt-4.1-mini"), 1_047_576);
        assert_eq!(context_window("llama"), 128_000);
        let policy = CompactionPolicy {
            window: Some(32_000),
            ..Default::default()
        };
        assert_eq!(policy.window_for("claude-sonnet-4-5"), 32_000);
    }

    #[test]
    fn outputs_are_elided_first_then_older_turns_summarised_at_a_turn_boundary() {
        let policy = CompactionPolicy::default();
        assert_eq!(
            plan(&policy, 32_000, &request(5, 100), len(&request(5, 100))),
            Plan::Nothing
        );
        let big = request(100, 1200);
        let Plan::Elide(before) = plan(&policy, 32_000, &big, len(&big)) else {
            panic!("long outputs are elided first");
        };
        assert!(before > 0 && (before as usize) < big.messages.len());
        let short = request(400, 100);
        let Plan::Summarise(upto) = plan(&policy, 32_000, &short, len(&short)) else {
            panic!("short outputs: summarised");
        };
        assert_eq!(short.messages[upto as usize].role, Role::Assistant);
        let rest: u64 = short.messages[upto as usize..]
            .iter()
            .map(message_tokens)
            .sum();
        assert!(
            rest <= (32_000.0 * policy.keep_share) as u64 + 200,
            "{rest}"
        );
        let off = CompactionPolicy {
            off: true,
            ..Default::default()
        };
        assert_eq!(plan(&off, 32_000, &short, len(&short)), Plan::Nothing);
        let asked = summary_request(&short, upto);
        assert_eq!(asked.messages.len(), upto as usize + 1);
        assert_eq!(asked.messages.last().unwrap().text(), SUMMARY_PROMPT);
    }
}
