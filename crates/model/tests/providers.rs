//! Both model clients against the fake provider over real HTTP on loopback.

use std::time::Duration;

use serde_json::json;
use steadfast_log::{Block, Message};
use steadfast_model::{Delta, Endpoint, Error, ModelClient, ModelRequest, RetryPolicy, ToolDef};
use steadfast_testkit::{FakeProvider, Script};

fn script(extra: serde_json::Value) -> Script {
    let mut step = json!({
        "text": "Let me look around, carefully.",
        "tool_calls": [
            {"name": "bash", "input": {"command": "ls -la"}},
            {"name": "read", "input": {"file_path": "src/main.rs", "offset": 3}}
        ]
    });
    if let (Some(s), Some(e)) = (step.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    serde_json::from_value::<Script>(json!({"steps": [step, {"text": "All done."}]}))
        .map_err(|e| e.to_string())
        .unwrap()
}

fn fast_retries() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 3,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(50),
    }
}

fn request() -> ModelRequest {
    ModelRequest {
        model: "claude-sonnet-4-5".into(),
        system: "You are a coding agent.".into(),
        messages: vec![Message::user_text("fix it")],
        tools: vec![ToolDef {
            name: "bash".into(),
            description: "run".into(),
            input_schema: json!({"type": "object"}),
        }],
        max_tokens: 1024,
    }
}

async fn client(provider: &str, fake: &FakeProvider, key: &str) -> ModelClient {
    let base_url = match provider {
        "openai" => format!("{}/v1", fake.base_url()),
        _ => fake.base_url(),
    };
    let endpoint = Endpoint {
        base_url,
        api_key: key.into(),
    };
    ModelClient::new(provider, endpoint, fast_retries()).unwrap()
}

async fn streams_text_and_tool_calls(provider: &str) {
    let fake = FakeProvider::start(script(json!({}))).await.unwrap();
    let client = client(provider, &fake, "test-key").await;
    let mut deltas = Vec::new();
    let reply = client
        .complete(&request(), &mut |d| deltas.push(d))
        .await
        .unwrap();
    assert_eq!(reply.stop_reason, "tool_use");
    assert_eq!(reply.content.len(), 3);
    assert_eq!(
        reply.content[0],
        Block::Text {
            text: "Let me look around, carefully.".into()
        }
    );
    let Block::ToolUse(read) = &reply.content[2] else {
        panic!("not a tool call")
    };
    assert_eq!(read.name, "read");
    assert_eq!(read.input, json!({"file_path": "src/main.rs", "offset": 3}));
    assert!(reply.usage.input_tokens > 0 && reply.usage.output_tokens > 0);
    let text: String = deltas
        .iter()
        .filter_map(|d| match d {
            Delta::Text(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(text, "Let me look around, carefully.");
    assert!(deltas.len() > 2, "the reply arrived in pieces");
    assert_eq!(fake.calls(), 1);

    // The conversation round-trips through the wire format: the next step is chosen
    // from the assistant turns the request carries.
    let mut next = request();
    next.messages.push(Message {
        role: steadfast_log::Role::Assistant,
        content: reply.content.clone(),
    });
    next.messages.push(Message {
        role: steadfast_log::Role::User,
        content: reply
            .content
            .iter()
            .filter_map(|b| match b {
                Block::ToolUse(t) => Some(Block::ToolResult {
                    tool_use_id: t.id.clone(),
                    content: "ok".into(),
                    is_error: false,
                }),
                _ => None,
            })
            .collect(),
    });
    let done = client.complete(&next, &mut |_| {}).await.unwrap();
    assert_eq!(
        done.content,
        vec![Block::Text {
            text: "All done.".into()
        }]
    );
    assert_eq!(done.stop_reason, "end_turn");
}

#[tokio::test]
async fn anthropic_streams_text_and_tool_calls() {
    streams_text_and_tool_calls("anthropic").await;
}

#[tokio::test]
async fn openai_streams_text_and_tool_calls() {
    streams_text_and_tool_calls("openai").await;
}

#[tokio::test]
async fn overloaded_and_rate_limited_calls_are_retried() {
    for (provider, status) in [("anthropic", 529), ("openai", 429), ("anthropic", 503)] {
        let fake = FakeProvider::start(script(json!({"fail": {"status": status, "times": 2}})))
            .await
            .unwrap();
        let client = client(provider, &fake, "k").await;
        let reply = client.complete(&request(), &mut |_| {}).await.unwrap();
        assert_eq!(reply.stop_reason, "tool_use");
        assert_eq!(
            fake.calls(),
            3,
            "{provider} {status}: two failures then success"
        );
    }
}

#[tokio::test]
async fn retries_give_up_with_a_clear_error() {
    let fake = FakeProvider::start(script(json!({"fail": {"status": 500, "times": 10}})))
        .await
        .unwrap();
    let client = client("anthropic", &fake, "k").await;
    let err = client.complete(&request(), &mut |_| {}).await.unwrap_err();
    assert!(
        matches!(err, Error::Unavailable { attempts: 3, .. }),
        "{err}"
    );
    assert!(err.is_retryable());
}

#[tokio::test]
async fn client_errors_are_not_retried() {
    let fake = FakeProvider::start(script(json!({"fail": {"status": 400, "times": 10}})))
        .await
        .unwrap();
    for provider in ["anthropic", "openai"] {
        let client = client(provider, &fake, "k").await;
        let err = client.complete(&request(), &mut |_| {}).await.unwrap_err();
        assert!(matches!(err, Error::Rejected { status: 400, .. }), "{err}");
        assert!(err.to_string().contains("scripted failure"));
    }
    assert_eq!(fake.calls(), 2, "one call per provider, no retries");
}

#[tokio::test]
async fn an_unreachable_provider_is_unavailable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let endpoint = Endpoint {
        base_url: format!("http://{addr}"),
        api_key: "k".into(),
    };
    let client = ModelClient::new("anthropic", endpoint, fast_retries()).unwrap();
    let err = client.complete(&request(), &mut |_| {}).await.unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err}");
}
