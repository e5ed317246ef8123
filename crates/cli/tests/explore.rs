//! Fork as a tool: a session allowed explorers (native, or a wrapped CLI through the
//! journaled MCP server: Claude Code, Codex, Pi and OpenCode) calls `explore` with two tasks,
//! waits, durably, while two forked sessions work on them in workspaces of their own,
//! and goes on with both answers as the call's result. The run is SIGKILLed while the
//! explorers work and resumed: no explorer is made twice and no model call is paid
//! twice.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::stderr;
use serde_json::{json, Value};
use steadfast_testkit::FakeProvider;

const BIN: &str = env!("CARGO_BIN_EXE_steadfast");

/// The parent asks for two explorers; every session then writes a file of its own
/// name and answers. (Steps go by the number of replies so far, so the explorers,
/// forked after the first, and the parent, given their answers, take the same ones.)
fn script(slow_ms: u64) -> steadfast_testkit::Script {
    serde_json::from_value(json!({"steps": [
        {"text": "Two approaches; I'll explore both.", "tool_calls": [
            {"name": "explore", "input": {"tasks": ["try approach A", "try approach B"]}}
        ]},
        {"text": "Writing.", "chunk_delay_ms": slow_ms, "tool_calls": [
            {"name": "bash", "input": {"command": "echo written > \"mark-$(date +%s%N).txt\"; ls mark-*.txt | wc -l"}}
        ]},
        {"text": "Finished my part."}
    ]}))
    .unwrap()
}

struct Case {
    dir: tempfile::TempDir,
    fake: FakeProvider,
}

impl Case {
    async fn new(slow_ms: u64) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("ws")).unwrap();
        std::fs::write(dir.path().join("ws/README"), "a project\n").unwrap();
        let fake = FakeProvider::start(script(slow_ms)).await.unwrap();
        Case { dir, fake }
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(BIN);
        cmd.args(args)
            .current_dir(self.dir.path())
            .env("STEADFAST_HOME", self.home())
            .env("STEADFAST_AGENTS_DIR", common::agents_dir())
            .env("ANTHROPIC_API_KEY", "sk-ant-the-harness-real-key")
            .env("ANTHROPIC_BASE_URL", self.fake.base_url())
            .env("OPENAI_API_KEY", "sk-openai-the-harness-real-key")
            .env("OPENAI_BASE_URL", format!("{}/v1", self.fake.base_url()))
            .env_remove("STEADFAST_FAULT")
            .env_remove("STEADFAST_MODEL")
            .env_remove("STEADFAST_WORLD")
            .kill_on_drop(true);
        cmd
    }

    async fn steadfast(&self, args: &[&str]) -> Output {
        self.command(args).output().await.unwrap()
    }

    fn run_args(&self) -> Vec<String> {
        [
            "run",
            "explore two approaches",
            "--workspace",
            &self.dir.path().join("ws").display().to_string(),
            "--model",
            "anthropic/claude-sonnet-4-5",
            "--explorers",
            "2",
            "--max-cost-usd",
            "1",
            "--json",
        ]
        .map(String::from)
        .to_vec()
    }

    /// `serve` with no workers of its own and a `worker` process with two: the API's
    /// URL and both processes (killed when dropped).
    async fn serve_with_workers(&self) -> (String, tokio::process::Child, tokio::process::Child) {
        use tokio::io::AsyncBufReadExt;
        let mut serve = self
            .command(&["serve", "--listen", "127.0.0.1:0", "--workers", "0"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let url = tokio::io::BufReader::new(serve.stdout.take().unwrap())
            .lines()
            .next_line()
            .await
            .unwrap()
            .unwrap();
        let workers = self
            .command(&["worker", "--workers", "2"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        (url, serve, workers)
    }

    async fn sessions(&self) -> Vec<Value> {
        common::json_lines(&self.steadfast(&["sessions", "--json"]).await)
    }

    async fn log(&self, session: &str) -> Vec<Value> {
        common::json_lines(&self.steadfast(&["log", session, "--json"]).await)
    }
}

/// Creates, through the API at `url`, a session allowed two explorers on the task
/// that explores; its id.
async fn explore_through_the_api(url: &str) -> String {
    let created: Value = reqwest::Client::new()
        .post(format!("{url}/v1/sessions"))
        .json(&json!({"model": "anthropic/claude-sonnet-4-5", "task": "explore two approaches", "explorers": 2}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    created["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_string()
}

fn marks(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("mark-")
        })
        .count()
}

/// What every case checks at the end: the parent finished with both answers as its
/// call's result; two explorers, each from the fork point, each in a workspace of its
/// own with only its own mark; 7 distinct model requests in all (3 the parent's, 2
/// each explorer's), and, without a crash, 7 calls: none repeated. (A crash may cut a
/// reply off mid-stream: that request, never answered, is asked again.)
async fn check_finished(case: &Case, crashed: bool) {
    let sessions = case.sessions().await;
    assert_eq!(sessions.len(), 3, "{sessions:?}");
    let parent = sessions
        .iter()
        .find(|s| !s["title"].as_str().unwrap_or("").starts_with("explorer"))
        .unwrap();
    assert_eq!(parent["status"], "completed", "{parent}");
    let parent_id = parent["id"].as_str().unwrap();
    let log = case.log(parent_id).await;
    let received: Vec<&Value> = common::events(&log, "signal_received");
    assert_eq!(received.len(), 2, "{log:?}");
    // The parent's own mark came after both answers, in its own directory.
    assert_eq!(marks(&case.dir.path().join("ws")), 1);
    // Its next request carried both answers as the explore call's result.
    let answered = case
        .fake
        .state()
        .requests()
        .into_iter()
        .find(|r| r.contains("2 explorer(s) finished"))
        .expect("a request with the explorers' answers");
    for n in [1, 2] {
        assert!(
            answered.contains(&format!("## Explorer {n} (ses_")),
            "{answered}"
        );
    }
    assert!(answered.contains("try approach B"), "{answered}");
    assert!(answered.contains("Finished my part."), "{answered}");
    for explorer in sessions.iter().filter(|s| s["id"] != parent["id"]) {
        let id = explorer["id"].as_str().unwrap();
        let own = case.log(id).await;
        let forked = common::events(&own, "forked");
        assert_eq!(forked.len(), 1, "{own:?}");
        assert_eq!(forked[0]["parent"], parent_id);
        let workspace = forked[0]["workspace"].as_str().unwrap();
        let dir = case.home().join("workspaces").join(workspace);
        assert_eq!(marks(&dir), 1, "{id}: its own mark only");
    }
    assert_eq!(case.fake.state().distinct_requests(), 7);
    if !crashed {
        assert_eq!(case.fake.calls(), 7, "a model call was paid twice");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explorers_work_apart_and_their_answers_come_back_together() {
    let case = Case::new(0).await;
    let out = case
        .steadfast(
            &case
                .run_args()
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        )
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    check_finished(&case, false).await;
    // The explorers shared the parent's budget, and their spend came back to it: the
    // parent reports every model call of the three sessions (the shared one once).
    let reported: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut spent = 0;
    for s in case.sessions().await {
        let log = case.log(s["id"].as_str().unwrap()).await;
        let own_from = common::events(&log, "forked")
            .first()
            .map_or(0, |f| f["at"].as_u64().unwrap());
        if let Some(f) = common::events(&log, "forked").first() {
            let max = f["limits"]["max_cost_micro_usd"].as_u64().unwrap();
            assert!((400_000..600_000).contains(&max), "{f}");
        }
        spent += log
            .iter()
            .filter(|r| r["seq"].as_u64().unwrap() > own_from)
            .filter_map(|r| r["event"]["model_call_outcome"]["cost_micro_usd"].as_u64())
            .sum::<u64>();
    }
    let parent_cost = steadfast_log::money::micro_usd(reported["cost_usd"].as_f64().unwrap());
    assert_eq!(parent_cost, spent, "{reported}");
}

/// SIGKILL while an explorer's reply streams: `resume` finishes everything, making
/// no explorer twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_while_explorers_work_loses_nothing_and_makes_none_twice() {
    let case = Case::new(150).await;
    let args = case.run_args();
    let mut run = case
        .command(&args.iter().map(String::as_str).collect::<Vec<_>>())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Kill it once an explorer exists and is streaming its second reply.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        assert!(std::time::Instant::now() < deadline, "no explorer started");
        if case.sessions().await.len() == 3 && case.fake.calls() >= 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    run.start_kill().unwrap();
    run.wait().await.unwrap();
    let parent = case
        .sessions()
        .await
        .into_iter()
        .find(|s| !s["title"].as_str().unwrap_or("").starts_with("explorer"))
        .unwrap();
    let id = parent["id"].as_str().unwrap().to_string();
    let out = case.steadfast(&["resume", &id, "--json"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    check_finished(&case, true).await;
}

/// Through the API, with workers: the explorers are sessions of the caller's, which
/// workers take like any other; the parent sleeps on its wait, holding no worker, and
/// a worker wakes it when the last answer comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_api_workers_run_the_explorers_and_wake_the_parent() {
    let case = Case::new(0).await;
    let (url, _serve, _workers) = case.serve_with_workers().await;
    let id = &explore_through_the_api(&url).await;
    let shown = common::idle_after(&url, id, 1).await;
    assert!(
        shown["children"].as_array().is_some_and(|c| c.len() == 2),
        "{shown}"
    );
    let sessions = case.sessions().await;
    assert_eq!(sessions.len(), 3, "{sessions:?}");
    assert_eq!(case.fake.calls(), 7);
    let refused = reqwest::Client::new()
        .post(format!("{url}/v1/sessions"))
        .json(&json!({"model": "anthropic/claude-sonnet-4-5", "task": "t", "explorers": 9}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 422);
    let body: Value = refused.json().await.unwrap();
    assert!(body.to_string().contains("explorers"), "{body}");
}

/// An explorer that ends before it answers (closed or deleted by its owner) tells its
/// parent why, as its task's answer: the parent's wait never outlives its explorers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explorers_closed_or_deleted_before_answering_do_not_hold_their_parent() {
    // The explorers' second reply streams slowly: they are closed in the middle of it.
    let case = Case::new(1500).await;
    let (url, _serve, _workers) = case.serve_with_workers().await;
    let http = reqwest::Client::new();
    let id = &explore_through_the_api(&url).await;
    let mut children = Vec::new();
    for _ in 0..300 {
        let shown: Value = http
            .get(format!("{url}/v1/sessions/{id}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if let Some(c) = shown["children"].as_array().filter(|c| c.len() == 2) {
            children = c.iter().map(|c| c.as_str().unwrap().to_string()).collect();
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(children.len(), 2, "the explorers were never made");
    let closed = http
        .post(format!("{url}/v1/sessions/{}/close", children[0]))
        .send()
        .await
        .unwrap();
    assert!(closed.status().is_success(), "{}", closed.status());
    let deleted = http
        .delete(format!("{url}/v1/sessions/{}", children[1]))
        .send()
        .await
        .unwrap();
    assert!(deleted.status().is_success(), "{}", deleted.status());

    common::idle_after(&url, id, 1).await;
    let answered = case
        .fake
        .state()
        .requests()
        .into_iter()
        .find(|r| r.contains("2 explorer(s) finished"))
        .expect("a request with the explorers' answers");
    assert!(
        answered.contains("ended without an answer: closed by"),
        "{answered}"
    );
    assert!(
        answered.contains("ended without an answer: deleted by"),
        "{answered}"
    );
    let gone = http
        .get(format!("{url}/v1/sessions/{}", children[1]))
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), 404);
}

/// A wrapped session explores through the journaled MCP server, for every CLI: the
/// `explore` call stops the CLI while the explorers (sessions of the same CLI forked
/// at that call, each replaying the shared part of the turn from the log) work;
/// started again, it is answered with their answers and finishes the turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrapped_session_explores_through_the_journal_for_every_cli() {
    for (adapter, model) in [
        ("claude-code", "anthropic/claude-sonnet-4-5"),
        ("codex", "openai/gpt-5"),
        ("pi", "anthropic/claude-sonnet-4-5"),
        ("opencode", "anthropic/claude-sonnet-4-5"),
    ] {
        common::installed(adapter).await;
        let case = Case::new(0).await;
        let mut args = case.run_args();
        let at = args.iter().position(|a| a == "--model").unwrap() + 1;
        args[at] = model.to_string();
        args.extend(["--agent".to_string(), adapter.to_string()]);
        let out = case
            .steadfast(&args.iter().map(String::as_str).collect::<Vec<_>>())
            .await;
        assert!(out.status.success(), "{adapter}: {}", stderr(&out));
        let sessions = case.sessions().await;
        assert_eq!(sessions.len(), 3, "{adapter}: {sessions:?}");
        let parent = sessions
            .iter()
            .find(|s| !s["title"].as_str().unwrap_or("").starts_with("explorer"))
            .unwrap();
        assert_eq!(parent["status"], "completed", "{adapter}: {parent}");
        let answered = case
            .fake
            .state()
            .requests()
            .into_iter()
            .find(|r| r.contains("2 explorer(s) finished"))
            .unwrap_or_else(|| panic!("{adapter}: no request with the explorers' answers"));
        assert!(answered.contains("try approach B"), "{adapter}: {answered}");
        assert_eq!(marks(&case.dir.path().join("ws")), 1, "{adapter}");
        for explorer in sessions.iter().filter(|s| s["id"] != parent["id"]) {
            let own = case.log(explorer["id"].as_str().unwrap()).await;
            let forked = common::events(&own, "forked");
            let dir = case
                .home()
                .join("workspaces")
                .join(forked[0]["workspace"].as_str().unwrap());
            assert_eq!(marks(&dir), 1, "{adapter}: {own:?}");
            // The shared part of the turn was answered from the log.
            assert!(
                common::events(&own, "replay_diverged").is_empty(),
                "{adapter}: {own:?}"
            );
        }
    }
}

/// A bound past the ceiling is refused, leaving nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explorers_past_the_ceiling_are_refused() {
    let case = Case::new(0).await;
    let mut args = case.run_args();
    let n = args.iter().position(|a| a == "2").unwrap();
    args[n] = "9".into();
    let out = case
        .steadfast(&args.iter().map(String::as_str).collect::<Vec<_>>())
        .await;
    assert!(!out.status.success());
    assert!(stderr(&out).contains("at most 8"), "{}", stderr(&out));
    assert!(case.sessions().await.is_empty());
}
