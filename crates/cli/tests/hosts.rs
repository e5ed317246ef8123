//! Many machines for real: a PostgreSQL world and an S3 bucket (moto's S3 server) are
//! all the hosts share. The API process and three worker processes each have their own
//! home, workspace root and host name, standing for separate machines; twenty
//! sessions (native ones and wrapped Codex ones) are created through the API while
//! workers are SIGKILLed at random, some coming back as the same host and some as a
//! brand-new one with an empty disk. Every session finishes on whatever host takes it,
//! its workspace byte-equal to a crash-free run's, no effect lost or run twice, and no
//! recorded reply asked for again.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use steadfast_testkit::{demo, FakeProvider, Script};

use common::{agents_dir, git, installed, kind, TestDatabase};

const BIN: &str = env!("CARGO_BIN_EXE_steadfast");
const NATIVE: usize = 18;
const WRAPPED: usize = 2;

/// One machine: its name and its own disk.
#[derive(Clone)]
struct Host {
    name: String,
    home: PathBuf,
}

struct Fleet {
    root: PathBuf,
    world: String,
    s3: String,
    native_fake: String,
    codex_fake: String,
}

impl Fleet {
    fn host(&self, name: &str) -> Host {
        Host {
            name: name.to_string(),
            home: self.root.join(name),
        }
    }

    fn command(&self, host: &Host, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(BIN);
        cmd.args(args)
            .env("STEADFAST_HOME", &host.home)
            .env("STEADFAST_HOST_ID", &host.name)
            .env("STEADFAST_WORLD", &self.world)
            .env("STEADFAST_BLOBS", "s3://fleet/steadfast")
            .env("AWS_ENDPOINT", &self.s3)
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_REGION", "us-east-1")
            .env("STEADFAST_AGENTS_DIR", agents_dir())
            .env("ANTHROPIC_API_KEY", "test-key")
            .env("ANTHROPIC_BASE_URL", &self.native_fake)
            .env("OPENAI_API_KEY", "test-key")
            .env("OPENAI_BASE_URL", format!("{}/v1", self.codex_fake))
            .env("STEADFAST_MODEL", "anthropic/claude-sonnet-4-5")
            .env_remove("STEADFAST_FAULT")
            .env_remove("STEADFAST_WORKSPACE_ROOT")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(steadfast_testkit::service_log::stderr(env!(
                "CARGO_TARGET_TMPDIR"
            )))
            .kill_on_drop(true);
        cmd
    }

    fn worker(&self, host: &Host) -> tokio::process::Child {
        self.command(host, &["worker", "--workers", "2"])
            .spawn()
            .unwrap()
    }

    async fn api(&self, host: &Host) -> (tokio::process::Child, String) {
        let mut child = self
            .command(
                host,
                &["serve", "--listen", "127.0.0.1:0", "--workers", "0"],
            )
            .spawn()
            .unwrap();
        let url = common::printed_url(&mut child).await;
        (child, url)
    }

    async fn log(&self, host: &Host, id: &str) -> Vec<Value> {
        let out = self
            .command(host, &["log", id, "--json"])
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "the log of {id} reads back verified");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// A session through the API: native on the empty-with-files workspace, or Codex on
/// the demo project.
async fn create(http: &reqwest::Client, api: &str, job: &str, wrapped: bool) -> Value {
    let body = if wrapped {
        json!({"agent": "codex", "model": "openai/gpt-5", "workspace": {"kind": "demo"}, "task": demo::TASK})
    } else {
        json!({"task": format!("job {job}"), "workspace": {"kind": "empty", "files": {
            "README.md": "A project that lives on no machine in particular.\n",
            "src/lib.rs": "pub fn answer() -> u32 { 42 }\n".repeat(200),
            "bin/run.sh": "#!/bin/sh\necho run\n",
        }}})
    };
    let resp = http
        .post(format!("{api}/v1/sessions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    resp.json().await.unwrap()
}

async fn status(_http: &reqwest::Client, api: &str, id: &str) -> String {
    let (_, shown) = common::call(
        reqwest::Method::GET,
        &format!("{api}/v1/sessions/{id}"),
        None,
    )
    .await;
    shown["status"].as_str().unwrap_or_default().to_string()
}

/// The session's workspace as its log's last snapshot has it, as the API serves it
/// (a deterministic tar archive).
async fn archive(http: &reqwest::Client, api: &str, id: &str) -> Vec<u8> {
    let resp = http
        .get(format!("{api}/v1/sessions/{id}/archive"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "{id}");
    resp.bytes().await.unwrap().to_vec()
}

/// Unpacks `archive` with the system's tar and lists what it holds.
fn unpacked(archive: &[u8], into: &Path) -> BTreeMap<String, (Vec<u8>, bool)> {
    std::fs::create_dir_all(into).unwrap();
    let file = into.with_extension("tar");
    std::fs::write(&file, archive).unwrap();
    assert!(Command::new("tar")
        .arg("-xf")
        .arg(&file)
        .arg("-C")
        .arg(into)
        .status()
        .unwrap()
        .success());
    common::tree(into)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_finish_on_any_host_with_only_the_database_and_the_bucket_shared() {
    installed("codex").await;
    let text = "Working on it, one small step at a time, streaming as I go.";
    let step = |n: u32| json!({"text": text, "chunk_delay_ms": 15, "tool_calls": [{"name": "bash", "input": {"command": format!("echo step{n} >> steps.txt && cat src/lib.rs | wc -l >> steps.txt")}}]});
    let script: Script = serde_json::from_value(
        json!({"steps": [step(1), step(2), step(3), {"text": "All three steps done.", "chunk_delay_ms": 15}]}),
    )
    .unwrap();
    let native_fake = FakeProvider::start(script).await.unwrap();
    let codex_fake = FakeProvider::start(demo::script()).await.unwrap();
    let moto = common::Moto::start("fleet");
    let s3 = moto.endpoint.clone();
    let dir = tempfile::tempdir().unwrap();
    let db = TestDatabase::create(&format!("steadfast_hosts_{}", std::process::id())).await;
    let fleet = Fleet {
        root: dir.path().to_path_buf(),
        world: db.url.clone(),
        s3,
        native_fake: native_fake.base_url(),
        codex_fake: codex_fake.base_url(),
    };
    let api_host = fleet.host("api");
    let migrated = fleet
        .command(&api_host, &["migrate"])
        .output()
        .await
        .unwrap();
    assert!(migrated.status.success());
    let (_api, api) = fleet.api(&api_host).await;
    let mut hosts: Vec<Host> = (1..=3).map(|n| fleet.host(&format!("host-{n}"))).collect();
    let mut workers: Vec<_> = hosts.iter().map(|h| fleet.worker(h)).collect();
    let http = reqwest::Client::new();

    // Crash-free runs first: what every session of each kind must end up with.
    let reference_native = create(&http, &api, "reference", false).await;
    let reference_codex = create(&http, &api, "reference", true).await;
    for reference in [&reference_native, &reference_codex] {
        let id = reference["id"].as_str().unwrap();
        for round in 0..1800 {
            if status(&http, &api, id).await == "idle" {
                break;
            }
            assert!(round < 1799, "the crash-free {id} did not finish");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let expected_native = archive(&http, &api, reference_native["id"].as_str().unwrap()).await;
    let expected_codex = archive(&http, &api, reference_codex["id"].as_str().unwrap()).await;
    let expected_tree = unpacked(&expected_native, &dir.path().join("expected-native"));
    assert_eq!(
        expected_tree["steps.txt"].0,
        b"step1\n200\nstep2\n200\nstep3\n200\n".to_vec(),
        "the crash-free run did its three steps once each"
    );
    let codex_tree = unpacked(&expected_codex, &dir.path().join("expected-codex"));
    assert!(
        String::from_utf8_lossy(&codex_tree["CHANGELOG.md"].0).contains("off-by-one"),
        "the crash-free Codex run finished the demo task"
    );

    // Twenty sessions, created while workers die.
    let mut sessions = Vec::new();
    for i in 0..NATIVE + WRAPPED {
        let wrapped = i % (NATIVE / WRAPPED + 1) == NATIVE / WRAPPED;
        sessions.push((create(&http, &api, &i.to_string(), wrapped).await, wrapped));
    }
    assert_eq!(sessions.iter().filter(|(_, w)| *w).count(), WRAPPED);

    // First a kill aimed at a Codex session's host mid-turn, after its second reply:
    // that machine is gone for good, so the turn must finish on another.
    let (db_client, conn) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let aimed = sessions.iter().find(|(_, w)| *w).unwrap().0["id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut new_hosts = 0;
    for round in 0..1200 {
        let row = db_client
            .query_one(
                "SELECT (SELECT count(*) FROM steadfast_events WHERE session_id = $1 AND kind = 'exchange_outcome'), \
                 (SELECT lease_host FROM steadfast_sessions WHERE id = $1)",
                &[&aimed],
            )
            .await
            .unwrap();
        let (replies, holder): (i64, Option<String>) = (row.get(0), row.get(1));
        let victim = holder.and_then(|h| hosts.iter().position(|x| x.name == h));
        if let (true, Some(victim)) = (replies >= 2, victim) {
            workers[victim].start_kill().unwrap(); // SIGKILL
            let _ = workers[victim].wait().await;
            new_hosts += 1;
            hosts[victim] = fleet.host(&format!("new-host-{new_hosts}"));
            workers[victim] = fleet.worker(&hosts[victim]);
            break;
        }
        assert!(round < 1199, "the aimed-at Codex session never got going");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut kills = 1;
    let mut seed = 11u64;
    for round in 0..3000 {
        let mut idle = 0;
        for (s, _) in &sessions {
            if status(&http, &api, s["id"].as_str().unwrap()).await == "idle" {
                idle += 1;
            }
        }
        if idle == sessions.len() {
            break;
        }
        assert!(round < 2999, "sessions did not all finish: {idle} idle");
        if round % 5 == 4 && kills < 8 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            let victim = (seed >> 33) as usize % workers.len();
            workers[victim].start_kill().unwrap(); // SIGKILL
            let _ = workers[victim].wait().await;
            kills += 1;
            if kills % 4 == 0 {
                // The machine is gone for good; a new one, with an empty disk, joins.
                new_hosts += 1;
                hosts[victim] = fleet.host(&format!("new-host-{new_hosts}"));
            }
            workers[victim] = fleet.worker(&hosts[victim]);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        kills >= 4,
        "workers were killed {kills} times during the run"
    );
    assert!(new_hosts >= 2, "new hosts joined");

    let mut native_outcomes = 0;
    let mut taken_over = 0;
    let mut moved = 0;
    let all_hosts: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.join("workspaces").is_dir())
        .collect();
    for (s, wrapped) in sessions.iter().chain(
        [(&reference_native, &false), (&reference_codex, &true)]
            .map(|(s, w)| (s.clone(), *w))
            .iter(),
    ) {
        let id = s["id"].as_str().unwrap();
        let records = fleet.log(&api_host, id).await;
        let seqs: Vec<u64> = records.iter().map(|r| r["seq"].as_u64().unwrap()).collect();
        assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "{id}");
        let kinds: Vec<String> = records.iter().map(kind).collect();
        assert_eq!(
            kinds.last().map(String::as_str),
            Some("turn_ended"),
            "{id}: {kinds:?}"
        );
        assert!(
            !kinds.iter().any(|k| k == "replay_diverged"),
            "{id}: {kinds:?}"
        );
        // The log names a workspace, not a host's directory.
        let started = &records[0]["event"]["session_started"];
        assert!(
            steadfast_log::is_workspace_id(started["workspace"].as_str().unwrap()),
            "{started}"
        );
        assert!(started.get("host").is_none(), "{started}");
        let epochs: Vec<u64> = records
            .iter()
            .map(|r| r["epoch"].as_u64().unwrap())
            .collect();
        assert!(epochs.windows(2).all(|w| w[0] <= w[1]), "{id}: {epochs:?}");
        if epochs.last().copied().unwrap_or(0) > 2 {
            taken_over += 1;
        }
        if *wrapped {
            let intents = kinds.iter().filter(|k| *k == "exchange_intent").count();
            assert!(intents > 0, "{id}: {kinds:?}");
            assert!(!kinds.iter().any(|k| k.starts_with("model_call")), "{id}");
        } else {
            native_outcomes += kinds.iter().filter(|k| *k == "model_call_outcome").count();
        }
        // Equal to the crash-free run of its kind, file by file: no effect lost or
        // repeated. (The archives' bytes differ: entries are dated when each snapshot
        // was recorded.)
        let got = archive(&http, &api, id).await;
        let tree = unpacked(&got, &dir.path().join(format!("got-{id}")));
        let want = if *wrapped {
            &codex_tree
        } else {
            &expected_tree
        };
        let differ: Vec<&String> = tree
            .keys()
            .chain(want.keys())
            .filter(|k| tree.get(*k) != want.get(*k))
            .collect();
        assert!(
            differ.is_empty(),
            "{id}: the workspace differs from the crash-free run's in {differ:?}\n{}\nits log:\n{}\nthe services' log: {}",
            differ
                .iter()
                .map(|k| format!(
                    "{k}: got {:?}\nwant {:?}",
                    tree.get(*k).map(|(b, _)| String::from_utf8_lossy(b)),
                    want.get(*k).map(|(b, _)| String::from_utf8_lossy(b))
                ))
                .collect::<Vec<_>>()
                .join("\n"),
            records
                .iter()
                .map(Value::to_string)
                .collect::<Vec<_>>()
                .join("\n"),
            steadfast_testkit::service_log::path(env!("CARGO_TARGET_TMPDIR")).display()
        );
        // Each host that drove it has its own copy; the last one is the log's.
        let ws = s["workspace"].as_str().unwrap();
        let copies: Vec<&PathBuf> = all_hosts
            .iter()
            .filter(|h| h.join("workspaces").join(ws).is_dir() && !h.ends_with("api"))
            .collect();
        assert!(!copies.is_empty(), "{id} was materialized on a worker host");
        let want = if *wrapped {
            &codex_tree
        } else {
            &expected_tree
        };
        assert!(
            copies
                .iter()
                .any(|h| common::tree(&h.join("workspaces").join(ws)) == *want),
            "{id}: some worker host's copy is the final workspace"
        );
        if copies.len() > 1 {
            moved += 1;
        }
        if id == aimed {
            assert!(
                copies.len() > 1,
                "the aimed-at Codex turn finished on another host"
            );
            let opened = kinds.iter().position(|k| k == "user_message").unwrap();
            let epochs: BTreeSet<u64> = records[opened..]
                .iter()
                .filter_map(|r| r["epoch"].as_u64())
                .collect();
            assert!(epochs.len() >= 2, "{id}: the turn moved: epochs {epochs:?}");
        }
    }
    assert!(
        taken_over > 0,
        "some turn was cut by a kill and finished elsewhere"
    );
    assert!(moved > 0, "some session was driven on more than one host");
    // No recorded reply was asked for again: every distinct request has exactly one
    // recorded outcome (a reply cut off by a kill is re-sent as the same request).
    assert_eq!(native_fake.state().distinct_requests(), native_outcomes);
    assert!(native_fake.calls() as usize >= native_outcomes);

    // The bucket holds the drive beside the blobs; no host's disk was needed.
    let listing = Command::new("curl")
        .args([
            "-sf",
            &format!("{}/fleet?list-type=2&prefix=steadfast/drive/", fleet.s3),
        ])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&listing.stdout).contains("<Key>steadfast/drive/"));
    for w in &mut workers {
        let _ = w.start_kill();
        let _ = w.wait().await;
    }

    // A session deleted through the API: gc on a host that drove it drops its copy
    // there and reclaims from the bucket only what no log refers to: every other
    // session's workspace still comes back whole. Then idle copies go too.
    let doomed = sessions[0].0.clone();
    let doomed_ws = doomed["workspace"].as_str().unwrap();
    let driver_host = all_hosts
        .iter()
        .find(|h| h.join("workspaces").join(doomed_ws).is_dir() && !h.ends_with("api"))
        .unwrap();
    let host_of = |home: &Path| Host {
        name: home.file_name().unwrap().to_string_lossy().into_owned(),
        home: home.to_path_buf(),
    };
    let resp = http
        .delete(format!(
            "{api}/v1/sessions/{}",
            doomed["id"].as_str().unwrap()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
    let gc = |home: &Path, extra: &[&str]| {
        let mut args = vec!["gc", "--min-age-secs", "0"];
        args.extend_from_slice(extra);
        fleet.command(&host_of(home), &args).output()
    };
    let out = gc(driver_host, &[]).await.unwrap();
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert!(!driver_host.join("workspaces").join(doomed_ws).exists());
    let copies = |home: &Path| std::fs::read_dir(home.join("workspaces")).unwrap().count();
    let kept = copies(driver_host);
    // The API host's cache emptied, so what it serves comes from the bucket.
    for entry in std::fs::read_dir(api_host.home.join("drive/objects")).unwrap() {
        let path = entry.unwrap().path();
        if !path.ends_with("tmp") {
            std::fs::remove_dir_all(path).unwrap();
        }
    }
    for (s, wrapped) in &sessions[1..] {
        let want = if *wrapped {
            &codex_tree
        } else {
            &expected_tree
        };
        let id = s["id"].as_str().unwrap();
        let got = archive(&http, &api, id).await;
        let tree = unpacked(&got, &dir.path().join(format!("after-gc-{id}")));
        assert_eq!(&tree, want, "{id} after gc");
    }
    if kept > 0 {
        let out = gc(driver_host, &["--idle-workspaces-secs", "0"])
            .await
            .unwrap();
        assert!(out.status.success(), "{}", common::stderr(&out));
        assert_eq!(copies(driver_host), 0, "idle copies dropped from this host");
    }
    db.drop_now().await;
}

/// A host with its own home, sharing a world file and a blob directory with the
/// others (standing for a database and a bucket).
fn on_host(
    shared: &Path,
    host: &str,
    fake: &FakeProvider,
    args: &[&str],
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.args(args)
        .current_dir(shared)
        .env("STEADFAST_HOME", shared.join(host))
        .env("STEADFAST_HOST_ID", host)
        .env(
            "STEADFAST_WORLD",
            format!("sqlite:{}", shared.join("world.db").display()),
        )
        .env("STEADFAST_BLOBS", shared.join("bucket"))
        .env("ANTHROPIC_API_KEY", "test-key")
        .env("ANTHROPIC_BASE_URL", fake.base_url())
        .env_remove("OPENAI_API_KEY")
        .env_remove("STEADFAST_FAULT")
        .env_remove("STEADFAST_WORKSPACE_ROOT")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// `on_host`'s command run to its end.
async fn output_on(
    shared: &Path,
    host: &str,
    fake: &FakeProvider,
    args: &[&str],
) -> std::process::Output {
    on_host(shared, host, fake, args).output().await.unwrap()
}

#[tokio::test]
async fn a_session_killed_in_its_directory_on_one_host_moves_to_another_at_its_users_word() {
    let script: Script = serde_json::from_value(json!({"steps": [
        {"text": "Setting up.", "tool_calls": [{"name": "bash", "input": {"command":
            "mkdir -p src && printf 'one\\n' > src/a.txt && ln -s src/a.txt link && head -c 300000 /dev/urandom > big.bin"}}]},
        {"text": "Running the slow job.", "tool_calls": [{"name": "bash", "input": {"command":
            "echo start >> job.log; sleep 2; echo late >> job.log"}}]},
        {"text": "done"},
    ]}))
    .unwrap();
    let fake = FakeProvider::start(script).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path();
    // Host a's lease lapses 3 s after it dies (its heartbeat stops).
    std::fs::write(
        shared.join("steadfast.toml"),
        "[harness]\nlease-ttl-secs = 3\n",
    )
    .unwrap();
    let on_a = shared.join("a-repo");
    std::fs::create_dir_all(&on_a).unwrap();
    std::fs::write(on_a.join("README"), "mine\n").unwrap();
    // A real repository with history, not a bare directory.
    git(&on_a, &["init", "-q"]);
    for (n, text) in ["first", "second"].iter().enumerate() {
        std::fs::write(on_a.join("README"), format!("mine {text}\n")).unwrap();
        git(&on_a, &["add", "-A"]);
        git(
            &on_a,
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@e",
                "commit",
                "-qm",
                &format!("commit {n}"),
            ],
        );
    }

    // Host a runs the session in the user's directory and dies mid-command.
    let mut run = on_host(
        shared,
        "a",
        &fake,
        &[
            "run",
            "go",
            "--workspace",
            on_a.to_str().unwrap(),
            "--model",
            "anthropic/claude-sonnet-4-5",
        ],
    )
    .spawn()
    .unwrap();
    common::wait_for("the slow job to start", async || {
        std::fs::read_to_string(on_a.join("job.log")).is_ok_and(|s| s.contains("start"))
    })
    .await;
    run.kill().await.unwrap();
    let listed = output_on(shared, "b", &fake, &["sessions", "--json"]).await;
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    let id = serde_json::from_str::<Value>(listed.lines().next().unwrap()).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let calls_before = fake.calls();

    // Host b will not drive it in a's directory, and says how to move it.
    let refused = output_on(shared, "b", &fake, &["resume", &id]).await;
    assert!(!refused.status.success());
    let said = common::stderr(&refused);
    assert!(
        said.contains("host `a`") && said.contains("--move-here"),
        "{said}"
    );

    // Not while a's lease stands: a may be alive and about to go on.
    let on_b = shared.join("b-disk").join("repo");
    let out = output_on(
        shared,
        "b",
        &fake,
        &["resume", &id, "--move-here", on_b.to_str().unwrap()],
    )
    .await;
    assert!(!out.status.success());
    assert!(
        common::stderr(&out).contains("being driven"),
        "{}",
        common::stderr(&out)
    );
    assert!(!on_b.exists(), "a refused move leaves nothing behind");
    tokio::time::sleep(Duration::from_secs(3)).await;

    // A file is not a directory to move into: refused, and left as it was.
    let file = shared.join("a-file");
    std::fs::write(&file, "keep").unwrap();
    let out = output_on(
        shared,
        "b",
        &fake,
        &["resume", &id, "--move-here", file.to_str().unwrap()],
    )
    .await;
    assert!(!out.status.success());
    assert!(
        common::stderr(&out).contains("a-file"),
        "{}",
        common::stderr(&out)
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");

    // A directory with something in it is not overwritten.
    let occupied = shared.join("occupied");
    std::fs::create_dir_all(&occupied).unwrap();
    std::fs::write(occupied.join("keep.txt"), "precious").unwrap();
    let out = output_on(
        shared,
        "b",
        &fake,
        &["resume", &id, "--move-here", occupied.to_str().unwrap()],
    )
    .await;
    assert!(!out.status.success());
    assert!(
        common::stderr(&out).contains("not empty"),
        "{}",
        common::stderr(&out)
    );
    assert_eq!(
        std::fs::read_to_string(occupied.join("keep.txt")).unwrap(),
        "precious"
    );

    // Moved: b's new directory gets the last snapshot and the turn finishes there.
    let out = output_on(
        shared,
        "b",
        &fake,
        &[
            "resume",
            &id,
            "--move-here",
            on_b.to_str().unwrap(),
            "--json",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", common::stderr(&out));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["status"], "completed", "{result}");
    let tree = common::tree(&on_b);
    assert_eq!(tree["README"].0, b"mine second\n");
    // The repository came along whole: its history, and nothing uncommitted but what
    // the session made.
    assert_eq!(git(&on_b, &["log", "--format=%s"]), "commit 1\ncommit 0");
    git(&on_b, &["fsck", "--no-progress"]);
    assert_eq!(
        git(&on_b, &["status", "--porcelain"]),
        "?? big.bin\n?? job.log\n?? link\n?? src/"
    );
    assert_eq!(tree["src/a.txt"].0, b"one\n");
    assert_eq!(tree["big.bin"].0.len(), 300_000);
    assert_eq!(
        std::fs::read_link(on_b.join("link")).unwrap(),
        Path::new("src/a.txt")
    );
    // The cut-off command was rolled back and ran once, whole, on b.
    assert_eq!(tree["job.log"].0, b"start\nlate\n");
    assert_eq!(
        tree["big.bin"].0,
        std::fs::read(on_a.join("big.bin")).unwrap()
    );
    // The log says where it went; from now on it belongs to b, not a.
    let log = output_on(shared, "b", &fake, &["log", &id, "--json"]).await;
    let records: Vec<Value> = String::from_utf8_lossy(&log.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let moved: Vec<&Value> = records
        .iter()
        .filter(|r| kind(r) == "workspace_moved")
        .collect();
    assert_eq!(moved.len(), 1, "{records:?}");
    // Every model call the log records was asked once: none that a recorded before
    // the move was asked again on b (the interrupted command's own step is new: the
    // model is told it was rolled back).
    let asked = records
        .iter()
        .filter(|r| kind(r) == "model_call_intent")
        .count() as u64;
    assert_eq!(fake.calls(), asked);
    assert!(fake.calls() > calls_before);
    let moved = moved[0].to_string();
    assert!(
        moved.contains("b-disk/repo") && moved.contains("a-repo"),
        "{moved}"
    );
    let out = output_on(shared, "a", &fake, &["resume", &id]).await;
    let said = common::stderr(&out);
    assert!(!out.status.success() && said.contains("host `b`"), "{said}");
}

/// `serve` with one worker as host `host` (sharing the world file and blob
/// directory of `shared`, bwrap sandboxes), and its URL.
async fn serve_on(
    shared: &Path,
    host: &str,
    fake: &FakeProvider,
) -> (tokio::process::Child, String) {
    let mut child = on_host(
        shared,
        host,
        fake,
        &["serve", "--listen", "127.0.0.1:0", "--workers", "1"],
    )
    .env("STEADFAST_MODEL", "anthropic/claude-sonnet-4-5")
    .env("STEADFAST_SANDBOX", "bwrap")
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let url = common::printed_url(&mut child).await;
    (child, url)
}

async fn wait_idle(url: &str, id: &str, turns: u64) {
    common::wait_for("the turn to end", async || {
        let (_, shown) = common::call(
            reqwest::Method::GET,
            &format!("{url}/v1/sessions/{id}"),
            None,
        )
        .await;
        shown["status"] == "idle" && shown["turn"].as_u64().unwrap_or(0) >= turns
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_logical_workspace_is_at_one_path_in_the_sandbox_on_every_host() {
    let bash = |command: &str| json!({"text": "running", "tool_calls": [{"name": "bash", "input": {"command": command}}]});
    let script: Script = serde_json::from_value(json!({"steps": [
        bash("pwd > where.txt; echo hello > notes.txt; ln -s \"$PWD/notes.txt\" abs-link"),
        {"text": "one done"},
        bash("cat \"$(cat where.txt)/notes.txt\" > seen.txt && cat abs-link >> seen.txt && pwd >> seen.txt"),
        {"text": "two done"},
    ]}))
    .unwrap();
    let fake = FakeProvider::start(script).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path();

    // Turn one on host a.
    let (a, url) = serve_on(shared, "a", &fake).await;
    let (status, created) = common::call(
        reqwest::Method::POST,
        &format!("{url}/v1/sessions"),
        Some(json!({"task": "one", "workspace": {"kind": "empty"}})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    wait_idle(&url, &id, 1).await;
    drop(a);
    let on_a = common::workspace_in(&shared.join("a"), &created);
    assert_eq!(
        std::fs::read_to_string(on_a.join("where.txt")).unwrap(),
        "/workspace\n"
    );

    // Turn two on host b, whose copy of the workspace is elsewhere on its disk: what
    // turn one wrote down about where it worked still holds.
    let (_b, url) = serve_on(shared, "b", &fake).await;
    let sent = reqwest::Client::new()
        .post(format!("{url}/v1/sessions/{id}/messages"))
        .json(&json!({"text": "two"}))
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), 200);
    drop(sent);
    wait_idle(&url, &id, 2).await;
    let on_b = common::workspace_in(&shared.join("b"), &created);
    assert_ne!(on_a, on_b);
    assert_eq!(
        std::fs::read_to_string(on_b.join("seen.txt")).unwrap(),
        "hello\nhello\n/workspace\n"
    );
    assert_eq!(
        std::fs::read_link(on_b.join("abs-link")).unwrap(),
        Path::new("/workspace/notes.txt")
    );
}
