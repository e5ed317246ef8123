//! The wrapped agents' tool journal on its own, over a real SQLite world, drive and
//! sandbox: parallel calls recorded out of order replay forward only, a new call runs
//! at the log's frontier, and a sandbox killed mid-call is recorded, the call resolved
//! and the sandbox replaced.

use std::path::PathBuf;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use serde_json::{json, Value};
use steadfast_drive::Drive;
use steadfast_journal::{Journal, MakeSandbox, SandboxSlot};
use steadfast_log::{Event, ModelSpec};
use steadfast_sandbox::{LocalSandbox, Sandbox, SandboxOptions};
use steadfast_world::{Blobs, Holder, Lease, LiveSession, SqliteWorld, World};

mod common;

use common::counter;

struct Setup {
    _dir: tempfile::TempDir,
    ws: PathBuf,
    world: SqliteWorld,
    lease: Lease,
    drive: Drive,
    blobs: Blobs,
    start: String,
}

/// A pi session with its first turn open, on a real SQLite world, drive and
/// local sandbox.
async fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("README.md"), "# project\n").unwrap();
    let drive = Drive::open(dir.path().join("drive")).unwrap();
    let blobs = Blobs::local(&dir.path().join("blobs")).unwrap();
    let start = drive.snapshot(&ws).unwrap();
    let world = SqliteWorld::open(dir.path().join("world.db")).unwrap();
    world.create_session("ses_t", "me").await.unwrap();
    let lease = world
        .acquire_lease("ses_t", &Holder::new("test"), Duration::from_secs(60))
        .await
        .unwrap();
    let opened = [
        Event::SessionStarted {
            agent: "pi".into(),
            agent_cli: None,
            model: ModelSpec {
                provider: "fake".into(),
                model: "m".into(),
            },
            workspace: ws.display().to_string(),
            host: None,
            system: "sys".into(),
            instructions: None,
            initial_snapshot: Some(start.clone()),
            created_at_ms: 0,
            budget_micro_usd: None,
            approve_external: false,
            approval: Vec::new(),
            limits: Default::default(),
            network: None,
            client_tools: Vec::new(),
            egress_credentials: Vec::new(),
            git: None,
            mcp_servers: Vec::new(),
            explorers: 0,
        },
        Event::UserMessage {
            turn: 1,
            text: "write".into(),
            inbox_id: None,
        },
    ];
    world.append(&lease, &opened).await.unwrap();
    Setup {
        _dir: dir,
        ws,
        world,
        lease,
        drive,
        blobs,
        start,
    }
}

/// One run of the agent over the log as it stands, the workspace at `at`, its tools
/// in local sandboxes.
async fn journal(s: &Setup, at: &str) -> Journal<SqliteWorld, LocalSandbox> {
    let ws = s.ws.clone();
    journal_with(
        s,
        at,
        Arc::new(move || LocalSandbox::new(&ws, SandboxOptions::default())),
    )
    .await
}

/// One run of the agent over the log as it stands, the workspace at `at`, its tools
/// in sandboxes `make` makes.
async fn journal_with<S: Sandbox>(
    s: &Setup,
    at: &str,
    make: MakeSandbox<S>,
) -> Journal<SqliteWorld, S> {
    s.drive.restore(&s.ws, at).unwrap();
    let live = Arc::new(
        LiveSession::open(s.world.clone(), s.lease.clone())
            .await
            .unwrap(),
    );
    Journal::new(
        live,
        s.drive.clone(),
        s.blobs.clone(),
        SandboxSlot::new(s.ws.clone(), make, s.drive.clone(), None),
        Arc::new(StdMutex::new(Some(at.to_string()))),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_killed_mid_call_is_recorded_the_call_resolved_and_replaced() {
    let s = setup().await;
    let pids = Arc::new(StdMutex::new(Vec::new()));
    let (ws, seen) = (s.ws.clone(), pids.clone());
    let options = SandboxOptions {
        agent: vec![
            env!("CARGO_BIN_EXE_steadfast").into(),
            "sandbox-agent".into(),
        ],
        ..SandboxOptions::default()
    };
    let make: MakeSandbox<steadfast_sandbox::BwrapSandbox> = Arc::new(move || {
        let sandbox = steadfast_sandbox::BwrapSandbox::new(&ws, &options)?;
        seen.lock().unwrap().push(sandbox.pid());
        Ok(sandbox)
    });
    let journal = journal_with(&s, &s.start, make).await;
    let log_file = s.ws.join("log.txt");
    let killer = async {
        for _ in 0..3000 {
            if log_file.exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(log_file.exists(), "the command ran");
        let pid = pids.lock().unwrap()[0];
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
    };
    let slow = bash("echo one >> log.txt; sleep 5");
    let (told, ()) = tokio::join!(journal.call("bash", &slow), killer);
    let (text, is_error) = told.unwrap();
    eprintln!("told: {text}");
    assert!(is_error);
    assert_eq!(text, steadfast_log::INTERRUPTED_ROLLED_BACK);
    assert!(!log_file.exists(), "the cut-off append was rolled back");
    // The next call runs in a new sandbox.
    let (text, is_error) = journal
        .call("bash", &bash("echo two >> log.txt"))
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    assert_eq!(std::fs::read_to_string(&log_file).unwrap(), "two\n");
    assert_eq!(pids.lock().unwrap().len(), 2, "a new sandbox was made");
    let log = s.world.read("ses_t", 1).await.unwrap();
    let kinds: Vec<&str> = log.iter().map(|r| r.event.kind()).collect();
    let lost = kinds
        .iter()
        .position(|k| *k == "sandbox_lost")
        .expect("recorded");
    assert_eq!(kinds[lost + 1], "tool_call_interrupted");
}

fn bash(command: &str) -> Value {
    json!({ "command": command })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_only_moves_the_workspace_forward_and_new_calls_run_at_the_frontier() {
    let s = setup().await;
    let slow = bash("sleep 2; echo a > a.txt");
    let quick = bash("echo b > b.txt");
    // The first run: two calls at once, the slow one asked a moment later (calls that
    // change the workspace take turns: the quick one runs, and is recorded, first).
    {
        let first = journal(&s, &s.start).await;
        let later = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            first.call("bash", &slow).await
        };
        let (a, b) = tokio::join!(later, first.call("bash", &quick));
        assert!(!a.unwrap().1 && !b.unwrap().1);
    }
    let state = LiveSession::open(s.world.clone(), s.lease.clone())
        .await
        .unwrap()
        .with(|s| s.wrapped_tools.clone());
    let recorded: Vec<(&Value, u32)> = state.iter().map(|t| (&t.input, t.result_order)).collect();
    assert_eq!(
        recorded,
        [(&quick, 1), (&slow, 2)],
        "the quick call's result came first"
    );

    // The agent started again asks in another order, slow one first: the workspace
    // goes to where the later result left it and stays there.
    let again = journal(&s, &s.start).await;
    assert!(!again.call("bash", &slow).await.unwrap().1);
    assert!(!again.call("bash", &quick).await.unwrap().1);
    assert_eq!(again.counters(), (2, 0), "both answered from the record");
    assert!(
        s.ws.join("a.txt").exists() && s.ws.join("b.txt").exists(),
        "the replay never went back to the quick call's earlier snapshot"
    );

    // A third run asks for only the quick one again, then something new: the new
    // call runs on the workspace every recorded call left, not the quick one's.
    let third = journal(&s, &s.start).await;
    assert!(!third.call("bash", &quick).await.unwrap().1);
    let (listing, failed) = third.call("bash", &bash("ls")).await.unwrap();
    assert!(!failed, "{listing}");
    assert!(
        listing.contains("a.txt") && listing.contains("b.txt"),
        "the new call ran at the frontier: {listing}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_snapshot_before_takes_too_long_never_runs_and_the_agent_is_told() {
    let s = setup().await;
    // A workspace of many files, and a drive on this host that has not seen it yet:
    // its first snapshot reads every file, which no deadline of zero allows.
    for d in 0..20 {
        let dir = s.ws.join(format!("d{d}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..100 {
            std::fs::write(dir.join(format!("f{f}")), format!("{d} {f}\n")).unwrap();
        }
    }
    let cold = Drive::open(s._dir.path().join("drive")).unwrap();
    let same_drive = cold.clone();
    let live = Arc::new(
        LiveSession::open(s.world.clone(), s.lease.clone())
            .await
            .unwrap(),
    );
    let ws = s.ws.clone();
    let journal = Journal::new(
        live,
        cold.clone(),
        s.blobs.clone(),
        SandboxSlot::new(
            s.ws.clone(),
            Arc::new(move || LocalSandbox::new(&ws, SandboxOptions::default())),
            cold.clone(),
            None,
        ),
        Arc::new(StdMutex::new(Some(s.start.clone()))),
    )
    .with_snapshot_timeout(Duration::ZERO);
    let (told, is_error) = journal
        .call("bash", &bash("echo ran > ran.txt"))
        .await
        .unwrap();
    assert!(is_error && told.contains("did not run"), "{told}");
    assert!(!s.ws.join("ran.txt").exists(), "nothing ran");
    // Recorded as begun and answered at once: its one outcome is the error the agent
    // was told, with no snapshot on either side.
    let log = s.world.read("ses_t", 1).await.unwrap();
    let kinds: Vec<&str> = log.iter().map(|r| r.event.kind()).collect();
    let intent = kinds.iter().position(|k| *k == "tool_call_intent").unwrap();
    assert_eq!(kinds[intent + 1], "tool_call_outcome", "{kinds:?}");
    match (&log[intent].event, &log[intent + 1].event) {
        (
            Event::ToolCallIntent {
                snapshot_before: None,
                ..
            },
            Event::ToolCallOutcome {
                is_error: true,
                snapshot_after: None,
                ..
            },
        ) => {}
        other => panic!("{other:?}"),
    }
    // The abandoned snapshot goes on in the background, holding the workspace: one
    // more waits for it, so the test's directory is not removed under it.
    let ws = s.ws.clone();
    tokio::task::spawn_blocking(move || same_drive.snapshot(&ws))
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrapped_call_cut_off_after_it_sent_a_request_is_outcome_unknown() {
    use steadfast_sandbox::egress::{EgressDesk, RecordEgress};
    let s = setup().await;
    let (port, hits) = counter();
    // Python's urllib: the classifier takes it for a mutation.
    let command = format!(
        "python3 -c \"import urllib.request as u; u.urlopen(u.Request('http://localhost:{port}/deploy', data=b'go'))\" && sleep 60"
    );
    assert_eq!(
        steadfast_sandbox::classify("bash", &bash(&command)),
        steadfast_log::ToolClass::Mutate
    );
    let live = Arc::new(
        LiveSession::open(s.world.clone(), s.lease.clone())
            .await
            .unwrap(),
    );
    let desk = EgressDesk::new();
    let record: RecordEgress = {
        let live = live.clone();
        Arc::new(move |event| {
            let live = live.clone();
            Box::pin(async move { live.append(&[event]).await.is_ok() })
        })
    };
    let options = SandboxOptions {
        agent: vec![
            env!("CARGO_BIN_EXE_steadfast").into(),
            "sandbox-agent".into(),
        ],
        network: steadfast_sandbox::NetworkPolicy::parse(&format!("allow:localhost:{port}"))
            .unwrap(),
        internal_hosts: vec![
            steadfast_sandbox::HostRule::parse(&format!("localhost:{port}")).unwrap(),
        ],
        egress_watch: Some(desk.watch(record)),
        ..SandboxOptions::default()
    };
    let ws = s.ws.clone();
    let make: MakeSandbox<steadfast_sandbox::BwrapSandbox> =
        Arc::new(move || steadfast_sandbox::BwrapSandbox::new(&ws, &options));
    let journal = Journal::new(
        live,
        s.drive.clone(),
        s.blobs.clone(),
        SandboxSlot::new(s.ws.clone(), make.clone(), s.drive.clone(), None),
        Arc::new(StdMutex::new(Some(s.start.clone()))),
    )
    .with_egress(desk);
    // The agent's process dies while the command runs, its request already made: the
    // call is cut off with no outcome, and its sandbox goes with it.
    let call = tokio::spawn(async move { journal.call("bash", &bash(&command)).await });
    for _ in 0..600 {
        if hits.load(std::sync::atomic::Ordering::SeqCst) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        hits.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the request was sent"
    );
    call.abort();
    let _ = call.await;

    let state = LiveSession::open(s.world.clone(), s.lease.clone())
        .await
        .unwrap()
        .state();
    let cut_off = &state.wrapped_tools[0];
    assert!(cut_off.result.is_none(), "no outcome was recorded");
    assert_eq!(cut_off.egress, [format!("localhost:{port}")]);
    steadfast_journal::resolve_cut_off(
        &LiveSession::open(s.world.clone(), s.lease.clone())
            .await
            .unwrap(),
        &s.drive,
        &state.wrapped_tools,
        state.last_snapshot.clone(),
        &[],
        None,
        &SandboxSlot::new(s.ws.clone(), make, s.drive.clone(), None),
    )
    .await
    .unwrap();
    let log = s.world.read("ses_t", 1).await.unwrap();
    let resolution = log
        .iter()
        .find_map(|r| match &r.event {
            Event::ToolCallInterrupted { resolution, .. } => Some(resolution.clone()),
            _ => None,
        })
        .expect("resolved");
    assert_eq!(resolution, steadfast_log::ToolResolution::OutcomeUnknown);
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1);
}
