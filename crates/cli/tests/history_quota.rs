//! The history quota, through a real `steadfast serve`: what a session's snapshots
//! and outputs keep is bounded per session and per owner, not only the workspace at
//! one moment. Five steps that each write a new file under a small workspace quota
//! used to keep every one of them in the drive; now calls stop running once the
//! history is full, and the agent is told why.

use serde_json::{json, Value};

mod common;

use common::{call, event_page, fake_playing, idle_after, queue_message, VaultSite};

const MIB: u64 = 1024 * 1024;

/// Bytes of the blob store under `home` (the drive's objects and offloaded outputs).
fn drive_bytes(home: &std::path::Path) -> u64 {
    walkdir::WalkDir::new(home.join("blobs"))
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

/// The outputs of session `id`'s tool calls, in order.
async fn outputs(url: &str, id: &str) -> Vec<String> {
    let page = event_page(&format!("{url}/v1/sessions/{id}/events?limit=1000")).await;
    page.iter()
        .filter(|e| e["type"] == "tool_call_outcome")
        .map(|o| {
            o["output"]["excerpt"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

/// A new session with `task`, once its first turn is over: its id and its calls'
/// outputs.
async fn first_turn(url: &str, task: &str) -> (String, Vec<String>) {
    let (status, created) = call(
        reqwest::Method::POST,
        &format!("{url}/v1/sessions"),
        Some(json!({ "task": task })),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    idle_after(url, &id, 1).await;
    let said = outputs(url, &id).await;
    (id, said)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_stop_once_a_sessions_or_an_owners_history_is_full() {
    // Each step writes 800 KB nobody has stored before (random bytes).
    let write = |n: u32| {
        json!({"text": format!("step {n}"), "tool_calls": [{"name": "bash", "input": {
            "command": format!("head -c 800000 /dev/urandom > f{n}.bin && rm -f f{}.bin && echo wrote {n}", n - 1)
        }}]})
    };
    // A turn ends at the first "done"; the next turn (of the second session) goes on
    // from there (the script answers by how many model turns a conversation holds).
    let fake = fake_playing(json!([
        write(1), write(2), write(3), write(4), {"text": "done"},
        write(5), {"text": "done again"}
    ]))
    .await;
    let dir = tempfile::tempdir().unwrap();
    // The workspace never holds more than one file: its own quota is not what stops it.
    let site = VaultSite::new(
        dir.path(),
        "[sandbox]\nbackend = \"bwrap\"\nworkspace-mb = 1\nhistory-mb = 2\nowner-history-mb = 3\n",
    );
    let (_api, url) = site.serve(&fake, "1").await;
    let sessions = format!("{url}/v1/sessions");

    let (first, said) = first_turn(&url, "write").await;
    assert_eq!(said.len(), 4, "{said:?}");
    // 0.8, 1.6, then 2.4 MB: the third call started under the 2 MiB quota.
    for (n, output) in said[..3].iter().enumerate() {
        assert!(output.contains(&format!("wrote {}", n + 1)), "{output}");
    }
    assert!(
        said[3].contains("this session's history is full") && said[3].contains("2.0 MiB"),
        "{}",
        said[3]
    );
    let (_, shown) = call(reqwest::Method::GET, &format!("{sessions}/{first}"), None).await;
    let history = shown["history_bytes"].as_u64().unwrap();
    assert!((2_400_000..2_500_000).contains(&history), "{shown}");
    let stored = drive_bytes(&site.home);
    assert!(
        (2_400_000..3 * MIB).contains(&stored),
        "the drive keeps the three calls that ran, and nothing of the fourth: {stored}"
    );

    // Another session of the same owner: its first call starts under the owner's
    // 3 MiB (2.4 MB kept so far) and passes it; the next ones do not run.
    let (second, said) = first_turn(&url, "write more").await;
    assert!(said[0].contains("wrote 1"), "{said:?}");
    for refused in &said[1..] {
        assert!(
            refused.contains("the histories of this user's sessions are full"),
            "{refused}"
        );
    }
    let owner_stored = drive_bytes(&site.home);
    assert!(owner_stored < 3 * MIB + 900_000, "{owner_stored}");

    // Deleting the first session frees its share: the second's calls run again.
    let (status, body) = call(
        reqwest::Method::DELETE,
        &format!("{sessions}/{first}"),
        None,
    )
    .await;
    assert!(status == 204 || status == 200, "{status} {body}");
    queue_message(&url, &second, "go on").await;
    let shown: Value = idle_after(&url, &second, 2).await;
    let said = outputs(&url, &second).await;
    assert!(
        said.len() == 5 && said[4].contains("wrote 5"),
        "after the delete: {said:?} {shown}"
    );
}
