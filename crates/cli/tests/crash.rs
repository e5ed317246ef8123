//! Crash tests with real process aborts.
//!
//! A crash-free `steadfast run` of the demo task is traced to learn every fault point
//! it passes. Then, for every point and every time it is reached, a fresh `steadfast
//! run` child process is aborted there (SIGABRT, via `STEADFAST_FAULT`), and `steadfast
//! resume` (another process) carries on. Each crashed-and-resumed run must end
//! byte-for-byte where the crash-free run ended, with no model call repeated except a
//! reply cut off before it was recorded, and no mutation applied twice.

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Output;

use serde_json::Value;
use steadfast_testkit::{demo, FakeProvider, Script};

mod common;

use common::{events, git, stderr, tree};

const BIN: &str = env!("CARGO_BIN_EXE_steadfast");
const MODEL: &str = "anthropic/claude-sonnet-4-5";

struct Case {
    dir: tempfile::TempDir,
    fake: FakeProvider,
    /// A configuration file every command of the case reads.
    config: Option<PathBuf>,
}

impl Case {
    async fn new(script: Script) -> Self {
        Self::configured(script, None).await
    }

    async fn configured(script: Script, config: Option<&str>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        demo::write_project(&dir.path().join("ws")).unwrap();
        let fake = FakeProvider::start(script).await.unwrap();
        let config = config.map(|text| {
            let path = dir.path().join("config.toml");
            std::fs::write(&path, text).unwrap();
            path
        });
        Case { dir, fake, config }
    }

    fn workspace(&self) -> PathBuf {
        self.dir.path().join("ws")
    }

    async fn steadfast(&self, args: &[&str], env: &[(&str, String)]) -> Output {
        let mut cmd = tokio::process::Command::new(BIN);
        cmd.args(args)
            .current_dir(self.dir.path())
            .env("STEADFAST_HOME", self.dir.path().join("home"))
            .env("ANTHROPIC_API_KEY", "test-key")
            .env("ANTHROPIC_BASE_URL", self.fake.base_url())
            .env_remove("OPENAI_API_KEY")
            .env_remove("STEADFAST_FAULT")
            .env_remove("STEADFAST_FAULT_TRACE")
            .env_remove("STEADFAST_MODEL")
            .env_remove("STEADFAST_CONFIG");
        if let Some(config) = &self.config {
            cmd.env("STEADFAST_CONFIG", config);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().await.unwrap()
    }

    async fn run(&self, task: &str, env: &[(&str, String)]) -> Output {
        let ws = self.workspace().display().to_string();
        self.steadfast(
            &["run", task, "--workspace", &ws, "--model", MODEL, "--json"],
            env,
        )
        .await
    }

    async fn sessions(&self) -> Vec<String> {
        let out = self.steadfast(&["sessions", "--json"], &[]).await;
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| {
                serde_json::from_str::<Value>(l).unwrap()["id"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    }

    async fn log(&self, session: &str) -> Vec<Value> {
        let out = self.steadfast(&["log", session, "--json"], &[]).await;
        assert!(
            out.status.success(),
            "log: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_crash_point_resumes_to_the_crash_free_result() {
    walk_every_crash_point(None).await;
}

/// The same walk with a checkpoint stored at every chance (`checkpoint-every = 1`):
/// each crashed-and-resumed log must hold checkpoints, and each one's stored state
/// must equal a fold from scratch of the records before it, before and after
/// retention prunes the log's streamed pieces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_crash_point_resumes_with_checkpoints_on_each_equal_to_a_full_fold() {
    walk_every_crash_point(Some("[harness]\ncheckpoint-every = 1\n")).await;
}

/// The walk once more with the conversation compacted as it goes (a 4k-token window:
/// the demo compacts along the way), checkpoints at every chance and retention: each
/// crash at each compaction point too resumes to the crash-free result, with no
/// recorded summary asked again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_crash_point_resumes_with_compaction_checkpoints_and_retention_on() {
    walk_every_crash_point(Some(
        "[harness]\ncheckpoint-every = 1\ncontext-window = 4096\ncompact-at = 0.3\n",
    ))
    .await;
}

/// Checks every checkpoint in `session`'s log against a fold of what precedes it;
/// returns how many there are.
async fn checkpoints_equal_full_folds(case: &Case, session: &str, label: &str) -> usize {
    let records: Vec<steadfast_log::Record> = case
        .log(session)
        .await
        .into_iter()
        .map(|r| serde_json::from_value(r).unwrap())
        .collect();
    let mut seen = 0;
    for (i, record) in records.iter().enumerate() {
        let steadfast_log::Event::Checkpoint { blob, .. } = &record.event else {
            continue;
        };
        let stored = std::fs::read(case.dir.path().join("home/blobs").join(&blob.hash)).unwrap();
        let checkpoint: steadfast_log::fold::Checkpoint = serde_json::from_slice(&stored).unwrap();
        let folded = steadfast_log::fold::fold(&records[..i]).unwrap();
        assert_eq!(
            serde_json::to_value(&checkpoint.state).unwrap(),
            serde_json::to_value(&folded).unwrap(),
            "{label}: the checkpoint at {} differs from a full fold",
            record.seq
        );
        seen += 1;
    }
    seen
}

async fn walk_every_crash_point(config: Option<&str>) {
    let compacting = config.is_some_and(|c| c.contains("context-window"));
    // The crash-free run, traced.
    let clean = Case::configured(demo::script(), config).await;
    let trace = clean.dir.path().join("trace");
    let out = clean
        .run(
            demo::TASK,
            &[("STEADFAST_FAULT_TRACE", trace.display().to_string())],
        )
        .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let expected = tree(&clean.workspace());
    let clean_calls = clean.fake.calls();
    let clean_session = clean.sessions().await.pop().unwrap();
    let clean_outcomes = events(&clean.log(&clean_session).await, "model_call_outcome").len();
    assert_eq!(
        clean_calls as usize, clean_outcomes,
        "one call per step without crashes"
    );
    let changelog = String::from_utf8_lossy(&expected["CHANGELOG.md"].0).into_owned();
    assert_eq!(changelog.matches("- Fix off-by-one").count(), 1);
    assert_eq!(
        clean.fake.state().summaries() > 0,
        compacting,
        "the demo compacts only with the small window"
    );

    let mut hits: BTreeMap<String, u64> = BTreeMap::new();
    for line in std::fs::read_to_string(&trace).unwrap().lines() {
        *hits.entry(line.to_string()).or_default() += 1;
    }
    let compaction_points = [
        steadfast_fault::points::COMPACTION_INTENT,
        steadfast_fault::points::COMPACTION_EFFECT,
    ];
    let expected_points = steadfast_fault::points::ALL
        .iter()
        .chain(compaction_points.iter().filter(|_| compacting));
    for point in expected_points {
        assert!(
            hits.contains_key(*point),
            "the demo never reaches {point}: {hits:?}"
        );
    }

    let mut crashes = 0;
    for (point, count) in &hits {
        for n in 1..=*count {
            let case = Case::configured(demo::script(), config).await;
            let label = format!("{point}:{n}");
            let out = case
                .run(demo::TASK, &[("STEADFAST_FAULT", label.clone())])
                .await;
            assert_eq!(
                out.status.signal(),
                Some(libc_sigabrt()),
                "{label} did not abort: {}",
                stderr(&out)
            );
            crashes += 1;

            let session = match case.sessions().await.pop() {
                Some(s) => s,
                None => {
                    // Aborted before the session existed (its first snapshot): nothing
                    // durable happened, so the user simply runs again.
                    assert_eq!(case.fake.calls(), 0, "{label}");
                    let again = case.run(demo::TASK, &[]).await;
                    assert!(again.status.success(), "{label}: {}", stderr(&again));
                    assert_eq!(tree(&case.workspace()), expected, "{label}");
                    continue;
                }
            };
            // A short read's step goes into the log in one commit with the next
            // call's intent: a crash just after that commit (at any of its records'
            // points) leaves an intent whose call was never made, as a crash at
            // `model.intent_committed` does. And a crash just after such a read ran
            // (`tool.effect`) is before its reply's commit: the reply is asked again.
            let crashed_log = case.log(&session).await;
            let ends_with = |kinds: &[&str]| {
                crashed_log
                    .last()
                    .is_some_and(|r| kinds.iter().any(|kind| r["event"].get(*kind).is_some()))
            };
            let ends_with_intent = ends_with(&["model_call_intent", "compaction_intent"]);
            let reply_unrecorded = ends_with(&["model_call_intent", "model_delta"]);
            let resumed = case.steadfast(&["resume", &session, "--json"], &[]).await;
            assert!(
                resumed.status.success(),
                "{label}: resume failed: {}",
                stderr(&resumed)
            );
            let result: Value = serde_json::from_slice(&resumed.stdout).unwrap();
            assert_eq!(result["status"], "completed", "{label}");

            // No sandbox outlives the processes that started it (the aborted run's
            // included, whenever it died).
            let ws = case
                .workspace()
                .canonicalize()
                .unwrap()
                .display()
                .to_string();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while sandboxes_of(&ws) > 0 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{label}: a sandbox of the dead runs is still running"
                );
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }

            // Files: byte for byte what the crash-free run left.
            let got = tree(&case.workspace());
            assert_eq!(
                got.keys().collect::<Vec<_>>(),
                expected.keys().collect::<Vec<_>>(),
                "{label}"
            );
            assert!(
                got == expected,
                "{label}: workspace differs from the crash-free run"
            );

            // Model calls: a recorded reply is never asked for again. Only a reply cut
            // off before it was recorded is asked again (same request), and a rolled-back
            // mutation costs one new call (the model is told, and decides again).
            let log = case.log(&session).await;
            let rollbacks = events(&log, "tool_call_interrupted")
                .iter()
                .filter(|r| r["resolution"]["kind"] == "rolled_back")
                .count() as u64;
            // A reply (or a summary) cut off before it was recorded: asked again.
            let repeated = u64::from(
                matches!(
                    point.as_str(),
                    "model.mid_stream" | "model.effect" | "compaction.effect"
                ) || (point == "tool.effect" && reply_unrecorded),
            );
            let intent_only = repeated == 0 && ends_with_intent;
            assert_eq!(
                intent_only,
                matches!(
                    point.as_str(),
                    "model.intent_committed" | "compaction.intent_committed"
                ) || (matches!(
                    point.as_str(),
                    "model.outcome_committed" | "tool.intent_committed" | "tool.outcome_committed"
                ) && ends_with_intent),
                "{label}: the log ends with an unanswered intent only at a commit"
            );
            let (calls, summaries) = (case.fake.calls(), case.fake.state().summaries());
            let compacted = events(&log, "compacted").len() as u64;
            // Which call a cut fell on: a summary streams like any reply.
            let repeated_replies = calls.checked_sub(clean_calls + rollbacks);
            let repeated_summaries = summaries.checked_sub(compacted);
            assert!(
                repeated_replies
                    .zip(repeated_summaries)
                    .is_some_and(|(r, s)| r + s == repeated),
                "{label}: model calls {calls} and summaries {summaries} for {clean_calls} \
                 clean calls, {rollbacks} rollbacks and {compacted} recorded summaries"
            );
            let repeated_replies = repeated_replies.unwrap_or_default();
            assert!(compacting || summaries == 0, "{label}");
            assert!(!compacting || compacted > 0, "{label}: no compaction");
            assert_eq!(
                case.fake.state().distinct_requests() as u64,
                calls - repeated_replies,
                "{label}: a request was repeated"
            );
            assert_eq!(
                events(&log, "model_call_outcome").len() as u64,
                clean_outcomes as u64 + rollbacks,
                "{label}"
            );
            assert_eq!(
                (calls + summaries) as usize,
                events(&log, "model_call_intent").len() + events(&log, "compaction_intent").len()
                    - usize::from(intent_only),
                "{label}: every call has its intent in the log"
            );
            let changelog = String::from_utf8_lossy(&got["CHANGELOG.md"].0).into_owned();
            assert_eq!(
                changelog.matches("- Fix off-by-one").count(),
                1,
                "{label}: appended twice"
            );

            // Resolutions are in the log, as invariant 4 says.
            let interrupted = events(&log, "tool_call_interrupted");
            // A command that had run when the process died (`tool.effect`) ran in the
            // sandbox, which outlived the process: the resume adopts it and records
            // the outcome it kept. Nothing is cut off.
            let cut_intent = crashed_log
                .last()
                .map(|r| r["event"]["tool_call_intent"].clone())
                .filter(|i| !i.is_null());
            let kept = point.starts_with("tool.effect")
                && cut_intent.as_ref().is_some_and(|i| i["tool"] == "bash");
            if let Some(intent) = cut_intent.as_ref().filter(|_| kept) {
                assert!(interrupted.is_empty(), "{label}: {interrupted:?}");
                assert!(
                    events(&log, "tool_call_outcome")
                        .iter()
                        .any(|o| o["call_id"] == intent["call_id"]),
                    "{label}: the kept command's outcome is recorded"
                );
            }
            // (Unless its intent is not in the log yet, or its outcome is already.)
            let cut_mid_tool = (point.starts_with("tool.intent")
                || point.starts_with("tool.effect"))
                && ends_with(&["tool_call_intent"])
                && !kept;
            // A snapshot is taken before a mutation's intent (nothing pending yet) and
            // after its effect (the call pending): either may be the one cut.
            let maybe_mid_tool = point == "drive.mid_snapshot" && interrupted.len() == 1;
            // A read's intent goes into the log with the reply that asks for it: a
            // crash just after the reply was recorded cuts that call off too.
            let announced_tool = point == "model.outcome_committed"
                && interrupted.len() == 1
                && written_with(
                    &log,
                    "tool_call_intent",
                    &interrupted[0]["call_id"],
                    "model_call_outcome",
                );
            if cut_mid_tool || maybe_mid_tool || announced_tool {
                assert_eq!(interrupted.len(), 1, "{label}");
                let intent = events(&log, "tool_call_intent")
                    .into_iter()
                    .find(|r| r["call_id"] == interrupted[0]["call_id"])
                    .unwrap();
                let expected_resolution = match intent["class"].as_str() {
                    Some("read") => "rerun",
                    Some("mutate") => "rolled_back",
                    other => panic!("{label}: unexpected class {other:?}"),
                };
                assert_eq!(
                    interrupted[0]["resolution"]["kind"], expected_resolution,
                    "{label}"
                );
            } else {
                assert!(
                    interrupted.is_empty(),
                    "{label}: nothing was cut off mid-tool"
                );
            }
            if repeated == 1 || intent_only {
                assert_eq!(events(&log, "model_call_interrupted").len(), 1, "{label}");
            }
            if config.is_some() {
                let checkpoints = checkpoints_equal_full_folds(&case, &session, &label).await;
                assert!(checkpoints > 0, "{label}: no checkpoint was stored");
                // Retention on the resumed log: the streamed pieces of its ended turn
                // are pruned, and every checkpoint still equals a full fold.
                let gc = case
                    .steadfast(&["gc", "--keep-deltas-secs", "0"], &[])
                    .await;
                assert!(gc.status.success(), "{label}: {}", stderr(&gc));
                let log = case.log(&session).await;
                assert!(events(&log, "model_delta").is_empty(), "{label}: pruned");
                assert!(!events(&log, "pruned").is_empty(), "{label}: pruned");
                checkpoints_equal_full_folds(&case, &session, &label).await;
            }
        }
    }
    assert!(crashes >= 50, "walked {crashes} crash points");
}

fn libc_sigabrt() -> i32 {
    nix::sys::signal::Signal::SIGABRT as i32
}

/// A tiny HTTP endpoint on loopback that counts the requests it receives: the
/// "outside world" an external-effect command reaches.
fn counting_endpoint() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/deploy", listener.local_addr().unwrap());
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = hits.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf);
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-length: 8\r\nconnection: close\r\n\r\ndeployed",
            );
        }
    });
    (url, hits)
}

#[tokio::test]
async fn an_interrupted_external_effect_is_reported_unknown_and_never_run_again() {
    for point in ["tool.intent_committed", "tool.effect"] {
        let (url, hits) = counting_endpoint();
        let script: Script = serde_json::from_value(serde_json::json!({"steps": [
            {"text": "Deploying.", "tool_calls": [{"name": "bash", "input": {"command": format!("curl -sf -X POST {url}")}}]},
            {"text": "The deploy may or may not have happened; I will not retry it blindly."}
        ]}))
        .unwrap();
        let case = Case::new(script).await;
        let out = case
            .run(
                "deploy",
                &[
                    ("STEADFAST_FAULT", format!("{point}:1")),
                    // The deploy reaches a host service: the sandbox must allow it.
                    ("STEADFAST_NETWORK", "open".to_string()),
                ],
            )
            .await;
        assert_eq!(
            out.status.signal(),
            Some(libc_sigabrt()),
            "{}",
            stderr(&out)
        );
        let before = hits.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(before, usize::from(point == "tool.effect"), "{point}");

        let session = case.sessions().await.pop().unwrap();
        let resumed = case.steadfast(&["resume", &session, "--json"], &[]).await;
        assert!(resumed.status.success(), "{}", stderr(&resumed));
        assert_eq!(
            hits.load(std::sync::atomic::Ordering::SeqCst),
            before,
            "{point}: the call ran again"
        );

        let log = case.log(&session).await;
        let interrupted = events(&log, "tool_call_interrupted");
        assert_eq!(events(&log, "tool_call_intent")[0]["class"], "external");
        assert_eq!(case.fake.calls(), 2);
        if point == "tool.effect" {
            // The command had run to its end in the sandbox, which outlived the
            // aborted process: the resume adopts it and records the outcome it kept.
            assert!(interrupted.is_empty(), "{point}: {interrupted:?}");
            let outcome = events(&log, "tool_call_outcome");
            assert_eq!(outcome.len(), 1, "{point}");
            assert_eq!(outcome[0]["exit_code"], 0, "{point}");
            continue;
        }
        // It never reached the sandbox: rule 4, and the model is told.
        assert_eq!(interrupted.len(), 1);
        assert_eq!(interrupted[0]["resolution"]["kind"], "outcome_unknown");
        assert!(
            events(&log, "tool_call_outcome").is_empty(),
            "{point}: no outcome invented"
        );
        // The model was told, in the conversation it was sent next.
        let text = String::from_utf8_lossy(&case.steadfast(&["log", &session], &[]).await.stdout)
            .into_owned();
        assert!(text.contains("outcome unknown, NOT re-run"), "{text}");
    }
}

fn postgres_admin() -> String {
    std::env::var("STEADFAST_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

async fn postgres_admin_client() -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(&postgres_admin(), tokio_postgres::NoTls)
        .await
        .expect("PostgreSQL must be running for these tests (see .ci/run)");
    tokio::spawn(conn);
    client
}

/// A fresh PostgreSQL database for one case; returns its URL and name.
async fn postgres_world() -> (String, String) {
    let admin = postgres_admin();
    let client = postgres_admin_client().await;
    let name = format!(
        "steadfast_crash_{}_{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    (
        format!("{}/{name}", &admin[..admin.rfind('/').unwrap()]),
        name,
    )
}

#[tokio::test]
async fn crashes_resume_on_the_postgres_world_too() {
    let clean = Case::new(demo::script()).await;
    assert!(clean.run(demo::TASK, &[]).await.status.success());
    let expected = tree(&clean.workspace());

    for label in [
        "model.mid_stream:3",
        "tool.effect:4",
        "drive.mid_snapshot:5",
        "tool.outcome_committed:6",
    ] {
        let (url, db) = postgres_world().await;
        let case = Case::new(demo::script()).await;
        let world = [("STEADFAST_WORLD", url.clone())];
        let migrated = case.steadfast(&["migrate"], &world).await;
        assert!(migrated.status.success(), "{}", stderr(&migrated));
        let out = case
            .run(
                demo::TASK,
                &[
                    ("STEADFAST_WORLD", url.clone()),
                    ("STEADFAST_FAULT", label.to_string()),
                ],
            )
            .await;
        assert_eq!(
            out.status.signal(),
            Some(libc_sigabrt()),
            "{label}: {}",
            stderr(&out)
        );
        let listed = case.steadfast(&["sessions", "--json"], &world).await;
        let line = String::from_utf8_lossy(&listed.stdout)
            .lines()
            .next()
            .unwrap()
            .to_string();
        let session = serde_json::from_str::<Value>(&line).unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string();
        let resumed = case
            .steadfast(&["resume", &session, "--json"], &world)
            .await;
        assert!(resumed.status.success(), "{label}: {}", stderr(&resumed));
        assert!(
            tree(&case.workspace()) == expected,
            "{label}: workspace differs"
        );
        assert_eq!(
            case.fake.state().distinct_requests() as u64,
            case.fake.calls() - u64::from(label.starts_with("model.mid")),
            "{label}"
        );
        let _ = postgres_admin_client()
            .await
            .batch_execute(&format!("DROP DATABASE {db} WITH (FORCE)"))
            .await;
    }
}

#[tokio::test]
async fn an_interrupted_git_push_is_reconciled_and_never_pushed_twice() {
    for point in ["tool.intent_committed", "tool.effect"] {
        let script: Script = serde_json::from_value(serde_json::json!({"steps": [
            {"text": "Pushing.", "tool_calls": [{"name": "bash", "input": {"command": "git push origin main"}}]},
            {"text": "Pushed."}
        ]}))
        .unwrap();
        let case = Case::new(script).await;
        // A bare remote outside the workspace, counting the pushes it receives.
        let remote = common::counting_remote(case.dir.path());
        let pushes = || common::pushes(&remote);
        let ws = case.workspace();
        git(&ws, &["init", "-q", "-b", "main"]);
        git(&ws, &["config", "user.email", "agent@example.com"]);
        git(&ws, &["config", "user.name", "agent"]);
        git(&ws, &["add", "-A"]);
        git(&ws, &["commit", "-qm", "the fix"]);
        git(&ws, &["remote", "add", "origin", remote.to_str().unwrap()]);
        let commit = git(&ws, &["rev-parse", "HEAD"]);
        // The remote is a host path: the local backend can reach it.
        let local = ("STEADFAST_SANDBOX", "local".to_string());

        let out = case
            .run(
                "push it",
                &[("STEADFAST_FAULT", format!("{point}:1")), local.clone()],
            )
            .await;
        assert_eq!(
            out.status.signal(),
            Some(libc_sigabrt()),
            "{}",
            stderr(&out)
        );
        let landed = point == "tool.effect";
        assert_eq!(pushes(), usize::from(landed), "{point}");

        let session = case.sessions().await.pop().unwrap();
        let resumed = case
            .steadfast(
                &["resume", &session, "--json"],
                std::slice::from_ref(&local),
            )
            .await;
        assert!(resumed.status.success(), "{}", stderr(&resumed));
        assert_eq!(pushes(), 1, "{point}: pushed exactly once");
        assert_eq!(git(&remote, &["rev-parse", "main"]), commit, "{point}");

        let log = case.log(&session).await;
        let interrupted = events(&log, "tool_call_interrupted");
        assert_eq!(interrupted.len(), 1, "{point}");
        assert_eq!(
            interrupted[0]["resolution"]["kind"], "reconciled",
            "{point}"
        );
        assert_eq!(interrupted[0]["resolution"]["done"], landed, "{point}");
        // Landed: recorded as done, never run again. Not landed: run again, once.
        let intents = events(&log, "tool_call_intent").len();
        let outcomes = events(&log, "tool_call_outcome").len();
        assert_eq!(
            (intents, outcomes),
            if landed { (1, 0) } else { (2, 1) },
            "{point}"
        );
        assert_eq!(case.fake.calls(), 2, "{point}");
    }
}

/// How many sandbox agents serve `workspace`.
fn sandboxes_of(workspace: &str) -> usize {
    let needle = format!("\"workspace\":\"{workspace}\"");
    std::fs::read_dir("/proc").map_or(0, |dir| {
        dir.filter_map(Result::ok)
            .filter(|e| {
                let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
                let cmdline = String::from_utf8_lossy(&cmdline);
                cmdline.contains("sandbox-agent") && cmdline.contains(&needle)
            })
            .count()
    })
}

/// Whether the `kind` record of `call_id` was written in one commit with the record
/// before it, of `before` (adjacent, same epoch and time).
fn written_with(log: &[Value], kind: &str, call_id: &Value, before: &str) -> bool {
    log.iter()
        .position(|r| r["event"][kind]["call_id"] == *call_id)
        .filter(|&i| i > 0)
        .is_some_and(|i| {
            let (prev, this) = (&log[i - 1], &log[i]);
            prev["event"].get(before).is_some()
                && prev["epoch"] == this["epoch"]
                && prev["at_ms"] == this["at_ms"]
        })
}
