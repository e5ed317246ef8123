//! The tool contract every [`Sandbox`] backend must keep: what the model's tools
//! answer, whichever backend runs them.
//!
//! Each function takes a sandbox made over a workspace laid out by [`lay_out`] (and,
//! for [`output_is_capped`], with `max_output_bytes` of [`CAPPED_OUTPUT`]) and panics
//! on a contract violation. A backend's tests call every function here (see
//! `tests/conformance.rs`), so a new backend keeps the contract exactly when it passes
//! the same suite: paging, exact edits, exit codes, timeouts, output caps, special
//! files, paths that lead out of the workspace.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::{Sandbox, ToolOutput};

/// The output cap [`output_is_capped`] expects its sandbox to have.
pub const CAPPED_OUTPUT: usize = 1000;

/// What a file outside the workspace holds; no tool may show it.
const SECRET: &str = "TOP SECRET";

/// Lays out the suite's workspace under `root`: `ws/src/a.txt` (four lines), a secret
/// beside the workspace, and links that lead to it (`ws/leak`, `ws/up`). Returns the
/// workspace to make the sandbox over.
pub fn lay_out(root: &Path) -> PathBuf {
    let ws = root.join("ws");
    std::fs::create_dir_all(ws.join("src")).unwrap();
    std::fs::write(ws.join("src/a.txt"), "one\ntwo\nthree\ntwo\n").unwrap();
    std::fs::write(root.join("secret.txt"), SECRET).unwrap();
    std::os::unix::fs::symlink(root.join("secret.txt"), ws.join("leak")).unwrap();
    std::os::unix::fs::symlink(root, ws.join("up")).unwrap();
    ws
}

async fn call<S: Sandbox>(sb: &S, tool: &str, input: serde_json::Value) -> ToolOutput {
    sb.execute(tool, &input)
        .await
        .unwrap_or_else(|e| panic!("{tool}: the sandbox failed: {e}"))
}

/// Every file tool refuses a path that leads out of the workspace (`..`, an absolute
/// path, a link), says so, and shows nothing of what is there.
pub async fn paths_stay_inside<S: Sandbox>(sb: &S, root: &Path) {
    let secret = root.join("secret.txt").display().to_string();
    for path in [
        "../secret.txt",
        secret.as_str(),
        "leak",
        "up/secret.txt",
        "src/../../secret.txt",
    ] {
        let cases = [
            ("read", json!({"file_path": path})),
            ("write", json!({"file_path": path, "content": "pwned"})),
            (
                "edit",
                json!({"file_path": path, "old_string": "TOP", "new_string": "pwned"}),
            ),
            ("glob", json!({"pattern": "*", "path": path})),
            ("grep", json!({"pattern": "SECRET", "path": path})),
        ];
        for (tool, input) in cases {
            let out = call(sb, tool, input).await;
            assert!(out.is_error, "{tool} {path} was allowed: {}", out.text);
            assert!(
                out.text.contains("outside the workspace"),
                "{tool} {path}: {}",
                out.text
            );
            assert!(!out.text.contains(SECRET));
        }
    }
    assert_eq!(
        std::fs::read_to_string(root.join("secret.txt")).unwrap(),
        SECRET
    );
    assert!(!root.join("pwned").exists());
}

/// `read` numbers lines from 1 and pages with `offset` and `limit`, saying how to read
/// on; a missing file or argument is a tool error naming it.
pub async fn read_pages<S: Sandbox>(sb: &S) {
    let out = call(sb, "read", json!({"file_path": "src/a.txt"})).await;
    assert_eq!(
        out.text,
        "     1\tone\n     2\ttwo\n     3\tthree\n     4\ttwo\n"
    );
    let out = call(
        sb,
        "read",
        json!({"file_path": "src/a.txt", "offset": 2, "limit": 1}),
    )
    .await;
    assert!(
        out.text
            .starts_with("     2\ttwo\n[2 more lines; read with offset=3]"),
        "{}",
        out.text
    );
    assert!(
        call(sb, "read", json!({"file_path": "nope"}))
            .await
            .is_error
    );
    assert!(call(sb, "read", json!({})).await.text.contains("file_path"));
}

/// `edit` replaces exactly one occurrence (or all, when asked), refuses an ambiguous, a
/// missing or a no-op replacement and leaves the file as it was, and creates a file
/// from an empty `old_string`.
pub async fn edit_is_exact<S: Sandbox>(sb: &S, ws: &Path) {
    let dup = call(
        sb,
        "edit",
        json!({"file_path": "src/a.txt", "old_string": "two", "new_string": "2"}),
    )
    .await;
    assert!(
        dup.is_error && dup.text.contains("occurs 2 times"),
        "{}",
        dup.text
    );
    let missing = call(
        sb,
        "edit",
        json!({"file_path": "src/a.txt", "old_string": "four", "new_string": "4"}),
    )
    .await;
    assert!(missing.is_error && missing.text.contains("not found"));
    let same = call(
        sb,
        "edit",
        json!({"file_path": "src/a.txt", "old_string": "one", "new_string": "one"}),
    )
    .await;
    assert!(same.is_error);
    assert_eq!(
        std::fs::read_to_string(ws.join("src/a.txt")).unwrap(),
        "one\ntwo\nthree\ntwo\n"
    );
    let ok = call(
        sb,
        "edit",
        json!({"file_path": "src/a.txt", "old_string": "three\n", "new_string": "3\n"}),
    )
    .await;
    assert!(!ok.is_error, "{}", ok.text);
    let all = call(
        sb,
        "edit",
        json!({"file_path": "src/a.txt", "old_string": "two", "new_string": "2", "replace_all": true}),
    )
    .await;
    assert!(all.text.contains("2 occurrences"), "{}", all.text);
    assert_eq!(
        std::fs::read_to_string(ws.join("src/a.txt")).unwrap(),
        "one\n2\n3\n2\n"
    );
    let created = call(
        sb,
        "edit",
        json!({"file_path": "new/b.txt", "old_string": "", "new_string": "hi"}),
    )
    .await;
    assert!(!created.is_error, "{}", created.text);
    assert_eq!(std::fs::read_to_string(ws.join("new/b.txt")).unwrap(), "hi");
}

/// `glob` and `grep` find what `write` wrote, in each of grep's output modes.
pub async fn glob_and_grep_find_files<S: Sandbox>(sb: &S) {
    call(
        sb,
        "write",
        json!({"file_path": "src/b.rs", "content": "fn two() {}\n"}),
    )
    .await;
    let g = call(sb, "glob", json!({"pattern": "**/*.rs"})).await;
    assert_eq!(g.text, "src/b.rs");
    let files = call(sb, "grep", json!({"pattern": "tw."})).await;
    assert_eq!(files.text, "src/a.txt\nsrc/b.rs");
    let content = call(
        sb,
        "grep",
        json!({"pattern": "^two$", "output_mode": "content"}),
    )
    .await;
    assert_eq!(content.text, "src/a.txt:2:two\nsrc/a.txt:4:two");
    let count = call(
        sb,
        "grep",
        json!({"pattern": "TWO", "-i": true, "output_mode": "count", "glob": "*.txt"}),
    )
    .await;
    assert_eq!(count.text, "src/a.txt:2");
}

/// `bash` runs in the workspace, merges stdout and stderr, and reports a non-zero exit
/// as an error with its code.
pub async fn bash_reports_exit_codes<S: Sandbox>(sb: &S) {
    let out = call(
        sb,
        "bash",
        json!({"command": "echo out; echo err >&2; exit 3"}),
    )
    .await;
    assert!(out.is_error);
    assert_eq!(out.exit_code, Some(3));
    assert!(
        out.text.contains("out") && out.text.contains("err") && out.text.contains("Exit code 3"),
        "{}",
        out.text
    );
    let here = call(sb, "bash", json!({"command": "cat src/a.txt | wc -l"})).await;
    assert!(!here.is_error, "{}", here.text);
    assert_eq!(here.exit_code, Some(0));
    assert_eq!(here.text.trim(), "4");
}

/// A `bash` call past its `timeout` is stopped, says so, and leaves nothing it started
/// running (its background children included).
pub async fn bash_timeout_kills_the_group<S: Sandbox>(sb: &S, marker: &str) {
    let start = Instant::now();
    let sleep = format!("sleep {marker}");
    let out = call(
        sb,
        "bash",
        json!({"command": format!("({sleep}; echo leaked > leaked.txt) & {sleep}"), "timeout": 300}),
    )
    .await;
    assert!(start.elapsed() < Duration::from_secs(20));
    assert!(
        out.is_error && out.text.contains("timed out"),
        "{}",
        out.text
    );
    let mut left = String::new();
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let ps = std::process::Command::new("pgrep")
            .args(["-f", &sleep])
            .output()
            .unwrap();
        left = String::from_utf8_lossy(&ps.stdout).trim().to_string();
        if left.is_empty() {
            return;
        }
    }
    panic!("a sleep outlived its timed-out call: {left}");
}

/// Output past the sandbox's cap is cut, and the cut says how much there was.
pub async fn output_is_capped<S: Sandbox>(sb: &S) {
    let out = call(
        sb,
        "bash",
        json!({"command": "head -c 50000 /dev/zero | tr '\\0' x"}),
    )
    .await;
    assert!(
        out.text.starts_with(&"x".repeat(CAPPED_OUTPUT)),
        "{}",
        out.text
    );
    assert!(
        out.text.contains(&format!(
            "output truncated: 50000 bytes written, first {CAPPED_OUTPUT} kept"
        )),
        "{}",
        out.text
    );
}

/// A FIFO, a socket, a device (where this process may make one) and a 1 GiB sparse
/// file in the workspace: every file tool answers at once, names what it found, reads a
/// bounded part at most, and leaves each as it was. A FIFO nobody writes would block an
/// open for reading for ever, and one nobody reads an open for writing. Blocking: it
/// runs each call on a thread of its own, so call it from a blocking context.
pub fn special_files_never_block<S: Sandbox>(sb: Arc<S>, ws: &Path) {
    nix::unistd::mkfifo(&ws.join("pipe"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let _socket = std::os::unix::net::UnixListener::bind(ws.join("sock")).unwrap();
    let device = nix::sys::stat::mknod(
        &ws.join("null"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::S_IRWXU,
        nix::sys::stat::makedev(1, 3),
    )
    .is_ok();
    let huge = std::fs::File::create(ws.join("huge.log")).unwrap();
    huge.set_len(1 << 30).unwrap();
    drop(huge);

    let mut specials = vec![("pipe", "a FIFO"), ("sock", "a socket")];
    if device {
        specials.push(("null", "a device"));
    }
    for (name, what) in &specials {
        let calls = [
            ("read", json!({"file_path": name})),
            ("write", json!({"file_path": name, "content": "x"})),
            (
                "edit",
                json!({"file_path": name, "old_string": "a", "new_string": "b"}),
            ),
        ];
        for (tool, input) in calls {
            let out =
                within_10s(&sb, tool, input).unwrap_or_else(|| panic!("{tool} of {name} blocked"));
            assert!(out.is_error, "{tool} {name}: {}", out.text);
            assert!(out.text.contains(what), "{tool} {name}: {}", out.text);
        }
    }
    // grep walks past them all (and reads no more of the huge file than its limit).
    let out = within_10s(&sb, "grep", json!({"pattern": "x"})).expect("grep blocked");
    assert!(!out.is_error, "{}", out.text);
    // The sparse gigabyte is read up to the bound only: zeros, so binary.
    let out = within_10s(&sb, "read", json!({"file_path": "huge.log"})).expect("read blocked");
    assert!(out.is_error && out.text.contains("binary"), "{}", out.text);
    let meta = std::fs::symlink_metadata(ws.join("pipe")).unwrap();
    use std::os::unix::fs::FileTypeExt;
    assert!(meta.file_type().is_fifo(), "the FIFO is left as it was");
}

/// A tool call made on a thread of its own, or `None` if it has not answered within
/// 10 s (a call blocked in the kernel cannot be cancelled; its thread is left behind).
fn within_10s<S: Sandbox>(sb: &Arc<S>, tool: &str, input: serde_json::Value) -> Option<ToolOutput> {
    let (sb, tool) = (sb.clone(), tool.to_string());
    let (done, answer) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let _ = done.send(runtime.block_on(call(sb.as_ref(), &tool, input)));
    });
    answer.recv_timeout(Duration::from_secs(10)).ok()
}

/// A file larger than a read is shown from its start with a note on how to see the
/// rest; an edit of it is refused with a way to make it.
pub async fn big_files_are_read_in_part<S: Sandbox>(sb: &S, ws: &Path) {
    let line = "a line of text that is not short\n";
    let big = line.repeat((20 * 1024 * 1024) / line.len());
    std::fs::write(ws.join("big.txt"), &big).unwrap();
    let out = call(sb, "read", json!({"file_path": "big.txt", "limit": 3})).await;
    assert!(!out.is_error, "{}", out.text);
    assert!(
        out.text.contains("only its first 16777216 were read"),
        "{}",
        out.text
    );
    let out = call(
        sb,
        "edit",
        json!({"file_path": "big.txt", "old_string": "not short", "new_string": "short"}),
    )
    .await;
    assert!(
        out.is_error && out.text.contains("edit it with bash"),
        "{}",
        out.text
    );
}
