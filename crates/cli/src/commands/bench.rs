//! `steadfast bench`: the journal and wake costs, as ratios against baselines
//! measured in the same run on the same machine.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use serde_json::json;
use steadfast_log::{Event, Output, ToolClass};
use steadfast_world::{Holder, SqliteWorld, World};

/// Which benchmark to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Which {
    /// Intent+outcome append against a bare SQLite insert of the same bytes.
    #[value(alias = "sqlite")]
    Journal,
    /// Taking a session of 1k, 10k and 100k events up: a full fold against the latest
    /// checkpoint and what follows it.
    Wake,
    /// SIGKILL of the driving worker to the next event by another worker.
    Recovery,
    /// SSE events per second to 100 concurrent readers of one session.
    Fanout,
    /// PostgreSQL appends (1, 8, 32 sessions) against bare inserts, and queue claims
    /// under 8 workers; needs `--world postgres://...`.
    Postgres,
    /// bwrap sandbox provisioning (cold and after an idle stop, hydrating 1,000 files)
    /// and per-command overhead, against the local backend.
    Sandbox,
    /// Added latency and time-to-first-byte of the gateway against calling the
    /// provider directly.
    Gateway,
    /// Per-step durable overhead at steps 100, 1,000 and 10,000 of one native session
    /// (beyond the model's and the tool's own time).
    Steps,
    /// Workspace snapshots of a 20,000-file tree (0, 10 and 1,000 files changed)
    /// against `git add -A && git write-tree`, and the bytes each stores; with
    /// `--blobs s3://...`, the drive in that store, and hydrating the tree on a cold
    /// host and on a warm one against `git clone` from a local bare repository.
    Drive,
    /// Listing one owner's sessions among 100,000 (a page, a label filter, a deep
    /// page) against reading them all; on PostgreSQL too with `--world postgres://...`.
    Sessions,
    /// Forking a session of 1k, 10k and 100k events against copying its log rows and
    /// its 20,000-file workspace.
    Fork,
    /// Opening a session's page in the web console at 1k and 50k events.
    Console,
    /// All of them.
    All,
}

/// Arguments of `steadfast bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// What to measure.
    #[arg(value_enum, default_value = "all")]
    which: Which,
    /// Intent+outcome pairs to append per round (journal).
    #[arg(long, default_value_t = 100)]
    pairs: usize,
    /// Events in the session to wake (default: 1,000, 10,000 and 100,000 in turn).
    #[arg(long)]
    events: Option<usize>,
    /// Rounds: worker kills to time (recovery), alternating baseline/Steadfast
    /// rounds (journal, postgres, sandbox), calls of each kind (gateway, at least 20).
    #[arg(long, default_value_t = 7)]
    rounds: usize,
    /// Worker processes for `recovery`, each seeing the others as other hosts
    /// (2 or more: a dead holder is found through the database, as across machines).
    #[arg(long, default_value_t = 1)]
    hosts: usize,
    /// Steps of the session `steps` runs.
    #[arg(long, default_value_t = 10_050)]
    steps: u32,
    /// Concurrent stream readers.
    #[arg(long, default_value_t = 100)]
    readers: usize,
}

pub(crate) fn tool_pair(i: usize) -> [Event; 2] {
    let id = format!("toolu_{i}");
    [
        Event::ToolCallIntent {
            call_id: id.clone(),
            tool: "bash".into(),
            input: json!({"command": format!("cargo test --package steadfast-{i}")}),
            class: ToolClass::Mutate,
            snapshot_before: Some(blake3::hash(&i.to_le_bytes()).to_hex().to_string()),
        },
        Event::ToolCallOutcome {
            call_id: id,
            is_error: false,
            exit_code: Some(0),
            output: Output::Inline {
                text: "test result: ok. 12 passed; 0 failed\n".repeat(8),
            },
            snapshot_after: Some(blake3::hash(&(i + 1).to_le_bytes()).to_hex().to_string()),
            stored_bytes: 0,
        },
    ]
}

pub(crate) use super::bench_rounds::{median, Rounds};

async fn journal(pairs: usize, rounds: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let world = SqliteWorld::open(dir.path().join("world.db"))?;
    world.create_session("bench", "bench").await?;
    let lease = world
        .acquire_lease("bench", &Holder::new("bench"), Duration::from_secs(3600))
        .await?;
    // Baseline: the same bytes, two committed inserts per pair, same file settings.
    let bare = rusqlite::Connection::open(dir.path().join("bare.db"))?;
    bare.pragma_update(None, "journal_mode", "WAL")?;
    bare.pragma_update(None, "synchronous", "FULL")?;
    bare.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")?;
    let mut timed = Rounds::default();
    for round in 0..rounds.max(1) {
        let events: Vec<[Event; 2]> = (round * pairs..(round + 1) * pairs)
            .map(tool_pair)
            .collect();
        let bodies: Vec<[Vec<u8>; 2]> = events
            .iter()
            .map(|pair| {
                pair.clone()
                    .map(|e| serde_json::to_vec(&e).expect("serializes"))
            })
            .collect();
        let start = Instant::now();
        // In a block of its own: no statement may be held across an await (the bench
        // runs on the runtime's workers, which need a `Send` future).
        {
            let mut insert = bare.prepare_cached("INSERT INTO t (body) VALUES (?1)")?;
            for pair in &bodies {
                for body in pair {
                    insert.execute([body])?;
                }
            }
        }
        let bare_time = start.elapsed();
        let start = Instant::now();
        for [intent, outcome] in events {
            world.append(&lease, &[intent]).await?;
            world.append(&lease, &[outcome]).await?;
        }
        timed.push(bare_time, start.elapsed());
    }
    let per = |d: Duration| d.as_micros() as f64 / pairs as f64;
    println!(
        "journal: intent+outcome pairs on SQLite, each append durable (WAL + synchronous=FULL), {} alternating rounds of {pairs}",
        timed.len()
    );
    println!(
        "  bare SQLite inserts of the same bytes: {:>9.1} µs/pair (median)",
        per(timed.base())
    );
    println!(
        "  steadfast fenced append (checksummed): {:>9.1} µs/pair (median)",
        per(timed.ours())
    );
    println!(
        "  ratio: {:.2}x, median of per-round ratios (target ≤ 1.5x)",
        timed.ratio()
    );
    Ok(())
}

pub async fn run(args: BenchArgs, config: &crate::config::Config) -> anyhow::Result<ExitCode> {
    let world = config.world.as_deref();
    if cfg!(debug_assertions) {
        eprintln!("note: this is a debug build; use `cargo run --release -p steadfast-cli -- bench` for real numbers");
    }
    if matches!(args.which, Which::Journal | Which::All) {
        journal(args.pairs, args.rounds).await?;
    }
    if matches!(args.which, Which::Wake | Which::All) {
        let sizes = match args.events {
            Some(n) => vec![n],
            None => vec![1_000, 10_000, 100_000],
        };
        super::bench_wake::run(&sizes).await?;
    }
    if matches!(args.which, Which::Fork | Which::All) {
        let sizes = match args.events {
            Some(n) => vec![n],
            None => vec![1_000, 10_000, 100_000],
        };
        super::bench_fork::run(&sizes, args.rounds).await?;
    }
    if matches!(args.which, Which::Console | Which::All) {
        let sizes = match args.events {
            Some(n) => vec![1_000, n],
            None => vec![1_000, 50_000],
        };
        super::bench_console::run(&sizes, args.rounds.max(7)).await?;
    }
    if matches!(args.which, Which::Steps | Which::All) {
        super::bench_steps::run(world, args.steps).await?;
    }
    if matches!(args.which, Which::Drive | Which::All) {
        super::bench_drive::run(args.rounds, config.blobs.clone()).await?;
    }
    if matches!(args.which, Which::Recovery | Which::All) {
        super::bench_server::recovery(args.rounds, world, config.blobs.as_deref(), args.hosts)
            .await?;
    }
    if matches!(args.which, Which::Fanout | Which::All) {
        super::bench_server::fanout(args.readers).await?;
    }
    if matches!(args.which, Which::Gateway | Which::All) {
        super::bench_gateway::run(args.rounds.max(20)).await?;
    }
    if matches!(args.which, Which::Sandbox | Which::All) {
        match steadfast_sandbox::bwrap_available() {
            Ok(()) => super::bench_sandbox::run(args.rounds).await?,
            Err(e) if args.which == Which::Sandbox => anyhow::bail!("{e}"),
            Err(e) => eprintln!("(sandbox benchmark skipped: {e})"),
        }
    }
    if matches!(args.which, Which::Sessions | Which::All) {
        let postgres = match world.filter(|w| w.starts_with("postgres")) {
            Some(url) => Some(steadfast_world::PostgresWorld::connect_and_migrate(url).await?),
            None => None,
        };
        super::bench_sessions::run(postgres, args.rounds).await?;
    }
    if matches!(args.which, Which::Postgres | Which::All) {
        match world.filter(|w| w.starts_with("postgres")) {
            Some(url) => {
                super::bench_pg::run(
                    steadfast_world::PostgresWorld::connect_and_migrate(url).await?,
                    args.rounds,
                )
                .await?
            }
            None if args.which == Which::Postgres => {
                anyhow::bail!("the postgres benchmark needs --world postgres://... (a database it may write to)")
            }
            None => eprintln!("(postgres benchmark skipped: no --world postgres://... given)"),
        }
    }
    Ok(ExitCode::SUCCESS)
}
