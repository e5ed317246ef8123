//! Benchmarks of the server side: worker recovery and stream fan-out.

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::json;
use steadfast_harness::{Harness, HarnessOptions, NewSession};
use steadfast_log::{Block, Event, ToolUse, Usage};
use steadfast_server::{app, Auth, ServerState};
use steadfast_testkit::{FakeProvider, Script};
use steadfast_world::{AnyWorld, Holder, World};

use super::bench::{median, tool_pair};

/// A worker process over `home`, `world` (the embedded SQLite world if `None`) and
/// the blob store `blobs`; with `host`, it takes that host identity, so it and its
/// siblings see one another as processes on other machines.
fn spawn_worker(
    home: &std::path::Path,
    world: Option<&str>,
    blobs: &str,
    host: Option<String>,
    fake: &FakeProvider,
) -> anyhow::Result<std::process::Child> {
    let mut command = std::process::Command::new(std::env::current_exe()?);
    command
        .arg("worker")
        .env("STEADFAST_HOME", home)
        .env("STEADFAST_BLOBS", blobs)
        .env("ANTHROPIC_API_KEY", "bench")
        .env("ANTHROPIC_BASE_URL", fake.base_url())
        .env_remove("STEADFAST_WORLD")
        .env_remove(steadfast_world::HOST_ID_ENV)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(world) = world {
        command.env("STEADFAST_WORLD", world);
    }
    if let Some(host) = host {
        command.env(steadfast_world::HOST_ID_ENV, host);
    }
    Ok(command.spawn()?)
}

/// The process holding a session's lease, and the lease's epoch.
async fn driver(
    world: &AnyWorld,
    home: &std::path::Path,
    id: &str,
) -> anyhow::Result<(Option<u32>, u64)> {
    match world {
        AnyWorld::Sqlite(_) => {
            let conn = rusqlite::Connection::open(home.join("world.db"))?;
            let (pid, epoch): (Option<i64>, i64) = conn.query_row(
                "SELECT lease_pid, lease_epoch FROM sessions WHERE id = ?1",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )?;
            Ok((pid.map(|p| p as u32), epoch as u64))
        }
        AnyWorld::Postgres(pg) => {
            let row = pg
                .pooled_connection()
                .await?
                .query_one(
                    "SELECT lease_pid, lease_epoch FROM steadfast_sessions WHERE id = $1",
                    &[&id],
                )
                .await?;
            Ok((
                row.get::<_, Option<i32>>(0).map(|p| p as u32),
                row.get::<_, i64>(1) as u64,
            ))
        }
    }
}

/// Median time from SIGKILL of the worker driving a turn to the next event of that
/// session written by another worker. With `hosts` of 2 or more, each worker process
/// has its own host identity, so a dead holder can only be found as another machine's
/// would be: through the database (PostgreSQL sees its connection close), and its
/// own home (disk): sessions' workspaces are logical, materialized from the drive in
/// the shared blob store (`blobs`, else a directory all hosts are given).
pub(crate) async fn recovery(
    rounds: usize,
    world: Option<&str>,
    blobs: Option<&str>,
    hosts: usize,
) -> anyhow::Result<()> {
    let postgres = world.filter(|w| w.starts_with("postgres"));
    if hosts > 1 && postgres.is_none() {
        anyhow::bail!("recovery across hosts needs --world postgres://... (the embedded SQLite world is one machine's)");
    }
    let text = "streaming slowly ".repeat(40);
    let step = json!({"text": text, "chunk_delay_ms": 50, "tool_calls": [{"name": "bash", "input": {"command": "true"}}]});
    let last = json!({"text": "done"});
    let script: Script = serde_json::from_value(json!({"steps": [step.clone(), step, last]}))?;
    let fake = FakeProvider::start(script).await?;
    let dir = tempfile::tempdir()?;
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home)?;
    let shared = dir.path().join("shared-blobs").display().to_string();
    let blobs_url = blobs.unwrap_or(&shared).to_string();
    let blobs = steadfast_world::Blobs::open(&blobs_url)?;
    let any = AnyWorld::open(postgres, &home, true)
        .await?
        .with_spill(blobs.clone());
    let harness = Harness::with_world_and_blobs(
        &home,
        any.clone(),
        blobs,
        HarnessOptions::fake_provider(&fake.base_url()),
    )?;
    let workers_n = hosts.max(2);
    let host = |i: usize| (hosts > 1).then(|| format!("bench-host-{i}"));
    // Each host its own disk; workers of one host share its home.
    let home_of = |i: usize| match hosts > 1 {
        true => dir.path().join(format!("bench-host-{i}")),
        false => home.clone(),
    };
    let spawn = |i: usize| spawn_worker(&home_of(i), postgres, &blobs_url, host(i), &fake);
    let mut workers = (0..workers_n)
        .map(spawn)
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut times = Vec::new();
    let mut sessions = Vec::new();
    for round in 0..rounds {
        let workspace_id = steadfast_harness::new_workspace_id();
        let ws = harness.workspace_dir_of(&workspace_id)?;
        std::fs::create_dir_all(&ws)?;
        std::fs::write(ws.join("round.txt"), format!("round {round}\n"))?;
        let mut new = NewSession::native("anthropic/claude-sonnet-4-5", &ws).with_task("go");
        new.workspace_id = Some(workspace_id);
        let id = harness.start_session(new).await?;
        sessions.push(id.clone());
        // Wait until a worker is streaming a reply.
        let (pid, epoch, seq) = loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let summary = harness.world().session(&id).await?;
            let log = harness.world().read(&id, summary.last_seq.max(1)).await?;
            let streaming = log.last().is_some_and(|r| r.event.kind() == "model_delta");
            let (pid, epoch) = driver(&any, &home, &id).await?;
            if let Some(pid) = pid.filter(|p| streaming && *p != std::process::id()) {
                break (pid, epoch, summary.last_seq);
            }
        };
        let Some(index) = workers.iter().position(|w| w.id() == pid) else {
            anyhow::bail!("the driving process {pid} is not one of the bench's workers");
        };
        let killed_at = Instant::now();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )?;
        loop {
            let next = harness.world().read(&id, seq + 1).await?;
            if next.iter().any(|r| r.epoch > epoch) {
                times.push(killed_at.elapsed());
                break;
            }
            if killed_at.elapsed() > Duration::from_secs(60) {
                anyhow::bail!("no worker took the session over within a minute");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let _ = workers[index].wait();
        workers[index] = spawn(index)?;
        // Let the session finish, so the workers are free for the next round.
        while harness.world().session(&id).await?.status == steadfast_log::Status::Running {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    for w in &mut workers {
        let _ = w.kill();
        let _ = w.wait();
    }
    for id in &sessions {
        let _ = harness.world().delete_session(id).await;
    }
    let mut sorted = times.clone();
    sorted.sort();
    let place = match (postgres, hosts > 1) {
        (Some(_), true) => format!(
            "{workers_n} workers as {workers_n} hosts with their own homes, PostgreSQL, blobs and drive in {blobs_url}"
        ),
        (Some(_), false) => format!("{workers_n} workers on one host, PostgreSQL"),
        _ => format!("{workers_n} workers on one host, SQLite"),
    };
    println!(
        "recovery: SIGKILL of the driving worker to the next event by another ({rounds} kills; {place})"
    );
    println!(
        "  median {:.0} ms, min {:.0} ms, max {:.0} ms (target: median < 1000 ms)",
        median(times).as_secs_f64() * 1e3,
        sorted[0].as_secs_f64() * 1e3,
        sorted[sorted.len() - 1].as_secs_f64() * 1e3
    );
    Ok(())
}

/// Events per second delivered to many concurrent readers of one session's stream,
/// against one reader alone.
/// The API over `harness`, with no auth (every caller is `local`), on a loopback port:
/// its URL, and the task serving it.
pub(super) async fn local_api(
    harness: Arc<Harness>,
    dir: &std::path::Path,
) -> anyhow::Result<(String, tokio::task::JoinHandle<std::io::Result<()>>)> {
    let state = ServerState::new(
        harness,
        Auth::new(&[], false, None).map_err(anyhow::Error::msg)?,
        dir.join("ws"),
        "fake/m".into(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let server = tokio::spawn(async move { axum::serve(listener, app(state)).await });
    Ok((url, server))
}

pub(crate) async fn fanout(readers: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let home = dir.path().join("home");
    let harness = Arc::new(Harness::open_local(
        &home,
        HarnessOptions::fake_provider("http://127.0.0.1:9"),
    )?);
    let world = harness.world().clone();
    world.create_session("fan", "local").await?;
    let lease = world
        .acquire_lease("fan", &Holder::new("bench"), Duration::from_secs(600))
        .await?;
    let mut log = vec![
        Event::bare_start(
            "native",
            steadfast_log::ModelSpec {
                provider: "fake".into(),
                model: "m".into(),
            },
            "/w",
        ),
        Event::UserMessage {
            turn: 1,
            text: "go".into(),
            inbox_id: None,
        },
    ];
    for i in 0..500 {
        let call = ToolUse {
            id: format!("toolu_{i}"),
            name: "bash".into(),
            input: json!({"command": "true"}),
        };
        log.push(Event::ModelCallIntent {
            call_id: format!("mc_{i}"),
            step: i + 1,
            fingerprint: "f".into(),
        });
        log.push(Event::ModelDelta {
            call_id: format!("mc_{i}"),
            text: "thinking... ".repeat(8),
            restart: false,
        });
        log.push(Event::ModelCallOutcome {
            call_id: format!("mc_{i}"),
            content: vec![Block::Text { text: "ok".into() }, Block::ToolUse(call)],
            stop_reason: "tool_use".into(),
            usage: Usage::default(),
            cost_micro_usd: 0,
        });
        log.extend(tool_pair(i as usize));
    }
    for chunk in log.chunks(500) {
        world.append(&lease, chunk).await?;
    }
    world
        .append(
            &lease,
            &[Event::SessionEnded {
                state: steadfast_log::EndState::Completed,
                reason: "bench".into(),
                diff: vec![],
            }],
        )
        .await?;
    let total = world.session("fan").await?.last_seq as usize;

    let (api, server) = local_api(harness, dir.path()).await?;
    let url = format!("{api}/v1/sessions/fan/events");

    let read_all = |url: String| async move {
        let resp = reqwest::get(url).await?;
        let mut stream = eventsource_stream::Eventsource::eventsource(resp.bytes_stream());
        let mut n = 0usize;
        while let Some(ev) = stream.next().await {
            if ev?.event == "end" {
                break;
            }
            n += 1;
        }
        anyhow::Ok(n)
    };
    let start = Instant::now();
    assert_eq!(read_all(url.clone()).await?, total);
    let one = start.elapsed();
    let start = Instant::now();
    let tasks: Vec<_> = (0..readers)
        .map(|_| tokio::spawn(read_all(url.clone())))
        .collect();
    for t in tasks {
        assert_eq!(t.await??, total);
    }
    let many = start.elapsed();
    server.abort();
    let rate = |n: usize, d: Duration| n as f64 / d.as_secs_f64();
    println!("fan-out: a {total}-event session streamed over SSE");
    println!("  1 reader:    {:>10.0} events/s", rate(total, one));
    println!(
        "  {readers} readers: {:>10.0} events/s in all",
        rate(total * readers, many)
    );
    println!(
        "  ratio: {:.1}x the single reader's throughput",
        rate(total * readers, many) / rate(total, one)
    );
    Ok(())
}
