//! Wrapped CLIs in a real git repository (a history of commits, as every user's
//! workspace is), on a multi-step task with one external effect: a `curl -X POST` to
//! a loopback service that counts its hits. The harness is aborted at each kind of
//! boundary (after a model intent, mid-stream, after a tool intent, right after the
//! external effect, after a tool outcome) or SIGKILLed during a slow command, then
//! resumed. Each case must replay without a divergence (the restarted CLI sees the
//! workspace it saw the first time: lockstep), ask again only for a reply the crash
//! cut off, hit the outside service exactly once, and end with the crash-free
//! workspace, byte for byte (but for git's stat cache, `.git/index`).

mod common;

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use common::{agents_dir, events, git, installed, stderr, tree};
use serde_json::{json, Value};
use steadfast_testkit::{demo, FakeProvider, Script};

const BIN: &str = env!("CARGO_BIN_EXE_steadfast");

/// An outside service on loopback that counts the POSTs it receives.
struct Service {
    url: String,
    hits: Arc<AtomicU64>,
    _task: tokio::task::JoinHandle<()>,
}

impl Service {
    async fn start() -> Self {
        let hits = Arc::new(AtomicU64::new(0));
        let counted = hits.clone();
        let app = axum::Router::new().route(
            "/hit",
            axum::routing::post(move || {
                let counted = counted.clone();
                async move {
                    counted.fetch_add(1, Ordering::SeqCst);
                    "recorded\n"
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hit", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Service {
            url,
            hits,
            _task: task,
        }
    }

    fn hits(&self) -> u64 {
        self.hits.load(Ordering::SeqCst)
    }
}

/// The demo task with an external effect and a slow command in the middle.
fn script(service: &str) -> Script {
    let mut steps: Vec<Value> =
        serde_json::from_str::<Value>(include_str!("../../testkit/demo/script.json")).unwrap()
            ["steps"]
            .as_array()
            .unwrap()
            .clone();
    let post = json!({"text": "Telling the tracker.", "tool_calls": [{"name": "bash",
        "input": {"command": format!("curl -s -X POST -d fixed {service}")}}]});
    let slow = json!({"text": "Waiting for the build.", "tool_calls": [{"name": "bash",
        "input": {"command": "sleep 3; echo built"}}]});
    steps.insert(3, post);
    steps.insert(4, slow);
    serde_json::from_value(json!({ "steps": steps })).unwrap()
}

/// The demo project as a repository with history: three commits on `main`.
fn repository(dir: &Path) {
    demo::write_project(dir).unwrap();
    git(dir, &["init", "-q", "-b", "main"]);
    git(dir, &["add", "stats.py", "README.md"]);
    git(dir, &["commit", "-q", "-m", "stats: mean and median"]);
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "tests and changelog"]);
    std::fs::write(
        dir.join("NOTES.md"),
        "Release notes live in CHANGELOG.md.\n",
    )
    .unwrap();
    git(dir, &["add", "NOTES.md"]);
    git(dir, &["commit", "-q", "-m", "notes"]);
}

struct Case {
    dir: tempfile::TempDir,
    fake: FakeProvider,
    service: Service,
}

impl Case {
    /// A case whose `steadfast.toml` is `config`.
    async fn new(config: &str) -> Self {
        Self::playing(config, script).await
    }

    /// A case whose model plays `script` (given the outside service's URL).
    async fn playing(config: &str, script: impl FnOnce(&str) -> Script) -> Self {
        let dir = tempfile::tempdir().unwrap();
        repository(&dir.path().join("ws"));
        std::fs::write(dir.path().join("steadfast.toml"), config).unwrap();
        let service = Service::start().await;
        let fake = FakeProvider::start(script(&service.url)).await.unwrap();
        Case { dir, fake, service }
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
            .env_remove("STEADFAST_MODEL")
            .env_remove("STEADFAST_NETWORK");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd
    }

    /// `steadfast run` with the network open (so the tool reaches the service); a
    /// resume gets no such flag and must take the policy from the session's log.
    fn run_command(
        &self,
        agent: &str,
        model: &str,
        env: &[(&str, String)],
    ) -> tokio::process::Command {
        let ws = self.workspace().display().to_string();
        let mut env = env.to_vec();
        env.push(("STEADFAST_NETWORK", "open".into()));
        let args = [
            "run",
            demo::TASK,
            "--agent",
            agent,
            "--workspace",
            &ws,
            "--model",
            model,
            "--json",
        ];
        self.command(&args, &env)
    }

    async fn steadfast(&self, args: &[&str]) -> Output {
        self.command(args, &[]).output().await.unwrap()
    }

    async fn session(&self) -> String {
        let out = self.steadfast(&["sessions", "--json"]).await;
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
        let out = self.steadfast(&["log", session, "--json"]).await;
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The workspace, but for git's stat cache (inode numbers and times of this
    /// checkout, which no two checkouts share).
    fn files(&self) -> BTreeMap<String, (Vec<u8>, bool)> {
        let mut files = tree(&self.workspace());
        files.remove(".git/index");
        files
    }

    async fn check(&self, session: &str, label: &str) {
        let log = self.log(session).await;
        assert!(
            events(&log, "replay_diverged").is_empty(),
            "{label}: the restarted CLI saw what it saw the first time and its requests matched the record"
        );
        let intents = events(&log, "exchange_intent").len() as u64;
        let outcomes = events(&log, "exchange_outcome").len() as u64;
        let calls = self.fake.calls();
        assert!(
            calls <= intents,
            "{label}: {calls} provider calls, {intents} intents"
        );
        assert!(
            calls <= outcomes + 1,
            "{label}: {calls} provider calls for {outcomes} recorded replies: only a cut-off reply is asked again"
        );
        assert_eq!(
            self.service.hits(),
            1,
            "{label}: the outside service was reached exactly once"
        );
    }
}

async fn reference(agent: &str, model: &str, config: &str) -> BTreeMap<String, (Vec<u8>, bool)> {
    let case = Case::new(config).await;
    let out = case.run_command(agent, model, &[]).output().await.unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["status"], "completed", "{}", stderr(&out));
    assert!(
        std::fs::read_to_string(case.workspace().join("CHANGELOG.md"))
            .unwrap()
            .contains("off-by-one"),
        "the CLI did the task"
    );
    let session = case.session().await;
    case.check(&session, "crash-free").await;
    case.files()
}

async fn resume(case: &Case, session: &str, label: &str) {
    let resumed = case.steadfast(&["resume", session, "--json"]).await;
    assert!(resumed.status.success(), "{label}: {}", stderr(&resumed));
    let result: Value = serde_json::from_slice(&resumed.stdout).unwrap();
    assert_eq!(
        result["status"],
        "completed",
        "{label}: {}",
        stderr(&resumed)
    );
}

async fn git_workspace_crash_suite(agent: &str, model: &str, config: &str) {
    let expected = reference(agent, model, config).await;
    let points = [
        "model.intent_committed:2",
        "model.mid_stream:3",
        "tool.intent_committed:2",
        // The curl has run; its outcome is not yet in the log.
        "tool.effect:4",
        "tool.outcome_committed:6",
    ];
    for point in points {
        let case = Case::new(config).await;
        let out = case
            .run_command(agent, model, &[("STEADFAST_FAULT", point.to_string())])
            .output()
            .await
            .unwrap();
        assert_eq!(out.status.signal(), Some(6), "{point}: {}", stderr(&out));
        let session = case.session().await;
        resume(&case, &session, point).await;
        assert_eq!(case.files(), expected, "{point}: the crash-free workspace");
        case.check(&session, point).await;
        if point.starts_with("model.intent_committed") {
            // The crash came after the intent and before the call: the provider never
            // had that request whole, so every call it had has its reply in the log.
            let outcomes = events(&case.log(&session).await, "exchange_outcome").len() as u64;
            assert_eq!(
                case.fake.calls(),
                outcomes,
                "{point}: a call reached the provider before its intent's crash point"
            );
        }
    }

    // SIGKILL of the harness while the slow command runs.
    let case = Case::new(config).await;
    let mut child = case.run_command(agent, model, &[]).spawn().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "the slow command never started"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before the kill"
        );
        if sleeping(&case.workspace()) {
            child.kill().await.unwrap();
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let session = case.session().await;
    resume(&case, &session, "killed in a slow command").await;
    assert_eq!(
        case.files(),
        expected,
        "killed in a slow command: the crash-free workspace"
    );
    case.check(&session, "killed in a slow command").await;
}

/// Whether the slow command runs in `workspace`.
fn sleeping(workspace: &Path) -> bool {
    let ws = workspace.display().to_string();
    std::fs::read_dir("/proc").is_ok_and(|dir| {
        dir.filter_map(Result::ok).any(|e| {
            let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let cwd = std::fs::read_link(e.path().join("cwd")).unwrap_or_default();
            String::from_utf8_lossy(&cmdline).starts_with("sleep\0")
                && cwd.display().to_string() == ws
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_in_a_git_repository_survives_every_kind_of_crash() {
    installed("claude-code").await;
    git_workspace_crash_suite("claude-code", "anthropic/claude-sonnet-4-5", "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_in_a_git_repository_survives_every_kind_of_crash() {
    installed("codex").await;
    git_workspace_crash_suite("codex", "openai/gpt-5", "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pi_in_a_git_repository_survives_every_kind_of_crash() {
    installed("pi").await;
    git_workspace_crash_suite("pi", "anthropic/claude-sonnet-4-5", "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_in_a_git_repository_survives_every_kind_of_crash() {
    installed("opencode").await;
    git_workspace_crash_suite("opencode", "anthropic/claude-sonnet-4-5", "").await;
}

/// A divergence forced on purpose: the session's agent is upgraded between the crash
/// and the resume (here from Claude Code to Pi, whose requests share nothing with
/// Claude Code's), so the restarted CLI's first request matches nothing recorded and
/// the turn is done again from its start. The outside service was already reached
/// before the crash: the same call is answered from its record, not made again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diverged_replay_never_repeats_an_external_effect() {
    installed("claude-code").await;
    installed("pi").await;
    let expected = reference("claude-code", "anthropic/claude-sonnet-4-5", "").await;
    // Killed after the effect's outcome was recorded, and killed once it had run but
    // before its outcome was (the sandbox, which outlives the process, kept it for the
    // resume to record): either way it happened, so it is not made again.
    for point in ["tool.outcome_committed:6", "tool.effect:4"] {
        let case = Case::new("").await;
        let config = |adapter: &str| {
            std::fs::write(
                case.dir.path().join("steadfast.toml"),
                format!("[[agents.named]]\nname = \"coder\"\nadapter = \"{adapter}\"\n"),
            )
            .unwrap()
        };
        config("claude-code");
        let out = case
            .run_command(
                "coder",
                "anthropic/claude-sonnet-4-5",
                &[("STEADFAST_FAULT", point.into())],
            )
            .output()
            .await
            .unwrap();
        assert_eq!(out.status.signal(), Some(6), "{point}: {}", stderr(&out));
        assert_eq!(
            case.service.hits(),
            1,
            "{point}: the effect happened before the crash"
        );
        config("pi");
        let session = case.session().await;
        resume(&case, &session, point).await;
        let log = case.log(&session).await;
        assert!(
            !events(&log, "replay_diverged").is_empty(),
            "{point}: the upgraded agent's requests did not match the record"
        );
        assert_eq!(
            case.service.hits(),
            1,
            "{point}: the external effect was not made again"
        );
        assert!(
            events(&log, "tool_call_interrupted").is_empty(),
            "{point}: nothing was cut off"
        );
        assert_eq!(case.files(), expected, "{point}: the crash-free workspace");
    }
}

/// The same suite on the newest version the npm registry serves (installed with
/// `install-agent <adapter>@<version>`, run as a named agent at that version).
async fn newest_version_suite(adapter: &str, package: &str, model: &str) {
    let version = common::newest(package).await;
    let listed = tokio::process::Command::new(BIN)
        .args(["agents", "--json"])
        .output()
        .await
        .unwrap();
    let pinned = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|a| a["name"] == adapter)
        .and_then(|a| a["version"].as_str().map(str::to_string))
        .expect("the adapter is listed");
    if version == pinned {
        eprintln!(
            "{adapter}: the newest version is the pinned one ({version}); its suite covers it"
        );
        return;
    }
    let (name, version, config) = common::newest_agent(adapter, package).await;
    eprintln!("{adapter}: the newest version is {version}");
    git_workspace_crash_suite(&name, model, &config).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_newest_claude_code_in_a_git_repository_survives_every_kind_of_crash() {
    newest_version_suite(
        "claude-code",
        "@anthropic-ai/claude-code",
        "anthropic/claude-sonnet-4-5",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_newest_codex_in_a_git_repository_survives_every_kind_of_crash() {
    newest_version_suite("codex", "@openai/codex", "openai/gpt-5").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_newest_pi_in_a_git_repository_survives_every_kind_of_crash() {
    newest_version_suite(
        "pi",
        "@mariozechner/pi-coding-agent",
        "anthropic/claude-sonnet-4-5",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_newest_opencode_in_a_git_repository_survives_every_kind_of_crash() {
    newest_version_suite("opencode", "opencode-ai", "anthropic/claude-sonnet-4-5").await;
}

/// The reconcilers decide a wrapped agent's cut-off external effect exactly as they do
/// a native one's: a `git push` cut off before it ran is run again (once), one cut off
/// after it landed is recorded as done with the evidence, and never pushed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrapped_agent_s_interrupted_git_push_is_reconciled() {
    installed("claude-code").await;
    for (point, landed) in [("tool.intent_committed:1", false), ("tool.effect:1", true)] {
        let case = Case::playing("", |_| {
            serde_json::from_value(json!({"steps": [
                {"text": "Pushing.", "tool_calls": [{"name": "bash", "input": {"command": "git push origin main"}}]},
                {"text": "Pushed."}
            ]}))
            .unwrap()
        })
        .await;
        // A bare remote outside the workspace that counts the pushes it receives (the
        // local backend, so the tools can reach a host path).
        let remote = common::counting_remote(case.dir.path());
        let pushes = || common::pushes(&remote);
        git(
            &case.workspace(),
            &["remote", "add", "origin", remote.to_str().unwrap()],
        );
        let local = ("STEADFAST_SANDBOX", "local".to_string());
        let out = case
            .run_command(
                "claude-code",
                "anthropic/claude-sonnet-4-5",
                &[("STEADFAST_FAULT", point.to_string()), local.clone()],
            )
            .output()
            .await
            .unwrap();
        assert_eq!(out.status.signal(), Some(6), "{point}: {}", stderr(&out));
        assert_eq!(pushes(), usize::from(landed), "{point}");
        let session = case.session().await;
        let resumed = case
            .command(
                &["resume", &session, "--json"],
                std::slice::from_ref(&local),
            )
            .output()
            .await
            .unwrap();
        assert!(resumed.status.success(), "{point}: {}", stderr(&resumed));
        assert_eq!(pushes(), 1, "{point}: pushed exactly once");
        let log = case.log(&session).await;
        let interrupted = events(&log, "tool_call_interrupted");
        assert_eq!(interrupted.len(), 1, "{point}");
        assert_eq!(
            interrupted[0]["resolution"]["kind"], "reconciled",
            "{point}: {interrupted:?}"
        );
        assert_eq!(interrupted[0]["resolution"]["done"], landed, "{point}");
        let intents = events(&log, "tool_call_intent").len();
        let outcomes = events(&log, "tool_call_outcome").len();
        assert_eq!(
            (intents, outcomes),
            if landed { (1, 0) } else { (2, 1) },
            "{point}"
        );
    }
}
