//! The OpenAI Chat Completions API (`POST /chat/completions`, streaming).

use futures_util::StreamExt;
use serde_json::{json, Value};
use steadfast_log::{Block, Message, Role, ToolUse, Usage};

use crate::retry::{send, Attempt};
use crate::{sse, Delta, Endpoint, Error, ModelResponse, RequestHead};

const PROVIDER: &str = "openai";

/// `m` as items of the request's `messages` (a user message's tool results are
/// messages of their own).
pub(crate) fn push_messages(m: &Message, out: &mut Vec<Value>) {
    match m.role {
        Role::User => {
            let text = m.text();
            for block in &m.content {
                if let Block::ToolResult {
                    tool_use_id,
                    content,
                    ..
                } = block
                {
                    out.push(
                        json!({"role": "tool", "tool_call_id": tool_use_id, "content": content}),
                    );
                }
            }
            if !text.is_empty() {
                out.push(json!({"role": "user", "content": text}));
            }
        }
        Role::Assistant => {
            let text = m.text();
            let calls: Vec<Value> = m
                .tool_uses()
                .map(|t| json!({"id": t.id, "type": "function", "function": {"name": t.name, "arguments": t.input.to_string()}}))
                .collect();
            let mut msg = json!({"role": "assistant", "content": if text.is_empty() { Value::Null } else { Value::String(text) }});
            if !calls.is_empty() {
                msg["tool_calls"] = Value::Array(calls);
            }
            out.push(msg);
        }
    }
}

/// The first of the request's `messages`: the system prompt.
pub(crate) fn system_message(head: RequestHead<'_>) -> Value {
    json!({"role": "system", "content": head.system})
}

/// The request body's fields besides `messages`.
pub(crate) fn head_json(head: RequestHead<'_>) -> Value {
    let tools: Vec<Value> = head
        .tools
        .iter()
        .map(|t| json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.input_schema}}))
        .collect();
    json!({
        "model": head.model,
        "tools": tools,
        "max_completion_tokens": head.max_tokens,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
}

fn protocol(message: impl Into<String>) -> Attempt {
    Attempt::Fatal(Error::Protocol {
        provider: PROVIDER,
        message: message.into(),
    })
}

#[derive(Default)]
struct Call {
    id: String,
    name: String,
    arguments: String,
}

pub(crate) async fn complete(
    http: &reqwest::Client,
    endpoint: &Endpoint,
    body: crate::Body<'_>,
    on_delta: &mut (dyn FnMut(Delta) + Send),
) -> Result<ModelResponse, Attempt> {
    let url = format!(
        "{}/chat/completions",
        endpoint.base_url.trim_end_matches('/')
    );
    let response = send(
        PROVIDER,
        body.on(http
            .post(&url)
            .bearer_auth(&endpoint.api_key)
            .header(reqwest::header::CONTENT_TYPE, "application/json")),
    )
    .await?;
    let mut events = sse::events(response);
    let mut text = String::new();
    let mut calls: Vec<Call> = Vec::new();
    let mut finish = None;
    let mut usage = Usage::default();
    let mut done = false;
    let mut mid_stream_marked = false;
    while let Some(event) = events.next().await {
        let event = event?;
        if event.data.trim() == "[DONE]" {
            done = true;
            break;
        }
        let chunk: Value =
            serde_json::from_str(&event.data).map_err(|e| protocol(format!("bad chunk: {e}")))?;
        if let Some(err) = chunk.get("error") {
            let message = err
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("stream error")
                .to_string();
            return Err(Attempt::Retry {
                message,
                after: None,
                streamed: true,
            });
        }
        if let Some(u) = chunk.get("usage").filter(|u| !u.is_null()) {
            let cached = u
                .pointer("/prompt_tokens_details/cached_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0);
            let prompt = u.get("prompt_tokens").and_then(Value::as_u64).unwrap_or(0);
            usage.input_tokens = prompt.saturating_sub(cached);
            usage.cache_read_tokens = cached;
            usage.output_tokens = u
                .get("completion_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0);
        }
        let Some(choice) = chunk.pointer("/choices/0") else {
            continue;
        };
        if let Some(r) = choice.get("finish_reason").and_then(Value::as_str) {
            finish = Some(r.to_string());
        }
        let Some(delta) = choice.get("delta") else {
            continue;
        };
        if let Some(piece) = delta.get("content").and_then(Value::as_str) {
            text.push_str(piece);
            on_delta(Delta::Text(piece.to_string()));
        }
        if let Some(tool_calls) = delta.get("tool_calls").and_then(Value::as_array) {
            for tc in tool_calls {
                let i = tc.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
                if calls.len() <= i {
                    calls.resize_with(i + 1, Call::default);
                }
                let call = &mut calls[i];
                if let Some(id) = tc.get("id").and_then(Value::as_str) {
                    call.id = id.to_string();
                }
                if let Some(name) = tc.pointer("/function/name").and_then(Value::as_str) {
                    call.name.push_str(name);
                    on_delta(Delta::ToolUse {
                        name: name.to_string(),
                    });
                }
                if let Some(args) = tc.pointer("/function/arguments").and_then(Value::as_str) {
                    call.arguments.push_str(args);
                }
            }
        }
        if !mid_stream_marked {
            mid_stream_marked = true;
            steadfast_fault::point(steadfast_fault::points::MODEL_MID_STREAM);
        }
    }
    if !done {
        return Err(Attempt::Retry {
            message: "stream ended before [DONE]".into(),
            after: None,
            streamed: true,
        });
    }
    let mut content = Vec::new();
    if !text.is_empty() {
        content.push(Block::Text { text });
    }
    let cut_off = finish.as_deref() == Some("length");
    for call in calls {
        let input = if call.arguments.trim().is_empty() {
            Value::Object(Default::default())
        } else {
            match serde_json::from_str(&call.arguments) {
                Ok(input) => input,
                // The output limit cut the call's arguments short: the call is left
                // out, the reply kept (it says why it stopped).
                Err(_) if cut_off => continue,
                Err(e) => return Err(protocol(format!("tool arguments are not JSON: {e}"))),
            }
        };
        content.push(Block::ToolUse(ToolUse {
            id: call.id,
            name: call.name,
            input,
        }));
    }
    let stop_reason = match finish.as_deref() {
        Some("tool_calls") => "tool_use",
        Some("length") => "max_tokens",
        _ => "end_turn",
    };
    Ok(ModelResponse {
        content,
        stop_reason: stop_reason.to_string(),
        usage,
    })
}
