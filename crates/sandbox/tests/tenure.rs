//! A sandbox that outlives its holder belongs to a session's lease: through its
//! socket, a request naming another session or an older epoch is refused; the next
//! holder adopts it and attaches to a command the last one began; and it ends itself,
//! with everything in it, when no holder renews its hold.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use steadfast_sandbox::agent::Request;
use steadfast_sandbox::{Backend, BwrapSandbox, Hold, Sandbox, SandboxOptions, ToolOutput};

fn options(session: &str, epoch: u64, hold: Duration) -> SandboxOptions {
    SandboxOptions {
        agent: vec![env!("CARGO_BIN_EXE_steadfast-sandbox-agent").to_string()],
        backend: Backend::Bwrap,
        lease: Some((session.to_string(), epoch)),
        hold: Some(Hold::new(move || hold)),
        ..SandboxOptions::default()
    }
}

/// The run directory of `session`'s sandbox, found as the next holder finds it.
fn run_dir(session: &str) -> PathBuf {
    let root = steadfast_sandbox::paths::socket_root();
    std::fs::read_dir(&root)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.extension().is_some_and(|x| x == "holds")
                && std::fs::read_to_string(p).is_ok_and(|h| h.lines().next() == Some(session))
        })
        .map(|p| p.with_extension(""))
        .expect("the sandbox's note")
}

/// Sends one request straight to the agent's socket.
fn send(
    run: &Path,
    tool: &str,
    input: Value,
    lease: Option<(&str, u64)>,
    call: Option<&str>,
) -> ToolOutput {
    use std::io::{BufRead, Write};
    let mut request = Request::new(tool, input, lease.map(|(s, e)| (s.to_string(), e)));
    request.call_id = call.map(str::to_string);
    let mut stream = std::os::unix::net::UnixStream::connect(run.join("agent.sock")).unwrap();
    let mut body = serde_json::to_vec(&request).unwrap();
    body.push(b'\n');
    stream.write_all(&body).unwrap();
    let mut line = String::new();
    std::io::BufReader::new(stream)
        .read_line(&mut line)
        .unwrap();
    serde_json::from_str(&line).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_serves_only_its_sessions_newest_holder() {
    if steadfast_sandbox::bwrap_available().is_err() {
        panic!("bwrap must run here");
    }
    let dir = tempfile::tempdir().unwrap();
    let session = format!("ses_tenure_{}", std::process::id());
    let first =
        BwrapSandbox::new(dir.path(), &options(&session, 5, Duration::from_secs(30))).unwrap();
    let run = run_dir(&session);
    let echo = json!({"command": "echo hi"});

    let foreign = send(
        &run,
        "bash",
        echo.clone(),
        Some(("ses_someone_else", 5)),
        None,
    );
    assert!(
        foreign.is_error && foreign.text.contains("another session"),
        "{foreign:?}"
    );
    let stale = send(&run, "bash", echo.clone(), Some((&session, 4)), None);
    assert!(
        stale.is_error && stale.text.contains("epoch 4"),
        "{stale:?}"
    );
    let unnamed = send(&run, "bash", echo.clone(), None, None);
    assert!(unnamed.is_error, "{unnamed:?}");
    let own = send(&run, "bash", echo.clone(), Some((&session, 5)), None);
    assert_eq!(own.text.trim(), "hi", "{own:?}");

    // The holder begins a command for a call and is gone: the command runs on.
    let slow = json!({"command": "sleep 1; echo one >> f.txt; echo ended"});
    let begun = {
        let run = run.clone();
        let (session, slow) = (session.clone(), slow.clone());
        std::thread::spawn(move || send(&run, "bash", slow, Some((&session, 5)), Some("call_1")))
    };
    std::thread::sleep(Duration::from_millis(200));
    std::mem::forget(first);

    // The next holder adopts it under epoch 6 and attaches to the call.
    let next =
        BwrapSandbox::new(dir.path(), &options(&session, 6, Duration::from_secs(30))).unwrap();
    assert_eq!(next.kept_calls(), vec!["call_1".to_string()]);
    let out = next.attach("call_1").await.unwrap();
    assert_eq!(out.text.trim(), "ended", "{out:?}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("f.txt")).unwrap(),
        "one\n"
    );
    assert_eq!(begun.join().unwrap().text.trim(), "ended");
    // The old holder is refused from now on; the new one is served.
    let stale = send(&run, "bash", echo.clone(), Some((&session, 5)), None);
    assert!(
        stale.is_error && stale.text.contains("epoch 5"),
        "{stale:?}"
    );
    let again = next.execute("bash", &echo).await.unwrap();
    assert_eq!(again.text.trim(), "hi");
    drop(next);
    assert!(!run.exists(), "released, its run directory is gone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_no_holder_renews_ends_itself_and_what_runs_in_it() {
    let dir = tempfile::tempdir().unwrap();
    let session = format!("ses_lapse_{}", std::process::id());
    // Its holder's heartbeat vouches for the lease until a point that never moves
    // again (it stopped renewing: hung, cut off, or dead).
    let until = Instant::now() + Duration::from_millis(1500);
    let options = SandboxOptions {
        hold: Some(Hold::new(move || {
            until.saturating_duration_since(Instant::now())
        })),
        ..options(&session, 1, Duration::ZERO)
    };
    let sandbox = BwrapSandbox::new(dir.path(), &options).unwrap();
    let run = run_dir(&session);
    let pid = sandbox.pid();
    let runner = {
        let (run, session) = (run.clone(), session.clone());
        std::thread::spawn(move || {
            let _ = std::panic::catch_unwind(|| {
                send(
                    &run,
                    "bash",
                    json!({"command": "sleep 7.7; echo late > late.txt"}),
                    Some((&session, 1)),
                    Some("c"),
                )
            });
        })
    };
    // The holder is gone without a word (nothing released).
    std::mem::forget(sandbox);
    let start = Instant::now();
    while alive(pid) && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !alive(pid),
        "the sandbox ended itself once its hold ran out"
    );
    let _ = runner.join();
    let gone = Instant::now();
    while run.exists() && gone.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!run.exists(), "its keeper removed its run directory");
    std::thread::sleep(Duration::from_secs(7));
    assert!(
        !dir.path().join("late.txt").exists(),
        "its command was killed with it"
    );
    let sleeping = std::process::Command::new("pgrep")
        .args(["-f", "^sleep 7.7$"])
        .output()
        .unwrap();
    assert!(!sleeping.status.success(), "nothing of it is left");
}

/// Whether process `pid` runs (a zombie, its parent yet to reap it, does not).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat[stat.rfind(')').map_or(0, |i| i + 1)..]
            .trim_start()
            .starts_with('Z')
    })
}

/// A command inside the sandbox reaches its agent's socket (it is in the run directory
/// the sandbox shares) but is refused: it cannot renew its sandbox's hold past the
/// lease, adopt it under an epoch of its own making, or run commands itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sandbox_s_own_commands_cannot_steer_its_agent() {
    let dir = tempfile::tempdir().unwrap();
    let session = format!("ses_inside_{}", std::process::id());
    let sandbox =
        BwrapSandbox::new(dir.path(), &options(&session, 3, Duration::from_secs(30))).unwrap();
    let script = format!(
        r#"import json, socket
for tool, epoch in [("steadfast.adopt", 9), ("steadfast.hold", 3), ("bash", 3)]:
    s = socket.socket(socket.AF_UNIX)
    s.connect("/run/steadfast/agent.sock")
    renewal = "999999\n" if tool == "steadfast.hold" else ""
    s.sendall((json.dumps({{"tool": tool, "input": {{"command": "echo ran", "hold_ms": 999999}}, "lease": ["{session}", epoch]}}) + "\n" + renewal).encode())
    print(tool, s.makefile().readline().strip())
"#
    );
    let out = sandbox
        .execute(
            "bash",
            &json!({ "command": format!("python3 -c '{script}'") }),
        )
        .await
        .unwrap();
    assert_eq!(
        out.text.matches("outside the sandbox only").count(),
        3,
        "{out:?}"
    );
    assert!(!out.text.contains("\"ran"), "{out:?}");
    // Its holder is still its holder.
    let own = sandbox
        .execute("bash", &json!({"command": "echo still"}))
        .await
        .unwrap();
    assert_eq!(own.text.trim(), "still", "{own:?}");
}

/// The service tool refuses bad input with an error naming what is wrong, and starts
/// nothing for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_tool_refuses_bad_input_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let session = format!("ses_bad_service_{}", std::process::id());
    let sandbox =
        BwrapSandbox::new(dir.path(), &options(&session, 1, Duration::from_secs(30))).unwrap();
    let cases = [
        (
            json!({"action": "start", "name": "../x", "command": "sleep 9"}),
            "`name`",
        ),
        (json!({"action": "start", "name": "web"}), "`command`"),
        (
            json!({"action": "start", "name": "web", "command": "sleep 9", "port": 70000}),
            "port 70000",
        ),
        (
            json!({"action": "launch", "name": "web"}),
            "unknown action `launch`",
        ),
        (
            json!({"action": "stop", "name": "nothing"}),
            "no service `nothing`",
        ),
        (
            json!({"action": "start", "name": "gone", "command": "exit 3"}),
            "exited at once",
        ),
        (json!("not an object"), "must be a JSON object"),
    ];
    for (input, says) in cases {
        let out = sandbox.execute("service", &input).await.unwrap();
        assert!(out.is_error && out.text.contains(says), "{input}: {out:?}");
    }
    let started = json!({"action": "start", "name": "web", "command": "sleep 9.31"});
    assert!(!sandbox.execute("service", &started).await.unwrap().is_error);
    let again = sandbox.execute("service", &started).await.unwrap();
    assert!(
        again.is_error && again.text.contains("running already"),
        "{again:?}"
    );
    let status = sandbox
        .execute("service", &json!({"action": "status"}))
        .await
        .unwrap();
    assert!(status.text.contains("web: running"), "{status:?}");
    assert!(!status.text.contains("gone"), "{status:?}");
}
