use std::time::{Duration, Instant};

use serde_json::json;

use crate::{LocalSandbox, Sandbox, SandboxOptions, ToolOutput};

fn sandbox() -> (tempfile::TempDir, LocalSandbox) {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(ws.join("src")).unwrap();
    std::fs::write(ws.join("src/a.txt"), "one\ntwo\nthree\ntwo\n").unwrap();
    std::fs::write(dir.path().join("secret.txt"), "TOP SECRET").unwrap();
    std::os::unix::fs::symlink(dir.path().join("secret.txt"), ws.join("leak")).unwrap();
    std::os::unix::fs::symlink(dir.path(), ws.join("up")).unwrap();
    let sb = LocalSandbox::new(&ws, SandboxOptions::default()).unwrap();
    (dir, sb)
}

async fn call(sb: &LocalSandbox, tool: &str, input: serde_json::Value) -> ToolOutput {
    sb.execute(tool, &input).await.unwrap()
}

#[tokio::test]
async fn every_file_tool_refuses_paths_outside_the_workspace() {
    let (dir, sb) = sandbox();
    let secret = dir.path().join("secret.txt").display().to_string();
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
            let out = call(&sb, tool, input).await;
            assert!(out.is_error, "{tool} {path} was allowed: {}", out.text);
            assert!(
                out.text.contains("outside the workspace"),
                "{tool} {path}: {}",
                out.text
            );
            assert!(!out.text.contains("TOP SECRET"));
        }
    }
    assert_eq!(
        std::fs::read_to_string(dir.path().join("secret.txt")).unwrap(),
        "TOP SECRET"
    );
    assert!(!dir.path().join("up").exists() || !dir.path().join("pwned").exists());
}

#[tokio::test]
async fn read_numbers_lines_and_pages() {
    let (_d, sb) = sandbox();
    let out = call(&sb, "read", json!({"file_path": "src/a.txt"})).await;
    assert_eq!(
        out.text,
        "     1\tone\n     2\ttwo\n     3\tthree\n     4\ttwo\n"
    );
    let out = call(
        &sb,
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
        call(&sb, "read", json!({"file_path": "nope"}))
            .await
            .is_error
    );
    assert!(call(&sb, "read", json!({}))
        .await
        .text
        .contains("file_path"));
}

#[tokio::test]
async fn edit_follows_the_exact_replace_contract() {
    let (_d, sb) = sandbox();
    let ws = sb.workspace().to_path_buf();
    let dup = call(
        &sb,
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
        &sb,
        "edit",
        json!({"file_path": "src/a.txt", "old_string": "four", "new_string": "4"}),
    )
    .await;
    assert!(missing.is_error && missing.text.contains("not found"));
    let same = call(
        &sb,
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
        &sb,
        "edit",
        json!({"file_path": "src/a.txt", "old_string": "three\n", "new_string": "3\n"}),
    )
    .await;
    assert!(!ok.is_error, "{}", ok.text);
    let all = call(&sb, "edit", json!({"file_path": "src/a.txt", "old_string": "two", "new_string": "2", "replace_all": true})).await;
    assert!(all.text.contains("2 occurrences"));
    assert_eq!(
        std::fs::read_to_string(ws.join("src/a.txt")).unwrap(),
        "one\n2\n3\n2\n"
    );
    let created = call(
        &sb,
        "edit",
        json!({"file_path": "new/b.txt", "old_string": "", "new_string": "hi"}),
    )
    .await;
    assert!(!created.is_error);
    assert_eq!(std::fs::read_to_string(ws.join("new/b.txt")).unwrap(), "hi");
}

#[tokio::test]
async fn glob_and_grep_find_files() {
    let (_d, sb) = sandbox();
    call(
        &sb,
        "write",
        json!({"file_path": "src/b.rs", "content": "fn two() {}\n"}),
    )
    .await;
    let g = call(&sb, "glob", json!({"pattern": "**/*.rs"})).await;
    assert_eq!(g.text, "src/b.rs");
    let files = call(&sb, "grep", json!({"pattern": "tw."})).await;
    assert_eq!(files.text, "src/a.txt\nsrc/b.rs");
    let content = call(
        &sb,
        "grep",
        json!({"pattern": "^two$", "output_mode": "content"}),
    )
    .await;
    assert_eq!(content.text, "src/a.txt:2:two\nsrc/a.txt:4:two");
    let count = call(
        &sb,
        "grep",
        json!({"pattern": "TWO", "-i": true, "output_mode": "count", "glob": "*.txt"}),
    )
    .await;
    assert_eq!(count.text, "src/a.txt:2");
}

#[tokio::test]
async fn bash_reports_exit_codes_and_merges_output() {
    let (_d, sb) = sandbox();
    let out = call(
        &sb,
        "bash",
        json!({"command": "echo out; echo err >&2; exit 3"}),
    )
    .await;
    assert!(out.is_error);
    assert_eq!(out.exit_code, Some(3));
    assert!(
        out.text.contains("out") && out.text.contains("err") && out.text.contains("Exit code 3")
    );
    let pwd = call(&sb, "bash", json!({"command": "pwd"})).await;
    assert_eq!(pwd.text.trim(), sb.workspace().display().to_string());
}

#[tokio::test]
async fn bash_timeout_kills_the_whole_process_group() {
    let (_d, sb) = sandbox();
    let start = Instant::now();
    let out = call(
        &sb,
        "bash",
        // A duration no other test uses: pgrep looks at the whole machine.
        json!({"command": "(sleep 30.517; echo leaked > leaked.txt) & sleep 30.517", "timeout": 300}),
    )
    .await;
    assert!(start.elapsed() < Duration::from_secs(10));
    assert!(
        out.is_error && out.text.contains("timed out"),
        "{}",
        out.text
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let ps = std::process::Command::new("pgrep")
        .args(["-f", "sleep 30.517"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&ps.stdout).trim().is_empty(),
        "a sleep survived"
    );
}

#[tokio::test]
async fn bash_output_is_capped() {
    let dir = tempfile::tempdir().unwrap();
    let options = SandboxOptions {
        max_output_bytes: 1000,
        ..SandboxOptions::default()
    };
    let sb = LocalSandbox::new(dir.path(), options).unwrap();
    let out = call(
        &sb,
        "bash",
        json!({"command": "head -c 50000 /dev/zero | tr '\\0' x"}),
    )
    .await;
    assert!(out.text.starts_with(&"x".repeat(1000)));
    assert!(out
        .text
        .contains("output truncated: 50000 bytes written, first 1000 kept"));
}

#[tokio::test]
async fn commands_see_no_credentials() {
    std::env::set_var("ANTHROPIC_API_KEY", "sk-ant-must-not-leak");
    std::env::set_var("OPENAI_API_KEY", "sk-must-not-leak");
    let dir = tempfile::tempdir().unwrap();
    let mut options = SandboxOptions::default();
    options
        .env
        .insert("GITHUB_TOKEN".into(), "ghp-must-not-leak".into());
    options.env.insert("PROJECT_MODE".into(), "test".into());
    let sb = LocalSandbox::new(dir.path(), options).unwrap();
    let out = call(&sb, "bash", json!({"command": "env"})).await;
    assert!(!out.text.contains("must-not-leak"), "{}", out.text);
    assert!(out.text.contains("PROJECT_MODE=test"));
    assert!(!out.text.contains("ANTHROPIC") && !out.text.contains("OPENAI"));
}

#[tokio::test]
async fn a_local_home_has_the_same_path_every_run_and_abandoned_ones_are_reaped() {
    let dir = tempfile::tempdir().unwrap();
    let home_of = |sandbox: &LocalSandbox| {
        sandbox
            .env
            .iter()
            .find(|(k, _)| k == "HOME")
            .map(|(_, v)| v.clone())
            .unwrap()
    };
    let (first, second) = {
        let a = LocalSandbox::new(dir.path(), SandboxOptions::default()).unwrap();
        let b = LocalSandbox::new(dir.path(), SandboxOptions::default()).unwrap();
        (home_of(&a), home_of(&b))
    };
    assert_ne!(first, second, "two live sandboxes never share a home");
    let again = LocalSandbox::new(dir.path(), SandboxOptions::default()).unwrap();
    assert_eq!(home_of(&again), first, "the same path as the last run's");
    drop(again);
    // A home whose process died without removing it.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let stale = std::env::temp_dir().join(format!("steadfast-home-abandoned{dead}-0"));
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(stale.with_extension("owner"), dead.to_string()).unwrap();
    let _sandbox = LocalSandbox::new(dir.path(), SandboxOptions::default()).unwrap();
    assert!(!stale.exists(), "the abandoned home was reaped");
}

/// A FIFO, a socket, a device (where this process may make one) and a 1 GiB sparse
/// file in the workspace: every file tool answers at once, names what it found, reads
/// a bounded part at most, and leaves each as it was. A FIFO nobody writes would block
/// an open for reading for ever, and one nobody reads an open for writing.
#[test]
fn special_and_huge_files_never_block_a_file_tool() {
    let (dir, sb) = sandbox();
    let sb = std::sync::Arc::new(sb);
    let root = &dir.path().join("ws");
    nix::unistd::mkfifo(&root.join("pipe"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let _socket = std::os::unix::net::UnixListener::bind(root.join("sock")).unwrap();
    let device = nix::sys::stat::mknod(
        &root.join("null"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::S_IRWXU,
        nix::sys::stat::makedev(1, 3),
    )
    .is_ok();
    let huge = std::fs::File::create(root.join("huge.log")).unwrap();
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
    let meta = std::fs::symlink_metadata(root.join("pipe")).unwrap();
    use std::os::unix::fs::FileTypeExt;
    assert!(meta.file_type().is_fifo(), "the FIFO is left as it was");
}

/// A tool call made on a thread of its own, or `None` if it has not answered within
/// 10 s (a call blocked in the kernel cannot be cancelled; its thread is left behind).
fn within_10s(
    sb: &std::sync::Arc<LocalSandbox>,
    tool: &str,
    input: serde_json::Value,
) -> Option<ToolOutput> {
    let (sb, tool) = (sb.clone(), tool.to_string());
    let (done, answer) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let _ = done.send(runtime.block_on(call(&sb, &tool, input)));
    });
    answer.recv_timeout(Duration::from_secs(10)).ok()
}

#[tokio::test]
async fn a_file_larger_than_a_read_shows_its_start_and_says_how_to_see_the_rest() {
    let (dir, sb) = sandbox();
    let line = "a line of text that is not short\n";
    let big = line.repeat((20 * 1024 * 1024) / line.len());
    std::fs::write(dir.path().join("ws/big.txt"), &big).unwrap();
    let out = call(&sb, "read", json!({"file_path": "big.txt", "limit": 3})).await;
    assert!(!out.is_error, "{}", out.text);
    assert!(
        out.text.contains("only its first 16777216 were read"),
        "{}",
        out.text
    );
    let out = call(
        &sb,
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
