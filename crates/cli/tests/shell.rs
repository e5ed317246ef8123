//! A person's shell in a session's sandbox: `steadfast attach` driven through a real
//! terminal (tmux) between turns — commands run, the window resized, detached — with
//! what the person changed recorded in the log (`human_shell`) and told to the model
//! with its next turn, and no credential anywhere the shell can look. While a turn
//! runs, a shell is read-only (the kernel refuses its writes and its signals to the
//! agent's command) unless the owner forces it, which interrupts the turn.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{agents_dir, wait_for};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

const ALICE: &str = "alice-token-0123456789abcdef";
const BOB: &str = "bob-token-0123456789abcdef01";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_person_attaches_a_shell_and_the_agent_is_told_what_they_changed() {
    let fake = common::fake_playing(json!([
        {"text": "Writing.", "tool_calls": [{"name": "bash", "input": {
            "command": "echo one > one.txt && echo kept > kept.txt"}}]},
        {"text": "Written."},
        {"text": "Second turn."},
        {"text": "Waiting.", "tool_calls": [{"name": "bash", "input": {
            "command": "sleep 60; echo late"}}]},
        {"text": "Third turn."},
    ]))
    .await;
    let metrics_at = format!("127.0.0.1:{}", common::free_port());
    let (dir, mut server, url) = serve(&fake, &metrics_at).await;
    let http = reqwest::Client::new();
    let id = common::idle_session_as(
        &http,
        &url,
        ALICE,
        json!({
            "model": "anthropic/claude-sonnet-4-5", "network": "deny-all",
            "workspace": {"kind": "empty"}, "task": "write two files",
        }),
    )
    .await;

    // Another owner's token finds no such session; a request that is no WebSocket is
    // told so.
    let shell_url = format!("{url}/v1/sessions/{id}/shell");
    let bobs = http.get(&shell_url).bearer_auth(BOB).send().await.unwrap();
    assert_eq!(bobs.status(), 404);
    let plain = http
        .get(&shell_url)
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), 426);
    let too_big = http
        .get(format!("{shell_url}?rows=5000"))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(too_big.status(), 422);
    assert!(too_big.text().await.unwrap().contains("rows"));

    // Between turns, in a real terminal: a person runs commands, resizes, detaches.
    let tmux = Tmux::start(
        dir.path(),
        &format!(
            "STEADFAST_TOKEN={ALICE} {} attach {id} --server {url}; echo ATTACH-EXIT=$?; sleep 600",
            env!("CARGO_BIN_EXE_steadfast")
        ),
    );
    tmux.wait_for("attached, read-write").await;
    tmux.keys("stty size").await;
    tmux.wait_for("40 120").await;
    // The new size reaches the shell as a signal reaches `attach`, so it may come
    // after the next keys: asked again until it shows.
    tmux.resize(30, 100);
    let mut resized = false;
    for _ in 0..100 {
        tmux.keys("clear; stty size").await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        if tmux.screen().contains("30 100") {
            resized = true;
            break;
        }
    }
    assert!(
        resized,
        "the shell never saw 30 rows of 100:\n{}",
        tmux.screen()
    );
    // The shell's processes are held to a command's memory and file size limits.
    tmux.keys("echo LIMITS=$(ulimit -v)-$(ulimit -f)").await;
    tmux.wait_for("LIMITS=4194304-65536").await;
    tmux.keys("echo from-a-person > person.txt; rm one.txt; echo DONE-$((6*7))")
        .await;
    tmux.wait_for("DONE-42").await;
    // No credential in the shell's environment, nor in any process it can see.
    let secrets = "sk-openai|alice-token|bob-token|API_KEY|STEADFAST_TOKEN";
    tmux.keys(&format!(
        "env > /tmp/seen; cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline | tr '\\0' '\\n' >> /tmp/seen; \
         echo LEAKS=$(grep -cE '{secrets}' /tmp/seen)-$(wc -l < /tmp/seen)"
    ))
    .await;
    let screen = tmux.wait_for("LEAKS=0-").await;
    let seen_lines: u64 = screen
        .split("LEAKS=0-")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(seen_lines > 5, "the shell saw its environment: {screen}");
    tmux.send("C-]");
    let screen = tmux.wait_for("ATTACH-EXIT=0").await;
    assert!(
        screen.contains("person.txt"),
        "told what was recorded: {screen}"
    );
    tmux.stop();

    // The log has the person's records: the shell opened, then left with who and
    // what changed.
    let log = events(&http, &url, &id).await;
    let shells: Vec<&Value> = log.iter().filter(|e| e["type"] == "human_shell").collect();
    assert_eq!(shells.len(), 2, "{log:?}");
    assert_eq!(shells[0]["detached"], false);
    assert_eq!(shells[0]["changes"], json!([]));
    let record = shells[1];
    assert_eq!(record["by"], "alice");
    assert_eq!(record["detached"], true);
    let changes = record["changes"].to_string();
    assert!(
        changes.contains("person.txt") && changes.contains("one.txt"),
        "{record}"
    );
    assert!(!changes.contains("kept.txt"), "{record}");

    // The model's next request says what the person did.
    send(&http, &url, &id, "carry on").await;
    wait_for("the second turn to end", async || {
        let (_, shown) =
            common::get_json_as(&http, &format!("{url}/v1/sessions/{id}"), ALICE).await;
        shown["status"] == "idle" && shown["turn"].as_u64() >= Some(2)
    })
    .await;
    let asked = fake.state().requests();
    let last = asked.last().unwrap();
    assert!(
        last.contains("opened a shell") && last.contains("person.txt"),
        "{last}"
    );
    let file = http
        .get(format!("{url}/v1/sessions/{id}/files/person.txt"))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(file.trim(), "from-a-person");

    // With no terminal, what is piped in is typed, and its end ends the shell: a
    // person's command, run and recorded like any.
    let (shown, recorded) =
        attach_piped(&url, &id, "echo piped > piped.txt\necho PIPED-$((2*21))\n").await;
    assert!(shown.contains("PIPED-42"), "{shown}");
    assert!(recorded.contains("piped.txt"), "{recorded}");

    // While a turn runs, a shell is read-only: no file written, the agent's command
    // not killable; writing to the terminal and /dev/null still works.
    send(&http, &url, &id, "wait a while").await;
    wait_for("the long command to start", async || {
        events(&http, &url, &id)
            .await
            .iter()
            .any(|e| e["type"] == "tool_call_intent" && e["input"].to_string().contains("sleep 60"))
    })
    .await;
    let mut watching = websocket(&url, &id, false).await;
    assert_eq!(next_notice(&mut watching).await["mode"], "read-only");
    type_in(
        &mut watching,
        "touch ro.txt; echo RO=$?; until pgrep -x sleep >/dev/null; do sleep 0.1; done; \
         kill -9 $(pgrep -x sleep); echo KILL=$?; echo x > /dev/null; echo NULL=$?\n",
    )
    .await;
    let shown = read_until(&mut watching, "NULL=").await;
    assert!(shown.contains("RO=1"), "{shown}");
    assert!(shown.contains("KILL=1"), "{shown}");
    assert!(shown.contains("NULL=0"), "{shown}");
    watching.close(None).await.unwrap();
    assert_eq!(
        status(&http, &url, &id).await,
        "running",
        "watching changed nothing"
    );

    // Forced: the turn is interrupted and the shell may write.
    let mut forced = websocket(&url, &id, true).await;
    assert_eq!(next_notice(&mut forced).await["mode"], "read-write");
    assert_eq!(
        status(&http, &url, &id).await,
        "idle",
        "the turn was interrupted"
    );
    type_in(&mut forced, "echo forced > forced.txt; exit 3\n").await;
    let exit = loop {
        let notice = next_notice(&mut forced).await;
        if notice["type"] == "exit" {
            break notice;
        }
    };
    assert_eq!(exit["code"], 3, "{exit}");
    assert!(exit["changes"].to_string().contains("forced.txt"), "{exit}");
    let shells = events(&http, &url, &id)
        .await
        .into_iter()
        .filter(|e| e["type"] == "human_shell" && e["detached"] == true)
        .count();
    assert_eq!(shells, 3);

    // Closing the session while a person is in: they are asked to leave, what they
    // changed is recorded first, and then the session ends.
    let mut staying = websocket(&url, &id, false).await;
    assert_eq!(next_notice(&mut staying).await["mode"], "read-write");
    type_in(&mut staying, "echo late > late.txt; echo WROTE=$((1+1))\n").await;
    read_until(&mut staying, "WROTE=").await;
    let closing = tokio::spawn({
        let (http, url, id) = (http.clone(), url.clone(), id.clone());
        async move {
            http.post(format!("{url}/v1/sessions/{id}/close"))
                .bearer_auth(ALICE)
                .send()
                .await
                .unwrap()
                .status()
        }
    });
    assert_eq!(next_notice(&mut staying).await["type"], "leave");
    let exit = next_notice(&mut staying).await;
    assert!(exit["changes"].to_string().contains("late.txt"), "{exit}");
    assert_eq!(closing.await.unwrap(), 200);
    let log = events(&http, &url, &id).await;
    let kinds: Vec<&str> = log.iter().filter_map(|e| e["type"].as_str()).collect();
    let last_shell = kinds.iter().rposition(|k| *k == "human_shell").unwrap();
    let ended = kinds.iter().position(|k| *k == "session_ended").unwrap();
    assert!(last_shell < ended, "{kinds:?}");
    let left = log
        .iter()
        .filter(|e| e["type"] == "human_shell" && e["detached"] == true)
        .count();
    assert_eq!(left, 4);

    // The owner's audit and the metrics show the shells.
    let (_, audit) =
        common::get_json_as(&http, &format!("{url}/v1/sessions/{id}/audit"), ALICE).await;
    for action in ["shell.attached", "shell.detached"] {
        assert!(audit.to_string().contains(action), "{action} in {audit}");
    }
    // The last shell's count drops once its connection's task has ended.
    let series = [
        r#"steadfast_shells_opened_total{mode="read-write"} 4"#,
        r#"steadfast_shells_opened_total{mode="read-only"} 1"#,
        "steadfast_shells_attached 0",
    ];
    let mut metrics = String::new();
    wait_for("the shells in /metrics", async || {
        metrics = http
            .get(format!("http://{metrics_at}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        series.iter().all(|s| metrics.contains(s))
    })
    .await;
    let _ = server.kill().await;
}

/// A server killed while a person is in a shell loses nothing they did: the log shows
/// the shell opened, and the next to wake the session (here, the restarted server's
/// worker taking the next message) records what the person changed before anything
/// restores the workspace; the model is told.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_person_s_changes_outlive_a_server_killed_under_their_shell() {
    let fake = common::fake_playing(json!([
        {"text": "Ready."},
        {"text": "Seen."},
    ]))
    .await;
    let metrics_at = format!("127.0.0.1:{}", common::free_port());
    let (dir, mut server, url) = serve(&fake, &metrics_at).await;
    let http = reqwest::Client::new();
    let id = common::idle_session_as(
        &http,
        &url,
        ALICE,
        json!({"network": "deny-all", "workspace": {"kind": "empty"}, "task": "get ready"}),
    )
    .await;
    let mut shell = websocket(&url, &id, false).await;
    assert_eq!(next_notice(&mut shell).await["mode"], "read-write");
    type_in(
        &mut shell,
        "echo unsaved > unsaved.txt; echo SAVED=$((3*3))\n",
    )
    .await;
    read_until(&mut shell, "SAVED=").await;
    server.start_kill().unwrap();
    server.wait().await.unwrap();
    drop(shell);

    let (mut server, url) = serve_in(dir.path(), &fake, &metrics_at).await;
    send(&http, &url, &id, "anything new?").await;
    wait_for("the second turn to end", async || {
        let (_, shown) =
            common::get_json_as(&http, &format!("{url}/v1/sessions/{id}"), ALICE).await;
        shown["status"] == "idle" && shown["turn"].as_u64() >= Some(2)
    })
    .await;
    let log = events(&http, &url, &id).await;
    let shells: Vec<&Value> = log.iter().filter(|e| e["type"] == "human_shell").collect();
    assert_eq!(
        shells.len(),
        2,
        "opened, then closed by the wake: {shells:?}"
    );
    assert_eq!(shells[0]["detached"], false);
    assert_eq!(shells[1]["detached"], true);
    assert!(
        shells[1]["changes"].to_string().contains("unsaved.txt"),
        "{shells:?}"
    );
    let file = http
        .get(format!("{url}/v1/sessions/{id}/files/unsaved.txt"))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(file.trim(), "unsaved");
    let asked = fake.state().requests();
    assert!(
        asked.last().unwrap().contains("unsaved.txt"),
        "the model is told: {:?}",
        asked.last()
    );
    let _ = server.kill().await;
}

/// The same for a wrapped agent: Claude Code, unchanged, is told at its next turn what a
/// person changed in its sandbox between turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wrapped_agent_is_told_what_a_person_changed_in_its_sandbox() {
    common::installed("claude-code").await;
    let fake = common::fake_playing(json!([
        {"text": "Ready."},
        {"text": "Seen."},
    ]))
    .await;
    let metrics_at = format!("127.0.0.1:{}", common::free_port());
    let (_dir, mut server, url) = serve(&fake, &metrics_at).await;
    let http = reqwest::Client::new();
    let id = common::idle_session_as(
        &http,
        &url,
        ALICE,
        json!({
            "agent": "claude-code", "network": "deny-all",
            "workspace": {"kind": "demo"}, "task": "get ready",
        }),
    )
    .await;
    let (_, recorded) = attach_piped(
        &url,
        &id,
        "echo 'note from a person' > PERSON.md\nrm -f README.md\n",
    )
    .await;
    assert!(recorded.contains("PERSON.md"), "{recorded}");
    send(&http, &url, &id, "what changed?").await;
    wait_for("the second turn to end", async || {
        let (_, shown) =
            common::get_json_as(&http, &format!("{url}/v1/sessions/{id}"), ALICE).await;
        shown["status"] == "idle" && shown["turn"].as_u64() >= Some(2)
    })
    .await;
    // Claude Code's own side requests aside, the turn's request carries the note.
    let asked = fake.state().requests();
    assert!(
        asked
            .iter()
            .any(|r| r.contains("opened a shell") && r.contains("PERSON.md")),
        "{asked:?}"
    );
    let _ = server.kill().await;
}

/// `steadfast serve` with one worker, bwrap sandboxes and Alice's and Bob's tokens, its
/// model calls going to `fake` and its metrics at `metrics_at`: its directory, the
/// process and its URL.
async fn serve(
    fake: &steadfast_testkit::FakeProvider,
    metrics_at: &str,
) -> (tempfile::TempDir, tokio::process::Child, String) {
    let dir = tempfile::tempdir().unwrap();
    let (server, url) = serve_in(dir.path(), fake, metrics_at).await;
    (dir, server, url)
}

/// [`serve`] in `dir`, kept from an earlier one (its world, its workspaces).
async fn serve_in(
    dir: &Path,
    fake: &steadfast_testkit::FakeProvider,
    metrics_at: &str,
) -> (tokio::process::Child, String) {
    std::fs::write(
        dir.join("steadfast.toml"),
        format!(
            "[harness]\nlease-ttl-secs = 3\n\
             [sandbox]\nbackend = \"bwrap\"\nmemory-mb = 4096\nfile-mb = 64\n\
             [[server.tokens]]\nowner = \"alice\"\ntoken-hash = \"{}\"\n\
             [[server.tokens]]\nowner = \"bob\"\ntoken-hash = \"{}\"\n",
            steadfast_server::hash_token(ALICE),
            steadfast_server::hash_token(BOB),
        ),
    )
    .unwrap();
    let mut server = common::site_command(
        dir,
        &agents_dir(),
        fake,
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--workers",
            "1",
            "--metrics-listen",
            metrics_at,
        ],
    )
    .spawn()
    .unwrap();
    let url = common::printed_url(&mut server).await;
    (server, url)
}

/// Runs `script` in `id`'s sandbox as a person would, through `steadfast attach` with
/// the script piped in: the command's output and what it recorded (its stderr).
async fn attach_piped(url: &str, id: &str, script: &str) -> (String, String) {
    use tokio::io::AsyncWriteExt;
    let mut piped = tokio::process::Command::new(env!("CARGO_BIN_EXE_steadfast"))
        .args(["attach", id, "--server", url])
        .env("STEADFAST_TOKEN", ALICE)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = piped.stdin.take().unwrap();
    stdin.write_all(script.as_bytes()).await.unwrap();
    drop(stdin);
    let out = tokio::time::timeout(Duration::from_secs(60), piped.wait_with_output())
        .await
        .expect("the piped shell ends with its input")
        .unwrap();
    let (shown, recorded) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "{shown} {recorded}");
    (shown, recorded)
}

/// A tmux server of the test's own (its socket in the test's directory), running one
/// window of 120×40.
struct Tmux {
    socket: std::path::PathBuf,
}

impl Tmux {
    fn start(dir: &Path, command: &str) -> Self {
        let tmux = Tmux {
            socket: dir.join("tmux.sock"),
        };
        let started = tmux
            .command()
            .args([
                "new-session",
                "-d",
                "-s",
                "t",
                "-x",
                "120",
                "-y",
                "40",
                command,
            ])
            .status()
            .unwrap();
        assert!(started.success());
        tmux
    }

    fn command(&self) -> std::process::Command {
        let mut cmd = std::process::Command::new("tmux");
        cmd.arg("-S").arg(&self.socket).env_remove("TMUX");
        cmd
    }

    /// Types `line` and Enter.
    async fn keys(&self, line: &str) {
        let sent = self
            .command()
            .args(["send-keys", "-t", "t", "-l", line])
            .status()
            .unwrap();
        assert!(sent.success());
        self.send("Enter");
    }

    /// Presses `key` (tmux's name for it).
    fn send(&self, key: &str) {
        let sent = self
            .command()
            .args(["send-keys", "-t", "t", key])
            .status()
            .unwrap();
        assert!(sent.success());
    }

    fn resize(&self, rows: u16, cols: u16) {
        let resized = self
            .command()
            .args(["resize-window", "-t", "t", "-x"])
            .arg(cols.to_string())
            .arg("-y")
            .arg(rows.to_string())
            .status()
            .unwrap();
        assert!(resized.success());
    }

    fn screen(&self) -> String {
        let out = self
            .command()
            .args(["capture-pane", "-p", "-J", "-t", "t", "-S", "-200"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The screen once it shows `text` (within a minute).
    async fn wait_for(&self, text: &str) -> String {
        for _ in 0..1200 {
            let screen = self.screen();
            if screen.contains(text) {
                return screen;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the terminal never showed {text:?}:\n{}", self.screen());
    }

    fn stop(&self) {
        let _ = self
            .command()
            .arg("kill-server")
            .stderr(std::process::Stdio::null())
            .status();
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        self.stop();
    }
}

type Socket = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

async fn websocket(url: &str, id: &str, force: bool) -> Socket {
    let ws = url.replacen("http", "ws", 1);
    let mut request = format!("{ws}/v1/sessions/{id}/shell?force={force}")
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {ALICE}").parse().unwrap());
    let address = url.trim_start_matches("http://");
    let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
    tokio_tungstenite::client_async(request, tcp)
        .await
        .unwrap()
        .0
}

async fn type_in(socket: &mut Socket, text: &str) {
    let input = json!({"type": "input", "data": text}).to_string();
    socket.send(Message::Text(input.into())).await.unwrap();
}

/// The next JSON notice (terminal output before it is skipped).
async fn next_notice(socket: &mut Socket) -> Value {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(60), socket.next())
            .await
            .expect("a notice within a minute")
            .expect("the socket open")
            .unwrap();
        if let Message::Text(text) = message {
            return serde_json::from_str(text.as_str()).unwrap();
        }
    }
}

/// The terminal's output until a command prints `marker` and a digit.
async fn read_until(socket: &mut Socket, marker: &str) -> String {
    let mut shown = String::new();
    loop {
        let message = tokio::time::timeout(Duration::from_secs(60), socket.next())
            .await
            .unwrap_or_else(|_| panic!("{marker:?} within a minute; shown: {shown}"))
            .expect("the socket open")
            .unwrap();
        if let Message::Binary(bytes) = message {
            shown.push_str(&String::from_utf8_lossy(&bytes));
        }
        // The typed line is echoed too: what a command printed has a digit after it.
        let printed = shown.match_indices(marker).any(|(at, _)| {
            shown[at + marker.len()..]
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit())
        });
        if printed {
            return shown;
        }
    }
}

async fn send(http: &reqwest::Client, url: &str, id: &str, text: &str) {
    let sent = http
        .post(format!("{url}/v1/sessions/{id}/messages"))
        .bearer_auth(ALICE)
        .header("accept", "application/json")
        .json(&json!({ "text": text }))
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), 202);
}

async fn events(http: &reqwest::Client, url: &str, id: &str) -> Vec<Value> {
    let (_, page) = common::get_json_as(
        http,
        &format!("{url}/v1/sessions/{id}/events?limit=1000"),
        ALICE,
    )
    .await;
    page["events"].as_array().cloned().unwrap_or_default()
}

async fn status(http: &reqwest::Client, url: &str, id: &str) -> String {
    let (_, shown) = common::get_json_as(http, &format!("{url}/v1/sessions/{id}"), ALICE).await;
    shown["status"].as_str().unwrap_or_default().to_string()
}
