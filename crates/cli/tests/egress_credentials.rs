//! Credentials at the egress proxy, through a real `steadfast serve` with bwrap
//! sandboxes: a session binds a credential from its owner's vault to a destination of
//! its allow-list, and the sandbox's plain-HTTP requests there arrive carrying it —
//! replacing whatever the sandbox sent — while nothing the sandbox can see (its
//! environment, its processes' environments, every file it can read) nor anything
//! Steadfast stores (the log, blobs, snapshots) holds the value.

use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use steadfast_testkit::{FakeProvider, Script};

mod common;

use common::{call, put_credential, wait_for, VaultSite};

const SECRET: &str = "tracker-token-5f0c2a91";

/// A loopback HTTP server that records each request's head.
fn receiver() -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut buf = [0u8; 8192];
            let n = stream.read(&mut buf).unwrap_or(0);
            seen.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&buf[..n]).to_string());
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Length: 7\r\nConnection: close\r\n\r\nissue 7"
            );
        }
    });
    (port, heads)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_credential_is_added_at_the_proxy_and_never_seen_inside() {
    let (port, heads) = receiver();
    let host = format!("localhost:{port}");
    // The command looks for the secret everywhere it can, without ever naming it.
    let command = format!(
        "curl -sS -m 5 -H 'Authorization: Bearer forged' http://{host}/issues/7 > fetched.txt; \
         curl -sS -m 5 -H 'Host: evil.test' http://{host}/issues/8 > hosted.txt; \
         curl -sS -m 5 -X TRACE http://{host}/trace > traced.txt; \
         env > env.txt; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' > environ.txt; \
         a=tracker-token; b=5f0c2a91; \
         grep -rsl \"$a-$b\" / --exclude-dir=proc --exclude-dir=sys --exclude-dir=usr > found.txt; true"
    );
    let script: Script = serde_json::from_value(json!({"steps": [
        {"text": "fetching", "tool_calls": [{"name": "bash", "input": {"command": command}}]},
        {"text": "done"}
    ]}))
    .unwrap();
    let fake = FakeProvider::start(script).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let site = VaultSite::new(
        dir.path(),
        &format!("[sandbox]\nbackend = \"bwrap\"\ninternal-hosts = [\"{host}\"]\n"),
    );
    let home = site.home.clone();
    let (_api, url) = site.serve(&fake, "1").await;
    put_credential(&url, "tracker", SECRET).await;

    // A binding must name a destination of the allow-list and a stored credential.
    let sessions = format!("{url}/v1/sessions");
    for (network, credential) in [
        (format!("allow:{host}"), "nothing-stored"),
        ("allow:example.com".to_string(), "tracker"),
    ] {
        let (status, body) = call(
            reqwest::Method::POST,
            &sessions,
            Some(json!({"network": network,
                   "egress_credentials": [{"host": host, "credential": credential}]})),
        )
        .await;
        assert_eq!(status, 422, "{body}");
        assert!(body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("egress_credentials"));
    }

    let (status, created) = call(
        reqwest::Method::POST,
        &sessions,
        Some(json!({
            "task": "fetch issue 7",
            "network": format!("allow:{host}"),
            "egress_credentials": [{"host": host, "credential": "tracker"}],
        })),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let workspace = common::workspace_in(&home, &created);
    wait_for("the turn to end", async || {
        reqwest::get(format!("{sessions}/{id}"))
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()["status"]
            == "idle"
    })
    .await;

    assert_eq!(
        std::fs::read_to_string(workspace.join("fetched.txt")).unwrap(),
        "issue 7"
    );
    let heads = heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 2, "TRACE never left the proxy: {heads:?}");
    let traced = std::fs::read_to_string(workspace.join("traced.txt")).unwrap();
    assert!(
        traced.contains("TRACE is not forwarded") && !traced.contains(SECRET),
        "{traced}"
    );
    let hosted = heads[1].to_ascii_lowercase();
    assert!(
        hosted.contains(&format!("host: {host}")) && !hosted.contains("evil.test"),
        "the request goes to the host it names: {}",
        heads[1]
    );
    let lower = heads[0].to_ascii_lowercase();
    assert!(
        lower.contains(&format!("authorization: bearer {SECRET}")),
        "{}",
        heads[0]
    );
    assert!(
        !lower.contains("forged"),
        "the sandbox's own header is replaced"
    );
    for seen in ["env.txt", "environ.txt"] {
        let text = std::fs::read_to_string(workspace.join(seen)).unwrap();
        assert!(!text.is_empty() && !text.contains(SECRET), "{seen}: {text}");
    }
    let found = std::fs::read_to_string(workspace.join("found.txt")).unwrap();
    assert!(
        found.trim().is_empty(),
        "files the sandbox can read hold it: {found}"
    );
    // Nor does anything Steadfast stored: the log, blobs, snapshots, the vault.
    let stored: Vec<String> = walkdir::WalkDir::new(&home)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .filter(|e| {
            std::fs::read(e.path())
                .is_ok_and(|b| b.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()))
        })
        .map(|e| e.path().display().to_string())
        .collect();
    assert!(stored.is_empty(), "{stored:?}");
    tokio::time::sleep(Duration::from_millis(10)).await;
}
