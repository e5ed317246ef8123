//! The CLI as a new user meets it: the demo interrupted with Ctrl-C under a real
//! pseudo-terminal and resumed with the printed line from another directory; a home
//! found without flags and never created by commands that only read; the changes a
//! session made; stopping, closing, deleting and following a session from another
//! process.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BIN: &str = env!("CARGO_BIN_EXE_steadfast");

/// A person's machine: a home directory of their own and no API key, so the bundled
/// fake provider plays the demo.
struct Person {
    dir: tempfile::TempDir,
}

impl Person {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["user", "here", "elsewhere"] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        Person { dir }
    }

    fn path(&self, sub: &str) -> PathBuf {
        self.dir.path().join(sub)
    }

    /// The per-user home the CLI should find.
    fn user_home(&self) -> PathBuf {
        self.path("user/.local/share/steadfast")
    }

    fn env(&self, cmd: &mut tokio::process::Command) {
        cmd.env("HOME", self.path("user"))
            .env("USER", "pat")
            .env_remove("STEADFAST_HOME")
            .env_remove("XDG_DATA_HOME")
            .env_remove("STEADFAST_CONFIG")
            .env_remove("STEADFAST_WORLD")
            .env_remove("STEADFAST_MODEL")
            .env_remove("STEADFAST_FAKE_SCRIPT")
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("OPENAI_API_KEY")
            .env_remove("RUST_LOG");
    }

    fn command(&self, cwd: &str, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(BIN);
        cmd.args(args)
            .current_dir(self.path(cwd))
            .stdin(Stdio::null())
            .kill_on_drop(true);
        self.env(&mut cmd);
        cmd
    }

    async fn steadfast(&self, cwd: &str, args: &[&str]) -> Output {
        self.command(cwd, args).output().await.unwrap()
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The session id in a line `... resume <id>`.
fn resume_line(output: &str) -> String {
    let line = output
        .lines()
        .rev()
        .find(|l| l.contains("resume ses_"))
        .unwrap_or_else(|| panic!("a resume line: {output}"));
    let at = line.rfind(": ").map(|i| i + 2).unwrap();
    line[at..].trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_in_a_terminal_stops_the_demo_and_the_printed_line_resumes_it_from_elsewhere() {
    let person = Person::new();
    // `script` gives the demo a real pseudo-terminal: Ctrl-C is a byte typed into it,
    // turned into SIGINT for the foreground process group by the terminal itself.
    let mut cmd = tokio::process::Command::new("script");
    cmd.args(["-qfec", &format!("{BIN} run"), "/dev/null"])
        .current_dir(person.path("here"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    person.env(&mut cmd);
    let mut terminal = cmd.spawn().unwrap();
    let mut screen = terminal.stdout.take().unwrap();
    let mut keyboard = terminal.stdin.take().unwrap();
    let mut shown = Vec::new();
    let mut buf = [0u8; 4096];
    let typed_at = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let n = screen.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "the demo ended before it was interrupted: {}",
                text(&shown)
            );
            shown.extend_from_slice(&buf[..n]);
            // Mid-run: the fix is being made.
            if text(&shown).contains("→ edit stats.py") {
                keyboard.write_all(b"\x03").await.unwrap();
                keyboard.flush().await.unwrap();
                return shown.len();
            }
        }
    })
    .await
    .expect("the demo reached its edit");
    screen.read_to_end(&mut shown).await.unwrap();
    let status = terminal.wait().await.unwrap();
    let screen = text(&shown);
    assert_eq!(status.code(), Some(130), "interrupted: {screen}");
    assert!(
        !text(&shown[typed_at..]).contains("All tests pass"),
        "the demo stopped mid-run: {screen}"
    );
    assert!(screen.contains("nothing is lost"), "{screen}");

    // The printed line, exactly as printed, from another directory.
    let line = resume_line(&screen);
    assert!(
        line.starts_with(BIN),
        "names the program as it can be run: {line}"
    );
    let mut resume = tokio::process::Command::new("sh");
    resume
        .args(["-c", &line])
        .current_dir(person.path("elsewhere"))
        .stdin(Stdio::null());
    person.env(&mut resume);
    let out = resume.output().await.unwrap();
    let said = text(&out.stderr);
    assert!(out.status.success(), "resumed: {said}");
    assert!(said.contains("completed"), "{said}");
    assert!(
        said.contains("modified stats.py"),
        "the report lists the changes: {said}"
    );
    let fixed = std::fs::read_to_string(person.path("here/steadfast-demo/stats.py")).unwrap();
    assert!(
        fixed.contains("/ len(values)") && !fixed.contains("len(values) - 1"),
        "{fixed}"
    );
    assert!(
        !person.path("elsewhere/.steadfast").exists()
            && person.user_home().join("world.db").exists(),
        "state is in the per-user home, not in either directory"
    );
}

#[tokio::test]
async fn commands_that_only_read_create_nothing_and_say_where_they_looked() {
    let person = Person::new();
    for args in [
        vec!["sessions"],
        vec!["log", "ses_nope"],
        vec!["diff", "ses_nope"],
        vec!["resume", "ses_nope"],
        vec!["stop", "ses_nope"],
    ] {
        let out = person.steadfast("here", &args).await;
        let said = text(&out.stderr);
        assert!(
            said.contains(&person.user_home().display().to_string()),
            "{args:?} names the home it looked for: {said}"
        );
        assert!(
            !person.path("user/.local").exists(),
            "{args:?} created a home"
        );
        assert!(
            !person.path("here/.steadfast").exists(),
            "{args:?} created ./.steadfast"
        );
    }
    // A home in a parent directory is found from below it, as git finds .git.
    std::fs::create_dir_all(person.path("here/.steadfast")).unwrap();
    std::fs::create_dir_all(person.path("here/deep/er")).unwrap();
    let out = person
        .steadfast("here/deep/er", &["run", "--pace", "0"])
        .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(person.path("here/.steadfast/world.db").exists());
    let listed = person.steadfast("here", &["sessions", "--json"]).await;
    assert_eq!(text(&listed.stdout).lines().count(), 1);
    let line = resume_line(&text(&out.stderr));
    assert!(
        line.contains(&format!(
            "--home {}",
            person.path("here/.steadfast").display()
        )),
        "a found home is named in the resume line, so it works from anywhere: {line}"
    );
}

#[tokio::test]
async fn usage_errors_missing_workspaces_and_secrets_on_the_command_line_are_refused() {
    let person = Person::new();
    let out = person.steadfast("here", &["run", "--no-such-flag"]).await;
    assert_eq!(
        out.status.code(),
        Some(64),
        "a usage error has its own code"
    );
    let out = person.steadfast("here", &["frobnicate"]).await;
    assert_eq!(out.status.code(), Some(64));
    let out = person.steadfast("here", &["--help"]).await;
    assert_eq!(out.status.code(), Some(0));

    let out = person
        .steadfast(
            "here",
            &["run", "go", "--workspace", "typo-dir", "--pace", "0"],
        )
        .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("--create"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        !person.path("here/typo-dir").exists(),
        "nothing was created"
    );
    assert!(
        !person.path("user/.local").exists(),
        "no session was created"
    );
    let out = person
        .steadfast(
            "here",
            &["run", "--workspace", "fresh", "--create", "--pace", "0"],
        )
        .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(person.path("here/fresh").is_dir());

    // The token comes from stdin; on the command line it is a usage error.
    let out = person.steadfast("here", &["hash-token", "s3cret"]).await;
    assert_eq!(out.status.code(), Some(64));
    let mut cmd = person.command("here", &["hash-token"]);
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"s3cret\n")
        .await
        .unwrap();
    let out = child.wait_with_output().await.unwrap();
    assert!(out.status.success());
    assert_eq!(
        text(&out.stdout).trim(),
        steadfast_server::hash_token("s3cret"),
        "the line ending is not part of the token"
    );

    // The API's document is printed without a server (and without making a home):
    // the same bytes as the checked-in copy clients generate code from.
    let out = person.steadfast("elsewhere", &["openapi"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let checked_in = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../server/openapi.json"),
    )
    .unwrap();
    assert_eq!(text(&out.stdout), checked_in);
}

#[tokio::test]
async fn a_session_shows_what_it_changed_as_content_diffs() {
    let person = Person::new();
    let out = person
        .steadfast("here", &["run", "--pace", "0", "--json"])
        .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = result["session"].as_str().unwrap();

    let out = person.steadfast("elsewhere", &["diff", id]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let patch = text(&out.stdout);
    for expected in [
        "--- a/stats.py",
        "+++ b/stats.py",
        "-    return sum(values) / (len(values) - 1)",
        "--- /dev/null",
        "+++ b/test_regression.py",
    ] {
        assert!(patch.contains(expected), "`{expected}` in:\n{patch}");
    }

    let out = person.steadfast("elsewhere", &["diff", id, "--json"]).await;
    let diff: Value = serde_json::from_slice(&out.stdout).unwrap();
    let files: Vec<&str> = diff["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(files, ["CHANGELOG.md", "stats.py", "test_regression.py"]);
    // Between two positions: nothing changed before the first edit.
    let out = person
        .steadfast(
            "elsewhere",
            &["diff", id, "--from", "0", "--to", "3", "--json"],
        )
        .await;
    let early: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(early["files"], serde_json::json!([]), "{early}");
    let out = person
        .steadfast("elsewhere", &["diff", id, "--from", "9", "--to", "2"])
        .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("from 9"),
        "{}",
        text(&out.stderr)
    );

    // The final record lists the changed paths too.
    let out = person.steadfast("elsewhere", &["log", id, "--json"]).await;
    let last: Value = serde_json::from_str(text(&out.stdout).lines().last().unwrap()).unwrap();
    assert_eq!(
        last["event"]["session_ended"]["diff"],
        serde_json::json!([
            "modified CHANGELOG.md",
            "modified stats.py",
            "added test_regression.py"
        ])
    );
}

fn slow_script(dir: &Path) -> PathBuf {
    let path = dir.join("slow.json");
    let steps = serde_json::json!({"steps": [
        {"text": "Running the long job.", "tool_calls": [{"name": "bash", "input": {"command": "sleep 60"}}]},
        {"text": "done"}
    ]});
    std::fs::write(&path, steps.to_string()).unwrap();
    path
}

/// The id of the person's session, once it has started a tool call (seen from
/// another directory).
async fn running_a_tool(person: &Person) -> String {
    let mut id = String::new();
    for _ in 0..300 {
        let out = person.steadfast("elsewhere", &["sessions", "--json"]).await;
        if let Some(line) = text(&out.stdout).lines().next() {
            let s: Value = serde_json::from_str(line).unwrap();
            id = s["id"].as_str().unwrap().to_string();
            let log = person.steadfast("elsewhere", &["log", &id, "--json"]).await;
            if text(&log.stdout).contains("tool_call_intent") {
                return id;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the session {id:?} never started a tool call")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_process_follows_stops_closes_and_deletes_a_running_session() {
    let person = Person::new();
    let script = slow_script(person.dir.path());
    let mut run = person.command("here", &["run", "wait for it", "--workspace", "."]);
    run.env("STEADFAST_FAKE_SCRIPT", &script)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut running = run.spawn().unwrap();
    // Wait for the long command to be running.
    let id = running_a_tool(&person).await;

    // A follower from another directory, until the session ends.
    let follower = person
        .command("elsewhere", &["log", &id, "--follow"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();

    // `close` interrupts the running command at once and ends the session.
    let started = std::time::Instant::now();
    let closed = person.steadfast("elsewhere", &["close", &id]).await;
    assert!(closed.status.success(), "{}", text(&closed.stderr));
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "closed without waiting for `sleep 60`"
    );
    let run_out = tokio::time::timeout(Duration::from_secs(20), running.wait())
        .await
        .expect("the running process stopped")
        .unwrap();
    assert_eq!(
        run_out.code(),
        Some(130),
        "the driving process says it was interrupted"
    );
    let followed = tokio::time::timeout(Duration::from_secs(20), follower.wait_with_output())
        .await
        .expect("the follower ends with the session")
        .unwrap();
    let timeline = text(&followed.stdout);
    assert!(timeline.contains("interrupted by cli:pat"), "{timeline}");
    assert!(timeline.contains("closed by cli:pat"), "{timeline}");

    let listed = person.steadfast("elsewhere", &["sessions", "--json"]).await;
    let s: Value = serde_json::from_str(text(&listed.stdout).lines().next().unwrap()).unwrap();
    assert_eq!(s["status"], "closed", "closed half done, not completed");
    assert_eq!(s["agent"], "native");
    let filtered = person
        .steadfast(
            "elsewhere",
            &["sessions", "--json", "--status", "idle,running"],
        )
        .await;
    assert_eq!(text(&filtered.stdout).trim(), "", "no open session");
    let filtered = person
        .steadfast(
            "elsewhere",
            &[
                "sessions", "--json", "--status", "closed", "--agent", "native",
            ],
        )
        .await;
    assert_eq!(text(&filtered.stdout).lines().count(), 1);
    let refused = person
        .steadfast("elsewhere", &["sessions", "--status", "shut"])
        .await;
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("--status: `shut`"),
        "{}",
        text(&refused.stderr)
    );
    let deleted = person.steadfast("elsewhere", &["delete", &id]).await;
    assert!(deleted.status.success(), "{}", text(&deleted.stderr));
    let listed = person.steadfast("elsewhere", &["sessions", "--json"]).await;
    assert_eq!(text(&listed.stdout).trim(), "", "the session is gone");
    let log = person.steadfast("elsewhere", &["log", &id]).await;
    assert_eq!(log.status.code(), Some(1));
    assert!(
        text(&log.stderr).contains("no session"),
        "{}",
        text(&log.stderr)
    );
}

#[tokio::test]
async fn a_long_command_shows_its_elapsed_time_on_a_terminal() {
    let person = Person::new();
    let path = person.dir.path().join("slow.json");
    let steps = serde_json::json!({"steps": [
        {"text": "Running the job.", "tool_calls": [{"name": "bash", "input": {"command": "sleep 3; echo finished"}}]},
        {"text": "done"}
    ]});
    std::fs::write(&path, steps.to_string()).unwrap();
    let mut cmd = tokio::process::Command::new("script");
    cmd.args(["-qfec", &format!("{BIN} run go --workspace ."), "/dev/null"])
        .current_dir(person.path("here"))
        .stdin(Stdio::piped());
    person.env(&mut cmd);
    cmd.env("STEADFAST_FAKE_SCRIPT", &path);
    let out = cmd.output().await.unwrap();
    let screen = text(&out.stdout);
    assert!(out.status.success(), "{screen}");
    assert!(
        screen.contains("bash running for 2s"),
        "the elapsed time is shown while the command runs: {screen}"
    );
    assert!(screen.contains("finished"), "{screen}");
}

#[tokio::test]
async fn deleting_a_session_never_takes_an_output_another_session_shares() {
    let person = Person::new();
    let path = person.dir.path().join("big.json");
    // An output well over the inline limit: it goes to the blob store, by content.
    let steps = serde_json::json!({"steps": [
        {"text": "Counting.", "tool_calls": [{"name": "bash", "input": {"command": "seq 1 40000"}}]},
        {"text": "done"}
    ]});
    std::fs::write(&path, steps.to_string()).unwrap();
    let mut ids = Vec::new();
    for ws in ["one", "two"] {
        let mut cmd = person.command(
            "here",
            &["run", "count", "--workspace", ws, "--create", "--json"],
        );
        cmd.env("STEADFAST_FAKE_SCRIPT", &path);
        let out = cmd.output().await.unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        let result: Value = serde_json::from_slice(&out.stdout).unwrap();
        ids.push(result["session"].as_str().unwrap().to_string());
    }
    let blob_of = |log: &str| -> String {
        log.lines()
            .find_map(|l| {
                let r: Value = serde_json::from_str(l).ok()?;
                r["event"]["tool_call_outcome"]["output"]["hash"]
                    .as_str()
                    .map(String::from)
            })
            .expect("the output went to the blob store")
    };
    let log = |id: String| {
        let person = &person;
        async move { person.steadfast("elsewhere", &["log", &id, "--json"]).await }
    };
    let shared = blob_of(&text(&log(ids[0].clone()).await.stdout));
    assert_eq!(
        shared,
        blob_of(&text(&log(ids[1].clone()).await.stdout)),
        "one blob, shared"
    );
    let stored = person.user_home().join("blobs").join(&shared);
    assert!(stored.exists());

    let deleted = person.steadfast("elsewhere", &["delete", &ids[0]]).await;
    assert!(deleted.status.success(), "{}", text(&deleted.stderr));
    let gc = person
        .steadfast("elsewhere", &["gc", "--min-age-secs", "0"])
        .await;
    assert!(gc.status.success(), "{}", text(&gc.stderr));
    let other = log(ids[1].clone()).await;
    assert!(
        other.status.success() && !text(&other.stderr).contains("DATA LOST"),
        "the other session's output is whole: {}",
        text(&other.stderr)
    );
    assert!(stored.exists(), "a blob another log refers to is kept");

    let deleted = person.steadfast("elsewhere", &["delete", &ids[1]]).await;
    assert!(deleted.status.success());
    let gc = person
        .steadfast("elsewhere", &["gc", "--min-age-secs", "0"])
        .await;
    assert!(gc.status.success(), "{}", text(&gc.stderr));
    assert!(
        !stored.exists(),
        "a blob no log refers to is reclaimed: {}",
        text(&gc.stderr)
    );
}

#[tokio::test]
async fn gc_prunes_the_streamed_pieces_of_ended_turns_and_the_log_still_verifies() {
    let person = Person::new();
    let mut cmd = person.command(
        "here",
        &["run", "count", "--workspace", "one", "--create", "--json"],
    );
    let out = cmd.output().await.unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = result["session"].as_str().unwrap().to_string();
    let kinds = || async {
        let log = person.steadfast("elsewhere", &["log", &id, "--json"]).await;
        assert!(log.status.success(), "{}", text(&log.stderr));
        text(&log.stdout)
            .lines()
            .map(|l| {
                let r: Value = serde_json::from_str(l).unwrap();
                let event = r["event"].as_object().unwrap();
                event.keys().next().unwrap().clone()
            })
            .collect::<Vec<_>>()
    };
    let count = |kinds: &[String], kind: &str| kinds.iter().filter(|k| *k == kind).count();
    let before = kinds().await;
    let deltas = count(&before, "model_delta");
    assert!(deltas > 0, "the replies streamed: {before:?}");

    // The default keeps a day: a turn that just ended keeps its pieces.
    let gc = person.steadfast("elsewhere", &["gc"]).await;
    assert!(gc.status.success(), "{}", text(&gc.stderr));
    assert_eq!(kinds().await, before);

    let gc = person
        .steadfast("elsewhere", &["gc", "--keep-deltas-secs", "0"])
        .await;
    assert!(gc.status.success(), "{}", text(&gc.stderr));
    assert!(
        text(&gc.stderr).contains(&format!("{deltas} streamed reply pieces")),
        "{}",
        text(&gc.stderr)
    );
    let after = kinds().await;
    assert_eq!(after.len(), before.len(), "every position stays");
    assert_eq!(count(&after, "model_delta"), 0);
    assert_eq!(count(&after, "pruned"), deltas);
    for (old, new) in before.iter().zip(&after) {
        if old != "model_delta" {
            assert_eq!(old, new);
        }
    }
    // What the session did is all still there: its diff reads the same snapshots.
    let diff = person.steadfast("elsewhere", &["diff", &id]).await;
    assert!(diff.status.success(), "{}", text(&diff.stderr));
}

/// What a newcomer reads says what it means: shell completions exist, the configuration
/// dump shows the address calls would go to, an unknown provider is named as such
/// (not as a missing key that is in fact set), the server's banner counts its workers,
/// and a command run where `USER` is unset still names who did it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_newcomer_reads_says_what_it_means() {
    let person = Person::new();
    for shell in ["bash", "zsh", "fish"] {
        let out = person.steadfast("here", &["completions", shell]).await;
        assert!(out.status.success(), "{shell}: {}", text(&out.stderr));
        let script = text(&out.stdout);
        assert!(
            script.contains("steadfast") && script.contains("resume"),
            "{shell}: {script}"
        );
    }

    let dump = person.steadfast("here", &["config", "--dump"]).await;
    let dump = text(&dump.stdout);
    assert!(
        dump.contains("base-url = \"https://api.anthropic.com\""),
        "{dump}"
    );
    assert!(!dump.contains("(no key set)"), "{dump}");
    // Settings left unset show the value in force.
    for setting in [
        "max-steps-per-turn = ",
        "lease-ttl-secs = ",
        "backend = \"auto\"",
        "default-timeout-secs = ",
        "max-restarts = ",
    ] {
        assert!(dump.contains(setting), "{setting}: {dump}");
    }

    // A setting in the file stands unless a flag says otherwise, and a named agent is
    // read as the harness takes it.
    std::fs::write(
        person.path("here").join("steadfast.toml"),
        "migrate-on-open = true\n[[agents.named]]\nname = \"reviewer\"\nadapter = \"claude-code\"\n",
    )
    .unwrap();
    let dump = person.steadfast("here", &["config", "--dump"]).await;
    let shown = text(&dump.stdout);
    assert!(dump.status.success(), "{}", text(&dump.stderr));
    assert!(shown.contains("migrate-on-open = true"), "{shown}");
    assert!(shown.contains("name = \"reviewer\""), "{shown}");
    std::fs::remove_file(person.path("here").join("steadfast.toml")).unwrap();

    let mut unknown = person.command(
        "here",
        &["run", "hello", "--workspace", ".", "--model", "foo/bar"],
    );
    unknown.env("FOO_API_KEY", "set-indeed");
    let out = unknown.output().await.unwrap();
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("unknown provider `foo`"), "{said}");
    assert!(!said.contains("set FOO_API_KEY"), "{said}");

    let mut serve = person.command(
        "here",
        &["serve", "--listen", "127.0.0.1:0", "--workers", "1"],
    );
    serve.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut server = serve.spawn().unwrap();
    let mut stderr = server.stderr.take().unwrap();
    let mut banner = String::new();
    let mut buf = [0u8; 1024];
    while !banner.contains("API described") {
        let n = tokio::time::timeout(Duration::from_secs(30), stderr.read(&mut buf))
            .await
            .expect("the banner")
            .unwrap();
        assert!(n > 0, "the server printed its banner: {banner}");
        banner.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    server.kill().await.unwrap();
    assert!(
        banner.contains("(no authentication: development; 1 worker)"),
        "{banner}"
    );

    // A running session closed by a user with no USER or LOGNAME.
    let script = slow_script(person.dir.path());
    let mut run = person.command("here", &["run", "wait for it", "--workspace", "."]);
    run.env("STEADFAST_FAKE_SCRIPT", &script)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut running = run.spawn().unwrap();
    let id = running_a_tool(&person).await;
    let mut close = person.command("elsewhere", &["close", &id]);
    close.env_remove("USER").env_remove("LOGNAME");
    let closed = close.output().await.unwrap();
    assert!(closed.status.success(), "{}", text(&closed.stderr));
    let _ = tokio::time::timeout(Duration::from_secs(20), running.wait()).await;
    let log = person.steadfast("elsewhere", &["log", &id]).await;
    let timeline = text(&log.stdout);
    assert!(!timeline.contains("cli:unknown"), "{timeline}");
    let me = nix_user_name();
    assert!(
        timeline.contains(&format!("closed by cli:{me}")),
        "{timeline}"
    );
}

/// This process's user name from the user database (what a command with no `USER`
/// names).
fn nix_user_name() -> String {
    let out = std::process::Command::new("id")
        .arg("-un")
        .output()
        .unwrap();
    text(&out.stdout).trim().to_string()
}

#[tokio::test]
async fn a_fork_outlives_its_deleted_parent_and_garbage_collection() {
    let person = Person::new();
    let out = person
        .command(
            "here",
            &["run", "count", "--workspace", "one", "--create", "--json"],
        )
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    let parent = result["session"].as_str().unwrap().to_string();
    let parent_diff = person.steadfast("elsewhere", &["diff", &parent]).await;
    assert!(
        parent_diff.status.success(),
        "{}",
        text(&parent_diff.stderr)
    );
    assert!(
        !text(&parent_diff.stdout).trim().is_empty(),
        "the demo changed files"
    );

    let refused = person
        .steadfast("elsewhere", &["fork", &parent, "--at", "0"])
        .await;
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("at:"),
        "{}",
        text(&refused.stderr)
    );
    let forked = person
        .steadfast("elsewhere", &["fork", &parent, "--count", "2"])
        .await;
    assert!(forked.status.success(), "{}", text(&forked.stderr));
    let forks: Vec<String> = text(&forked.stdout).lines().map(str::to_string).collect();
    assert_eq!(forks.len(), 2, "{}", text(&forked.stdout));
    let listed = text(&person.steadfast("elsewhere", &["sessions"]).await.stdout);
    let row = listed
        .lines()
        .find(|l| l.starts_with(&forks[0]))
        .expect("the fork is listed");
    assert!(row.contains(&format!("(fork of {parent} at #")), "{listed}");

    // The parent and everything only it referred to go; the forks keep what they share.
    let deleted = person.steadfast("elsewhere", &["delete", &parent]).await;
    assert!(deleted.status.success(), "{}", text(&deleted.stderr));
    let gc = person
        .steadfast(
            "elsewhere",
            &["gc", "--min-age-secs", "0", "--keep-deltas-secs", "0"],
        )
        .await;
    assert!(gc.status.success(), "{}", text(&gc.stderr));
    for fork in &forks {
        let log = person.steadfast("elsewhere", &["log", fork]).await;
        assert!(log.status.success(), "{}", text(&log.stderr));
        assert!(
            !text(&log.stderr).contains("DATA LOST"),
            "{}",
            text(&log.stderr)
        );
        assert!(
            text(&log.stdout).contains(&format!("forked from {parent}")),
            "{}",
            text(&log.stdout)
        );
        let diff = person.steadfast("elsewhere", &["diff", fork]).await;
        assert!(diff.status.success(), "{}", text(&diff.stderr));
        assert_eq!(
            text(&diff.stdout),
            text(&parent_diff.stdout),
            "the same changes, from the same snapshots"
        );
    }

    // A fork carries on by itself, its parent gone.
    let sent = person
        .steadfast("elsewhere", &["send", &forks[0], "and now?"])
        .await;
    assert!(sent.status.success(), "{}", text(&sent.stderr));
    let resumed = person.steadfast("elsewhere", &["resume", &forks[0]]).await;
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    let log = person
        .steadfast("elsewhere", &["log", &forks[0], "--json"])
        .await;
    let turns = text(&log.stdout)
        .lines()
        .filter(|l| l.contains("\"turn_ended\""))
        .count();
    assert_eq!(turns, 2, "the parent's turn, shared, and the fork's own");

    // Its workspace, on this host since it was driven here, is its own and is kept.
    let forked: Value = text(&log.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|r| r["event"].get("forked").is_some())
        .expect("a forked record");
    let workspace = person
        .user_home()
        .join("workspaces")
        .join(forked["event"]["forked"]["workspace"].as_str().unwrap());
    assert!(
        workspace.join("tests").exists() || std::fs::read_dir(&workspace).unwrap().next().is_some()
    );
    let gc = person
        .steadfast("elsewhere", &["gc", "--min-age-secs", "0"])
        .await;
    assert!(gc.status.success(), "{}", text(&gc.stderr));
    assert!(
        workspace.exists(),
        "gc dropped a live fork's workspace: {}",
        text(&gc.stderr)
    );

    // Rewound to its start: what it did is kept in a branch, its workspace put back.
    let rewound = person
        .steadfast("elsewhere", &["rewind", &forks[0], "--to", "1"])
        .await;
    assert!(rewound.status.success(), "{}", text(&rewound.stderr));
    let branch = text(&rewound.stdout).trim().to_string();
    assert!(branch.starts_with("ses_"), "{branch}");
    let log = person.steadfast("elsewhere", &["log", &forks[0]]).await;
    assert!(
        text(&log.stdout).contains(&format!("rewound to #1; what followed is kept as {branch}")),
        "{}",
        text(&log.stdout)
    );
    let diff = person.steadfast("elsewhere", &["diff", &forks[0]]).await;
    assert!(
        diff.status.success() && text(&diff.stdout).trim().is_empty(),
        "nothing changed since the start: {}",
        text(&diff.stdout)
    );
    let kept = person.steadfast("elsewhere", &["diff", &branch]).await;
    assert_eq!(text(&kept.stdout), text(&parent_diff.stdout));
}
