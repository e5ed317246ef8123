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

/// Sends the test request through `client` under a gate held shut, as a task.
fn send_held(
    client: ModelClient,
) -> (
    steadfast_model::GateOpener,
    tokio::task::JoinHandle<steadfast_model::Result<steadfast_model::ModelResponse>>,
) {
    let prepared = steadfast_model::RequestBuilder::default().prepare(
        &client,
        request().head(),
        &request().messages,
    );
    let (opener, gate) = steadfast_model::gate();
    let call = tokio::spawn(async move { client.send_gated(&prepared, gate, &mut |_| {}).await });
    (opener, call)
}

/// Reads one HTTP request's head from `socket`: its bytes so far and the body's length.
async fn read_head(socket: &mut tokio::net::TcpStream) -> (Vec<u8>, usize) {
    use tokio::io::AsyncReadExt;
    let mut seen = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        let n = socket.read(&mut buf).await.unwrap();
        assert!(n > 0, "the client closed before its request's head");
        seen.extend_from_slice(&buf[..n]);
        if let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&seen[..end]).to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .expect("the length is declared")
                .trim()
                .parse()
                .unwrap();
            return (seen[end + 4..].to_vec(), length);
        }
    }
}

#[tokio::test]
async fn a_gated_request_is_sent_but_for_its_last_byte_until_the_gate_opens() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = Endpoint {
        base_url: format!("http://{}", listener.local_addr().unwrap()),
        api_key: "k".into(),
    };
    let client = ModelClient::new("anthropic", endpoint, fast_retries()).unwrap();
    let (opener, call) = send_held(client);
    let (mut socket, _) = listener.accept().await.unwrap();
    let (mut body, length) = read_head(&mut socket).await;
    let mut buf = vec![0u8; length];
    while body.len() < length - 1 {
        let n = socket.read(&mut buf).await.unwrap();
        assert!(n > 0, "the client closed mid-body");
        body.extend_from_slice(&buf[..n]);
    }
    assert_eq!(
        body.len(),
        length - 1,
        "all but the last byte arrive at once"
    );
    // Held: nothing more comes until the gate opens.
    let more = tokio::time::timeout(Duration::from_millis(300), socket.read(&mut buf)).await;
    assert!(more.is_err(), "the last byte waits for the gate: {more:?}");
    opener.open();
    let n = socket.read(&mut buf).await.unwrap();
    body.extend_from_slice(&buf[..n]);
    assert_eq!(body.len(), length, "the last byte follows the gate");
    let request: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(request["messages"][0]["content"][0]["text"], "fix it");
    let answer = br#"{"type":"error","error":{"type":"invalid_request_error","message":"seen"}}"#;
    let head = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        answer.len()
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    socket.write_all(answer).await.unwrap();
    let err = call.await.unwrap().unwrap_err();
    assert!(matches!(err, Error::Rejected { status: 400, .. }), "{err}");
}

async fn a_refused_gate_abandons_the_request(provider: &str) {
    let fake = FakeProvider::start(script(json!({}))).await.unwrap();
    let (opener, call) = send_held(client(provider, &fake, "fake-provider-key").await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(fake.state().connections(), 1, "the request is on its way");
    assert_eq!(fake.calls(), 0, "but not whole");
    drop(opener);
    let err = call.await.unwrap().unwrap_err();
    assert!(matches!(err, Error::Withheld), "{err}");
    // Not retried either.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(fake.calls(), 0, "the provider never had the whole request");
}

#[tokio::test]
async fn a_refused_gate_abandons_an_anthropic_request() {
    a_refused_gate_abandons_the_request("anthropic").await;
}

#[tokio::test]
async fn a_refused_gate_abandons_an_openai_request() {
    a_refused_gate_abandons_the_request("openai").await;
}

async fn an_open_gate_completes_the_call(provider: &str) {
    let fake = FakeProvider::start(script(json!({}))).await.unwrap();
    let (opener, call) = send_held(client(provider, &fake, "fake-provider-key").await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(fake.calls(), 0, "held");
    opener.open();
    let response = call.await.unwrap().unwrap();
    assert_eq!(fake.calls(), 1);
    assert!(!response.content.is_empty());
}

#[tokio::test]
async fn an_open_gate_completes_an_anthropic_call() {
    an_open_gate_completes_the_call("anthropic").await;
}

#[tokio::test]
async fn an_open_gate_completes_an_openai_call() {
    an_open_gate_completes_the_call("openai").await;
}

/// A provider on loopback that answers one request with `events`, a server-sent event
/// stream, as `provider` would.
async fn answering(provider: &str, events: String) -> ModelClient {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let (mut body, length) = read_head(&mut socket).await;
        let mut buf = vec![0u8; 65536];
        while body.len() < length {
            let n = socket.read(&mut buf).await.unwrap();
            body.extend_from_slice(&buf[..n]);
        }
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n",
            events.len()
        );
        socket.write_all(head.as_bytes()).await.unwrap();
        socket.write_all(events.as_bytes()).await.unwrap();
    });
    let base_url = match provider {
        "openai" => format!("{base}/v1"),
        _ => base,
    };
    let endpoint = Endpoint {
        base_url,
        api_key: "k".into(),
    };
    ModelClient::new(provider, endpoint, fast_retries()).unwrap()
}

async fn sent(client: &ModelClient) -> steadfast_model::Result<steadfast_model::ModelResponse> {
    let prepared = steadfast_model::RequestBuilder::default().prepare(
        client,
        request().head(),
        &request().messages,
    );
    let (opener, gate) = steadfast_model::gate();
    opener.open();
    client.send_gated(&prepared, gate, &mut |_| {}).await
}

#[tokio::test]
async fn a_tool_call_cut_off_by_the_output_limit_is_left_out_and_the_reply_kept() {
    // A reply that ran into its output limit (as one lowered to fit a spend cap may)
    // part way through a tool call's input: the text stands, the cut call goes.
    let anthropic = [
        json!({"type": "message_start", "message": {"usage": {"input_tokens": 10, "output_tokens": 0}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Writing it."}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "t1", "name": "bash", "input": {}}}),
        json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"command\": \"echo hel"}}),
        json!({"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, "usage": {"output_tokens": 1024}}),
        json!({"type": "message_stop"}),
    ]
    .iter()
    .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap()))
    .collect::<String>();
    let reply = sent(&answering("anthropic", anthropic).await)
        .await
        .unwrap();
    assert_eq!(reply.stop_reason, "max_tokens");
    assert!(
        matches!(&reply.content[..], [Block::Text { text }] if text == "Writing it."),
        "{:?}",
        reply.content
    );

    let openai = [
        json!({"choices": [{"index": 0, "delta": {"content": "Writing it."}}]}),
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1", "type": "function",
            "function": {"name": "bash", "arguments": "{\"command\": \"echo hel"}}]}}]}),
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
               "usage": {"prompt_tokens": 10, "completion_tokens": 1024}}),
    ]
    .iter()
    .map(|e| format!("data: {e}\n\n"))
    .chain(["data: [DONE]\n\n".to_string()])
    .collect::<String>();
    let reply = sent(&answering("openai", openai).await).await.unwrap();
    assert_eq!(reply.stop_reason, "max_tokens");
    assert!(
        matches!(&reply.content[..], [Block::Text { text }] if text == "Writing it."),
        "{:?}",
        reply.content
    );
}
