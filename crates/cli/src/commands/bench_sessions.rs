//! Listing sessions among 100,000: a page of one owner's, a label-filtered page and a
//! page deep in the listing, against reading every session and filtering in memory
//! (what `GET /v1/sessions` did before it was paged).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use steadfast_world::{SessionQuery, SqliteWorld, World};

use super::bench_rounds::Rounds;

/// Sessions in the world.
const SESSIONS: usize = 100_000;
/// Owners they are spread over.
const OWNERS: usize = 100;
/// Sessions a page holds.
const PAGE: usize = 100;

/// Runs the listing benchmark on a fresh SQLite world, and on `postgres` (sessions
/// made under a `bench_` prefix and deleted after) if given.
pub(crate) async fn run(
    postgres: Option<steadfast_world::PostgresWorld>,
    rounds: usize,
) -> anyhow::Result<()> {
    let rounds = rounds.max(5);
    println!(
        "session listing: {SESSIONS} sessions over {OWNERS} owners, pages of {PAGE}; the baseline reads every session and filters in memory; {rounds} alternating rounds, each timed call after an untimed one of its kind"
    );
    println!(
        "  {:<10} {:<28} {:>12} {:>12} {:>8}",
        "world", "page", "all rows", "steadfast", "ratio"
    );
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("world.db");
    let world = SqliteWorld::open(&path)?;
    fill_sqlite(&path, "bench")?;
    compare("sqlite", &world, "bench", rounds).await?;
    if let Some(pg) = postgres {
        let prefix = format!("bench_{}", std::process::id());
        fill_postgres(&pg, &prefix).await?;
        let compared = compare("postgres", &pg, &prefix, rounds).await;
        let client = pg.pooled_connection().await?;
        client
            .execute(
                "DELETE FROM steadfast_sessions WHERE left(owner, length($1) + 2) = $1 || '_o'",
                &[&prefix],
            )
            .await?;
        compared?;
    }
    Ok(())
}

/// The owner a session belongs to, and its labels: every tenth is `team=infra`.
fn owner_of(prefix: &str, i: usize) -> String {
    format!("{prefix}_o{}", i % OWNERS)
}

fn fill_sqlite(path: &std::path::Path, prefix: &str) -> anyhow::Result<()> {
    let mut conn = rusqlite::Connection::open(path)?;
    let tx = conn.transaction()?;
    {
        let mut insert = tx.prepare(
            "INSERT INTO sessions (id, owner, created_at_ms, updated_at_ms, status, title, agent, labels) \
             VALUES (?1, ?2, ?3, ?3, 'idle', ?4, 'native', ?5)",
        )?;
        for i in 0..SESSIONS {
            let labels = if (i / OWNERS).is_multiple_of(10) {
                r#"{"team":"infra"}"#
            } else {
                r#"{"team":"web"}"#
            };
            insert.execute(rusqlite::params![
                format!("ses_{i:08}"),
                owner_of(prefix, i),
                1_700_000_000_000i64 + i as i64,
                format!("task number {i}"),
                labels
            ])?;
        }
    }
    tx.commit()?;
    // Into the database file, as SQLite's own checkpoints would put them over time,
    // rather than read back from a 20 MB write-ahead log by every query.
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    Ok(())
}

async fn fill_postgres(pg: &steadfast_world::PostgresWorld, prefix: &str) -> anyhow::Result<()> {
    let client = pg.pooled_connection().await?;
    client
        .execute(
            "INSERT INTO steadfast_sessions (id, owner, created_at_ms, updated_at_ms, status, title, agent, labels) \
             SELECT $1 || '_ses_' || lpad(i::text, 8, '0'), $1 || '_o' || (i % $2::bigint), 1700000000000 + i, 1700000000000 + i, \
                    'idle', 'task number ' || i, 'native', \
                    CASE WHEN (i / $2::bigint) % 10 = 0 THEN '{\"team\":\"infra\"}'::jsonb ELSE '{\"team\":\"web\"}'::jsonb END \
               FROM generate_series(0::bigint, $3::bigint - 1) AS i",
            &[&prefix, &(OWNERS as i64), &(SESSIONS as i64)],
        )
        .await?;
    client.batch_execute("ANALYZE steadfast_sessions").await?;
    Ok(())
}

/// Times each page against the baseline that answers the same question.
async fn compare<W: World>(
    name: &str,
    world: &W,
    prefix: &str,
    rounds: usize,
) -> anyhow::Result<()> {
    let owner = owner_of(prefix, 7);
    let infra = BTreeMap::from([("team".to_string(), "infra".to_string())]);
    let first = SessionQuery {
        owner: Some(owner.clone()),
        limit: Some(PAGE),
        ..Default::default()
    };
    let labelled = SessionQuery {
        labels: infra.clone(),
        ..first.clone()
    };
    // The cursor of the ninth page, so the measured one is the tenth.
    let mut deep = first.clone();
    for _ in 0..9 {
        deep.after = world.list_sessions(&deep).await?.next;
    }
    let cases: [(&str, &SessionQuery, usize); 3] = [
        ("first page of one owner", &first, 0),
        ("label team=infra", &labelled, 0),
        ("tenth page (cursor)", &deep, 9 * PAGE),
    ];
    for (label, query, skip) in cases {
        let mut timed = Rounds::default();
        for _ in 0..rounds {
            // Each timed call follows an untimed one of its own kind, so neither is
            // timed on a cache the other's reads just evicted (the full read evicts
            // SQLite's whole page cache).
            world.list_sessions(&SessionQuery::default()).await?;
            let started = Instant::now();
            let everything = world.list_sessions(&SessionQuery::default()).await?;
            let by_hand: Vec<_> = everything
                .sessions
                .into_iter()
                .filter(|s| s.owner == owner)
                .filter(|s| query.labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
                .skip(skip)
                .take(PAGE)
                .collect();
            let base = started.elapsed();
            world.list_sessions(query).await?;
            let started = Instant::now();
            let page = world.list_sessions(query).await?;
            let ours = started.elapsed();
            anyhow::ensure!(
                page.sessions == by_hand,
                "{name} {label}: the page differs from the filtered full list"
            );
            timed.push(base, ours);
        }
        println!(
            "  {:<10} {:<28} {:>9.2} ms {:>9.2} ms {:>7.3}x",
            name,
            label,
            ms(timed.base()),
            ms(timed.ours()),
            timed.ratio()
        );
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
