//! PostgreSQL benchmarks: fenced appends against bare inserts over the same pool, and
//! queue claims under competing workers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use steadfast_world::{Holder, InboundKind, PostgresWorld, World};

use super::bench::{median, tool_pair, Rounds};

const PAIRS_PER_SESSION: usize = 100;

/// Runs the PostgreSQL benchmarks against `world` (sessions are created under a
/// `bench_` prefix; a scratch table `steadfast_bench_bare` is created and dropped),
/// alternating the baseline and Steadfast for `rounds` rounds per concurrency.
pub(crate) async fn run(world: PostgresWorld, rounds: usize) -> anyhow::Result<()> {
    let world = Arc::new(world);
    let run_id = uuid_suffix();
    let rounds = rounds.max(5);
    {
        let client = world.pooled_connection().await?;
        client
            .batch_execute("CREATE TABLE IF NOT EXISTS steadfast_bench_bare (id BIGSERIAL PRIMARY KEY, body BYTEA NOT NULL)")
            .await?;
    }
    println!(
        "postgres journal: intent+outcome pairs, each append committed before its session's next (the baseline: each insert its own transaction), {rounds} alternating rounds of {PAIRS_PER_SESSION} pairs per session"
    );
    println!(
        "  {:>8} {:>16} {:>17} {:>7}   (medians; ratio: median of per-round ratios, target ≤ 1.5x)",
        "sessions", "bare pairs/s", "steadfast pairs/s", "ratio"
    );
    for concurrency in [1usize, 8, 32] {
        let mut timed = Rounds::default();
        let mut grouped = Vec::new();
        for round in 0..rounds {
            let bare = bare_inserts(&world, concurrency).await?;
            let prefix = format!("{run_id}_{concurrency}_{round}");
            let ours = fenced_appends(&world, &prefix, concurrency).await?;
            timed.push(bare, ours);
            grouped.push(appends_per_commit(&world, &prefix).await?);
        }
        let pairs = (concurrency * PAIRS_PER_SESSION) as f64;
        if concurrency == 1 {
            latency_line(timed.base(), timed.ours());
        }
        grouped.sort_by(f64::total_cmp);
        println!(
            "  {:>8} {:>16.0} {:>17.0} {:>6.2}x   ({:.1} appends per commit)",
            concurrency,
            pairs / timed.base().as_secs_f64(),
            pairs / timed.ours().as_secs_f64(),
            timed.ratio(),
            grouped[grouped.len() / 2]
        );
    }

    // Queue claims: 8 workers compete for 200 queued sessions.
    let queued = 200;
    for n in 0..queued {
        let session = format!("bench_{run_id}_q{n}");
        world.create_session(&session, "bench").await?;
        let lease = world
            .acquire_lease(&session, &Holder::new("bench"), Duration::from_secs(60))
            .await?;
        world.append(&lease, &[started()]).await?;
        world.release_lease(&lease).await?;
        world
            .post(&session, InboundKind::Message, "", &serde_json::json!("go"))
            .await?;
    }
    let mut tasks = Vec::new();
    for w in 0..8 {
        let world = world.clone();
        tasks.push(tokio::spawn(async move {
            let holder = Holder::new(format!("bench-worker-{w}"));
            let mut times = Vec::new();
            let mut claimed = Vec::new();
            let mut misses = 0;
            // A claim can miss while rivals hold the rows it would take (SKIP LOCKED);
            // a worker stops after a few misses in a row.
            while misses < 3 {
                let start = Instant::now();
                let lease = world.claim(&holder, Duration::from_secs(600)).await?;
                times.push(start.elapsed());
                match lease {
                    Some(l) => {
                        misses = 0;
                        claimed.push(l.session);
                    }
                    None => {
                        misses += 1;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            }
            anyhow::Ok((times, claimed))
        }));
    }
    let mut times = Vec::new();
    let mut claimed = Vec::new();
    for t in tasks {
        let (t, c) = t.await??;
        times.extend(t);
        claimed.extend(c);
    }
    let distinct: std::collections::HashSet<_> = claimed.iter().collect();
    assert_eq!(distinct.len(), claimed.len(), "no session claimed twice");
    assert!(claimed.len() >= queued, "every queued session was claimed");
    let mut sorted = times.clone();
    sorted.sort();
    println!(
        "postgres queue: 8 workers claiming {queued} queued sessions (FOR UPDATE SKIP LOCKED)"
    );
    println!(
        "  claim latency median {:.2} ms, p99 {:.2} ms",
        median(times).as_secs_f64() * 1e3,
        sorted[sorted.len() * 99 / 100].as_secs_f64() * 1e3
    );

    let client = world.pooled_connection().await?;
    client
        .batch_execute("DROP TABLE IF EXISTS steadfast_bench_bare")
        .await?;
    let pattern = format!("bench_{run_id}_%");
    client
        .execute(
            "DELETE FROM steadfast_sessions WHERE id LIKE $1",
            &[&pattern],
        )
        .await?;
    client
        .execute(
            "DELETE FROM steadfast_events WHERE session_id LIKE $1",
            &[&pattern],
        )
        .await?;
    Ok(())
}

/// The baseline: the same bytes as the journal's events, one INSERT per event, from
/// `concurrency` tasks at once, each insert on a connection taken from the same pool
/// the journal's appends take theirs from.
async fn bare_inserts(world: &Arc<PostgresWorld>, concurrency: usize) -> anyhow::Result<Duration> {
    let bodies: Arc<Vec<[Vec<u8>; 2]>> = Arc::new(
        (0..PAIRS_PER_SESSION)
            .map(|i| tool_pair(i).map(|e| serde_json::to_vec(&e).expect("serializes")))
            .collect(),
    );
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (world, bodies) = (world.clone(), bodies.clone());
        tasks.push(tokio::spawn(async move {
            for pair in bodies.iter() {
                for body in pair {
                    // A connection per insert, as each append takes one: with more
                    // sessions than the pool has connections, both share it alike.
                    let client = world.pooled_connection().await?;
                    let insert = client
                        .prepare_cached("INSERT INTO steadfast_bench_bare (body) VALUES ($1)")
                        .await?;
                    client.execute(&insert, &[body]).await?;
                }
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(start.elapsed())
}

/// Steadfast: `concurrency` sessions (created and leased before the clock starts),
/// each appending its intent+outcome pairs one fenced append at a time.
async fn fenced_appends(
    world: &Arc<PostgresWorld>,
    prefix: &str,
    concurrency: usize,
) -> anyhow::Result<Duration> {
    let mut leases = Vec::new();
    for n in 0..concurrency {
        let session = format!("bench_{prefix}_{n}");
        world.create_session(&session, "bench").await?;
        leases.push(
            world
                .acquire_lease(&session, &Holder::new("bench"), Duration::from_secs(600))
                .await?,
        );
    }
    let start = Instant::now();
    let mut tasks = Vec::new();
    for lease in leases {
        let world = world.clone();
        let events: Vec<[steadfast_log::Event; 2]> =
            (0..PAIRS_PER_SESSION).map(tool_pair).collect();
        tasks.push(tokio::spawn(async move {
            for [intent, outcome] in events {
                world.append(&lease, &[intent]).await?;
                world.append(&lease, &[outcome]).await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(start.elapsed())
}

/// How many appends each of a round's commits held on average (the group commit
/// puts several sessions' appends in one transaction when they queue): the round's
/// events against the distinct transactions that wrote them.
async fn appends_per_commit(world: &PostgresWorld, prefix: &str) -> anyhow::Result<f64> {
    let client = world.pooled_connection().await?;
    let row = client
        .query_one(
            "SELECT count(*), count(DISTINCT xmin::text) FROM steadfast_events WHERE session_id LIKE $1",
            &[&format!("bench_{prefix}_%")],
        )
        .await?;
    let (events, commits): (i64, i64) = (row.get(0), row.get(1));
    Ok(events as f64 / commits.max(1) as f64)
}

fn latency_line(bare: Duration, journal: Duration) {
    let per = |d: Duration| d.as_secs_f64() * 1e3 / (2 * PAIRS_PER_SESSION) as f64;
    println!(
        "  one session, mean latency per append: bare INSERT {:.2} ms, fenced append {:.2} ms",
        per(bare),
        per(journal)
    );
}

fn started() -> steadfast_log::Event {
    steadfast_log::Event::bare_start(
        "native",
        steadfast_log::ModelSpec {
            provider: "fake".into(),
            model: "m".into(),
        },
        "/w",
    )
}

fn uuid_suffix() -> String {
    format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    )
}
