//! The two wire formats the fake provider speaks, and how it picks a scripted step.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::Step;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    Anthropic,
    OpenAi,
}

use crate::redo::content_rolled_back as rolled_back;

/// A message's text, whether its content is a string or blocks.
pub(crate) fn text_of(message: &Value) -> String {
    match message.get("content") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(blocks)) => blocks
            .iter()
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// The script step answering a conversation: its completed model turns, not counting
/// turns whose tool calls were rolled back (those are retried, so the step repeats),
/// and counting the turns a compaction summary stands for.
pub(crate) fn step_index(format: Format, messages: &[Value]) -> usize {
    let mut index = 0usize;
    let mut last_assistant_redo = false;
    for m in messages {
        if m.get("role").and_then(Value::as_str) == Some("user") {
            let text = text_of(m);
            if let Some(done) = place_in(&text) {
                // A summary this provider wrote says where the script was (rolled-back
                // turns it replaced not counted), whoever compacted.
                index = done;
            } else if let Some(turns) = steadfast_log::fold::compacted_turns(&text) {
                index += turns as usize;
            }
        }
        let redo = match (format, m.get("role").and_then(Value::as_str)) {
            (_, Some("assistant")) => {
                index += 1;
                last_assistant_redo = false;
                false
            }
            (Format::Anthropic, Some("user")) => m
                .get("content")
                .and_then(Value::as_array)
                .is_some_and(|blocks| {
                    blocks.iter().any(|b| {
                        b.get("type").and_then(Value::as_str) == Some("tool_result")
                            && b.get("content").is_some_and(rolled_back)
                    })
                }),
            (Format::OpenAi, Some("tool")) => m.get("content").is_some_and(rolled_back),
            _ => false,
        };
        if redo && !last_assistant_redo && index > 0 {
            index -= 1;
            last_assistant_redo = true;
        }
    }
    index
}

/// The mark a summary written for a wrapped CLI's compaction carries: how many
/// script steps the conversation it replaces had done.
pub(crate) fn place_marker(done: usize) -> String {
    format!("[fake provider: {done} script steps done]")
}

/// The script steps done, from a summary's mark in `text`.
fn place_in(text: &str) -> Option<usize> {
    let rest = &text[text.find("[fake provider: ")? + "[fake provider: ".len()..];
    rest.split(' ').next()?.parse().ok()
}

fn chunks(s: &str, size: usize) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    chars
        .chunks(size.max(1))
        .map(|c| c.iter().collect())
        .collect()
}

fn tool_id(format: Format, step: usize, j: usize) -> String {
    match format {
        Format::Anthropic => format!("toolu_fake_{step}_{j}"),
        Format::OpenAi => format!("call_fake_{step}_{j}"),
    }
}

pub(crate) fn reply(
    format: Format,
    index: usize,
    step: &Step,
    model: &str,
    input_tokens: u64,
    stream: bool,
) -> Response {
    let output_tokens = (step.text.len() / 4) as u64 + 12 * step.tool_calls.len() as u64 + 1;
    let frames = match (format, stream) {
        (Format::Anthropic, false) => {
            return Json(anthropic_message(
                index,
                step,
                model,
                input_tokens,
                output_tokens,
            ))
            .into_response()
        }
        (Format::OpenAi, false) => {
            return Json(openai_completion(
                index,
                step,
                model,
                input_tokens,
                output_tokens,
            ))
            .into_response()
        }
        (Format::Anthropic, true) => {
            anthropic_frames(index, step, model, input_tokens, output_tokens)
        }
        (Format::OpenAi, true) => openai_frames(index, step, model, input_tokens, output_tokens),
    };
    event_stream(frames, step)
}

/// Server-sent `frames` as a streamed reply, `step.chunk_delay_ms` apart: the pause
/// is between chunks, the first going at once, as a provider's opening event does.
pub(crate) fn event_stream(frames: Vec<String>, step: &Step) -> Response {
    let delay = Duration::from_millis(step.chunk_delay_ms);
    let body = futures_util::stream::unfold(
        (frames.into_iter(), true),
        move |(mut it, first)| async move {
            let frame = it.next()?;
            if !first && !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            Some((Ok::<_, Infallible>(bytes::Bytes::from(frame)), (it, false)))
        },
    );
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

fn stop_reason(step: &Step) -> &'static str {
    if step.tool_calls.is_empty() {
        "end_turn"
    } else {
        "tool_use"
    }
}

fn anthropic_message(index: usize, step: &Step, model: &str, input: u64, output: u64) -> Value {
    let mut content = Vec::new();
    if !step.text.is_empty() {
        content.push(json!({"type": "text", "text": step.text}));
    }
    for (j, call) in step.tool_calls.iter().enumerate() {
        content.push(json!({"type": "tool_use", "id": tool_id(Format::Anthropic, index, j), "name": call.name, "input": call.input}));
    }
    json!({
        "id": format!("msg_fake_{index}"), "type": "message", "role": "assistant", "model": model,
        "content": content, "stop_reason": stop_reason(step), "stop_sequence": null,
        "usage": {"input_tokens": input, "output_tokens": output},
    })
}

fn sse(event: &str, data: Value) -> String {
    format!("event: {event}\ndata: {data}\n\n")
}

fn anthropic_frames(
    index: usize,
    step: &Step,
    model: &str,
    input: u64,
    output: u64,
) -> Vec<String> {
    let mut frames = vec![sse(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": format!("msg_fake_{index}"), "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": input, "output_tokens": 1}}}),
    )];
    let mut block = 0;
    if !step.text.is_empty() {
        frames.push(sse("content_block_start", json!({"type": "content_block_start", "index": block, "content_block": {"type": "text", "text": ""}})));
        frames.push(sse("ping", json!({"type": "ping"})));
        for piece in chunks(&step.text, 16) {
            frames.push(sse("content_block_delta", json!({"type": "content_block_delta", "index": block, "delta": {"type": "text_delta", "text": piece}})));
        }
        frames.push(sse(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": block}),
        ));
        block += 1;
    }
    for (j, call) in step.tool_calls.iter().enumerate() {
        frames.push(sse("content_block_start", json!({"type": "content_block_start", "index": block,
            "content_block": {"type": "tool_use", "id": tool_id(Format::Anthropic, index, j), "name": call.name, "input": {}}})));
        for piece in chunks(&call.input.to_string(), 24) {
            frames.push(sse("content_block_delta", json!({"type": "content_block_delta", "index": block, "delta": {"type": "input_json_delta", "partial_json": piece}})));
        }
        frames.push(sse(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": block}),
        ));
        block += 1;
    }
    frames.push(sse("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": stop_reason(step), "stop_sequence": null}, "usage": {"output_tokens": output}})));
    frames.push(sse("message_stop", json!({"type": "message_stop"})));
    frames
}

fn openai_finish(step: &Step) -> &'static str {
    if step.tool_calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    }
}

fn openai_completion(index: usize, step: &Step, model: &str, input: u64, output: u64) -> Value {
    let calls: Vec<Value> = step
        .tool_calls
        .iter()
        .enumerate()
        .map(|(j, c)| json!({"id": tool_id(Format::OpenAi, index, j), "type": "function", "function": {"name": c.name, "arguments": c.input.to_string()}}))
        .collect();
    let mut message = json!({"role": "assistant", "content": if step.text.is_empty() { Value::Null } else { json!(step.text) }});
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    json!({
        "id": format!("chatcmpl-fake-{index}"), "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": openai_finish(step)}],
        "usage": {"prompt_tokens": input, "completion_tokens": output, "total_tokens": input + output},
    })
}

fn openai_frames(index: usize, step: &Step, model: &str, input: u64, output: u64) -> Vec<String> {
    let id = format!("chatcmpl-fake-{index}");
    let chunk = |choices: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": id, "object": "chat.completion.chunk", "created": 0, "model": model, "choices": choices})
        )
    };
    let mut frames = vec![chunk(
        json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]),
    )];
    for piece in chunks(&step.text, 16) {
        frames.push(chunk(
            json!([{"index": 0, "delta": {"content": piece}, "finish_reason": null}]),
        ));
    }
    for (j, call) in step.tool_calls.iter().enumerate() {
        frames.push(chunk(json!([{"index": 0, "delta": {"tool_calls": [{"index": j, "id": tool_id(Format::OpenAi, index, j), "type": "function", "function": {"name": call.name, "arguments": ""}}]}, "finish_reason": null}])));
        for piece in chunks(&call.input.to_string(), 24) {
            frames.push(chunk(json!([{"index": 0, "delta": {"tool_calls": [{"index": j, "function": {"arguments": piece}}]}, "finish_reason": null}])));
        }
    }
    frames.push(chunk(
        json!([{"index": 0, "delta": {}, "finish_reason": openai_finish(step)}]),
    ));
    frames.push(format!(
        "data: {}\n\n",
        json!({"id": id, "object": "chat.completion.chunk", "created": 0, "model": model, "choices": [],
               "usage": {"prompt_tokens": input, "completion_tokens": output, "total_tokens": input + output}})
    ));
    frames.push("data: [DONE]\n\n".to_string());
    frames
}
