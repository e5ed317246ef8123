//! A session that outgrows its model's context window: 2,000 steps of the native agent
//! under a fake provider with a 32k-token window (which refuses a larger request, as
//! providers do). The harness elides old outputs and summarises older turns as it
//! goes, so no request passes the window and the turn finishes. The harness is aborted
//! once after a summary arrived (before its compaction was recorded) and once after a
//! compaction's intent (before the summary was asked); each resume (waking from the
//! latest checkpoint) carries on: the summary cut off is asked again once, and no
//! recorded compaction is asked twice.

use std::path::Path;
use std::process::Stdio;

use serde_json::{json, Value};
use steadfast_testkit::{FakeProvider, Script};

const BIN: &str = env!("CARGO_BIN_EXE_steadfast");
const STEPS: usize = 2000;
const WINDOW: u64 = 32_000;

fn command(dir: &Path, fake: &FakeProvider, args: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new(BIN);
    cmd.args(args)
        .current_dir(dir)
        .env("STEADFAST_HOME", dir.join("home"))
        .env("STEADFAST_CONFIG", dir.join("steadfast.toml"))
        .env("ANTHROPIC_API_KEY", "test-key")
        .env("ANTHROPIC_BASE_URL", fake.base_url())
        .env_remove("OPENAI_API_KEY")
        .env_remove("STEADFAST_FAULT")
        .env_remove("STEADFAST_WORLD")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

fn log(dir: &Path, fake: &FakeProvider, id: &str) -> Vec<Value> {
    let out = command(dir, fake, &["log", id, "--json"]).output().unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn kinds<'a>(log: &'a [Value], kind: &str) -> Vec<&'a Value> {
    log.iter()
        .filter(|r| r["event"].get(kind).is_some())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_session_compacts_within_the_window_and_survives_crashes_mid_compaction() {
    let filler = "I read the notes again and compare them with what I found so far. ".repeat(13);
    let steps: Vec<Value> = (0..STEPS)
        .map(|i| {
            json!({"text": format!("step {i}: {filler}"),
                   "tool_calls": [{"name": "read", "input": {"file_path": format!("notes{}.txt", i % 2)}}]})
        })
        .chain(std::iter::once(json!({"text": "all 2000 steps done"})))
        .collect();
    let script: Script =
        serde_json::from_value(json!({"steps": steps, "context_window": WINDOW})).unwrap();
    let fake = FakeProvider::start(script).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    for i in 0..2 {
        std::fs::write(
            ws.join(format!("notes{i}.txt")),
            format!("notes {i}: the parser drops trailing commas in lists\n").repeat(40),
        )
        .unwrap();
    }
    std::fs::write(
        dir.path().join("steadfast.toml"),
        format!("[harness]\ncontext-window = {WINDOW}\nmax-steps-per-turn = 5000\n"),
    )
    .unwrap();
    let d = dir.path().to_path_buf();

    // First run: aborted after the second summary arrived, before it was recorded.
    let run = {
        let mut cmd = command(
            &d,
            &fake,
            &[
                "run",
                "work through the notes",
                "--workspace",
                ws.to_str().unwrap(),
                "--model",
                "anthropic/claude-sonnet-4-5",
            ],
        );
        cmd.env(
            "STEADFAST_FAULT",
            format!("{}:2", steadfast_fault::points::COMPACTION_EFFECT),
        );
        tokio::task::spawn_blocking(move || cmd.output().unwrap())
    };
    let out = run.await.unwrap();
    assert!(!out.status.success(), "the run was to abort");
    let out = command(&d, &fake, &["sessions", "--json"])
        .output()
        .unwrap();
    let first = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap()
        .to_string();
    let id = serde_json::from_str::<Value>(&first).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        fake.state().summaries(),
        2,
        "the cut-off summary had arrived"
    );

    // Second: aborted right after the next compaction's intent (the cut-off one's
    // retry), before the summary was asked.
    let mut cmd = command(&d, &fake, &["resume", &id]);
    cmd.env(
        "STEADFAST_FAULT",
        format!("{}:1", steadfast_fault::points::COMPACTION_INTENT),
    );
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    assert!(!out.status.success(), "the resume was to abort");
    assert_eq!(
        fake.state().summaries(),
        2,
        "nothing asked after the intent"
    );

    // Third: to the end.
    let mut cmd = command(&d, &fake, &["resume", &id]);
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let state = fake.state();
    assert_eq!(state.too_long(), 0, "no request passed the window");
    assert!(
        state.largest_request() <= WINDOW,
        "{}",
        state.largest_request()
    );
    let records = log(&d, &fake, &id);
    let compacted = kinds(&records, "compacted").len() as u64;
    let intents = kinds(&records, "compaction_intent").len() as u64;
    let elided = kinds(&records, "outputs_elided").len();
    eprintln!(
        "{STEPS} steps: {compacted} compactions, {elided} elisions, largest request {} tokens of {WINDOW}",
        state.largest_request()
    );
    assert!(compacted >= 5, "compactions: {compacted}");
    assert!(elided >= 1, "outputs elided first");
    assert!(
        !kinds(&records, "checkpoint").is_empty(),
        "the resumes woke from checkpoints"
    );
    assert_eq!(intents, compacted + 2, "two compactions were cut off");
    assert_eq!(
        state.summaries(),
        compacted + 1,
        "only the summary cut off after it arrived was asked again"
    );
    // Every step of the script was asked once: the summaries stood for the turns
    // they replaced, and the model never lost its place.
    let per_step = state.calls_per_step();
    assert_eq!(per_step.len(), STEPS + 1, "{per_step:?}");
    assert!(per_step.iter().all(|&n| n == 1), "{per_step:?}");
    assert_eq!(kinds(&records, "turn_ended").len(), 1);
    let last_reply = kinds(&records, "model_call_outcome")
        .last()
        .unwrap()
        .to_string();
    assert!(last_reply.contains("all 2000 steps done"), "{last_reply}");
}
