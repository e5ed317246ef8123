//! `steadfast bench fork`: forking a session at its latest position, at 1k, 10k and
//! 100k events, alternated with what a fork that copies would pay: the log's rows
//! copied under a new id, and the workspace (20,000 files) copied with
//! `cp --reflink=auto -a`.
//!
//! A fork names the part of the parent's log it shares and the snapshot by content,
//! and folds only from the latest checkpoint before the fork point (to know where the
//! fork stands), so neither the history's length nor the workspace's size enters.

use std::path::Path;
use std::time::{Duration, Instant};

use steadfast_harness::{ForkRequest, Harness, HarnessOptions};

use super::bench_rounds::Rounds;

/// Copies every row of session `bench` under the id `to`, in one transaction.
fn copy_rows(conn: &mut rusqlite::Connection, to: &str) -> anyhow::Result<usize> {
    let tx = conn.transaction()?;
    let copied = tx.execute(
        "INSERT INTO events (session_id, seq, epoch, at_ms, schema, kind, body, checksum, blob) \
         SELECT ?1, seq, epoch, at_ms, schema, kind, body, checksum, blob FROM events WHERE session_id = 'bench'",
        [to],
    )?;
    tx.commit()?;
    Ok(copied)
}

fn cp(from: &Path, to: &Path) -> anyhow::Result<()> {
    let status = std::process::Command::new("cp")
        .arg("--reflink=auto")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()?;
    anyhow::ensure!(status.success(), "cp failed");
    Ok(())
}

/// Median times of `rounds` alternating rounds for a session of about `events`:
/// (events, rows copied, cp, fork).
async fn measure(
    events: usize,
    rounds: usize,
    tree: &Path,
) -> anyhow::Result<(usize, Rounds, Rounds)> {
    let dir = tempfile::tempdir()?;
    let home = dir.path().join("home");
    let harness = Harness::open_local(&home, HarnessOptions::fake_provider("http://127.0.0.1:9"))?;
    let n = super::bench_wake::write_session(&harness, events).await?;
    let mut conn = rusqlite::Connection::open(home.join("world.db"))?;
    conn.busy_timeout(Duration::from_secs(10))?;
    let (mut vs_rows, mut vs_cp) = (Rounds::default(), Rounds::default());
    let request = ForkRequest {
        parent: "bench".into(),
        count: 1,
        owner: "bench".into(),
        ..Default::default()
    };
    // One untimed round of each first: caches and prepared statements warm.
    harness.fork(&request).await?;
    copy_rows(&mut conn, "warm")?;
    for round in 0..rounds {
        let start = Instant::now();
        let copied = copy_rows(&mut conn, &format!("copy{round}"))?;
        let rows = start.elapsed();
        anyhow::ensure!(copied == n, "copied {copied} of {n} rows");

        let copy = dir.path().join(format!("copy{round}"));
        let start = Instant::now();
        cp(tree, &copy)?;
        let copied_tree = start.elapsed();

        let start = Instant::now();
        let made = harness.fork(&request).await?;
        let forked = start.elapsed();
        anyhow::ensure!(made.len() == 1 && made[0].forked_at == Some(n as u64));

        vs_rows.push(rows, forked);
        vs_cp.push(copied_tree, forked);
        std::fs::remove_dir_all(&copy)?;
    }
    Ok((n, vs_rows, vs_cp))
}

/// Prints fork latency at each size against the copies.
pub async fn run(sizes: &[usize], rounds: usize) -> anyhow::Result<()> {
    let rounds = rounds.max(5);
    let dir = tempfile::tempdir()?;
    let tree = dir.path().join("tree");
    let files = super::bench_drive::generate(&tree)?;
    println!(
        "fork: a session at its latest position, against copying its log rows and its {files}-file workspace; {rounds} alternating rounds, medians"
    );
    println!(
        "  {:>8}  {:>14}  {:>14}  {:>14}  {:>9}  {:>9}",
        "events", "copy log rows", "cp -a files", "steadfast fork", "vs rows", "vs cp"
    );
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    for &size in sizes {
        let (n, vs_rows, vs_cp) = measure(size, rounds, &tree).await?;
        println!(
            "  {n:>8}  {:>12.2}ms  {:>12.1}ms  {:>12.2}ms  {:>8.3}x  {:>8.4}x",
            ms(vs_rows.base()),
            ms(vs_cp.base()),
            ms(vs_rows.ours()),
            vs_rows.ratio(),
            vs_cp.ratio()
        );
    }
    println!(
        "  target: a fork under 20 ms at every size, flat in events (the workspace is never read)"
    );
    Ok(())
}
