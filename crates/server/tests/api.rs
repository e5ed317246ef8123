//! The API over real HTTP on loopback, with a real SQLite world, workers and the
//! fake provider.

mod common;

use std::time::Duration;

use common::{assert_error, call, dev, server, tokens, wait_status};
use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde_json::{json, Value};
use steadfast_server::Auth;

/// One SSE frame as the client saw it.
#[derive(Debug, Clone, PartialEq)]
struct Frame {
    id: String,
    event: String,
    data: String,
}

/// Reads frames from `url` until `end`, or until `limit` frames have been read (then
/// drops the connection).
async fn read_frames(url: &str, last_id: Option<&str>, limit: usize) -> (Vec<Frame>, bool) {
    let mut req = reqwest::Client::new().get(url);
    if let Some(id) = last_id {
        req = req.header("Last-Event-ID", id);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream().eventsource();
    let mut frames = Vec::new();
    while let Some(ev) = stream.next().await {
        let ev = ev.unwrap();
        if ev.event == "end" {
            return (frames, true);
        }
        frames.push(Frame {
            id: ev.id,
            event: steadfast_testkit::frame_kind(&ev.event, &ev.data),
            data: ev.data,
        });
        if frames.len() >= limit {
            return (frames, false);
        }
    }
    (frames, false)
}

fn slow_steps() -> Value {
    let text = "Let me think about this carefully and explain each step as I go along.";
    json!([
        {"text": text, "chunk_delay_ms": 5, "tool_calls": [{"name": "write", "input": {"file_path": "a.txt", "content": "one\n"}}]},
        {"text": text, "chunk_delay_ms": 5, "tool_calls": [{"name": "bash", "input": {"command": "sleep 0.2; cat a.txt"}}]},
        {"text": text, "chunk_delay_ms": 5, "tool_calls": [{"name": "edit", "input": {"file_path": "a.txt", "old_string": "one", "new_string": "two"}}]},
        {"text": "All done.", "chunk_delay_ms": 5}
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_keeps_dropping_sees_every_event_exactly_once() {
    let srv = server(slow_steps(), dev(), 1, |_| {}).await;
    let (status, created) = call(
        reqwest::Method::POST,
        &format!("{}/v1/sessions", srv.url),
        None,
        Some(json!({"task": "go"})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let events = format!(
        "{}/v1/sessions/{}/events",
        srv.url,
        created["id"].as_str().unwrap()
    );

    // A client that drops after a pseudo-random number of events, all through the
    // turn, and reconnects with the last id it saw.
    let mut seed = 0x9e37_79b9_u64;
    let mut dropping = Vec::new();
    let mut reconnects = 0;
    let mut reconnects_before_turn_end = None;
    loop {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let limit = 1 + (seed >> 33) as usize % 4;
        let last = dropping.last().map(|f: &Frame| f.id.clone());
        let (frames, ended) = read_frames(&events, last.as_deref(), limit).await;
        if reconnects_before_turn_end.is_none() && frames.iter().any(|f| f.event == "turn_ended") {
            reconnects_before_turn_end = Some(reconnects);
        }
        dropping.extend(frames);
        if ended {
            break;
        }
        reconnects += 1;
    }
    assert!(reconnects > 5, "the client dropped {reconnects} times");
    assert!(
        reconnects_before_turn_end.unwrap() >= 3,
        "the client dropped while the turn was running, not only afterwards"
    );

    // A client that never dropped, and one that reads afterwards with ?cursor=0.
    let (whole, ended) = read_frames(&format!("{events}?cursor=0"), None, usize::MAX).await;
    assert!(ended);
    assert_eq!(
        dropping, whole,
        "every event exactly once, in order, identical"
    );
    let ids: Vec<u64> = whole.iter().map(|f| f.id.parse().unwrap()).collect();
    assert_eq!(
        ids,
        (1..=ids.len() as u64).collect::<Vec<_>>(),
        "ids are log positions"
    );
    assert!(
        whole.iter().any(|f| f.event == "model_delta"),
        "text deltas stream"
    );
    assert!(whole.iter().any(|f| f.event == "turn_ended"));
    // A cursor in the middle continues from there.
    let (tail, _) = read_frames(&format!("{events}?cursor=10"), None, usize::MAX).await;
    assert_eq!(tail, whole[10..]);
}

#[tokio::test]
async fn posting_a_message_streams_its_turn() {
    let srv = server(
        json!([{"text": "hello there"}, {"text": "second"}]),
        dev(),
        1,
        |_| {},
    )
    .await;
    let created = srv.create(json!({})).await;
    let id = created["id"].as_str().unwrap();
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/sessions/{id}/messages", srv.url))
        .json(&json!({"text": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut stream = resp.bytes_stream().eventsource();
    let mut kinds = Vec::new();
    while let Some(ev) = stream.next().await {
        let ev = ev.unwrap();
        kinds.push(steadfast_testkit::frame_kind(&ev.event, &ev.data));
        if ev.event == "end" {
            break;
        }
    }
    assert_eq!(kinds.first().map(String::as_str), Some("user_message"));
    assert!(kinds.contains(&"model_call_outcome".to_string()));
    assert_eq!(&kinds[kinds.len() - 2..], ["turn_ended", "end"]);
    let (_, shown) = call(
        reqwest::Method::GET,
        &format!("{}/v1/sessions/{id}", srv.url),
        None,
        None,
    )
    .await;
    assert_eq!(shown["reply"], "hello there");
    assert_eq!(shown["status"], "idle");
}

/// A client that posts a message and then polls until the session is idle must not
/// stop before its turn has run: while no worker has taken the message, the session
/// reads as running.
#[tokio::test]
async fn a_queued_message_reads_as_running_until_its_turn_is_over() {
    let srv = server(json!([{"text": "done"}]), dev(), 0, |_| {}).await;
    let created = srv.create(json!({})).await;
    let id = created["id"].as_str().unwrap();
    assert_eq!(srv.show(id).await["status"], "idle");
    let queued = reqwest::Client::new()
        .post(format!("{}/v1/sessions/{id}/messages", srv.url))
        .header("accept", "application/json")
        .json(&json!({"text": "go"}))
        .send()
        .await
        .unwrap();
    assert_eq!(queued.status(), 202);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        srv.show(id).await["status"],
        "running",
        "no worker has taken the message, and the session must not read as idle"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_names_each_record_whose_blob_was_lost() {
    let srv = server(
        json!([
            {"tool_calls": [{"name": "bash", "input": {"command": "yes y | head -c 150000"}}]},
            {"text": "done"}
        ]),
        dev(),
        1,
        |_| {},
    )
    .await;
    let created = srv
        .create(json!({"task": "print", "workspace": {"kind": "empty", "files": {"notes.txt": "keep me\n"}}}))
        .await;
    let id = created["id"].as_str().unwrap();
    wait_status(&srv.url, id, None, "idle").await;
    let integrity = format!("{}/v1/sessions/{id}/integrity", srv.url);
    let (status, report) = call(reqwest::Method::GET, &integrity, None, None).await;
    assert_eq!(
        (status, report["ok"].clone()),
        (200, json!(true)),
        "{report}"
    );
    let blobs = srv._dir.path().join("home/blobs");
    let lost: Vec<_> = std::fs::read_dir(&blobs)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().unwrap().is_file())
        .collect();
    assert_eq!(lost.len(), 1, "one output blob");
    std::fs::remove_file(lost[0].path()).unwrap();
    let (status, report) = call(reqwest::Method::GET, &integrity, None, None).await;
    assert_eq!(status, 200);
    assert_eq!(report["ok"], false, "{report}");
    let damaged = &report["damaged"][0];
    assert_eq!(damaged["problem"], "missing", "{report}");
    assert_eq!(
        damaged["blob"],
        lost[0].file_name().to_string_lossy().as_ref()
    );
    assert!(damaged["seq"].as_u64().unwrap() > 1, "{report}");
    assert!(report["snapshots"].as_u64().unwrap() >= 1, "{report}");
    assert_eq!(report["lost_objects"], json!([]), "{report}");

    // A workspace file's stored object lost: named by the check; reading that file or
    // the workspace there is an error, not an absent file or an archive cut short.
    let object = blake3::hash(b"keep me\n").to_hex().to_string();
    let stored: Vec<_> = walkdir::WalkDir::new(srv._dir.path().join("home"))
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| {
            // Objects are stored as `ab/cdef...` (the hash's first two digits a directory).
            e.file_name().to_string_lossy() == object[2..]
                && e.path().parent().unwrap().ends_with(&object[..2])
        })
        .collect();
    assert_eq!(stored.len(), 1, "the file's object is stored once");
    std::fs::remove_file(stored[0].path()).unwrap();
    let (_, report) = call(reqwest::Method::GET, &integrity, None, None).await;
    let lost = &report["lost_objects"];
    assert_eq!(lost.as_array().unwrap().len(), 1, "{report}");
    assert_eq!(lost[0]["object"], object.as_str());
    assert_eq!(lost[0]["problem"], "missing");
    let files = format!("{}/v1/sessions/{id}/files", srv.url);
    assert_error(
        &call(
            reqwest::Method::GET,
            &format!("{files}/notes.txt"),
            None,
            None,
        )
        .await,
        500,
        "data_lost",
    );
    assert_error(
        &call(
            reqwest::Method::GET,
            &format!("{files}/nope.txt"),
            None,
            None,
        )
        .await,
        404,
        "no_file",
    );
    let archive = reqwest::get(format!("{}/v1/sessions/{id}/archive", srv.url))
        .await
        .unwrap();
    assert_eq!(archive.status(), 500, "refused before any byte");
    let body: Value = archive.json().await.unwrap();
    assert_eq!(body["error"]["code"], "data_lost", "{body}");

    // A worker that must rebuild the workspace from it (this host's copy gone) leaves
    // the session to hosts that may read the object, says why, and never ends it.
    std::fs::remove_dir_all(srv.workspace(&created)).unwrap();
    let queued = reqwest::Client::new()
        .post(format!("{}/v1/sessions/{id}/messages", srv.url))
        .header("accept", "application/json")
        .json(&json!({"text": "go on"}))
        .send()
        .await
        .unwrap();
    assert_eq!(queued.status(), 202, "queued, not streamed");
    let events = format!("{}/v1/sessions/{id}/events?after=0&limit=1000", srv.url);
    let mut said = None;
    for _ in 0..200 {
        let page: Value = reqwest::Client::new()
            .get(&events)
            .header("accept", "application/json")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        said = page["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["type"] == "error")
            .cloned();
        if said.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let said = said.expect("an error event says why no worker here drives it");
    let message = said["error"]["message"].as_str().unwrap();
    assert!(message.contains("cannot be rebuilt here"), "{said}");
    let shown = srv.show(id).await;
    assert_ne!(shown["status"], "failed", "{shown}");
    assert!(shown["end_reason"].is_null(), "{shown}");
}

#[tokio::test]
async fn tokens_owners_and_production_mode() {
    let srv = server(json!([{"text": "hi"}]), tokens(), 0, |_| {}).await;
    let sessions = format!("{}/v1/sessions", srv.url);
    assert_error(
        &call(reqwest::Method::POST, &sessions, None, Some(json!({}))).await,
        401,
        "unauthorized",
    );
    assert_error(
        &call(
            reqwest::Method::POST,
            &sessions,
            Some("nope"),
            Some(json!({})),
        )
        .await,
        401,
        "unauthorized",
    );
    let (status, created) = call(
        reqwest::Method::POST,
        &sessions,
        Some("alice-secret"),
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 201);
    let id = created["id"].as_str().unwrap();
    let mine = format!("{sessions}/{id}");

    // Bob cannot see, use, stream, signal, close or delete Alice's session: 404, as
    // if it did not exist.
    for (method, url, body) in [
        (reqwest::Method::GET, mine.clone(), None),
        (
            reqwest::Method::POST,
            format!("{mine}/messages"),
            Some(json!({"text": "x"})),
        ),
        (reqwest::Method::GET, format!("{mine}/events"), None),
        (
            reqwest::Method::POST,
            format!("{mine}/signals/approval"),
            Some(json!({})),
        ),
        (reqwest::Method::POST, format!("{mine}/close"), None),
        (reqwest::Method::DELETE, mine.clone(), None),
    ] {
        assert_error(
            &call(method.clone(), &url, Some("bob-secret"), body).await,
            404,
            "session_not_found",
        );
    }
    let (_, listed) = call(reqwest::Method::GET, &sessions, Some("bob-secret"), None).await;
    assert_eq!(listed["sessions"], json!([]));
    let (_, listed) = call(reqwest::Method::GET, &sessions, Some("alice-secret"), None).await;
    assert_eq!(listed["sessions"][0]["id"], id);
    assert_eq!(
        call(reqwest::Method::GET, &mine, Some("alice-secret"), None)
            .await
            .0,
        200
    );
    assert_error(
        &call(
            reqwest::Method::GET,
            &format!("{sessions}/ses_nope"),
            Some("alice-secret"),
            None,
        )
        .await,
        404,
        "session_not_found",
    );
    assert_eq!(
        call(reqwest::Method::DELETE, &mine, Some("alice-secret"), None)
            .await
            .0,
        204
    );
    assert_error(
        &call(reqwest::Method::GET, &mine, Some("alice-secret"), None).await,
        404,
        "session_not_found",
    );

    // Production mode with no tokens: every request is refused.
    let closed = server(json!([]), Auth::new(&[], true, None).unwrap(), 0, |_| {}).await;
    for (method, path) in [
        (reqwest::Method::POST, "/v1/sessions"),
        (reqwest::Method::GET, "/v1/sessions"),
        (reqwest::Method::GET, "/v1/sessions/x/events"),
    ] {
        assert_error(
            &call(
                method,
                &format!("{}{path}", closed.url),
                Some("anything"),
                Some(json!({})),
            )
            .await,
            401,
            "unauthorized",
        );
    }
    // Public mode must name a positive spend cap, and caps every session's budget.
    assert!(Auth::new(&[], true, Some(0.0)).is_err());
    let public = server(
        json!([]),
        Auth::new(&[], true, Some(0.5)).unwrap(),
        0,
        |_| {},
    )
    .await;
    let over = call(
        reqwest::Method::POST,
        &format!("{}/v1/sessions", public.url),
        None,
        Some(json!({"budget": {"max_cost_usd": 100.0}})),
    )
    .await;
    assert_error(&over, 403, "over_ceiling");
    assert!(over.1["error"]["message"]
        .as_str()
        .unwrap()
        .contains("budget.max_cost_usd"));
    let (status, created) = call(
        reqwest::Method::POST,
        &format!("{}/v1/sessions", public.url),
        None,
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 201);
    let (_, shown) = call(
        reqwest::Method::GET,
        &format!(
            "{}/v1/sessions/{}",
            public.url,
            created["id"].as_str().unwrap()
        ),
        None,
        None,
    )
    .await;
    assert_eq!(shown["budget_usd"], 0.5);

    // A public server never opens the sandbox's network; an allow-list is the session's.
    let (status, refused) = call(
        reqwest::Method::POST,
        &format!("{}/v1/sessions", public.url),
        None,
        Some(json!({"network": "open"})),
    )
    .await;
    assert_eq!(status, 403, "{refused}");
    let (status, created) = call(
        reqwest::Method::POST,
        &format!("{}/v1/sessions", public.url),
        None,
        Some(json!({"network": "allow:pypi.org", "budget": {"max_turns": 3}})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let (_, shown) = call(
        reqwest::Method::GET,
        &format!(
            "{}/v1/sessions/{}",
            public.url,
            created["id"].as_str().unwrap()
        ),
        None,
        None,
    )
    .await;
    assert_eq!(shown["network"], "allow:pypi.org");
    assert_eq!(shown["limits"]["max_turns"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_client_lifts_a_bound_past_the_operators_ceiling() {
    // Public mode: the spend cap is the ceiling of every session, anonymous callers
    // included. A priced model's first call could cost more than the cap: it is never
    // made, and the session escalates.
    let public = server(
        json!([{"text": "one"}, {"text": "two"}, {"text": "three"}]),
        Auth::new(&[], false, Some(0.0001)).unwrap(),
        1,
        |_| {},
    )
    .await;
    let (status, created) = call(
        reqwest::Method::POST,
        &format!("{}/v1/sessions", public.url),
        None,
        Some(json!({"model": "fake/claude-sonnet-4", "task": "go"})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap();
    // A model with no price would never trip the cap: refused, nothing made.
    let unpriced = call(
        reqwest::Method::POST,
        &format!("{}/v1/sessions", public.url),
        None,
        Some(json!({"model": "anthropic/house-model"})),
    )
    .await;
    assert_error(&unpriced, 422, "invalid");
    assert!(
        unpriced.1["error"]["message"]
            .as_str()
            .unwrap()
            .contains("has no price"),
        "{unpriced:?}"
    );
    let shown = wait_status(&public.url, id, None, "escalated").await;
    assert_eq!(shown["cost_usd"], 0.0, "{shown}");
    assert_eq!(public.fake.calls(), 0, "no call was made");
    let signal = |body: Value| {
        let url = format!("{}/v1/sessions/{id}/signals/resume", public.url);
        async move { call(reqwest::Method::POST, &url, None, Some(body)).await }
    };
    for lift in [
        json!({"max_cost_usd": 100}),
        json!({"max_cost_usd": 0.00011}),
        json!({"max_tokens": 5, "max_cost_usd": 1}),
    ] {
        assert_error(&signal(lift).await, 403, "over_ceiling");
    }
    assert_error(
        &signal(json!({"max_cost_usd": "lots"})).await,
        422,
        "invalid_body",
    );
    assert_error(&signal(json!({"max_turns": -1})).await, 422, "invalid_body");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, after) = call(
        reqwest::Method::GET,
        &format!("{}/v1/sessions/{id}", public.url),
        None,
        None,
    )
    .await;
    assert_eq!(after["status"], "escalated", "{after}");
    assert_eq!(
        after["cost_usd"], shown["cost_usd"],
        "nothing more was spent"
    );
    assert_eq!(after["budget_usd"], 0.0001);

    // Token mode: the operator's ceilings hold for the owner too; others cannot touch it.
    let srv = server(json!([{"text": "hi"}]), tokens(), 0, |s| {
        s.ceilings.max_turns = Some(5);
        s.ceilings.max_cost_micro_usd = Some(2_000_000);
    })
    .await;
    let over = call(
        reqwest::Method::POST,
        &format!("{}/v1/sessions", srv.url),
        Some("alice-secret"),
        Some(json!({"budget": {"max_turns": 50}})),
    )
    .await;
    assert_error(&over, 403, "over_ceiling");
    let (status, created) = call(
        reqwest::Method::POST,
        &format!("{}/v1/sessions", srv.url),
        Some("alice-secret"),
        Some(json!({"budget": {"max_turns": 2}})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap();
    let (_, shown) = call(
        reqwest::Method::GET,
        &format!("{}/v1/sessions/{id}", srv.url),
        Some("alice-secret"),
        None,
    )
    .await;
    assert_eq!(shown["limits"]["max_turns"], 2);
    assert_eq!(
        shown["budget_usd"], 2.0,
        "the ceiling is the default: {shown}"
    );
    let resume = format!("{}/v1/sessions/{id}/signals/resume", srv.url);
    let raise = |token: &'static str, body: Value| {
        let url = resume.clone();
        async move { call(reqwest::Method::POST, &url, Some(token), Some(body)).await }
    };
    assert_error(
        &raise("bob-secret", json!({"max_turns": 3})).await,
        404,
        "session_not_found",
    );
    assert_error(
        &raise("alice-secret", json!({"max_turns": 6})).await,
        403,
        "over_ceiling",
    );
    // Within the ceiling, but the session waits for nothing: queued only if asked.
    assert_error(
        &raise("alice-secret", json!({"max_turns": 5})).await,
        409,
        "not_waiting",
    );
    let queued = call(
        reqwest::Method::POST,
        &format!("{resume}?queue=true"),
        Some("alice-secret"),
        Some(json!({"max_turns": 5})),
    )
    .await;
    assert_eq!(queued.0, 202, "{queued:?}");
    // The scheme of the Authorization header is case-insensitive.
    let resp = reqwest::Client::new()
        .get(format!("{}/v1/sessions/{id}", srv.url))
        .header("authorization", "bearer alice-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_approval_is_refused_and_never_pre_approves() {
    let srv = server(
        json!([
            {"text": "hi"},
            {"tool_calls": [{"name": "request_approval", "input": {"reason": "may I?"}}]},
            {"text": "approved, done"}
        ]),
        dev(),
        1,
        |_| {},
    )
    .await;
    let created = srv.create(json!({"task": "hello"})).await;
    let id = created["id"].as_str().unwrap();
    wait_status(&srv.url, id, None, "idle").await;
    let approval = format!("{}/v1/sessions/{id}/signals/approval", srv.url);
    // Nothing waits: refused, saying what the session waits for.
    let stale = call(
        reqwest::Method::POST,
        &approval,
        None,
        Some(json!({"approved": true})),
    )
    .await;
    assert_error(&stale, 409, "not_waiting");
    assert!(
        stale.1["error"]["message"]
            .as_str()
            .unwrap()
            .contains("is idle"),
        "{stale:?}"
    );
    // The next turn asks for approval and really waits for a human.
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/sessions/{id}/messages", srv.url))
        .json(&json!({"text": "do the risky thing"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    drop(resp);
    let waiting = wait_status(&srv.url, id, None, "waiting").await;
    assert_eq!(waiting["waiting_for"], "approval", "{waiting}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, still) = call(
        reqwest::Method::GET,
        &format!("{}/v1/sessions/{id}", srv.url),
        None,
        None,
    )
    .await;
    assert_eq!(
        still["status"], "waiting",
        "no stale approval was taken: {still}"
    );
    // An answer names the wait it answers: one naming another wait is refused.
    let since = still["waiting_since"]
        .as_u64()
        .expect("the wait's position");
    let wrong = call(
        reqwest::Method::POST,
        &format!("{approval}?wait={}", since - 1),
        None,
        Some(json!({"approved": true})),
    )
    .await;
    assert_error(&wrong, 409, "not_waiting");
    assert!(
        wrong.1["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("now waits at #{since}")),
        "{wrong:?}"
    );
    let answer = call(
        reqwest::Method::POST,
        &format!("{approval}?wait={since}"),
        None,
        Some(json!({"approved": true})),
    )
    .await;
    assert_eq!(answer.0, 202, "{answer:?}");
    assert_eq!(answer.1["answers"], since, "{answer:?}");
    let done = wait_status(&srv.url, id, None, "idle").await;
    assert_eq!(done["reply"], "approved, done");
    // The same answer again is for a wait that is over.
    let late = call(
        reqwest::Method::POST,
        &format!("{approval}?wait={since}"),
        None,
        Some(json!({"approved": true})),
    )
    .await;
    assert_error(&late, 409, "not_waiting");
    assert!(
        late.1["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("no longer waits at #{since}")),
        "{late:?}"
    );
}

#[tokio::test]
async fn bad_input_gets_clear_json_errors() {
    let srv = server(json!([{"text": "hi"}]), dev(), 0, |s| {
        s.messages_per_minute = 2
    })
    .await;
    let sessions = format!("{}/v1/sessions", srv.url);
    let client = reqwest::Client::new();
    let raw = |body: &'static str, ct: &'static str| {
        let client = client.clone();
        let url = sessions.clone();
        async move {
            let resp = client
                .post(url)
                .header("content-type", ct)
                .body(body)
                .send()
                .await
                .unwrap();
            (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
        }
    };
    assert_error(
        &raw("{not json", "application/json").await,
        400,
        "malformed_json",
    );
    assert_error(
        &raw("{}", "text/plain").await,
        415,
        "unsupported_media_type",
    );
    let wrong = raw(
        r#"{"budget": {"max_cost_usd": "lots"}}"#,
        "application/json",
    )
    .await;
    assert_error(&wrong, 422, "invalid_body");
    assert!(
        wrong.1["error"]["message"]
            .as_str()
            .unwrap()
            .contains("budget.max_cost_usd"),
        "{wrong:?}"
    );
    assert_error(
        &raw(r#"{"modle": "x"}"#, "application/json").await,
        422,
        "invalid_body",
    );
    let bad_network = raw(r#"{"network": "everywhere"}"#, "application/json").await;
    assert_error(&bad_network, 422, "invalid_body");
    assert!(
        bad_network.1["error"]["message"]
            .as_str()
            .unwrap()
            .contains("network"),
        "{bad_network:?}"
    );
    // Agents: an unknown one, and a wrapped CLI this server does not have installed.
    // Both are refused before anything exists (no session, no workspace).
    let unknown = raw(r#"{"agent": "aider"}"#, "application/json").await;
    assert_error(&unknown, 422, "invalid_body");
    let message = unknown.1["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("agent: unknown agent `aider`") && message.contains("opencode"),
        "{unknown:?}"
    );
    let missing = raw(r#"{"agent": "claude-code"}"#, "application/json").await;
    assert_error(&missing, 422, "invalid_body");
    assert!(
        missing.1["error"]["message"]
            .as_str()
            .unwrap()
            .contains("steadfast install-agent claude-code@"),
        "{missing:?}"
    );
    let listed = call(reqwest::Method::GET, &sessions, None, None).await;
    assert_eq!(listed.0, 200);
    assert_eq!(
        listed.1["sessions"].as_array().map(Vec::len),
        Some(0),
        "{listed:?}"
    );
    let bad_budget = raw(r#"{"budget": {"max_turns": 0}}"#, "application/json").await;
    assert_error(&bad_budget, 422, "invalid_body");
    assert_error(
        &call(
            reqwest::Method::POST,
            &sessions,
            None,
            Some(json!({"model": "noslash"})),
        )
        .await,
        422,
        "invalid_body",
    );
    assert_error(
        &call(
            reqwest::Method::POST,
            &sessions,
            None,
            Some(json!({"workspace": {"kind": "empty", "files": {"../escape.txt": "x"}}})),
        )
        .await,
        422,
        "invalid_body",
    );
    let huge = json!({"task": "x".repeat(300 * 1024)});
    assert_error(
        &call(reqwest::Method::POST, &sessions, None, Some(huge)).await,
        413,
        "body_too_large",
    );
    assert_error(
        &call(
            reqwest::Method::GET,
            &format!("{}/v2/whatever", srv.url),
            None,
            None,
        )
        .await,
        404,
        "not_found",
    );

    let (_, created) = call(reqwest::Method::POST, &sessions, None, Some(json!({}))).await;
    let id = created["id"].as_str().unwrap();
    let messages = format!("{sessions}/{id}/messages");
    assert_error(
        &call(
            reqwest::Method::POST,
            &messages,
            None,
            Some(json!({"text": ""})),
        )
        .await,
        422,
        "invalid_body",
    );
    assert_error(
        &call(
            reqwest::Method::POST,
            &messages,
            None,
            Some(json!({"text": "x", "kind": "shout"})),
        )
        .await,
        422,
        "invalid_body",
    );
    assert_error(
        &call(
            reqwest::Method::GET,
            &format!("{sessions}/{id}/events?cursor=-1"),
            None,
            None,
        )
        .await,
        400,
        "invalid_query",
    );
    assert_error(
        &call(
            reqwest::Method::POST,
            &format!("{sessions}/{id}/signals/bad%20name"),
            None,
            None,
        )
        .await,
        422,
        "invalid_signal",
    );
    // Two messages a minute: the third is refused.
    for _ in 0..2 {
        let resp = client
            .post(&messages)
            .json(&json!({"text": "hi"}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
    assert_error(
        &call(
            reqwest::Method::POST,
            &messages,
            None,
            Some(json!({"text": "hi"})),
        )
        .await,
        429,
        "rate_limited",
    );
    // Signals are bounded the same way, apart from messages.
    let signal = messages.replace("/messages", "/signals/nudge?queue=true");
    for _ in 0..2 {
        let (status, body) = call(reqwest::Method::POST, &signal, None, Some(json!({}))).await;
        assert_eq!(status, 202, "{body}");
    }
    assert_error(
        &call(reqwest::Method::POST, &signal, None, Some(json!({}))).await,
        429,
        "rate_limited",
    );
    // The OpenAPI document is served and names every route.
    let (status, doc) = call(
        reqwest::Method::GET,
        &format!("{}/openapi.json", srv.url),
        None,
        None,
    )
    .await;
    assert_eq!(status, 200);
    for path in [
        "/v1/sessions",
        "/v1/sessions/{id}",
        "/v1/sessions/{id}/close",
        "/v1/sessions/{id}/integrity",
        "/v1/sessions/{id}/interrupt",
        "/v1/sessions/{id}/messages",
        "/v1/sessions/{id}/events",
        "/v1/sessions/{id}/signals/{name}",
        "/v1/sessions/{id}/diff",
        "/v1/sessions/{id}/files",
        "/v1/sessions/{id}/files/{path}",
        "/v1/agents",
        "/metrics",
    ] {
        assert!(
            doc["paths"].get(path).is_some(),
            "{path} missing from openapi.json"
        );
    }
    // A closed session takes no more messages.
    assert_eq!(
        call(
            reqwest::Method::POST,
            &format!("{sessions}/{id}/close"),
            None,
            None
        )
        .await
        .0,
        200
    );
    tokio::time::sleep(Duration::from_millis(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steer_sent_during_a_long_tool_call_is_taken_at_the_next_step() {
    let srv = server(
        json!([
            {"text": "running the slow step", "tool_calls": [{"name": "bash", "input": {"command": "sleep 3; echo slow done"}}]},
            {"text": "steered, finishing"}
        ]),
        dev(),
        1,
        |_| {},
    )
    .await;
    let created = srv.create(json!({"task": "go"})).await;
    let id = created["id"].as_str().unwrap();
    let events = format!("{}/v1/sessions/{id}/events", srv.url);
    // Follow the stream until the slow command is running, then steer.
    let mut last: Option<String> = None;
    loop {
        let (frames, _) = read_frames(&events, last.as_deref(), 1).await;
        let frame = frames
            .into_iter()
            .next()
            .expect("the turn is still running");
        if frame.event == "tool_call_intent" {
            break;
        }
        last = Some(frame.id);
    }
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/sessions/{id}/messages", srv.url))
        .json(&json!({"text": "also update the changelog", "kind": "steer"}))
        .send()
        .await
        .unwrap();
    let mut stream = resp.bytes_stream().eventsource();
    let mut kinds = Vec::new();
    while let Some(ev) = stream.next().await {
        let ev = ev.unwrap();
        if ev.event == "end" {
            break;
        }
        let kind = steadfast_testkit::frame_kind(&ev.event, &ev.data);
        if kind != "model_delta" {
            kinds.push(kind);
        }
    }
    let at = kinds
        .iter()
        .position(|k| k == "steered")
        .expect("the steer is in the stream");
    assert_eq!(
        kinds[at - 1],
        "tool_call_outcome",
        "taken after the call in flight: {kinds:?}"
    );
    assert_eq!(
        kinds[at + 1],
        "model_call_intent",
        "before the next model call: {kinds:?}"
    );
    assert_eq!(kinds.last().map(String::as_str), Some("turn_ended"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_stays_open_through_a_wait_unless_asked_to_end_there() {
    let srv = server(
        json!([
            {"tool_calls": [{"name": "request_approval", "input": {"reason": "may I?"}}]},
            {"text": "approved, done"}
        ]),
        dev(),
        1,
        |_| {},
    )
    .await;
    let created = srv.create(json!({"task": "go"})).await;
    let id = created["id"].as_str().unwrap();
    wait_status(&srv.url, id, None, "waiting").await;
    let events = format!("{}/v1/sessions/{id}/events", srv.url);

    // Asked to end at a wait, it does: the wait is its last frame.
    let (frames, ended) = read_frames(&format!("{events}?until=wait"), None, 1000).await;
    assert!(ended, "{frames:?}");
    assert_eq!(frames.last().unwrap().event, "wait_started", "{frames:?}");

    // By default it stays open: the answer and the rest of the turn come on the same
    // connection, which ends only when the turn is over.
    let resp = reqwest::get(&events).await.unwrap();
    let mut stream = resp.bytes_stream().eventsource();
    let mut after_wait = Vec::new();
    let mut waited = false;
    while let Some(ev) = stream.next().await {
        let ev = ev.unwrap();
        if ev.event == "end" {
            break;
        }
        let kind = steadfast_testkit::frame_kind(&ev.event, &ev.data);
        if waited {
            after_wait.push(kind);
        } else if kind == "wait_started" {
            waited = true;
            let (status, _) = call(
                reqwest::Method::POST,
                &format!("{}/v1/sessions/{id}/signals/approval", srv.url),
                None,
                Some(json!({"approved": true})),
            )
            .await;
            assert_eq!(status, 202);
        }
    }
    assert!(waited);
    assert!(
        after_wait.first().map(String::as_str) == Some("signal_received")
            && after_wait.last().map(String::as_str) == Some("turn_ended"),
        "{after_wait:?}"
    );
    // `until` takes only what it names.
    let bad = call(
        reqwest::Method::GET,
        &format!("{events}?until=never"),
        None,
        None,
    )
    .await;
    assert_error(&bad, 400, "invalid_query");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_names_no_bound_gets_the_operators_defaults_within_the_ceilings() {
    let srv = server(json!([{"text": "hi"}]), dev(), 0, |state| {
        state.defaults = steadfast_log::Limits {
            max_cost_micro_usd: Some(1_000_000),
            max_turns: Some(4),
            max_tokens: Some(900_000),
            max_duration_ms: None,
        };
        state.ceilings = steadfast_log::Limits {
            max_cost_micro_usd: Some(2_000_000),
            max_tokens: Some(500_000),
            ..Default::default()
        };
    })
    .await;
    let limits_of = async |body: Value| {
        let created = srv.create(body).await;
        srv.show(created["id"].as_str().unwrap()).await["limits"].clone()
    };
    // Nothing named: the defaults, a default over its ceiling kept to the ceiling.
    assert_eq!(
        limits_of(json!({})).await,
        json!({"max_cost_micro_usd": 1_000_000, "max_turns": 4, "max_tokens": 500_000})
    );
    // What a session names wins, within the ceilings.
    assert_eq!(
        limits_of(json!({"budget": {"max_cost_usd": 1.5, "max_turns": 9}})).await,
        json!({"max_cost_micro_usd": 1_500_000, "max_turns": 9, "max_tokens": 500_000})
    );
}

/// Sessions are listed a page at a time, newest first and only the caller's, found by
/// label, title and status, and renamed, relabelled and annotated; every bad parameter
/// is a 400 (or a 422 for a body) naming it, and a refused creation leaves nothing.
#[tokio::test]
async fn sessions_are_listed_a_page_at_a_time_and_found_by_label() {
    let srv = server(json!([]), tokens(), 0, |_| {}).await;
    let sessions = format!("{}/v1/sessions", srv.url);
    let alice = Some("alice-secret");
    let post = |body: Value, token: Option<&'static str>| {
        let url = sessions.clone();
        async move { call(reqwest::Method::POST, &url, token, Some(body)).await }
    };
    let mut made = Vec::new();
    for i in 0..5 {
        let team = if i % 2 == 0 { "infra" } else { "web" };
        let (status, created) = post(
            json!({
                "labels": {"team": team, "n": format!("n{i}")},
                "metadata": {"ticket": format!("PROJ-{i}")},
                "title": (i == 3).then_some("Nightly flake hunt"),
                "task": (i == 3).then_some("find the flaky test"),
            }),
            alice,
        )
        .await;
        assert_eq!(status, 201, "{created}");
        made.push(created["id"].as_str().unwrap().to_string());
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    assert_eq!(
        post(json!({"labels": {"team": "infra"}}), Some("bob-secret"))
            .await
            .0,
        201
    );
    let newest_first: Vec<String> = made.iter().rev().cloned().collect();
    let list = |query: String, token: Option<&'static str>| {
        let url = format!("{sessions}?{query}");
        async move { call(reqwest::Method::GET, &url, token, None).await }
    };
    fn ids(page: &Value) -> Vec<&str> {
        page["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap())
            .collect()
    }

    // Pages of two, followed by their cursors: each of Alice's once, newest first.
    let mut seen = Vec::new();
    let mut query = "limit=2".to_string();
    let mut pages = 0;
    loop {
        let (status, page) = list(query.clone(), alice).await;
        assert_eq!(status, 200, "{page}");
        pages += 1;
        seen.extend(ids(&page).into_iter().map(String::from));
        match page["next_cursor"].as_str() {
            Some(cursor) => query = format!("limit=2&cursor={cursor}"),
            None => break,
        }
    }
    assert_eq!(seen, newest_first);
    assert_eq!(pages, 3);

    // Filters.
    let (_, infra) = list("label=team=infra".into(), alice).await;
    assert_eq!(
        ids(&infra),
        [made[4].as_str(), made[2].as_str(), made[0].as_str()]
    );
    let (_, one) = list("label=team=infra,n=n2".into(), alice).await;
    assert_eq!(ids(&one), [made[2].as_str()]);
    let (_, titled) = list("title=FLAKE".into(), alice).await;
    assert_eq!(ids(&titled), [made[3].as_str()]);
    assert_eq!(titled["sessions"][0]["title"], "Nightly flake hunt");
    assert_eq!(titled["sessions"][0]["metadata"]["ticket"], "PROJ-3");
    assert_eq!(titled["sessions"][0]["agent"], "native");
    let (_, running) = list("status=running,waiting".into(), alice).await;
    assert_eq!(
        ids(&running),
        [made[3].as_str()],
        "the one with a task (no worker here)"
    );
    let (_, native) = list("agent=native&limit=1".into(), alice).await;
    assert_eq!(ids(&native), [made[4].as_str()]);
    let (_, none) = list("agent=codex".into(), alice).await;
    assert_eq!(ids(&none), Vec::<&str>::new());
    assert!(none.get("next_cursor").is_none(), "{none}");

    // Renamed, relabelled and annotated; another owner cannot.
    let one_url = format!("{sessions}/{}", made[1]);
    let (status, changed) = call(
        reqwest::Method::PATCH,
        &one_url,
        alice,
        Some(json!({"title": "Renamed", "labels": {"team": "infra", "n": null}, "metadata": {"ticket": null, "owner": "ops"}})),
    )
    .await;
    assert_eq!(status, 200, "{changed}");
    assert_eq!(changed["title"], "Renamed");
    assert_eq!(changed["labels"], json!({"team": "infra"}));
    assert_eq!(changed["metadata"], json!({"owner": "ops"}));
    let (_, infra) = list("label=team=infra".into(), alice).await;
    assert_eq!(
        ids(&infra),
        [
            made[4].as_str(),
            made[2].as_str(),
            made[1].as_str(),
            made[0].as_str()
        ]
    );
    assert_error(
        &call(
            reqwest::Method::PATCH,
            &one_url,
            Some("bob-secret"),
            Some(json!({"title": "mine"})),
        )
        .await,
        404,
        "session_not_found",
    );
    let too_many: serde_json::Map<String, Value> =
        (0..32).map(|i| (format!("k{i}"), json!("v"))).collect();
    assert_error(
        &call(
            reqwest::Method::PATCH,
            &one_url,
            alice,
            Some(json!({"labels": too_many})),
        )
        .await,
        422,
        "invalid_body",
    );
    let (_, kept) = call(reqwest::Method::GET, &one_url, alice, None).await;
    assert_eq!(
        kept["labels"],
        json!({"team": "infra"}),
        "a refused patch changes nothing"
    );

    // Bad parameters name themselves.
    for (query, field) in [
        ("status=bogus", "status"),
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("cursor=garbage", "cursor"),
        ("label=team", "label"),
        ("label=team=a%20b", "label"),
        ("created_after=yesterday", "created_after"),
        ("colour=red", "colour"),
    ] {
        let got = list(query.into(), alice).await;
        assert_error(&got, 400, "invalid_query");
        let message = got.1["error"]["message"].as_str().unwrap();
        assert!(message.contains(field), "{query}: {message}");
    }
    for (body, field) in [
        (json!({"labels": {"bad key": "x"}}), "labels"),
        (json!({"labels": {"team": "a,b"}}), "labels.team"),
        (json!({"title": "   "}), "title"),
        (json!({"metadata": {"k": "x".repeat(513)}}), "metadata.k"),
    ] {
        let got = post(body, alice).await;
        assert_error(&got, 422, "invalid_body");
        let message = got.1["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(field), "{field}: {message}");
    }
    let (_, all) = list("limit=1000".into(), alice).await;
    assert_eq!(ids(&all).len(), 5, "refused creations left no session");
    let workspaces = std::fs::read_dir(srv._dir.path().join("home/workspaces"))
        .unwrap()
        .count();
    assert_eq!(workspaces, 6, "nor a workspace");
}
