//! Requests built a message at a time.
//!
//! A long session sends its whole conversation with every call. Building that request
//! from scratch each time (cloning the messages, turning each into the provider's JSON,
//! serializing, hashing the lot) made a step's cost grow with the conversation. A
//! [`RequestBuilder`] keeps, for every settled message (all but the last, which a tool
//! result can still grow), its JSON on the wire, its canonical size and hash; the next
//! call serializes and hashes only the messages that are new or were rewritten. What
//! is left per call is copying the bytes into the body, which the socket needs anyway,
//! and hashing one hash per message into the fingerprint.

use serde::Serialize;
use steadfast_log::Message;

use crate::{anthropic, openai, ModelClient, Provider, ToolDef};

/// What a request says besides its messages.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RequestHead<'a> {
    /// The provider's model name.
    pub model: &'a str,
    /// The system prompt.
    pub system: &'a str,
    /// The tools on offer.
    pub tools: &'a [ToolDef],
    /// The most tokens the reply may have.
    pub max_tokens: u32,
}

/// A request ready to send with [`ModelClient::send`].
#[derive(Debug, Clone)]
pub struct Prepared {
    pub(crate) provider: Provider,
    pub(crate) body: bytes::Bytes,
    /// Names the request: equal heads and equal messages, equal fingerprints, whichever
    /// provider it is for (a hash over the head and each message's canonical JSON's
    /// hash).
    pub fingerprint: String,
    /// The length of the request's canonical JSON (its head and every message), the
    /// measure compaction estimates tokens from.
    pub canonical_bytes: usize,
}

impl Prepared {
    /// The length of the body sent, what a call's worst-case cost is counted from
    /// (see [`crate::pricing::output_room`]).
    pub fn body_len(&self) -> usize {
        self.body.len()
    }
}

/// One settled message: what the next request reuses.
#[derive(Debug)]
struct Settled {
    /// Its JSON on the wire: zero or more array items, comma-separated.
    wire: Vec<u8>,
    /// The length of its canonical JSON.
    canonical: usize,
    /// The hash of its canonical JSON.
    hash: blake3::Hash,
}

impl Settled {
    fn of(provider: Provider, message: &Message) -> Settled {
        let canonical = serde_json::to_vec(message).expect("messages serialize");
        Settled {
            wire: wire_message(provider, message),
            canonical: canonical.len(),
            hash: blake3::hash(&canonical),
        }
    }
}

/// Builds the requests of one conversation as it grows (see the module's docs). Call
/// [`RequestBuilder::forget`] for a message other than the last that is rewritten (an
/// elision), [`RequestBuilder::forget_from`] when they all move (a compaction); a
/// conversation that only grows needs nothing.
#[derive(Debug, Default)]
pub struct RequestBuilder {
    provider: Option<Provider>,
    /// By position; `None`: to be built again.
    settled: Vec<Option<Settled>>,
    /// The last head's wire form, kept while the head stays the same (as it does
    /// from call to call): turning the tools into the provider's JSON cost more than
    /// the rest of a step's request.
    head: Option<WireHead>,
}

/// A request head on the wire, and the canonical head it was built from.
#[derive(Debug)]
struct WireHead {
    canonical: Vec<u8>,
    /// The body up to its messages' first item.
    prefix: Vec<u8>,
    /// Items that come before the conversation's.
    leading: Vec<Vec<u8>>,
}

/// What the fingerprint's hash starts with: a new scheme, a new prefix.
const FINGERPRINT_SCHEME: &[u8] = b"steadfast request v2\0";

impl RequestBuilder {
    /// Drops what was kept of the message at `index`: the next request builds it again.
    pub fn forget(&mut self, index: usize) {
        if let Some(settled) = self.settled.get_mut(index) {
            *settled = None;
        }
    }

    /// Drops what was kept of messages from `index` on (`0`: everything).
    pub fn forget_from(&mut self, index: usize) {
        self.settled.truncate(index);
    }

    /// How many messages the next request will not serialize again.
    pub fn settled(&self) -> usize {
        self.settled.iter().flatten().count()
    }

    /// The request of `head` and `messages` for `client`'s provider.
    pub fn prepare(
        &mut self,
        client: &ModelClient,
        head: RequestHead<'_>,
        messages: &[Message],
    ) -> Prepared {
        let provider = client.provider;
        if self.provider != Some(provider) {
            self.settled.clear();
            self.head = None;
            self.provider = Some(provider);
        }
        let settle_to = messages.len().saturating_sub(1);
        self.settled.truncate(settle_to);
        for (kept, message) in self.settled.iter_mut().zip(messages) {
            if kept.is_none() {
                *kept = Some(Settled::of(provider, message));
            }
        }
        let from = self.settled.len();
        self.settled.extend(
            messages[from..settle_to]
                .iter()
                .map(|m| Some(Settled::of(provider, m))),
        );
        let last = messages.get(settle_to).map(|m| Settled::of(provider, m));
        let all: Vec<&Settled> = self.settled.iter().flatten().chain(last.as_ref()).collect();

        let head_canonical = serde_json::to_vec(&head).expect("request heads serialize");
        let mut hasher = blake3::Hasher::new();
        hasher.update(FINGERPRINT_SCHEME);
        hasher.update(&head_canonical);
        for message in &all {
            hasher.update(message.hash.as_bytes());
        }
        // As `ModelRequest`'s JSON: the head, `"messages":[...],` and the messages
        // with a comma between each two.
        let canonical_bytes = head_canonical.len()
            + r#""messages":[],"#.len()
            + all.iter().map(|s| s.canonical + 1).sum::<usize>()
            - usize::from(!all.is_empty());

        if self
            .head
            .as_ref()
            .is_none_or(|kept| kept.canonical != head_canonical)
        {
            let (prefix, leading) = wire_head(provider, head);
            self.head = Some(WireHead {
                canonical: head_canonical,
                prefix,
                leading,
            });
        }
        let WireHead {
            prefix, leading, ..
        } = self.head.as_ref().expect("the head was just kept");
        let items = leading
            .iter()
            .map(Vec::as_slice)
            .chain(all.iter().map(|s| s.wire.as_slice()))
            .filter(|item| !item.is_empty());
        let size: usize = prefix.len()
            + leading.iter().map(Vec::len).sum::<usize>()
            + all.iter().map(|s| s.wire.len() + 1).sum::<usize>()
            + 2;
        let mut body = Vec::with_capacity(size);
        body.extend_from_slice(prefix);
        for (i, item) in items.enumerate() {
            if i > 0 {
                body.push(b',');
            }
            body.extend_from_slice(item);
        }
        body.extend_from_slice(b"]}");
        Prepared {
            provider,
            body: body.into(),
            fingerprint: hasher.finalize().to_hex().to_string(),
            canonical_bytes,
        }
    }
}

/// The body up to its messages' first item (`{..., "messages":[`), and the items that
/// come before the conversation's (OpenAI's system message).
fn wire_head(provider: Provider, head: RequestHead<'_>) -> (Vec<u8>, Vec<Vec<u8>>) {
    let (object, leading) = match provider {
        Provider::Anthropic => (anthropic::head_json(head), Vec::new()),
        Provider::OpenAi => (
            openai::head_json(head),
            vec![serde_json::to_vec(&openai::system_message(head)).expect("json serializes")],
        ),
    };
    let mut prefix = serde_json::to_vec(&object).expect("json serializes");
    // `{...}` → `{..., "messages":[`
    prefix.pop();
    if prefix.len() > 1 {
        prefix.push(b',');
    }
    prefix.extend_from_slice(br#""messages":["#);
    (prefix, leading)
}

/// `message` as items of the provider's `messages` array, comma-separated.
fn wire_message(provider: Provider, message: &Message) -> Vec<u8> {
    let items = match provider {
        Provider::Anthropic => vec![anthropic::message_json(message)],
        Provider::OpenAi => {
            let mut items = Vec::new();
            openai::push_messages(message, &mut items);
            items
        }
    };
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        serde_json::to_writer(&mut out, item).expect("json serializes");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Endpoint, RetryPolicy};
    use serde_json::{json, Value};
    use steadfast_log::{Block, Role, ToolUse};

    fn client(provider: &str) -> ModelClient {
        let endpoint = Endpoint {
            base_url: "http://127.0.0.1:9".into(),
            api_key: "k".into(),
        };
        ModelClient::new(provider, endpoint, RetryPolicy::default()).unwrap()
    }

    fn tools() -> Vec<ToolDef> {
        vec![ToolDef {
            name: "read".into(),
            description: "reads a file".into(),
            input_schema: json!({"type": "object"}),
        }]
    }

    fn head(tools: &[ToolDef]) -> RequestHead<'_> {
        RequestHead {
            model: "claude-sonnet-4-5",
            system: "You are a coding agent.",
            tools,
            max_tokens: 1024,
        }
    }

    /// A session's conversation as it grows, with the last message growing in place
    /// (a second tool result joining the first).
    fn conversations() -> Vec<Vec<Message>> {
        let mut conversation = vec![Message::user_text("fix the parser")];
        let mut all = vec![conversation.clone()];
        for step in 0..6 {
            let uses: Vec<ToolUse> = (0..2)
                .map(|k| ToolUse {
                    id: format!("toolu_{step}_{k}"),
                    name: "read".into(),
                    input: json!({"file_path": format!("f{k}.rs")}),
                })
                .collect();
            conversation.push(Message {
                role: Role::Assistant,
                content: std::iter::once(Block::Text {
                    text: format!("step {step} \"quoted\"\n"),
                })
                .chain(uses.iter().cloned().map(Block::ToolUse))
                .collect(),
            });
            all.push(conversation.clone());
            for use_ in &uses {
                let result = Block::ToolResult {
                    tool_use_id: use_.id.clone(),
                    content: format!("contents of {}", use_.input["file_path"]),
                    is_error: false,
                };
                match conversation.last_mut() {
                    Some(m) if m.role == Role::User => m.content.push(result),
                    _ => conversation.push(Message {
                        role: Role::User,
                        content: vec![result],
                    }),
                }
                all.push(conversation.clone());
            }
        }
        all
    }

    #[test]
    fn a_request_built_step_by_step_equals_one_built_from_scratch() {
        let tools = tools();
        for provider in ["anthropic", "openai"] {
            let client = client(provider);
            let mut builder = RequestBuilder::default();
            for messages in conversations() {
                let grown = builder.prepare(&client, head(&tools), &messages);
                let fresh = RequestBuilder::default().prepare(&client, head(&tools), &messages);
                assert_eq!(grown.body, fresh.body, "{provider}");
                assert_eq!(grown.fingerprint, fresh.fingerprint);
                assert_eq!(grown.canonical_bytes, fresh.canonical_bytes);
                let request = crate::ModelRequest {
                    model: "claude-sonnet-4-5".into(),
                    system: "You are a coding agent.".into(),
                    messages: messages.clone(),
                    tools: tools.clone(),
                    max_tokens: 1024,
                };
                let canonical = serde_json::to_vec(&request).unwrap();
                assert_eq!(grown.canonical_bytes, canonical.len());
                assert_eq!(builder.settled(), messages.len() - 1);
                let body: Value = serde_json::from_slice(&grown.body).unwrap();
                assert_eq!(body["model"], "claude-sonnet-4-5");
                assert_eq!(body["stream"], true);
                let sent = body["messages"].as_array().unwrap();
                match provider {
                    "anthropic" => {
                        assert_eq!(sent.len(), messages.len());
                        assert_eq!(body["system"], "You are a coding agent.");
                    }
                    _ => {
                        assert_eq!(sent[0]["role"], "system");
                        let results: usize = messages
                            .iter()
                            .flat_map(|m| &m.content)
                            .filter(|b| matches!(b, Block::ToolResult { .. }))
                            .count();
                        assert_eq!(sent.iter().filter(|m| m["role"] == "tool").count(), results);
                    }
                }
            }
        }
    }

    #[test]
    fn fingerprints_follow_content_not_provider() {
        let tools = tools();
        let messages = &conversations()[5];
        let (a, b) = (client("anthropic"), client("openai"));
        let of = |client: &ModelClient, messages: &[Message], head: RequestHead<'_>| {
            RequestBuilder::default()
                .prepare(client, head, messages)
                .fingerprint
        };
        let fingerprint = of(&a, messages, head(&tools));
        assert_eq!(fingerprint, of(&b, messages, head(&tools)));
        assert_ne!(fingerprint, of(&a, &messages[1..], head(&tools)));
        let mut other = messages.clone();
        other[0] = Message::user_text("fix the lexer");
        assert_ne!(fingerprint, of(&a, &other, head(&tools)));
        let longer = RequestHead {
            max_tokens: 2048,
            ..head(&tools)
        };
        assert_ne!(fingerprint, of(&a, messages, longer));
    }

    #[test]
    fn a_rewritten_history_is_built_again_once_forgotten() {
        let tools = tools();
        let client = client("anthropic");
        let mut builder = RequestBuilder::default();
        let mut messages = conversations().pop().unwrap();
        builder.prepare(&client, head(&tools), &messages);
        let fresh = |messages: &[Message]| {
            RequestBuilder::default().prepare(&client, head(&tools), messages)
        };
        // One message rewritten in place (an elision).
        messages[3] = Message::user_text("[elided]");
        builder.forget(3);
        let rebuilt = builder.prepare(&client, head(&tools), &messages);
        assert_eq!(rebuilt.body, fresh(&messages).body);
        assert_eq!(rebuilt.fingerprint, fresh(&messages).fingerprint);
        // All of them moved (a compaction).
        messages.drain(..4);
        messages.insert(0, Message::user_text("[summary] the parser is fixed"));
        builder.forget_from(0);
        let rebuilt = builder.prepare(&client, head(&tools), &messages);
        assert_eq!(rebuilt.body, fresh(&messages).body);
        assert_eq!(rebuilt.fingerprint, fresh(&messages).fingerprint);
    }

    #[test]
    fn a_changed_head_is_built_again() {
        let mut tools = tools();
        let messages = conversations().pop().unwrap();
        for provider in ["anthropic", "openai"] {
            let client = client(provider);
            let mut builder = RequestBuilder::default();
            builder.prepare(&client, head(&tools), &messages);
            // A tool joins (an MCP server connected), then the prompt changes.
            tools.push(ToolDef {
                name: "search".into(),
                description: "searches".into(),
                input_schema: json!({"type": "object"}),
            });
            let grown = builder.prepare(&client, head(&tools), &messages);
            let fresh = RequestBuilder::default().prepare(&client, head(&tools), &messages);
            assert_eq!(grown.body, fresh.body, "{provider}");
            let body: Value = serde_json::from_slice(&grown.body).unwrap();
            assert_eq!(body["tools"].as_array().unwrap().len(), tools.len());
            let other = RequestHead {
                system: "You are a careful coding agent.",
                ..head(&tools)
            };
            let grown = builder.prepare(&client, other, &messages);
            let fresh = RequestBuilder::default().prepare(&client, other, &messages);
            assert_eq!(grown.body, fresh.body, "{provider}");
        }
    }
}
