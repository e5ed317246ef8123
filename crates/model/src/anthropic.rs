//! The Anthropic Messages API (`POST /v1/messages`, streaming).

use futures_util::StreamExt;
use serde_json::{json, Value};
use steadfast_log::{Block, Message, Role, ToolUse, Usage};

use crate::retry::{send, Attempt};
use crate::{sse, Delta, Endpoint, Error, ModelResponse, RequestHead};

const PROVIDER: &str = "anthropic";
const API_VERSION: &str = "2023-06-01";

fn block_json(block: &Block) -> Option<Value> {
    Some(match block {
        Block::Text { text } if text.is_empty() => return None,
        Block::Text { text } => json!({"type": "text", "text": text}),
        Block::ToolUse(t) => {
            json!({"type": "tool_use", "id": t.id, "name": t.name, "input": t.input})
        }
        Block::ToolResult {
            tool_use_id,
            content,
            is_error,
        } => {
            json!({"type": "tool_result", "tool_use_id": tool_use_id, "content": content, "is_error": is_error})
        }
    })
}

/// `m` as an item of the request's `messages`.
pub(crate) fn message_json(m: &Message) -> Value {
    let role = match m.role {
        Role::User => "user",
        Role::Assistant => "assistant",
    };
    let content: Vec<Value> = m.content.iter().filter_map(block_json).collect();
    json!({"role": role, "content": content})
}

/// The request body's fields besides `messages`.
pub(crate) fn head_json(head: RequestHead<'_>) -> Value {
    let tools: Vec<Value> = head
        .tools
        .iter()
        .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.input_schema}))
        .collect();
    json!({
        "model": head.model,
        "max_tokens": head.max_tokens,
        "system": head.system,
        "tools": tools,
        "stream": true,
    })
}

fn protocol(message: impl Into<String>) -> Attempt {
    Attempt::Fatal(Error::Protocol {
        provider: PROVIDER,
        message: message.into(),
    })
}

enum Partial {
    Text(String),
    Tool {
        id: String,
        name: String,
        json: String,
    },
}

fn usage_from(v: &Value, usage: &mut Usage) {
    let get = |k: &str| v.get(k).and_then(Value::as_u64);
    if let Some(n) = get("input_tokens") {
        usage.input_tokens = n;
    }
    if let Some(n) = get("output_tokens") {
        usage.output_tokens = n;
    }
    if let Some(n) = get("cache_read_input_tokens") {
        usage.cache_read_tokens = n;
    }
    if let Some(n) = get("cache_creation_input_tokens") {
        usage.cache_write_tokens = n;
    }
}

pub(crate) async fn complete(
    http: &reqwest::Client,
    endpoint: &Endpoint,
    body: crate::Body<'_>,
    on_delta: &mut (dyn FnMut(Delta) + Send),
) -> Result<ModelResponse, Attempt> {
    let url = format!("{}/v1/messages", endpoint.base_url.trim_end_matches('/'));
    let response = send(
        PROVIDER,
        body.on(http
            .post(&url)
            .header("x-api-key", &endpoint.api_key)
            .header("anthropic-version", API_VERSION)
            .header(reqwest::header::CONTENT_TYPE, "application/json")),
    )
    .await?;

    let mut events = sse::events(response);
    let mut blocks: Vec<Option<Partial>> = Vec::new();
    let mut usage = Usage::default();
    let mut stop_reason = None;
    let mut mid_stream_marked = false;
    let mut finished = false;
    while let Some(event) = events.next().await {
        let event = event?;
        let data: Value = match serde_json::from_str(&event.data) {
            Ok(v) => v,
            Err(_) if event.data.trim().is_empty() => continue,
            Err(e) => return Err(protocol(format!("bad event data: {e}"))),
        };
        let kind = data
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or(&event.event);
        let index = data.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
        match kind {
            "message_start" => {
                if let Some(u) = data.pointer("/message/usage") {
                    usage_from(u, &mut usage);
                }
            }
            "content_block_start" => {
                let block = data
                    .get("content_block")
                    .ok_or_else(|| protocol("content_block_start without a block"))?;
                let partial = match block.get("type").and_then(Value::as_str) {
                    Some("text") => Partial::Text(
                        block
                            .get("text")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string(),
                    ),
                    Some("tool_use") => {
                        let name = block
                            .get("name")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string();
                        on_delta(Delta::ToolUse { name: name.clone() });
                        Partial::Tool {
                            id: block
                                .get("id")
                                .and_then(Value::as_str)
                                .unwrap_or("")
                                .to_string(),
                            name,
                            json: String::new(),
                        }
                    }
                    _ => continue, // thinking and other block kinds are not kept
                };
                if blocks.len() <= index {
                    blocks.resize_with(index + 1, || None);
                }
                blocks[index] = Some(partial);
            }
            "content_block_delta" => {
                let delta = data.get("delta").ok_or_else(|| protocol("delta missing"))?;
                match (
                    blocks.get_mut(index).and_then(Option::as_mut),
                    delta.get("type").and_then(Value::as_str),
                ) {
                    (Some(Partial::Text(text)), Some("text_delta")) => {
                        let piece = delta.get("text").and_then(Value::as_str).unwrap_or("");
                        text.push_str(piece);
                        on_delta(Delta::Text(piece.to_string()));
                    }
                    (Some(Partial::Tool { json, .. }), Some("input_json_delta")) => {
                        json.push_str(
                            delta
                                .get("partial_json")
                                .and_then(Value::as_str)
                                .unwrap_or(""),
                        );
                    }
                    _ => {}
                }
                if !mid_stream_marked {
                    mid_stream_marked = true;
                    steadfast_fault::point(steadfast_fault::points::MODEL_MID_STREAM);
                }
            }
            "message_delta" => {
                if let Some(r) = data.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    stop_reason = Some(r.to_string());
                }
                if let Some(u) = data.get("usage") {
                    usage_from(u, &mut usage);
                }
            }
            "message_stop" => {
                finished = true;
                break;
            }
            "error" => {
                let message = data
                    .pointer("/error/message")
                    .and_then(Value::as_str)
                    .unwrap_or("stream error");
                let kind = data
                    .pointer("/error/type")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                return Err(
                    if matches!(kind, "overloaded_error" | "api_error" | "rate_limit_error") {
                        Attempt::Retry {
                            message: message.to_string(),
                            after: None,
                            streamed: true,
                        }
                    } else {
                        Attempt::Fatal(Error::Rejected {
                            provider: PROVIDER,
                            status: 400,
                            message: message.to_string(),
                        })
                    },
                );
            }
            _ => {} // ping, content_block_stop
        }
    }
    if !finished {
        return Err(Attempt::Retry {
            message: "stream ended before message_stop".into(),
            after: None,
            streamed: true,
        });
    }
    let mut content = Vec::new();
    let cut_off = stop_reason.as_deref() == Some("max_tokens");
    for partial in blocks.into_iter().flatten() {
        content.push(match partial {
            Partial::Text(text) => Block::Text { text },
            Partial::Tool { id, name, json } => {
                let input = if json.trim().is_empty() {
                    Value::Object(Default::default())
                } else {
                    match serde_json::from_str(&json) {
                        Ok(input) => input,
                        // The output limit cut the call's input short: the call is
                        // left out, the reply kept (it says why it stopped).
                        Err(_) if cut_off => continue,
                        Err(e) => return Err(protocol(format!("tool input is not JSON: {e}"))),
                    }
                };
                Block::ToolUse(ToolUse { id, name, input })
            }
        });
    }
    Ok(ModelResponse {
        content,
        stop_reason: stop_reason.unwrap_or_else(|| "end_turn".into()),
        usage,
    })
}
