//! What the fake model asks again after a crash: only the calls it was told were rolled
//! back, as a model does when told "rolled back, run it again if still needed". (Asking
//! the whole step again would repeat siblings that already took effect: an append or a
//! POST done twice because of the script, not because of the harness.)

use serde_json::Value;
use steadfast_log::INTERRUPTED_ROLLED_BACK;

use crate::wire::Format;
use crate::Step;

/// `step` as asked again: when the request's last model turn had calls whose results
/// say they were rolled back, only those calls (matched by name and input, as often as
/// each was rolled back); otherwise the whole step.
pub(crate) fn only_rolled_back(mut step: Step, rolled_back: Vec<(String, Value)>) -> Step {
    if rolled_back.is_empty() {
        return step;
    }
    let mut left = rolled_back;
    let kept: Vec<_> = step
        .tool_calls
        .iter()
        .filter(|call| {
            match left
                .iter()
                .position(|(name, input)| *name == call.name && *input == call.input)
            {
                Some(at) => {
                    left.remove(at);
                    true
                }
                None => false,
            }
        })
        .cloned()
        .collect();
    if !kept.is_empty() {
        step.tool_calls = kept;
    }
    step
}

/// Whether a tool result's text says its call was rolled back. Anywhere in it: a CLI
/// may put a note of its own first (Codex's `Wall time: ...`).
fn is_rolled_back(text: &str) -> bool {
    text.contains(&INTERRUPTED_ROLLED_BACK[..40])
}

/// Whether a tool result (text, or a list of parts with text) says its call was
/// rolled back: the one check every wire format's step counting and redo use.
pub(crate) fn content_rolled_back(content: &Value) -> bool {
    match content {
        Value::String(s) => is_rolled_back(s),
        Value::Array(parts) => parts.iter().any(|p| {
            p.get("text")
                .and_then(Value::as_str)
                .is_some_and(is_rolled_back)
        }),
        _ => false,
    }
}

/// An argument string parsed (OpenAI sends tool inputs as JSON text).
fn arguments(value: Option<&Value>) -> Value {
    match value {
        Some(Value::String(text)) => serde_json::from_str(text).unwrap_or(Value::Null),
        Some(other) => other.clone(),
        None => Value::Null,
    }
}

/// The calls of the last model turn in `messages` (Anthropic Messages or OpenAI Chat)
/// whose results say they were rolled back.
pub(crate) fn in_messages(format: Format, messages: &[Value]) -> Vec<(String, Value)> {
    let Some(last) = messages
        .iter()
        .rposition(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
    else {
        return Vec::new();
    };
    let turn = &messages[last];
    let calls: Vec<(String, String, Value)> = match format {
        Format::Anthropic => turn
            .get("content")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_use"))
            .map(|b| {
                (
                    b["id"].as_str().unwrap_or_default().to_string(),
                    b["name"].as_str().unwrap_or_default().to_string(),
                    b.get("input").cloned().unwrap_or(Value::Null),
                )
            })
            .collect(),
        Format::OpenAi => turn
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|c| {
                (
                    c["id"].as_str().unwrap_or_default().to_string(),
                    c["function"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    arguments(c["function"].get("arguments")),
                )
            })
            .collect(),
    };
    let mut rolled = Vec::new();
    for m in &messages[last + 1..] {
        match format {
            Format::Anthropic => {
                for block in m
                    .get("content")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    if block.get("type").and_then(Value::as_str) == Some("tool_result")
                        && block.get("content").is_some_and(content_rolled_back)
                    {
                        rolled.push(block["tool_use_id"].as_str().unwrap_or_default());
                    }
                }
            }
            Format::OpenAi => {
                if m.get("role").and_then(Value::as_str) == Some("tool")
                    && m.get("content").is_some_and(content_rolled_back)
                {
                    rolled.push(m["tool_call_id"].as_str().unwrap_or_default());
                }
            }
        }
    }
    matched(&calls, &rolled)
}

/// The calls of the last model turn in a Responses `input` whose outputs say they were
/// rolled back.
pub(crate) fn in_responses_input(input: &Value) -> Vec<(String, Value)> {
    let Some(items) = input.as_array() else {
        return Vec::new();
    };
    let Some(last) = items
        .iter()
        .rposition(|i| i.get("type").and_then(Value::as_str) == Some("function_call"))
    else {
        return Vec::new();
    };
    let first = items[..=last]
        .iter()
        .rposition(|i| {
            let kind = i.get("type").and_then(Value::as_str).unwrap_or("message");
            let from_model = matches!(kind, "function_call" | "reasoning")
                || (kind == "message"
                    && i.get("role").and_then(Value::as_str) == Some("assistant"));
            !from_model
        })
        .map_or(0, |at| at + 1);
    let calls: Vec<(String, String, Value)> = items[first..=last]
        .iter()
        .filter(|i| i.get("type").and_then(Value::as_str) == Some("function_call"))
        .map(|i| {
            (
                i["call_id"].as_str().unwrap_or_default().to_string(),
                i["name"].as_str().unwrap_or_default().to_string(),
                arguments(i.get("arguments")),
            )
        })
        .collect();
    let rolled: Vec<&str> = items[last + 1..]
        .iter()
        .filter(|i| {
            i.get("type").and_then(Value::as_str) == Some("function_call_output")
                && i.get("output").is_some_and(content_rolled_back)
        })
        .map(|i| i["call_id"].as_str().unwrap_or_default())
        .collect();
    matched(&calls, &rolled)
}

fn matched(calls: &[(String, String, Value)], rolled: &[&str]) -> Vec<(String, Value)> {
    calls
        .iter()
        .filter(|(id, _, _)| rolled.contains(&id.as_str()))
        .map(|(_, name, input)| (name.clone(), input.clone()))
        .collect()
}
