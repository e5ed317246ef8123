//! A full disk under a SQLite home, for real: the server runs in a mount namespace of
//! its own whose home is a small tmpfs, and the test fills that filesystem while a
//! command of the session's turn runs. Nothing is lost or wedged: the server keeps
//! answering, the turn is neither ended nor dropped, and once space is freed the session
//! goes on by itself (no message, no restart) and ends its turn, its log whole.

mod common;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

const BIN: &str = env!("CARGO_BIN_EXE_steadfast");

/// `steadfast serve` over `home`, which is a tmpfs of `mb` MiB in the server's own
/// mount namespace (and user namespace, when the test is not root).
fn serve_on_a_small_disk(
    home: &Path,
    mb: u32,
    fake: &steadfast_testkit::FakeProvider,
) -> tokio::process::Command {
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    let mut cmd = tokio::process::Command::new("unshare");
    if !root {
        cmd.args(["--user", "--map-root-user"]);
    }
    cmd.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(format!(
            r#"mount -t tmpfs -o size={mb}m steadfast-small-disk "$0" && exec "$@""#
        ))
        .arg(home)
        .args([BIN, "serve", "--listen", "127.0.0.1:0", "--workers", "1"]);
    common::service_env(&mut cmd, home, fake);
    cmd
}

/// Fills the filesystem `file` is on, to the last byte; returns how much it wrote.
fn fill(file: &Path) -> u64 {
    let mut out = std::fs::File::create(file).unwrap();
    let chunk = vec![7u8; 64 << 10];
    let mut written = 0;
    loop {
        match out.write(&chunk) {
            Ok(0) => break,
            Ok(n) => written += n as u64,
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(ENOSPC), "{e}");
                break;
            }
        }
    }
    // Whatever is left in smaller pieces, so not even a page is free.
    for size in [4096usize, 512, 1] {
        while out.write_all(&vec![7u8; size]).is_ok() {
            written += size as u64;
        }
    }
    written
}

/// "No space left on device".
const ENOSPC: i32 = 28;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_stopped_by_a_full_disk_goes_on_by_itself_once_space_is_freed() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let fake = common::fake_playing(json!([
        {"text": "first", "tool_calls": [{"name": "bash", "input": {"command": "echo one > one.txt"}}]},
        {"text": "first turn done"},
        {"text": "second", "tool_calls": [{"name": "bash", "input":
            {"command": "for i in $(seq 100); do seq 1 2000 >> numbers.txt; sleep 0.05; done; echo finished"}}]},
        {"text": "second turn done"}
    ]))
    .await;
    let mut server = serve_on_a_small_disk(&home, 48, &fake).spawn().unwrap();
    let url = common::printed_url(&mut server).await;
    // The home as the server sees it: its tmpfs, reached through its root.
    let seen = PathBuf::from(format!("/proc/{}/root", server.id().unwrap()))
        .join(home.strip_prefix("/").unwrap());
    let (status, created) = common::call(
        reqwest::Method::POST,
        &format!("{url}/v1/sessions"),
        Some(json!({"task": "count"})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    common::idle_after(&url, &id, 1).await;

    // The second turn's command writes for a few seconds; once it has begun, the disk
    // is filled to the last byte under it.
    let workspace = seen
        .join("workspaces")
        .join(created["workspace"].as_str().unwrap());
    common::queue_message(&url, &id, "again").await;
    common::wait_for("the second turn's command", async || {
        workspace.join("numbers.txt").exists()
    })
    .await;
    let filler = seen.join("filler");
    let filled = fill(&filler);
    assert!(filled > 1 << 20, "the disk had room to fill: {filled}");

    // Full until the driver has given the turn up (the server says so in its log: the
    // drive failed, or its worker is claiming work again): the command's outcome could
    // not be recorded, the turn cannot end, and the server keeps answering.
    let log = steadfast_testkit::service_log::path(env!("CARGO_TARGET_TMPDIR"));
    let met = async || {
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        said.contains("driving the session failed") || said.contains("claiming a turn failed")
    };
    for _ in 0..1200 {
        if met().await {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        met().await,
        "the harness met the full disk within two minutes"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let health = reqwest::get(format!("{url}/healthz")).await.unwrap();
    assert!(health.status().is_success() || health.status().as_u16() == 503);
    let shown = common::status(&url, &id).await;
    assert!(
        !["failed", "completed", "closed", "idle"].contains(&shown.as_str()),
        "a turn that could not be recorded is neither ended nor lost: {shown}"
    );

    // Space again: the session goes on by itself.
    std::fs::remove_file(&filler).unwrap();
    let after = common::idle_after(&url, &id, 2).await;
    assert_eq!(after["status"], "idle", "{after}");
    let (status, integrity) = common::call(
        reqwest::Method::GET,
        &format!("{url}/v1/sessions/{id}/integrity"),
        None,
    )
    .await;
    assert_eq!(
        (status, &integrity["ok"]),
        (200, &json!(true)),
        "{integrity}"
    );
    drop(server);
}
