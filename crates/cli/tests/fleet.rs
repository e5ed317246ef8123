//! Many processes on one PostgreSQL world: three worker processes and two API
//! processes, twenty concurrent sessions, workers SIGKILLed at random throughout.

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde_json::{json, Value};
use steadfast_testkit::{FakeProvider, Script};
use tokio::io::AsyncBufReadExt;

use common::{kind, TestDatabase};

const BIN: &str = env!("CARGO_BIN_EXE_steadfast");
const SESSIONS: usize = 20;

struct Fleet {
    home: PathBuf,
    world: String,
    fake_url: String,
}

impl Fleet {
    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(BIN);
        cmd.args(args)
            .env("STEADFAST_HOME", &self.home)
            .env("STEADFAST_WORLD", &self.world)
            .env("ANTHROPIC_API_KEY", "test-key")
            .env("ANTHROPIC_BASE_URL", &self.fake_url)
            .env("STEADFAST_MODEL", "anthropic/claude-sonnet-4-5")
            .env_remove("OPENAI_API_KEY")
            .env_remove("STEADFAST_FAULT")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        cmd
    }

    fn worker(&self) -> tokio::process::Child {
        self.command(&["worker", "--workers", "2"]).spawn().unwrap()
    }

    async fn api(&self) -> (tokio::process::Child, String) {
        let mut child = self
            .command(&["serve", "--listen", "127.0.0.1:0", "--workers", "0"])
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let url = tokio::io::BufReader::new(stdout)
            .lines()
            .next_line()
            .await
            .unwrap()
            .unwrap();
        (child, url)
    }
}

fn workspace(fleet: &Fleet, created: &Value) -> PathBuf {
    common::workspace_in(&fleet.home, created)
}

async fn log(fleet: &Fleet, id: &str) -> Vec<Value> {
    let out = fleet
        .command(&["log", id, "--json"])
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "the log of {id} reads back verified");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_sessions_survive_random_worker_kills_on_postgres() {
    // Long enough (16 pieces of 15 ms a reply, four replies) that twenty sessions on six
    // worker slots outlast several kills, however fast the machine.
    let text = "Working on it, one small step at a time, streaming as I go. ".repeat(4);
    let step = |n: u32| json!({"text": text, "chunk_delay_ms": 15, "tool_calls": [{"name": "bash", "input": {"command": format!("echo step{n} >> steps.txt")}}]});
    let script: Script = serde_json::from_value(json!({"steps": [step(1), step(2), step(3), {"text": "All three steps done.", "chunk_delay_ms": 15}]})).unwrap();
    let fake = FakeProvider::start(script).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = TestDatabase::create(&format!("steadfast_fleet_{}", std::process::id())).await;
    let world = db.url.clone();
    let fleet = Fleet {
        home: dir.path().join("home"),
        world,
        fake_url: fake.base_url(),
    };
    assert!(fleet
        .command(&["migrate"])
        .output()
        .await
        .unwrap()
        .status
        .success());

    let (_api1, url1) = fleet.api().await;
    let (_api2, url2) = fleet.api().await;
    let mut workers: Vec<_> = (0..3).map(|_| fleet.worker()).collect();
    let http = reqwest::Client::new();

    let mut sessions = Vec::new();
    for i in 0..SESSIONS {
        let api = if i % 2 == 0 { &url1 } else { &url2 };
        let created: Value = http
            .post(format!("{api}/v1/sessions"))
            .json(&json!({"task": format!("job {i}")}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        sessions.push(created);
    }
    // A stream on the other API instance than the one that created the session.
    let watched = sessions[0]["id"].as_str().unwrap().to_string();
    let stream_url = format!("{url2}/v1/sessions/{watched}/events");
    let watcher = tokio::spawn(async move {
        let resp = reqwest::get(stream_url).await.unwrap();
        let mut stream = resp.bytes_stream().eventsource();
        let mut last = String::new();
        while let Some(ev) = stream.next().await {
            let ev = ev.unwrap();
            if ev.event == "end" {
                break;
            }
            last = steadfast_testkit::frame_kind(&ev.event, &ev.data);
        }
        last
    });

    // Kill a worker process every so often while the sessions run.
    let mut kills = 0;
    let mut seed = 7u64;
    let all_idle = |http: reqwest::Client, sessions: Vec<Value>, url: String| async move {
        for s in &sessions {
            let shown: Value = http
                .get(format!("{url}/v1/sessions/{}", s["id"].as_str().unwrap()))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if shown["status"] != "idle" {
                return false;
            }
        }
        true
    };
    for round in 0..600 {
        if all_idle(http.clone(), sessions.clone(), url1.clone()).await {
            break;
        }
        if round % 2 == 1 && kills < 5 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            let victim = (seed >> 33) as usize % workers.len();
            workers[victim].start_kill().unwrap(); // SIGKILL
            let _ = workers[victim].wait().await;
            workers[victim] = fleet.worker();
            kills += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(round < 599, "sessions did not all finish");
    }
    assert!(
        kills >= 3,
        "workers were killed {kills} times during the run"
    );
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(30), watcher)
            .await
            .unwrap()
            .unwrap(),
        "turn_ended"
    );

    let mut outcomes = 0;
    let mut taken_over = 0;
    for s in &sessions {
        let id = s["id"].as_str().unwrap();
        let records = log(&fleet, id).await;
        // Nothing lost: positions contiguous (verified by `log`), the whole turn there.
        let seqs: Vec<u64> = records.iter().map(|r| r["seq"].as_u64().unwrap()).collect();
        assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "{id}");
        let kinds: Vec<String> = records.iter().map(kind).collect();
        assert_eq!(kinds.last().map(String::as_str), Some("turn_ended"), "{id}");
        outcomes += kinds.iter().filter(|k| *k == "model_call_outcome").count();
        // Never two drivers at once: epochs only go up along the log.
        let epochs: Vec<u64> = records
            .iter()
            .map(|r| r["epoch"].as_u64().unwrap())
            .collect();
        assert!(epochs.windows(2).all(|w| w[0] <= w[1]), "{id}: {epochs:?}");
        if epochs.last().copied().unwrap_or(0) > 2 {
            taken_over += 1;
        }
        // No mutation applied twice.
        assert_eq!(
            std::fs::read_to_string(workspace(&fleet, s).join("steps.txt")).unwrap(),
            "step1\nstep2\nstep3\n",
            "{id}"
        );
    }
    assert!(
        taken_over > 0,
        "some turn was cut by a kill and finished by another worker"
    );
    // No recorded reply was asked for again: every distinct request has exactly one
    // recorded outcome (a reply cut off by a kill is re-sent as the same request).
    assert_eq!(fake.state().distinct_requests(), outcomes);
    assert!(fake.calls() as usize >= outcomes);

    for w in &mut workers {
        let _ = w.start_kill();
    }
    db.drop_now().await;
}
