//! A whole session through the API — create, stream, steer, wait and signal,
//! escalate and resume, a client tool answered, inspect, interrupt, close, delete, and
//! the errors on the way —
//! with every response and every event validated, by a JSON Schema validator, against
//! the OpenAPI document the server generates and serves: the schema of that
//! operation's status and content type. A reply or an event the document does not
//! describe fails here.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{dev, server, wait_status};
use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde_json::{json, Value};

/// The served document, and the kinds of event and operations checked against it.
struct Checker {
    doc: Value,
    events: BTreeSet<String>,
    checked: BTreeSet<String>,
}

impl Checker {
    async fn fetch(url: &str) -> Self {
        let doc: Value = reqwest::get(format!("{url}/openapi.json"))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        Checker {
            doc,
            events: BTreeSet::new(),
            checked: BTreeSet::new(),
        }
    }

    /// What is wrong with `instance` by `schema`, whose `$ref`s point into the document.
    fn problems(&self, schema: &Value, instance: &Value, what: &str) -> Vec<String> {
        let root = json!({"components": self.doc["components"], "allOf": [schema]});
        let validator = jsonschema::draft202012::new(&root)
            .unwrap_or_else(|e| panic!("{what}: the document's schema does not compile: {e}"));
        validator
            .iter_errors(instance)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect()
    }

    /// Validates `instance` against `schema`.
    fn validate(&self, schema: &Value, instance: &Value, what: &str) {
        let problems = self.problems(schema, instance, what);
        assert!(
            problems.is_empty(),
            "{what}: the reply does not match the document:\n{}\n{instance:#}",
            problems.join("\n")
        );
    }

    /// The schema the document gives for `method template` answering `status` as
    /// `content_type`.
    fn response_schema(
        &self,
        method: &str,
        template: &str,
        status: u16,
        content_type: &str,
    ) -> Value {
        let op = &self.doc["paths"][template][method];
        assert!(op.is_object(), "{method} {template} is not in the document");
        let response = &op["responses"][status.to_string()];
        assert!(
            response.is_object(),
            "{method} {template} answered {status}, which the document does not list"
        );
        response["content"][content_type]["schema"].clone()
    }

    /// Sends a request and validates the reply against the document; returns it.
    async fn call(
        &mut self,
        method: reqwest::Method,
        url: &str,
        template: &str,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = reqwest::Client::new().request(method.clone(), format!("{url}{path}"));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let bytes = resp.bytes().await.unwrap();
        let method = method.as_str().to_lowercase();
        self.checked.insert(format!("{method} {template} {status}"));
        if status == 204 {
            assert!(bytes.is_empty());
            self.response_schema(&method, template, status, "");
            return (status, Value::Null);
        }
        if content_type.starts_with("application/json") {
            let value: Value = serde_json::from_slice(&bytes).unwrap();
            let schema = self.response_schema(&method, template, status, "application/json");
            self.validate(&schema, &value, &format!("{method} {path} {status}"));
            if template == "/v1/sessions/{id}/events" && status == 200 {
                for event in value["events"].as_array().unwrap() {
                    self.events
                        .insert(event["type"].as_str().unwrap().to_string());
                }
            }
            return (status, value);
        }
        let op = &self.doc["paths"][template][&method]["responses"][status.to_string()];
        let media = if op["content"][&content_type].is_object() {
            content_type.clone()
        } else {
            content_type
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        };
        let schema = self.response_schema(&method, template, status, &media);
        assert!(
            schema.is_object(),
            "{method} {template} {status}: the document has no {content_type} content"
        );
        (
            status,
            Value::String(String::from_utf8_lossy(&bytes).into()),
        )
    }

    /// Reads an event stream to its `end`, validating every frame against the
    /// document's frame schema and every event against `PublicEvent`.
    async fn stream(
        &mut self,
        resp: reqwest::Response,
        template: &str,
        method: &str,
    ) -> Vec<Value> {
        assert_eq!(resp.status(), 200);
        let frame_schema = self.response_schema(method, template, 200, "text/event-stream");
        let event_schema = json!({"$ref": "#/components/schemas/PublicEvent"});
        let mut events = Vec::new();
        let mut stream = resp.bytes_stream().eventsource();
        while let Some(frame) = tokio::time::timeout(Duration::from_secs(60), stream.next())
            .await
            .expect("the stream goes on")
        {
            let frame = frame.unwrap();
            let mut shown = json!({"data": frame.data});
            if !frame.id.is_empty() {
                shown["id"] = frame.id.clone().into();
            }
            if frame.event != "message" {
                shown["event"] = frame.event.clone().into();
            }
            self.validate(&frame_schema, &shown, "a stream frame");
            if frame.event == "end" {
                break;
            }
            let event: Value = serde_json::from_str(&frame.data).unwrap();
            self.validate(&event_schema, &event, "a streamed event");
            assert_eq!(event["seq"].to_string(), frame.id, "ids are log positions");
            self.events
                .insert(event["type"].as_str().unwrap().to_string());
            events.push(event);
        }
        self.checked
            .insert(format!("{method} {template} 200 (stream)"));
        events
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_session_answers_only_what_the_document_describes() {
    let srv = server(
        json!([
            {"text": "writing the notes", "tool_calls": [{"name": "bash", "input": {"command": "printf 'one\\n' > notes.txt"}}]},
            {"text": "written"},
            {"text": "running the slow step", "tool_calls": [{"name": "bash", "input": {"command": "sleep 2; echo slow done"}}]},
            {"text": "steered, finishing"},
            {"tool_calls": [{"name": "request_approval", "input": {"reason": "may I push?"}}]},
            {"text": "approved, done"},
            {"text": "resumed", "tool_calls": [{"name": "bash", "input": {"command": "printf 'two\\n' >> notes.txt"}}]},
            {"text": "all done"},
            {"text": "looking the ticket up", "tool_calls": [{"name": "lookup_ticket", "input": {"id": 7}}]},
            {"text": "ticket 7 is closed"}
        ]),
        dev(),
        1,
        |_| {},
    )
    .await;
    let url = srv.url.clone();
    let mut c = Checker::fetch(&url).await;
    use reqwest::Method as M;

    // Create, with bad bodies on the way.
    let (status, _) = c
        .call(
            M::POST,
            &url,
            "/v1/sessions",
            "/v1/sessions",
            Some(json!({"budget": {"max_turns": 0}})),
        )
        .await;
    assert_eq!(status, 422);
    let (status, created) = c
        .call(
            M::POST,
            &url,
            "/v1/sessions",
            "/v1/sessions",
            Some(json!({"task": "write the notes", "budget": {"max_turns": 3}, "workspace": {"kind": "empty", "files": {"README.md": "# notes\n"}},
                        "tools": [{"name": "lookup_ticket", "description": "Look a ticket up", "input_schema": {"type": "object", "properties": {"id": {"type": "integer"}}}}]})),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let session = format!("/v1/sessions/{id}");
    let (status, _) = c
        .call(
            M::GET,
            &url,
            "/v1/sessions/{id}",
            "/v1/sessions/s_nobody",
            None,
        )
        .await;
    assert_eq!(status, 404);

    // The first turn, streamed from the start.
    let resp = reqwest::get(format!("{url}{session}/events"))
        .await
        .unwrap();
    let first = c.stream(resp, "/v1/sessions/{id}/events", "get").await;
    assert!(first.iter().any(|e| e["type"] == "tool_call_outcome"));
    wait_status(&url, &id, None, "idle").await;

    // A second turn with a steer while its slow command runs.
    let resp = reqwest::Client::new()
        .post(format!("{url}{session}/messages"))
        .json(&json!({"text": "run the slow step"}))
        .send()
        .await
        .unwrap();
    let streaming = {
        let url = url.clone();
        let session = session.clone();
        tokio::spawn(async move {
            for _ in 0..400 {
                let page: Value = reqwest::Client::new()
                    .get(format!("{url}{session}/events?after=0&limit=1000"))
                    .header("accept", "application/json")
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                let running = page["events"].as_array().unwrap().iter().any(|e| {
                    e["type"] == "tool_call_intent"
                        && e["input"]["command"]
                            .as_str()
                            .is_some_and(|c| c.starts_with("sleep"))
                });
                if running {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            panic!("the slow command never started");
        })
    };
    streaming.await.unwrap();
    let (status, _) = c
        .call(
            M::POST,
            &url,
            "/v1/sessions/{id}/messages",
            &format!("{session}/messages"),
            Some(json!({"text": "", "kind": "steer"})),
        )
        .await;
    assert_eq!(status, 422);
    let steer = reqwest::Client::new()
        .post(format!("{url}{session}/messages"))
        .json(&json!({"text": "also note the time", "kind": "steer"}))
        .send()
        .await
        .unwrap();
    let steered = c.stream(steer, "/v1/sessions/{id}/messages", "post").await;
    assert!(
        steered.iter().any(|e| e["type"] == "steered"),
        "{steered:?}"
    );
    c.stream(resp, "/v1/sessions/{id}/messages", "post").await;
    wait_status(&url, &id, None, "idle").await;

    // A third turn waits for approval; a stale or misnamed answer is refused.
    let (status, _) = c
        .call(
            M::POST,
            &url,
            "/v1/sessions/{id}/signals/{name}",
            &format!("{session}/signals/approval"),
            Some(json!({"approved": true})),
        )
        .await;
    assert_eq!(status, 409);
    let ask = reqwest::Client::new()
        .post(format!("{url}{session}/messages"))
        .json(&json!({"text": "push it"}))
        .send()
        .await
        .unwrap();
    let waiting = wait_status(&url, &id, None, "waiting").await;
    let (_, shown) = c
        .call(M::GET, &url, "/v1/sessions/{id}", &session, None)
        .await;
    assert_eq!(shown["waiting_for"], "approval");
    let wait = waiting["waiting_since"].as_u64().unwrap();
    let (status, accepted) = c
        .call(
            M::POST,
            &url,
            "/v1/sessions/{id}/signals/{name}",
            &format!("{session}/signals/approval?wait={wait}"),
            Some(json!({"approved": true})),
        )
        .await;
    assert_eq!((status, accepted["answers"].as_u64()), (202, Some(wait)));
    c.stream(ask, "/v1/sessions/{id}/messages", "post").await;
    wait_status(&url, &id, None, "idle").await;

    // A fourth turn passes the turn bound: escalated, then resumed with a raise.
    let more = reqwest::Client::new()
        .post(format!("{url}{session}/messages"))
        .json(&json!({"text": "add a second line"}))
        .send()
        .await
        .unwrap();
    drop(more);
    wait_status(&url, &id, None, "escalated").await;
    let (_, shown) = c
        .call(M::GET, &url, "/v1/sessions/{id}", &session, None)
        .await;
    assert_eq!(shown["escalated_by"], "turns");
    let (status, _) = c
        .call(
            M::POST,
            &url,
            "/v1/sessions/{id}/signals/{name}",
            &format!("{session}/signals/resume"),
            Some(json!({"max_turns": -1})),
        )
        .await;
    assert_eq!(status, 422);
    let (status, _) = c
        .call(
            M::POST,
            &url,
            "/v1/sessions/{id}/signals/{name}",
            &format!("{session}/signals/resume"),
            Some(json!({"max_turns": 5})),
        )
        .await;
    assert_eq!(status, 202);
    wait_status(&url, &id, None, "idle").await;

    let (_, shown) = c
        .call(M::GET, &url, "/v1/sessions/{id}", &session, None)
        .await;
    assert_eq!(shown["reply"], "all done");

    // A fifth turn calls the client's tool: the session waits until the client answers.
    let ask = reqwest::Client::new()
        .post(format!("{url}{session}/messages"))
        .json(&json!({"text": "what about ticket 7?"}))
        .send()
        .await
        .unwrap();
    wait_status(&url, &id, None, "waiting").await;
    let (_, shown) = c
        .call(M::GET, &url, "/v1/sessions/{id}", &session, None)
        .await;
    assert_eq!(shown["waiting_call"]["tool"], "lookup_ticket", "{shown}");
    let call_id = shown["waiting_call"]["call_id"]
        .as_str()
        .unwrap()
        .to_string();
    let results = format!("{session}/tool_results");
    let (status, _) = c
        .call(
            M::POST,
            &url,
            "/v1/sessions/{id}/tool_results",
            &results,
            Some(json!({"call_id": "nope", "content": "x"})),
        )
        .await;
    assert_eq!(status, 409);
    let (status, _) = c
        .call(
            M::POST,
            &url,
            "/v1/sessions/{id}/tool_results",
            &results,
            Some(json!({"call_id": call_id, "content": {"state": "closed"}})),
        )
        .await;
    assert_eq!(status, 202);
    c.stream(ask, "/v1/sessions/{id}/messages", "post").await;
    wait_status(&url, &id, None, "idle").await;

    // Inspect: state, listing, pages, the workspace then and now, its diff, integrity.
    let (_, shown) = c
        .call(M::GET, &url, "/v1/sessions/{id}", &session, None)
        .await;
    assert_eq!(shown["reply"], "ticket 7 is closed");
    let (_, listing) = c
        .call(M::GET, &url, "/v1/sessions", "/v1/sessions", None)
        .await;
    assert_eq!(listing["sessions"].as_array().unwrap().len(), 1);
    let mut after = 0;
    let mut pages = 0;
    loop {
        let page = {
            let resp = reqwest::Client::new()
                .get(format!("{url}{session}/events?after={after}&limit=7"))
                .header("accept", "application/json")
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
            let value: Value = resp.json().await.unwrap();
            let schema =
                c.response_schema("get", "/v1/sessions/{id}/events", 200, "application/json");
            c.validate(&schema, &value, "an event page");
            for event in value["events"].as_array().unwrap() {
                c.events.insert(event["type"].as_str().unwrap().to_string());
            }
            value
        };
        pages += 1;
        after = page["next_after"].as_u64().unwrap();
        if !page["has_more"].as_bool().unwrap() {
            break;
        }
    }
    assert!(pages > 3, "{pages} pages");
    let (status, _) = c
        .call(
            M::GET,
            &url,
            "/v1/sessions/{id}/events",
            &format!("{session}/events?cursor=first"),
            None,
        )
        .await;
    assert_eq!(status, 400);
    // The whole log once more, as a stream from the start.
    let resp = reqwest::get(format!("{url}{session}/events"))
        .await
        .unwrap();
    let all = c.stream(resp, "/v1/sessions/{id}/events", "get").await;
    assert_eq!(all.last().unwrap()["seq"].as_u64(), Some(after));
    let (_, files) = c
        .call(
            M::GET,
            &url,
            "/v1/sessions/{id}/files",
            &format!("{session}/files"),
            None,
        )
        .await;
    assert!(files["entries"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["path"] == "notes.txt" && e["kind"] == "file"));
    let (_, before) = c
        .call(
            M::GET,
            &url,
            "/v1/sessions/{id}/files",
            &format!("{session}/files?at=0"),
            None,
        )
        .await;
    assert!(!before["entries"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["path"] == "notes.txt"));
    let (status, text) = c
        .call(
            M::GET,
            &url,
            "/v1/sessions/{id}/files/{path}",
            &format!("{session}/files/notes.txt"),
            None,
        )
        .await;
    assert_eq!((status, text), (200, json!("one\ntwo\n")));
    let (status, _) = c
        .call(
            M::GET,
            &url,
            "/v1/sessions/{id}/files/{path}",
            &format!("{session}/files/missing.txt"),
            None,
        )
        .await;
    assert_eq!(status, 404);
    let (_, diff) = c
        .call(
            M::GET,
            &url,
            "/v1/sessions/{id}/diff",
            &format!("{session}/diff"),
            None,
        )
        .await;
    assert_eq!(diff["files"][0]["change"], "added", "{diff}");
    let (status, _) = c
        .call(
            M::GET,
            &url,
            "/v1/sessions/{id}/diff",
            &format!("{session}/diff?to=999999"),
            None,
        )
        .await;
    assert_eq!(status, 422);
    let (status, _) = c
        .call(
            M::GET,
            &url,
            "/v1/sessions/{id}/archive",
            &format!("{session}/archive?at=0"),
            None,
        )
        .await;
    assert_eq!(status, 200);
    let (_, integrity) = c
        .call(
            M::GET,
            &url,
            "/v1/sessions/{id}/integrity",
            &format!("{session}/integrity"),
            None,
        )
        .await;
    assert_eq!(integrity["ok"], true);
    c.call(M::GET, &url, "/v1/agents", "/v1/agents", None).await;
    c.call(M::GET, &url, "/healthz", "/healthz", None).await;
    c.call(M::GET, &url, "/metrics", "/metrics", None).await;

    // Nothing runs: an interrupt is refused; close, then delete.
    let (status, _) = c
        .call(
            M::POST,
            &url,
            "/v1/sessions/{id}/interrupt",
            &format!("{session}/interrupt"),
            None,
        )
        .await;
    assert_eq!(status, 409);
    let (status, closed) = c
        .call(
            M::POST,
            &url,
            "/v1/sessions/{id}/close",
            &format!("{session}/close"),
            None,
        )
        .await;
    assert_eq!((status, &closed["status"]), (200, &json!("closed")));
    let (status, _) = c
        .call(
            M::POST,
            &url,
            "/v1/sessions/{id}/messages",
            &format!("{session}/messages"),
            Some(json!({"text": "one more"})),
        )
        .await;
    assert_eq!(status, 409);
    let (status, _) = c
        .call(M::DELETE, &url, "/v1/sessions/{id}", &session, None)
        .await;
    assert_eq!(status, 204);
    let (status, _) = c
        .call(M::GET, &url, "/v1/sessions/{id}", &session, None)
        .await;
    assert_eq!(status, 404);

    // The checks can fail: events the document does not describe are refused.
    let event = json!({"$ref": "#/components/schemas/PublicEvent"});
    for bad in [
        json!({"type": "turn_ended", "turn": 1, "reply": null, "at_ms": 1}),
        json!({"type": "no_such_kind", "seq": 1, "at_ms": 1}),
        json!({"type": "tool_call_outcome", "seq": 1, "at_ms": 1, "call_id": "t", "is_error": false,
               "exit_code": 0, "output": {"excerpt": "", "truncated": false, "bytes": "12"}}),
        json!({"type": "turn_ended", "seq": -1, "at_ms": 1, "turn": 1, "reply": "done"}),
    ] {
        assert!(
            !c.problems(&event, &bad, "a bad event").is_empty(),
            "{bad} passed"
        );
    }

    // The run produced every kind of event a native session's turns make.
    for kind in [
        "session_started",
        "user_message",
        "steered",
        "model_call_intent",
        "model_delta",
        "model_call_outcome",
        "tool_call_intent",
        "tool_call_outcome",
        "wait_started",
        "signal_received",
        "turn_ended",
        "escalated",
    ] {
        assert!(c.events.contains(kind), "no {kind} among {:?}", c.events);
    }
    assert!(c.checked.len() >= 25, "{:?}", c.checked);
}
