//! Wrapped CLIs, installed from npm at their pinned versions and run unchanged through
//! the gateway against the fake provider: a crash-free run of the demo task, then the
//! same run crashed at several points — the harness process aborted (taking the CLI
//! with it) after a model intent, mid-stream, after a tool intent, after a tool's
//! effect and after a tool outcome, or the CLI process alone SIGKILLed mid-turn — and
//! carried on. Each must end with the crash-free workspace, and the fake provider must
//! never have been asked again for a reply the log had recorded.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use common::{agents_dir, events, installed, stderr, tree};
use serde_json::Value;
use steadfast_testkit::{demo, FakeProvider};

const BIN: &str = env!("CARGO_BIN_EXE_steadfast");

struct Case {
    dir: tempfile::TempDir,
    fake: FakeProvider,
}

impl Case {
    async fn new() -> Self {
        Self::with_script(demo::script()).await
    }

    async fn with_script(script: steadfast_testkit::Script) -> Self {
        let dir = tempfile::tempdir().unwrap();
        demo::write_project(&dir.path().join("ws")).unwrap();
        let fake = FakeProvider::start(script).await.unwrap();
        Case { dir, fake }
    }

    fn workspace(&self) -> PathBuf {
        self.dir.path().join("ws")
    }

    fn command(&self, args: &[&str], env: &[(&str, String)]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(BIN);
        cmd.args(args)
            .current_dir(self.dir.path())
            .env("STEADFAST_HOME", self.dir.path().join("home"))
            .env("STEADFAST_AGENTS_DIR", agents_dir())
            .env("ANTHROPIC_API_KEY", "sk-ant-the-harness-real-key")
            .env("ANTHROPIC_BASE_URL", self.fake.base_url())
            .env("OPENAI_API_KEY", "sk-openai-the-harness-real-key")
            .env("OPENAI_BASE_URL", format!("{}/v1", self.fake.base_url()))
            .env_remove("STEADFAST_FAULT")
            .env_remove("STEADFAST_MODEL");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd
    }

    async fn steadfast(&self, args: &[&str], env: &[(&str, String)]) -> Output {
        self.command(args, env).output().await.unwrap()
    }

    async fn run(&self, agent: &str, model: &str, env: &[(&str, String)]) -> Output {
        self.run_task(demo::TASK, agent, model, env).await
    }

    async fn run_task(
        &self,
        task: &str,
        agent: &str,
        model: &str,
        env: &[(&str, String)],
    ) -> Output {
        let ws = self.workspace().display().to_string();
        let args = [
            "run",
            task,
            "--agent",
            agent,
            "--workspace",
            &ws,
            "--model",
            model,
            "--json",
        ];
        self.steadfast(&args, env).await
    }

    async fn session(&self) -> String {
        let out = self.steadfast(&["sessions", "--json"], &[]).await;
        let line = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap()
            .to_string();
        serde_json::from_str::<Value>(&line).unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string()
    }

    async fn log(&self, session: &str) -> Vec<Value> {
        let out = self.steadfast(&["log", session, "--json"], &[]).await;
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// Every provider call had an intent in the log before it was made (a replayed
    /// request makes none), and at most one call — the one whose reply the crash cut
    /// off — was paid for without its reply being recorded.
    async fn assert_nothing_paid_twice(&self, session: &str, label: &str) {
        let log = self.log(session).await;
        let intents = events(&log, "exchange_intent").len() as u64;
        let outcomes = events(&log, "exchange_outcome").len() as u64;
        let calls = self.fake.calls();
        assert!(
            calls <= intents,
            "{label}: {calls} provider calls, {intents} intents"
        );
        assert!(
            calls <= outcomes + 1,
            "{label}: {calls} provider calls for {outcomes} recorded replies"
        );
    }
}

/// The crash-free run of `agent` and its final workspace.
async fn reference(
    agent: &str,
    model: &str,
) -> std::collections::BTreeMap<String, (Vec<u8>, bool)> {
    let case = Case::new().await;
    let out = case.run(agent, model, &[]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["status"], "completed");
    assert!(
        std::fs::read_to_string(case.workspace().join("CHANGELOG.md"))
            .unwrap()
            .contains("off-by-one"),
        "the CLI did the task with the sandbox's tools"
    );
    let session = case.session().await;
    case.assert_nothing_paid_twice(&session, "crash-free").await;
    // Every tool call went through the journal (no built-in tool of the CLI's ran).
    let log = case.log(&session).await;
    assert_eq!(
        result["model_calls"].as_u64(),
        Some(events(&log, "exchange_outcome").len() as u64),
        "every answered model call of the CLI is counted"
    );
    assert_eq!(
        events(&log, "tool_call_outcome").len(),
        7,
        "the demo's seven tool calls were journaled"
    );
    tree(&case.workspace())
}

async fn crash_and_resume(agent: &str, model: &str) {
    let expected = reference(agent, model).await;
    let points = [
        "model.intent_committed:2",
        "model.mid_stream:3",
        "tool.intent_committed:2",
        "tool.effect:3",
        "tool.outcome_committed:5",
    ];
    for point in points {
        let case = Case::new().await;
        let out = case
            .run(agent, model, &[("STEADFAST_FAULT", point.to_string())])
            .await;
        assert_eq!(out.status.signal(), Some(6), "{point}: {}", stderr(&out));
        let session = case.session().await;
        let resumed = case.steadfast(&["resume", &session, "--json"], &[]).await;
        assert!(resumed.status.success(), "{point}: {}", stderr(&resumed));
        let text = stderr(&resumed);
        assert!(
            text.contains("answered from the log"),
            "{point}: the restarted CLI replayed the log: {text}"
        );
        assert_eq!(
            tree(&case.workspace()),
            expected,
            "{point}: the crash-free workspace"
        );
        let log = case.log(&session).await;
        assert!(
            events(&log, "replay_diverged").is_empty(),
            "{point}: the restarted CLI's requests matched the record (normalization)"
        );
        case.assert_nothing_paid_twice(&session, point).await;
        if point.starts_with("model.intent_committed") {
            // The crash came after the intent and before the call: the provider never
            // had that request whole, so every call it had has its reply in the log.
            let outcomes = events(&log, "exchange_outcome").len() as u64;
            assert_eq!(
                case.fake.calls(),
                outcomes,
                "{point}: a call reached the provider before its intent's crash point"
            );
        }
    }
}

/// The host PID of a process whose command line contains `needle` and the workspace.
fn find_process(needle: &str, workspace: &Path) -> Option<i32> {
    let ws = workspace.display().to_string();
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(Result::ok)
        .find_map(|e| {
            let pid: i32 = e.file_name().to_string_lossy().parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            let cwd = std::fs::read_link(e.path().join("cwd")).ok()?;
            (cmdline.contains(needle) && cwd.display().to_string() == ws).then_some(pid)
        })
}

/// The CLI process alone is SIGKILLed mid-turn; the harness notices and starts it again.
async fn kill_the_cli_mid_turn(agent: &str, model: &str, needle: &str) {
    let expected = reference(agent, model).await;
    // The fifth reply streams slowly, so the CLI is surely mid-turn when it is killed.
    let mut script = demo::script();
    script.steps[4].chunk_delay_ms = 100;
    let case = Case::with_script(script).await;
    let mut child = case
        .command(
            &[
                "run",
                demo::TASK,
                "--agent",
                agent,
                "--workspace",
                &case.workspace().display().to_string(),
                "--model",
                model,
                "--json",
            ],
            &[],
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Once the fix is in (a few calls in), kill the CLI.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "the CLI never got going"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before the kill"
        );
        if case.fake.calls() >= 5 {
            if let Some(pid) = find_process(needle, &case.workspace()) {
                nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                )
                .unwrap();
                break;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let out = child.wait_with_output().await.unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stderr(&out);
    assert!(text.contains("1 restart(s)"), "{text}");
    assert_eq!(tree(&case.workspace()), expected);
    let session = case.session().await;
    case.assert_nothing_paid_twice(&session, "cli killed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_survives_crashes_at_every_kind_of_point() {
    installed("claude-code").await;
    crash_and_resume("claude-code", "anthropic/claude-sonnet-4-5").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_killed_mid_turn_is_started_again_and_finishes() {
    installed("claude-code").await;
    kill_the_cli_mid_turn("claude-code", "anthropic/claude-sonnet-4-5", "claude").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_survives_crashes_at_every_kind_of_point() {
    installed("codex").await;
    crash_and_resume("codex", "openai/gpt-5").await;
}

/// A wrapped session crashed mid-turn in its directory and moved by its user to
/// another: the CLI restarted there replays the turn from the log, though its working
/// directory and the recorded tool outputs it is sent name different directories.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_codex_session_moved_to_another_directory_replays_there() {
    installed("codex").await;
    let expected = reference("codex", "openai/gpt-5").await;
    let case = Case::new().await;
    let crash = [("STEADFAST_FAULT", "tool.outcome_committed:5".to_string())];
    let out = case.run("codex", "openai/gpt-5", &crash).await;
    assert_eq!(out.status.signal(), Some(6), "{}", stderr(&out));
    let session = case.session().await;
    let moved = case.dir.path().join("elsewhere").join("repo");
    let dir = moved.display().to_string();
    let resumed = case
        .steadfast(&["resume", &session, "--move-here", &dir, "--json"], &[])
        .await;
    assert!(resumed.status.success(), "{}", stderr(&resumed));
    let text = stderr(&resumed);
    assert!(text.contains("answered from the log"), "{text}");
    assert_eq!(
        tree(&moved),
        expected,
        "the crash-free workspace, in its new place"
    );
    let log = case.log(&session).await;
    assert_eq!(events(&log, "workspace_moved").len(), 1);
    assert!(
        events(&log, "replay_diverged").is_empty(),
        "the moved CLI's requests matched the record under the old directory's name"
    );
    case.assert_nothing_paid_twice(&session, "moved").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_killed_mid_turn_is_started_again_and_finishes() {
    installed("codex").await;
    kill_the_cli_mid_turn("codex", "openai/gpt-5", "codex").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pi_survives_crashes_at_every_kind_of_point() {
    installed("pi").await;
    crash_and_resume("pi", "anthropic/claude-sonnet-4-5").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pi_killed_mid_turn_is_started_again_and_finishes() {
    installed("pi").await;
    // Pi names its process `pi` (padded with spaces, over its arguments).
    kill_the_cli_mid_turn("pi", "anthropic/claude-sonnet-4-5", "pi  ").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_survives_crashes_at_every_kind_of_point() {
    installed("opencode").await;
    crash_and_resume("opencode", "anthropic/claude-sonnet-4-5").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_killed_mid_turn_is_started_again_and_finishes() {
    installed("opencode").await;
    kill_the_cli_mid_turn("opencode", "anthropic/claude-sonnet-4-5", "opencode").await;
}

/// The environment and arguments of every process whose command line has `needle`.
fn process_texts(needle: &str) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| {
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            // The CLI, not the harness (whose arguments name the agent too).
            let program = cmdline.split(' ').next().unwrap_or_default();
            if !cmdline.contains(needle) || program.ends_with("/steadfast") {
                return None;
            }
            let environ = std::fs::read(e.path().join("environ")).unwrap_or_default();
            Some(format!(
                "{cmdline}\n{}",
                String::from_utf8_lossy(&environ).replace('\0', "\n")
            ))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_provider_key_never_reaches_a_wrapped_cli_or_its_tools() {
    installed("claude-code").await;
    const KEY: &str = "sk-ant-the-harness-real-key";
    // A tool call looks for the key everywhere a command can: its environment, every
    // process's arguments and environment, and the files it can read. (The pattern is
    // spelled so that the probe's own command line does not contain the key.)
    let probe = "{ env; cat /proc/[0-9]*/cmdline /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'; \
         grep -rIl --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev -e sk-ant-the-harness-rea[l]-key / 2>/dev/null; } > probe.txt; echo probed"
    .to_string();
    let script: steadfast_testkit::Script = serde_json::from_value(serde_json::json!({"steps": [
        {"text": "Probing.", "tool_calls": [{"name": "bash", "input": {"command": probe}}]},
        {"text": "Done, slowly.", "chunk_delay_ms": 400}
    ]}))
    .unwrap();
    let case = Case::with_script(script).await;
    let mut run = case
        .command(
            &[
                "run",
                "probe",
                "--agent",
                "claude-code",
                "--workspace",
                &case.workspace().display().to_string(),
                "--model",
                "anthropic/claude-sonnet-4-5",
            ],
            &[],
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Meanwhile, look at the CLI's processes from outside.
    let mut seen = Vec::new();
    while run.try_wait().unwrap().is_none() {
        seen.extend(process_texts("claude"));
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let out = run.wait_with_output().await.unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        seen.iter().any(|t| t.contains("ANTHROPIC_API_KEY=sf-gw-")),
        "the CLI was seen, holding its session token"
    );
    for text in &seen {
        assert!(!text.contains(KEY), "the key reached the CLI: {text}");
    }
    let probe = std::fs::read_to_string(case.workspace().join("probe.txt")).unwrap();
    assert!(probe.contains("PATH="), "the probe ran: {probe}");
    assert!(!probe.contains(KEY), "the key reached a tool: {probe}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrapped_cli_is_bounded_and_a_raised_bound_resumes_it() {
    for (agent, model) in AGENTS {
        installed(agent).await;
        bounded(agent, model).await;
    }
}

async fn bounded(agent: &str, model: &str) {
    let expected = reference(agent, model).await;
    let case = Case::new().await;
    let ws = case.workspace().display().to_string();
    let args = [
        "run",
        demo::TASK,
        "--agent",
        agent,
        "--workspace",
        &ws,
        "--model",
        model,
        "--max-tokens",
        "8000",
        "--json",
    ];
    let out = case.steadfast(&args, &[]).await;
    assert_eq!(
        out.status.code(),
        Some(2),
        "{agent} escalated: {}",
        stderr(&out)
    );
    let session = case.session().await;
    let calls = case.fake.calls();
    assert!(
        (1..8).contains(&calls),
        "{agent} stopped part way: {calls} calls"
    );
    let text =
        String::from_utf8_lossy(&case.steadfast(&["log", &session], &[]).await.stdout).into_owned();
    assert!(
        text.contains("escalated by the tokens breaker"),
        "{agent}: {text}"
    );

    // Without a raise nothing moves; with one, the turn finishes where it would have.
    let again = case.steadfast(&["resume", &session], &[]).await;
    assert_eq!(again.status.code(), Some(2), "{}", stderr(&again));
    assert_eq!(case.fake.calls(), calls, "{agent}");
    let signal = case
        .steadfast(
            &["signal", &session, "resume", r#"{"max_tokens": 100000000}"#],
            &[],
        )
        .await;
    assert!(signal.status.success(), "{}", stderr(&signal));
    let resumed = case.steadfast(&["resume", &session, "--json"], &[]).await;
    assert!(resumed.status.success(), "{agent}: {}", stderr(&resumed));
    assert_eq!(tree(&case.workspace()), expected, "{agent}");
    case.assert_nothing_paid_twice(&session, "bounded").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrapped_cli_going_in_circles_trips_the_loop_breaker() {
    for (agent, model) in AGENTS {
        installed(agent).await;
        going_in_circles(agent, model).await;
    }
}

/// Every wrapped CLI and the model it is tested with.
const AGENTS: [(&str, &str); 4] = [
    ("claude-code", "anthropic/claude-sonnet-4-5"),
    ("codex", "openai/gpt-5"),
    ("pi", "anthropic/claude-sonnet-4-5"),
    ("opencode", "anthropic/claude-sonnet-4-5"),
];

async fn going_in_circles(agent: &str, model: &str) {
    let look = serde_json::json!({"text": "Looking again.", "tool_calls": [{"name": "bash", "input": {"command": "cat stats.py"}}]});
    let script: steadfast_testkit::Script = serde_json::from_value(serde_json::json!({
        "steps": [look.clone(), look.clone(), look, {"text": "Done looking."}]
    }))
    .unwrap();
    let case = Case::with_script(script).await;
    let ws = case.workspace().display().to_string();
    let args = [
        "run",
        "look",
        "--agent",
        agent,
        "--workspace",
        &ws,
        "--model",
        model,
    ];
    let out = case.steadfast(&args, &[]).await;
    assert_eq!(out.status.code(), Some(2), "{agent}: {}", stderr(&out));
    assert_eq!(
        case.fake.calls(),
        3,
        "{agent}: the fourth model call was refused"
    );
    let session = case.session().await;
    let text =
        String::from_utf8_lossy(&case.steadfast(&["log", &session], &[]).await.stdout).into_owned();
    assert!(
        text.contains("escalated by the loop breaker"),
        "{agent}: {text}"
    );

    // A human looked: resuming starts the count over, and the turn ends.
    let signal = case
        .steadfast(&["signal", &session, "resume", "{}"], &[])
        .await;
    assert!(signal.status.success(), "{}", stderr(&signal));
    let resumed = case.steadfast(&["resume", &session], &[]).await;
    assert!(resumed.status.success(), "{agent}: {}", stderr(&resumed));
    assert_eq!(case.fake.calls(), 4, "{agent}");
}

/// The runaway guard: however a wrapped CLI misbehaves, a turn makes at most four tool
/// calls per model call it is allowed; past that every call is refused, the next model
/// call too, and the session escalates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrapped_cli_cannot_run_away_with_tool_calls() {
    for (agent, model) in AGENTS {
        installed(agent).await;
        running_away(agent, model).await;
    }
}

async fn running_away(agent: &str, model: &str) {
    let calls: Vec<serde_json::Value> = (0..15)
        .map(|i| serde_json::json!({"name": "bash", "input": {"command": format!("echo {i} >> runaway.txt")}}))
        .collect();
    let script: steadfast_testkit::Script = serde_json::from_value(serde_json::json!({
        "steps": [{"text": "Many at once.", "tool_calls": calls}, {"text": "Done."}]
    }))
    .unwrap();
    let case = Case::with_script(script).await;
    std::fs::write(
        case.dir.path().join("steadfast.toml"),
        "[harness]\nmax-steps-per-turn = 3\n",
    )
    .unwrap();
    let ws = case.workspace().display().to_string();
    let args = [
        "run",
        "go",
        "--agent",
        agent,
        "--workspace",
        &ws,
        "--model",
        model,
    ];
    let out = case.steadfast(&args, &[]).await;
    assert_eq!(
        out.status.code(),
        Some(2),
        "{agent} escalated: {}",
        stderr(&out)
    );
    let session = case.session().await;
    let log = case.log(&session).await;
    assert_eq!(
        events(&log, "tool_call_intent").len(),
        12,
        "{agent}: twelve calls ran (3 model calls x 4), the rest were refused"
    );
    let text =
        String::from_utf8_lossy(&case.steadfast(&["log", &session], &[]).await.stdout).into_owned();
    assert!(text.contains("tool calls in this turn"), "{agent}: {text}");
    let lines = std::fs::read_to_string(case.workspace().join("runaway.txt")).unwrap();
    assert_eq!(lines.lines().count(), 12, "{agent}");
}

/// A wrapped session checkpoints at its turn's end as a native one does, and the
/// stored state equals a fold of the whole log before it (what a wake then reads).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrapped_session_checkpoints_at_its_turn_end() {
    installed("claude-code").await;
    let case = Case::new().await;
    std::fs::write(
        case.dir.path().join("steadfast.toml"),
        "[harness]\ncheckpoint-every = 1\n",
    )
    .unwrap();
    let out = case
        .run("claude-code", "anthropic/claude-sonnet-4-5", &[])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let session = case.session().await;
    let records: Vec<steadfast_log::Record> = case
        .log(&session)
        .await
        .into_iter()
        .map(|r| serde_json::from_value(r).unwrap())
        .collect();
    let at = records
        .iter()
        .position(|r| matches!(r.event, steadfast_log::Event::Checkpoint { .. }))
        .expect("a checkpoint after the turn");
    assert!(
        records[..at]
            .iter()
            .any(|r| matches!(r.event, steadfast_log::Event::TurnEnded { .. })),
        "stored once the turn had ended"
    );
    let steadfast_log::Event::Checkpoint { blob, .. } = &records[at].event else {
        unreachable!()
    };
    let stored = std::fs::read(case.dir.path().join("home/blobs").join(&blob.hash)).unwrap();
    let checkpoint: steadfast_log::fold::Checkpoint = serde_json::from_slice(&stored).unwrap();
    assert_eq!(
        serde_json::to_value(&checkpoint.state).unwrap(),
        serde_json::to_value(steadfast_log::fold::fold(&records[..at]).unwrap()).unwrap(),
        "the checkpoint is the state a full fold gives"
    );
}

/// Claude Code compacting its own conversation (its auto-compact, made to start
/// early): the summary requests go through the gateway like any other exchange, and
/// after a crash — mid-stream or just after an exchange was recorded — the restarted
/// CLI's compactions are answered from the log, never asked of the provider twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_s_own_compactions_are_journaled_and_replayed() {
    installed("claude-code").await;
    // A 20k window compacted at 10%: twice in the demo (lower and it thrashes, and
    // Claude Code gives up; 11% and it never compacts). The margin is thin: every
    // request carries the tools' specs, so a longer tool description moves it.
    let config = "[sandbox.env]\nCLAUDE_AUTOCOMPACT_PCT_OVERRIDE = \"10\"\nCLAUDE_CODE_AUTO_COMPACT_WINDOW = \"20000\"\n";
    let agent = ("claude-code", "anthropic/claude-sonnet-4-5");
    let clean = Case::new().await;
    std::fs::write(clean.dir.path().join("steadfast.toml"), config).unwrap();
    let out = clean.run(agent.0, agent.1, &[]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let summaries = clean.fake.state().summaries();
    assert!(summaries > 0, "Claude Code compacted its conversation");
    let expected = tree(&clean.workspace());
    assert!(
        String::from_utf8_lossy(&expected["CHANGELOG.md"].0).contains("off-by-one"),
        "the task was done across the compactions"
    );
    let session = clean.session().await;
    clean
        .assert_nothing_paid_twice(&session, "crash-free")
        .await;
    // Which provider calls were the compactions (1-based, as fault points count).
    let compactions = clean.fake.state().summaries_at();

    // Cut off in the middle of a compaction's reply, and just after one was recorded.
    let points: Vec<String> = compactions
        .iter()
        .flat_map(|k| {
            [
                format!("model.mid_stream:{k}"),
                format!("model.outcome_committed:{k}"),
            ]
        })
        .collect();
    for point in &points {
        let point = point.as_str();
        let case = Case::new().await;
        std::fs::write(case.dir.path().join("steadfast.toml"), config).unwrap();
        let out = case
            .run(agent.0, agent.1, &[("STEADFAST_FAULT", point.to_string())])
            .await;
        assert_eq!(out.status.signal(), Some(6), "{point}: {}", stderr(&out));
        let session = case.session().await;
        let resumed = case.steadfast(&["resume", &session, "--json"], &[]).await;
        assert!(resumed.status.success(), "{point}: {}", stderr(&resumed));
        assert_eq!(tree(&case.workspace()), expected, "{point}");
        let log = case.log(&session).await;
        assert!(
            events(&log, "replay_diverged").is_empty(),
            "{point}: the restarted CLI's requests, compactions included, matched the record"
        );
        case.assert_nothing_paid_twice(&session, point).await;
        let again = u64::from(point.starts_with("model.mid_stream"));
        assert_eq!(
            case.fake.state().summaries(),
            summaries + again,
            "{point}: a recorded summary is answered from the log; only one cut off mid-stream is asked again"
        );
    }
}

/// A reply of eight tool calls that write files of their own, one of them slow.
fn parallel_script() -> steadfast_testkit::Script {
    // The slow one first: however an agent batches the calls, it is still running
    // when the reads' results are recorded.
    let bash = |command: String| serde_json::json!({"name": "bash", "input": {"command": command}});
    let mut calls = vec![bash("sleep 2; echo late > late.txt".into())];
    calls.extend(["ls", "pwd", "echo reading"].map(|c| bash(c.into())));
    calls.extend((0..4).map(|i| bash(format!("echo {i} > f{i}.txt"))));
    serde_json::from_value(serde_json::json!({
        "steps": [{"text": "Writing them all at once.", "tool_calls": calls}, {"text": "Written."}]
    }))
    .unwrap()
}

/// The snapshots the log's tool events name, in log order (`intent`: taken before a
/// call; `outcome`: after it; a resolution's kind: where a cut-off call left it),
/// whether calls overlapped (an intent recorded before an earlier call's outcome), and
/// whether two calls that may change the workspace did.
fn tool_records(log: &[Value]) -> (Vec<(String, String)>, bool, bool) {
    let mut open = 0;
    let mut writers_open = 0;
    let mut overlapped = false;
    let mut writers_overlapped = false;
    let mut writers = std::collections::HashSet::new();
    let mut snapshots = Vec::new();
    for r in log {
        let event = &r["event"];
        if let Some(intent) = event.get("tool_call_intent") {
            overlapped |= open > 0;
            open += 1;
            if intent["class"] != "read" {
                writers_overlapped |= writers_open > 0;
                writers_open += 1;
                writers.insert(intent["call_id"].clone());
            }
            if let Some(before) = intent["snapshot_before"].as_str() {
                snapshots.push(("intent".to_string(), before.to_string()));
            }
        }
        let ended = event
            .get("tool_call_outcome")
            .or_else(|| event.get("tool_call_interrupted"));
        if ended.is_some_and(|e| writers.contains(&e["call_id"])) {
            writers_open -= 1;
        }
        if let Some(outcome) = event.get("tool_call_outcome") {
            open -= 1;
            snapshots.push((
                "outcome".to_string(),
                outcome["snapshot_after"].as_str().unwrap_or("").to_string(),
            ));
        }
        if let Some(cut) = event.get("tool_call_interrupted") {
            open -= 1;
            let resolution = &cut["resolution"];
            let kind = resolution["kind"].as_str().unwrap_or("").to_string();
            let to = resolution["snapshot"].as_str().unwrap_or("").to_string();
            snapshots.push((kind, to));
        }
    }
    (snapshots, overlapped, writers_overlapped)
}

/// Pi and OpenCode run the tool calls of a reply at once. Reads run beside the others;
/// calls that change the workspace take turns. Each gets one recorded outcome, and a
/// crash while some are still running rolls those back without undoing the ones whose
/// results were recorded: the workspace the rollback restores holds every finished
/// sibling's file, and the session then ends with the crash-free workspace. (Random
/// kill points, through the API and workers: `parallel_campaign.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pi_s_parallel_calls_each_get_one_outcome_and_a_crash_keeps_the_finished_ones() {
    installed("pi").await;
    parallel_calls("pi").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_s_parallel_calls_each_get_one_outcome_and_a_crash_keeps_the_finished_ones() {
    installed("opencode").await;
    parallel_calls("opencode").await;
}

async fn parallel_calls(agent: &str) {
    let model = "anthropic/claude-sonnet-4-5";
    let clean = Case::with_script(parallel_script()).await;
    let out = clean.run_task("write", agent, model, &[]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let session = clean.session().await;
    let log = clean.log(&session).await;
    let (records, overlapped, writers_overlapped) = tool_records(&log);
    assert!(overlapped, "{agent} ran the calls of the reply at once");
    assert!(
        !writers_overlapped,
        "{agent}: calls changing the workspace took turns: {log:?}"
    );
    let outcomes = records.iter().filter(|(k, _)| k == "outcome").count();
    assert_eq!(outcomes, 8, "every call has one outcome: {records:?}");
    let expected = tree(&clean.workspace());
    for i in 0..4 {
        assert!(expected.contains_key(&format!("f{i}.txt")));
    }
    assert!(expected.contains_key("late.txt"));

    // Killed once two results are recorded, the slow writer (or a writer waiting
    // behind it) still to finish.
    let case = Case::with_script(parallel_script()).await;
    let crash = [("STEADFAST_FAULT", "tool.outcome_committed:2".to_string())];
    let out = case.run_task("write", agent, model, &crash).await;
    assert_eq!(out.status.signal(), Some(6), "{}", stderr(&out));
    let session = case.session().await;
    let resumed = case.steadfast(&["resume", &session, "--json"], &[]).await;
    assert!(resumed.status.success(), "{}", stderr(&resumed));
    let log = case.log(&session).await;
    let (records, _, writers_overlapped) = tool_records(&log);
    assert!(!writers_overlapped, "{records:?}");
    let Some(cut) = records.iter().position(|(kind, _)| kind == "rolled_back") else {
        // Nothing was running when it died: nothing to roll back.
        assert_eq!(
            tree(&case.workspace()),
            expected,
            "the crash-free workspace"
        );
        return;
    };
    let outcomes = records[..cut]
        .iter()
        .filter(|(k, _)| k == "outcome")
        .count();
    assert_eq!(outcomes, 2, "{records:?}");
    // Each rollback went to the newest snapshot the log named before the crash, which
    // holds every recorded sibling's work, never to an older one that would undo it.
    let newest = records[..cut]
        .iter()
        .rev()
        .map(|(_, snap)| snap)
        .find(|snap| !snap.is_empty())
        .expect("a snapshot before the crash");
    for (kind, snap) in records[cut..]
        .iter()
        .take_while(|(k, _)| k == "rolled_back")
    {
        assert_eq!(
            snap, newest,
            "{kind}: a rollback kept every recorded sibling: {records:?}"
        );
    }
    // The restarted agent's new calls ran on the workspace every recorded call left
    // (even while its earlier calls were still being answered from the record), never
    // on one a replay passed through on its way there.
    let passed: std::collections::HashSet<&String> = records[..cut]
        .iter()
        .map(|(_, snap)| snap)
        .filter(|snap| *snap != newest)
        .collect();
    for (kind, snap) in &records[cut..] {
        assert!(
            kind != "intent" || !passed.contains(snap),
            "a call after the crash ran on an earlier workspace: {records:?}"
        );
    }
    assert_eq!(
        tree(&case.workspace()),
        expected,
        "the crash-free workspace"
    );
    case.assert_nothing_paid_twice(&session, "parallel crash")
        .await;
}

/// A long `TMPDIR` (a deep CI workspace, a per-user temporary directory) does not
/// break a wrapped session: its sockets (the sandbox agent's, the gateway's, the MCP
/// server's) are made where their paths fit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_tmpdir_does_not_break_a_wrapped_session() {
    installed("claude-code").await;
    let case = Case::new().await;
    let long = case
        .dir
        .path()
        .join("a-temporary-directory-whose-path-is-far-too-long-for-a-unix-socket");
    std::fs::create_dir_all(&long).unwrap();
    assert!(long.as_os_str().len() > 80);
    let out = case
        .run(
            "claude-code",
            "anthropic/claude-sonnet-4-5",
            &[("TMPDIR", long.display().to_string())],
        )
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["status"], "completed");
}
