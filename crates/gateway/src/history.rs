//! A wrapped CLI's conversation across turns.
//!
//! A CLI is started afresh for each turn (and again after a crash, to replay its turn
//! from the log), so on its own it would know nothing of the turns before. The gateway
//! makes each turn continue the last: when a run of the CLI stops, the items of the
//! last conversation request it made are kept, with its final answer after them (a
//! [`Conversation`], named by the log's `conversation_kept`). The next turn's CLI is
//! given only the new message, and the gateway puts the kept items in front of that
//! message in each of its conversation requests. The model sees every earlier message,
//! tool call and result, in the CLI's own wire format, as an interactive session of
//! the CLI would send them; and since the items come from the log and the blob store,
//! a replay after a crash, another host and a fork all send the same requests.
//!
//! A *conversation request* offers tools and has a user item holding the turn's
//! message; the CLIs' side requests (titles, quota probes) are left as they are.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::Api;

/// A wrapped CLI's conversation as a run of it left it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Conversation {
    /// The CLI that made it (`claude-code`, ...): only that CLI is given it.
    pub cli: String,
    /// The API its requests went to: only requests to that API are continued with it.
    pub api: Api,
    /// The request's items (`messages`, or `input` for the Responses API), ending
    /// with the CLI's answer, or with a note of why the turn stopped.
    pub items: Vec<Value>,
}

/// What a gateway knows of the conversation it continues.
#[derive(Debug, Clone, Default)]
pub struct Continuing {
    /// The message the turn's CLI was given: it opens the turn's part of each
    /// conversation request.
    pub task: String,
    /// The conversation of the turns before, if one was kept.
    pub history: Option<Conversation>,
}

/// The last conversation request a gateway saw, as sent on.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    /// The API it went to.
    pub(crate) kind: Api,
    /// Its items.
    pub items: Vec<Value>,
    /// Its exchange's index in the session's record.
    pub index: usize,
}

impl Seen {
    /// The API it went to.
    pub fn api(&self) -> Api {
        self.kind
    }

    /// The conversation to keep: these items, closed by `closing` said by the
    /// assistant (the CLI's answer, or why the turn stopped).
    pub fn kept(&self, cli: &str, closing: Option<&str>) -> Conversation {
        let mut items = self.items.clone();
        if let Some(text) = closing {
            items.push(assistant(self.api(), text));
        }
        Conversation {
            cli: cli.to_string(),
            api: self.api(),
            items,
        }
    }
}

/// The field an API's request carries its conversation in.
fn items_field(api: Api) -> Option<&'static str> {
    match api {
        Api::AnthropicMessages | Api::OpenAiChat => Some("messages"),
        Api::OpenAiResponses => Some("input"),
        Api::AnthropicCountTokens => None,
    }
}

/// The text of an item's content: a string, or the `text` of each of its parts.
fn text_of(content: &Value) -> String {
    match content {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

fn role(item: &Value) -> Option<&str> {
    item.get("role").and_then(Value::as_str)
}

/// An assistant item saying `text`, in `api`'s format.
fn assistant(api: Api, text: &str) -> Value {
    match api {
        Api::OpenAiChat => json!({"role": "assistant", "content": text}),
        Api::OpenAiResponses => json!({
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text}],
        }),
        _ => json!({"role": "assistant", "content": [{"type": "text", "text": text}]}),
    }
}

/// Where the turn's part of a conversation request begins: the first user item that
/// holds `task`. `None` for a request that is not one of the conversation's.
pub(crate) fn opening(request: &Value, api: Api, task: &str) -> Option<usize> {
    let task = task.trim();
    let offers_tools = request
        .get("tools")
        .and_then(Value::as_array)
        .is_some_and(|t| !t.is_empty());
    if task.is_empty() || !offers_tools {
        return None;
    }
    let items = request.get(items_field(api)?)?.as_array()?;
    items.iter().position(|item| {
        role(item) == Some("user")
            && item
                .get("content")
                .is_some_and(|c| text_of(c).contains(task))
    })
}

/// The items `request` is sent with: `history`'s, then the request's own from
/// `opening` on (what came before it, the CLI's preamble, is in `history` already).
/// A history that does not end with the assistant (its turn was cut off) gets a note
/// saying so, so that the roles still alternate.
pub(crate) fn continued(history: &Conversation, request: &mut Value, api: Api, opening: usize) {
    let Some(field) = items_field(api) else {
        return;
    };
    let Some(own) = request.get(field).and_then(Value::as_array) else {
        return;
    };
    let mut items = history.items.clone();
    if items.last().and_then(role) != Some("assistant") {
        items.push(assistant(
            history.api,
            "[This turn was interrupted before it finished.]",
        ));
    }
    items.extend(own[opening..].iter().cloned());
    request[field] = Value::Array(items);
}

/// What the model said in a recorded reply (`status`, content type, body): the text
/// of a streamed reply's text deltas, or of a whole reply's text parts.
pub(crate) fn reply_text(api: Api, content_type: &str, body: &str) -> String {
    if content_type.starts_with("text/event-stream") {
        let mut deltas = crate::deltas::TextDeltas::default();
        let mut text = deltas.feed(api, body.as_bytes());
        text.push_str(&deltas.feed(api, b"\n\n"));
        return text;
    }
    let Ok(doc) = serde_json::from_str::<Value>(body) else {
        return String::new();
    };
    let texts = |parts: &Value, kind: &str| -> Vec<String> {
        parts
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["type"] == kind)
            .filter_map(|p| p["text"].as_str().map(str::to_string))
            .collect()
    };
    match api {
        Api::AnthropicMessages => texts(&doc["content"], "text").join(""),
        Api::OpenAiChat => doc["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        Api::OpenAiResponses => doc["output"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|item| item["type"] == "message")
            .flat_map(|item| texts(&item["content"], "output_text"))
            .collect::<Vec<_>>()
            .join(""),
        Api::AnthropicCountTokens => String::new(),
    }
}

/// The items of a conversation request.
pub(crate) fn items(request: &Value, api: Api) -> Vec<Value> {
    items_field(api)
        .and_then(|f| request.get(f))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anthropic(messages: Value) -> Value {
        json!({"model": "m", "tools": [{"name": "bash"}], "messages": messages})
    }

    #[test]
    fn a_turn_continues_the_kept_conversation_from_its_own_message_on() {
        let turn_one = Seen {
            kind: Api::AnthropicMessages,
            items: vec![
                json!({"role": "user", "content": [{"type": "text", "text": "<reminder>"}, {"type": "text", "text": "fix it"}]}),
                json!({"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "bash", "input": {}}]}),
                json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "MARKER-42"}]}),
            ],
            index: 1,
        }
        .kept("claude-code", Some("Fixed."));
        assert_eq!(turn_one.items.len(), 4);
        let mut request = anthropic(json!([
            {"role": "user", "content": "preamble"},
            {"role": "user", "content": [{"type": "text", "text": "and now?"}]},
        ]));
        let at = opening(&request, Api::AnthropicMessages, "and now?").unwrap();
        assert_eq!(at, 1);
        continued(&turn_one, &mut request, Api::AnthropicMessages, at);
        let sent = request["messages"].as_array().unwrap();
        assert_eq!(sent.len(), 5, "{request}");
        assert!(request.to_string().contains("MARKER-42"));
        assert_eq!(sent[3]["content"][0]["text"], "Fixed.");
        assert_eq!(sent[4]["content"][0]["text"], "and now?");
        assert!(!request.to_string().contains("preamble"));
    }

    #[test]
    fn a_reply_says_what_the_model_wrote_streamed_or_whole() {
        let streamed = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"Done \"}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"now.\"}}\n\n";
        assert_eq!(
            reply_text(Api::AnthropicMessages, "text/event-stream", streamed),
            "Done now."
        );
        let whole = json!({"output": [
            {"type": "reasoning", "summary": []},
            {"type": "message", "content": [{"type": "output_text", "text": "All good."}]},
        ]});
        assert_eq!(
            reply_text(Api::OpenAiResponses, "application/json", &whole.to_string()),
            "All good."
        );
        let chat = json!({"choices": [{"message": {"content": "Yes."}}]});
        assert_eq!(
            reply_text(Api::OpenAiChat, "application/json", &chat.to_string()),
            "Yes."
        );
    }

    #[test]
    fn side_requests_and_other_apis_are_left_alone() {
        let no_tools = json!({"messages": [{"role": "user", "content": "fix it"}]});
        assert_eq!(opening(&no_tools, Api::AnthropicMessages, "fix it"), None);
        let other_text = anthropic(json!([{"role": "user", "content": "a title please"}]));
        assert_eq!(opening(&other_text, Api::AnthropicMessages, "fix it"), None);
        let responses = json!({"tools": [{}], "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "fix it"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix it"}]},
        ]});
        assert_eq!(opening(&responses, Api::OpenAiResponses, "fix it"), Some(1));
    }

    #[test]
    fn a_cut_off_history_is_closed_before_the_next_message() {
        let cut = Conversation {
            cli: "pi".into(),
            api: steadfast_log::Api::OpenAiChat,
            items: vec![json!({"role": "user", "content": "fix it"})],
        };
        let mut request = json!({"tools": [{}], "messages": [
            {"role": "system", "content": "you are pi"},
            {"role": "user", "content": "go on"},
        ]});
        let at = opening(&request, Api::OpenAiChat, "go on").unwrap();
        continued(&cut, &mut request, Api::OpenAiChat, at);
        let roles: Vec<&str> = request["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles, ["user", "assistant", "user"]);
    }
}
