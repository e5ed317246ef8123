//! A workspace in and out through the API: seeded with text and binary files at
//! creation, changed by the agent, and downloaded as a tar archive at any log
//! position, which the system's `tar` unpacks to exactly what the workspace held then.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use base64::Engine as _;
use common::{assert_error, call, dev, server, wait_status};
use serde_json::json;

/// Every path under `dir` with what it is: file bytes and exec bit, link target, dir.
fn tree(dir: &Path) -> BTreeMap<String, String> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = BTreeMap::new();
    for entry in walkdir::WalkDir::new(dir).min_depth(1) {
        let entry = entry.unwrap();
        let path = entry
            .path()
            .strip_prefix(dir)
            .unwrap()
            .display()
            .to_string();
        let meta = entry.path().symlink_metadata().unwrap();
        let what = if meta.file_type().is_symlink() {
            format!("-> {}", std::fs::read_link(entry.path()).unwrap().display())
        } else if meta.is_dir() {
            "dir".into()
        } else {
            let exec = meta.permissions().mode() & 0o111 != 0;
            format!("{exec} {:?}", std::fs::read(entry.path()).unwrap())
        };
        out.insert(path, what);
    }
    out
}

/// Downloads the archive at `query` and unpacks it with the system's tar.
async fn unpack(url: &str, into: &Path) -> (String, String) {
    let resp = reqwest::get(url).await.unwrap();
    assert_eq!(resp.status(), 200, "{url}");
    let kind = resp.headers()["content-type"].to_str().unwrap().to_string();
    let disposition = resp.headers()["content-disposition"]
        .to_str()
        .unwrap()
        .to_string();
    let bytes = resp.bytes().await.unwrap();
    std::fs::create_dir_all(into).unwrap();
    let archive = into.with_extension("tar");
    std::fs::write(&archive, &bytes).unwrap();
    let status = std::process::Command::new("tar")
        .arg("-xf")
        .arg(&archive)
        .arg("-C")
        .arg(into)
        .status()
        .unwrap();
    assert!(status.success(), "tar unpacks it");
    (kind, disposition)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_binary_files_come_back_in_the_archive_at_every_position() {
    let srv = server(
        json!([
            {"text": "changing things", "tool_calls": [{"name": "bash", "input": {"command":
                "chmod +x run.sh && ln -s notes.txt latest && mkdir -p out/empty && printf 'two\\n' >> notes.txt && rm old.txt"}}]},
            {"text": "done"}
        ]),
        dev(),
        1,
        |_| {},
    )
    .await;
    let binary: Vec<u8> = (0..=255u8).cycle().take(3000).collect();
    let encoded = base64::engine::general_purpose::STANDARD.encode(&binary);
    let sessions = format!("{}/v1/sessions", srv.url);

    // Bad base64 is refused, naming the file, and leaves nothing behind.
    let refused = call(
        reqwest::Method::POST,
        &sessions,
        None,
        Some(json!({"workspace": {"kind": "empty", "files": {"img.bin": {"base64": "not base64!"}}}})),
    )
    .await;
    assert_error(&refused, 422, "invalid_body");
    assert!(refused.1["error"]["message"]
        .as_str()
        .unwrap()
        .contains("img.bin"));

    let (status, created) = call(
        reqwest::Method::POST,
        &sessions,
        None,
        Some(
            json!({"task": "change things", "workspace": {"kind": "empty", "files": {
                "notes.txt": "one\n",
                "old.txt": "going\n",
                "run.sh": "#!/bin/sh\necho run\n",
                "assets/img.bin": {"base64": encoded},
            }}}),
        ),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap();
    let workspace = Path::new(created["workspace"].as_str().unwrap()).to_path_buf();
    assert_eq!(
        std::fs::read(workspace.join("assets/img.bin")).unwrap(),
        binary
    );
    let before = tree(&workspace);
    wait_status(&srv.url, id, None, "idle").await;
    let after = tree(&workspace);
    assert_ne!(before, after);

    let dir = tempfile::tempdir().unwrap();
    let archive = format!("{sessions}/{id}/archive");
    let (kind, disposition) = unpack(&format!("{archive}?at=0"), &dir.path().join("then")).await;
    assert_eq!(kind, "application/x-tar");
    assert_eq!(disposition, format!("attachment; filename=\"{id}-0.tar\""));
    assert_eq!(
        tree(&dir.path().join("then")),
        before,
        "as the session began"
    );
    unpack(&archive, &dir.path().join("now")).await;
    assert_eq!(tree(&dir.path().join("now")), after, "as it is now");
    assert!(after["run.sh"].starts_with("true"), "{after:?}");
    assert_eq!(after["latest"], "-> notes.txt");

    // Positions past the log's end, and other owners' sessions, are refused.
    let past = call(
        reqwest::Method::GET,
        &format!("{archive}?at=99999"),
        None,
        None,
    )
    .await;
    assert_eq!(past.0, 422, "{past:?}");
    let missing = call(
        reqwest::Method::GET,
        &format!("{sessions}/ses_nobody/archive"),
        None,
        None,
    )
    .await;
    assert_error(&missing, 404, "session_not_found");
}
