//! `steadfast replay`: a wrapped agent's recorded session (in a git repository) run
//! again through the pinned and the newest version of its CLI, and through another
//! model, answered from the log. The fake provider's counter shows that no request
//! reached it; a replay that diverges names the recorded request and shows a diff;
//! the forks it made are gone after it, unless it goes on live. Also: a named agent's
//! instructions, and a rewind of a wrapped CLI's directory session cut off by a crash.

mod common;

use std::path::PathBuf;
use std::process::Output;

use common::{agents_dir, installed, kind, stderr, tree};
use serde_json::Value;
use steadfast_testkit::{demo, FakeProvider};

const BIN: &str = env!("CARGO_BIN_EXE_steadfast");

/// The named agents' instructions, and the ones a replay tries instead.
const BRIEF: &str = "Keep every answer under ten lines.";
const OTHER_BRIEF: &str = "Answer in French, and keep it short.";

struct Case {
    dir: tempfile::TempDir,
    fake: FakeProvider,
}

impl Case {
    /// The demo project as a git repository with a commit, and the fake provider.
    async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        demo::write_project(&ws).unwrap();
        for args in [
            &["init", "-q"][..],
            &["add", "-A"],
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@e",
                "commit",
                "-qm",
                "start",
            ],
        ] {
            let ok = std::process::Command::new("git")
                .args(args)
                .current_dir(&ws)
                .status()
                .unwrap()
                .success();
            assert!(ok, "git {args:?}");
        }
        std::os::unix::fs::symlink("stats.py", ws.join("link.py")).unwrap();
        let fake = FakeProvider::start(demo::script()).await.unwrap();
        // Every adapter as a named agent with instructions of its own.
        let named: String = ["claude-code", "codex", "pi", "opencode"]
            .iter()
            .map(|a| {
                format!(
                    "[[agents.named]]\nname = \"{a}-briefed\"\nadapter = \"{a}\"\n\
                     instructions = \"{BRIEF}\"\n"
                )
            })
            .collect();
        std::fs::write(dir.path().join("steadfast.toml"), named).unwrap();
        Case { dir, fake }
    }

    fn workspace(&self) -> PathBuf {
        self.dir.path().join("ws")
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    async fn steadfast(&self, args: &[&str]) -> Output {
        tokio::process::Command::new(BIN)
            .args(args)
            .current_dir(self.dir.path())
            .env("STEADFAST_HOME", self.home())
            .env("STEADFAST_CONFIG", self.dir.path().join("steadfast.toml"))
            .env("STEADFAST_AGENTS_DIR", agents_dir())
            .env("ANTHROPIC_API_KEY", "sk-ant-the-harness-real-key")
            .env("ANTHROPIC_BASE_URL", self.fake.base_url())
            .env("OPENAI_API_KEY", "sk-openai-the-harness-real-key")
            .env("OPENAI_BASE_URL", format!("{}/v1", self.fake.base_url()))
            .env_remove("STEADFAST_FAULT")
            .env_remove("STEADFAST_MODEL")
            .env_remove("STEADFAST_WORLD")
            .output()
            .await
            .unwrap()
    }

    /// Records a session of `agent` on the demo task; its id.
    async fn record(&self, agent: &str, model: &str) -> String {
        let ws = self.workspace().display().to_string();
        let out = self
            .steadfast(&[
                "run",
                demo::TASK,
                "--agent",
                agent,
                "--workspace",
                &ws,
                "--model",
                model,
            ])
            .await;
        assert!(out.status.success(), "{agent}: {}", stderr(&out));
        let sessions = self.sessions().await;
        assert_eq!(sessions.len(), 1, "{sessions:?}");
        sessions[0]["id"].as_str().unwrap().to_string()
    }

    async fn sessions(&self) -> Vec<Value> {
        common::json_lines(&self.steadfast(&["sessions", "--json"]).await)
    }

    async fn log(&self, session: &str) -> Vec<Value> {
        common::json_lines(&self.steadfast(&["log", session, "--json"]).await)
    }

    /// `steadfast replay` with `args`: its exit code and JSON report.
    async fn replay(&self, session: &str, args: &[&str]) -> (i32, Value) {
        let mut all = vec!["replay", session, "--json"];
        all.extend_from_slice(args);
        let out = self.steadfast(&all).await;
        let report = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("replay {args:?}: {e}: {}", stderr(&out)));
        (out.status.code().unwrap(), report)
    }

    /// The forks' workspaces this home still has.
    fn fork_workspaces(&self) -> usize {
        std::fs::read_dir(self.home().join("workspaces")).map_or(0, |d| d.count())
    }
}

/// A report's divergence, checked: it names a recorded model request in the log and
/// carries a diff of the recorded request and the replayed one.
fn check_divergence(report: &Value, log: &[Value]) -> Value {
    let d = report["divergence"].clone();
    let position = d["position"].as_u64().unwrap_or_else(|| panic!("{report}"));
    let record = log
        .iter()
        .find(|r| r["seq"].as_u64() == Some(position))
        .unwrap();
    assert_eq!(kind(record), "exchange_intent", "{record}");
    let diff = d["diff"].as_str().unwrap_or_else(|| panic!("{report}"));
    assert!(diff.starts_with("--- recorded\n+++ replayed\n"), "{diff}");
    assert!(diff
        .lines()
        .any(|l| l.starts_with('-') && !l.starts_with("---")));
    d
}

/// A Claude Code and a Codex session replayed against the CLI version that recorded
/// it match it request for request; against the newest version the npm registry
/// serves, the replay either matches or names the first request that differs with
/// its diff. Either way no request reaches the provider, the recorded workspace is
/// untouched and the replay's forks are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_sessions_replay_against_the_pinned_and_newest_cli_with_no_provider_call() {
    for (agent, model, package) in [
        (
            "claude-code",
            "anthropic/claude-sonnet-4-5",
            "@anthropic-ai/claude-code",
        ),
        ("codex", "openai/gpt-5", "@openai/codex"),
    ] {
        installed(agent).await;
        let case = Case::new().await;
        let session = case.record(agent, model).await;
        let calls = case.fake.calls();
        let recorded = tree(&case.workspace());
        let log = case.log(&session).await;
        let requests = log.iter().filter(|r| kind(r) == "exchange_intent").count() as u64;

        let (code, report) = case.replay(&session, &[]).await;
        assert_eq!(code, 0, "{agent}: {report}");
        assert!(report["divergence"].is_null(), "{agent}: {report}");
        assert_eq!(
            report["turns"][0]["replayed"].as_u64(),
            Some(requests),
            "{report}"
        );
        assert_eq!(report["provider_calls"], 0, "{report}");
        assert!(
            report["cli"].as_str().unwrap().starts_with(package),
            "{report}"
        );

        let newest = common::newest(package).await;
        let out = case
            .steadfast(&["install-agent", &format!("{agent}@{newest}")])
            .await;
        assert!(out.status.success(), "{}", stderr(&out));
        let (code, report) = case
            .replay(&session, &["--agent", &format!("{agent}@{newest}")])
            .await;
        assert_eq!(
            report["cli"].as_str(),
            Some(format!("{package}@{newest}").as_str())
        );
        match code {
            0 => assert!(report["divergence"].is_null(), "{report}"),
            3 => {
                check_divergence(&report, &log);
            }
            other => panic!("{agent}@{newest}: exit {other}: {report}"),
        }
        assert_eq!(report["provider_calls"], 0, "{report}");

        assert_eq!(
            case.fake.calls(),
            calls,
            "{agent}: a replay asked the provider"
        );
        assert_eq!(tree(&case.workspace()), recorded, "{agent}");
        assert_eq!(case.sessions().await.len(), 1, "{agent}: a fork was left");
        assert_eq!(
            case.fork_workspaces(),
            0,
            "{agent}: a fork's workspace was left"
        );
    }
}

/// Another model changes the first request: the replay stops there with no provider
/// call and a diff naming both models, after a blob sweep (the requests' blobs are
/// kept with the log); with `--continue` it goes on live from there as a fork that
/// finishes the turn and is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_model_diverges_at_the_first_request_and_can_go_on_live() {
    installed("claude-code").await;
    let case = Case::new().await;
    let session = case
        .record("claude-code", "anthropic/claude-sonnet-4-5")
        .await;
    let calls = case.fake.calls();
    let out = case.steadfast(&["gc", "--min-age-secs", "0"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let log = case.log(&session).await;

    let other = "anthropic/claude-opus-4-1";
    let (code, report) = case.replay(&session, &["--model", other]).await;
    assert_eq!(code, 3, "{report}");
    let d = check_divergence(&report, &log);
    let first = log.iter().find(|r| kind(r) == "exchange_intent").unwrap();
    assert_eq!(d["position"], first["seq"], "{report}");
    let diff = d["diff"].as_str().unwrap();
    assert!(
        diff.contains("-  \"model\": \"claude-sonnet-4-5\","),
        "{diff}"
    );
    // (Claude Code may name the model its own way: an older one as the newest.)
    assert!(
        diff.lines()
            .any(|l| l.starts_with("+  \"model\": \"claude-opus-")),
        "{diff}"
    );
    assert_eq!(report["provider_calls"], 0);
    assert_eq!(case.fake.calls(), calls);
    assert_eq!(case.sessions().await.len(), 1);

    let (code, report) = case
        .replay(&session, &["--model", other, "--continue"])
        .await;
    assert_eq!(code, 3, "{report}");
    let fork = report["continued"]
        .as_str()
        .unwrap_or_else(|| panic!("{report}"));
    assert!(report["provider_calls"].as_u64().unwrap() > 0, "{report}");
    assert!(case.fake.calls() > calls);
    let sessions = case.sessions().await;
    assert_eq!(sessions.len(), 2, "{sessions:?}");
    let own = case.log(fork).await;
    let kinds: Vec<String> = own.iter().map(kind).collect();
    assert!(kinds.iter().any(|k| k == "replay_diverged"), "{kinds:?}");
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("turn_ended"),
        "{kinds:?}"
    );
}

/// A named agent's instructions reach its CLI's model requests (every adapter) and
/// stay the session's: replayed as recorded they match request for request; replayed
/// with other instructions (`--system-prompt`) the first request differs, and the diff
/// shows the recorded instructions going and the new ones coming, with no provider
/// call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_of_instructions_is_replayed_first_for_every_cli() {
    for (adapter, model) in [
        ("claude-code", "anthropic/claude-sonnet-4-5"),
        ("codex", "openai/gpt-5"),
        ("pi", "anthropic/claude-sonnet-4-5"),
        ("opencode", "anthropic/claude-sonnet-4-5"),
    ] {
        installed(adapter).await;
        let case = Case::new().await;
        let session = case.record(&format!("{adapter}-briefed"), model).await;
        let requests = case.fake.state().requests();
        assert!(!requests.is_empty());
        assert!(
            requests.iter().all(|r| r.contains(BRIEF)),
            "{adapter}: a model request without the agent's instructions"
        );
        let calls = case.fake.calls();
        let log = case.log(&session).await;

        let (code, report) = case.replay(&session, &[]).await;
        assert_eq!(code, 0, "{adapter}: {report}");
        assert_eq!(report["instructions"], BRIEF, "{report}");

        let (code, report) = case
            .replay(&session, &["--system-prompt", OTHER_BRIEF])
            .await;
        assert_eq!(code, 3, "{adapter}: {report}");
        let d = check_divergence(&report, &log);
        let first = log.iter().find(|r| kind(r) == "exchange_intent").unwrap();
        assert_eq!(d["position"], first["seq"], "{adapter}: {report}");
        let diff = d["diff"].as_str().unwrap();
        let changed = |sign: char, text: &str| {
            diff.lines()
                .any(|l| l.starts_with(sign) && l.contains(text))
        };
        assert!(changed('-', BRIEF), "{adapter}: {diff}");
        assert!(changed('+', OTHER_BRIEF), "{adapter}: {diff}");
        assert!(!changed('+', BRIEF), "{adapter}: {diff}");
        assert_eq!(report["provider_calls"], 0, "{report}");
        assert_eq!(
            case.fake.calls(),
            calls,
            "{adapter}: a replay asked the provider"
        );
        assert_eq!(case.sessions().await.len(), 1, "{adapter}: a fork was left");
    }
}

/// A rewind of a wrapped CLI's directory session that is cut off after its record and
/// before the directory is put back: the next wake puts it back (a wrapped CLI's
/// directory is otherwise left as its user has it), so the session goes on from the
/// workspace the rewind promised.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewind_cut_off_before_its_restore_is_made_good_by_the_next_wake() {
    installed("claude-code").await;
    let case = Case::new().await;
    let before = tree(&case.workspace());
    let session = case
        .record("claude-code", "anthropic/claude-sonnet-4-5")
        .await;
    let after = tree(&case.workspace());
    assert_ne!(before, after, "the task changed nothing");

    let killed = tokio::process::Command::new(BIN)
        .args(["rewind", &session, "--to", "1"])
        .current_dir(case.dir.path())
        .env("STEADFAST_HOME", case.home())
        .env("STEADFAST_CONFIG", case.dir.path().join("steadfast.toml"))
        .env("STEADFAST_AGENTS_DIR", agents_dir())
        .env(
            "STEADFAST_FAULT",
            format!("{}:1", steadfast_fault::points::REWIND_RECORDED),
        )
        .output()
        .await
        .unwrap();
    assert!(!killed.status.success(), "the rewind was not cut off");
    let log = case.log(&session).await;
    assert_eq!(log.last().map(kind).as_deref(), Some("rewound"), "{log:?}");
    assert!(
        tree(&case.workspace()) == after,
        "restored before the crash"
    );

    let out = case.steadfast(&["resume", &session]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        tree(&case.workspace()) == before,
        "the rewind was not made good"
    );
}

/// A native session has no CLI to replay: refused, saying why, leaving nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_session_is_refused() {
    let case = Case::new().await;
    let ws = case.workspace().display().to_string();
    let out = case
        .steadfast(&[
            "run",
            demo::TASK,
            "--workspace",
            &ws,
            "--model",
            "anthropic/claude-sonnet-4-5",
        ])
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let session = case.sessions().await[0]["id"].as_str().unwrap().to_string();
    let out = case.steadfast(&["replay", &session]).await;
    assert!(!out.status.success());
    assert!(stderr(&out).contains("native loop"), "{}", stderr(&out));
    assert_eq!(case.sessions().await.len(), 1);
}
