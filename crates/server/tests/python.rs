//! The OpenAPI document makes a working Python client: openapi-python-client (from
//! PyPI; `.ci/run` installs it) generates one, with every JSON operation and model,
//! and a program using it against a live server creates a labelled session with a
//! seeded workspace, sends a message (queued, 202) and follows its turn through the
//! event pages (each event typed by its `type`), lists and renames the session.

mod common;

use std::process::Command;

use common::{dev, server};
use serde_json::json;

const PROGRAM: &str = r#"
import sys, time
from steadfast_client import Client
from steadfast_client.api.sessions import create, list_, update
from steadfast_client.api.messages import post_message, events
from steadfast_client.models import CreateSession, PostMessage, UpdateSession, Created, EventPage, SessionList, Session, MessageQueued

client = Client(base_url=sys.argv[1], headers={"accept": "application/json"}, timeout=30)
created = create.sync(client=client, body=CreateSession.from_dict({
    "labels": {"team": "py"},
    "workspace": {"kind": "empty", "files": {"notes.txt": "hello", "bin.dat": {"base64": "AAE="}}},
}))
assert isinstance(created, Created), created
sid = created.id

# A message is queued (202 with JSON); its turn is read from the event pages that follow.
queued = post_message.sync(sid, client=client, body=PostMessage(text="say hello"))
assert isinstance(queued, MessageQueued), queued
kinds, after = [], queued.after
for _ in range(300):
    page = events.sync(sid, client=client, after=after, limit=100)
    assert isinstance(page, EventPage), page
    for e in page.events:
        event = e.to_dict()
        kinds.append(event["type"])
        if event["type"] == "model_call_outcome":
            assert event["text"] == "Hello from Python's server.", event
    after = page.next_after
    if "turn_ended" in kinds:
        break
    time.sleep(0.05)
assert kinds[0] == "user_message" and "turn_ended" in kinds, kinds
first = events.sync(sid, client=client, after=0, limit=1)
assert first.events[0].to_dict()["type"] == "session_started" and first.has_more, first

listed = list_.sync(client=client, label="team=py")
assert isinstance(listed, SessionList), listed
assert [s.id for s in listed.sessions] == [sid], listed

renamed = update.sync(sid, client=client, body=UpdateSession.from_dict({"title": "From Python"}))
assert isinstance(renamed, Session), renamed
assert renamed.title == "From Python" and renamed.labels.to_dict() == {"team": "py"}, renamed
print("ok", sid, len(kinds))
"#;

fn have(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generated_python_client_creates_messages_streams_and_lists() {
    assert!(
        have("openapi-python-client"),
        "openapi-python-client is not installed (pip install openapi-python-client; .ci/run does)"
    );
    let dir = tempfile::tempdir().unwrap();
    let document = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.json");
    let generated = Command::new("openapi-python-client")
        .args([
            "generate",
            "--path",
            document,
            "--meta",
            "none",
            "--output-path",
        ])
        .arg(dir.path().join("steadfast_client"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&generated.stdout).to_string()
        + &String::from_utf8_lossy(&generated.stderr);
    assert!(generated.status.success(), "{said}");
    // Only the two routes that answer no JSON (metrics text, a tar archive) are left
    // without a parsed response; every schema and every JSON operation is generated.
    for line in said
        .lines()
        .filter(|l| l.starts_with("WARNING") || l.starts_with("Unable"))
    {
        assert!(
            line.contains("GET /metrics") || line.contains("/archive"),
            "{line}\n{said}"
        );
    }

    let srv = server(
        json!([{"text": "Hello from Python's server."}]),
        dev(),
        1,
        |_| {},
    )
    .await;
    let mut python = Command::new("python3");
    python
        .args(["-c", PROGRAM, &srv.url])
        .env("PYTHONPATH", dir.path());
    common::run_client_program(python).await;
}
