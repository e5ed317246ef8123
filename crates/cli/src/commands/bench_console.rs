//! `steadfast bench console`: what the web console pays to open a session page, at
//! 1,000 and 50,000 events — the three requests the page makes before it shows
//! anything (the session's summary, its last 300 events, its live stream's
//! connection), over HTTP on loopback through the real router. The short session is
//! the baseline: a page that is as fast to open at 50,000 events is flat.

use std::sync::Arc;
use std::time::{Duration, Instant};

use steadfast_harness::{Harness, HarnessOptions};

use super::bench::median;

/// The events the page shows before "earlier events" is asked for.
const WINDOW: u64 = 300;

/// Opens the page of a session of about `events` records `rounds` times; the median.
async fn open_page(events: usize, rounds: usize) -> anyhow::Result<(usize, Duration)> {
    let dir = tempfile::tempdir()?;
    let harness = Arc::new(Harness::open_local(
        &dir.path().join("home"),
        HarnessOptions::fake_provider("http://127.0.0.1:9"),
    )?);
    let n = super::bench_wake::write_session_of(&harness, events, "local").await?;
    let (api, server) = super::bench_server::local_api(harness, dir.path()).await?;
    let base = format!("{api}/v1/sessions/bench");
    let http = reqwest::Client::new();
    let mut took = Vec::new();
    for _ in 0..rounds {
        let start = Instant::now();
        let summary: serde_json::Value = http
            .get(&base)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let last = summary["last_seq"].as_u64().unwrap_or(0);
        let page: serde_json::Value = http
            .get(format!(
                "{base}/events?after={}&limit=1000",
                last.saturating_sub(WINDOW)
            ))
            .header("accept", "application/json")
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let shown = page["events"].as_array().map_or(0, Vec::len) as u64;
        anyhow::ensure!(shown == WINDOW.min(last), "the page showed {shown} events");
        let stream = http
            .get(format!("{base}/events?until=ended"))
            .header("accept", "text/event-stream")
            .header("last-event-id", last.to_string())
            .send()
            .await?
            .error_for_status()?;
        took.push(start.elapsed());
        drop(stream);
    }
    server.abort();
    Ok((n, median(took)))
}

/// Prints the time to open a session's page at each size, and the ratio to the first.
pub async fn run(sizes: &[usize], rounds: usize) -> anyhow::Result<()> {
    println!(
        "console: opening a session's page (summary, last {WINDOW} events, stream), median of {rounds}"
    );
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut first: Option<(usize, Duration)> = None;
    for &size in sizes {
        let (n, took) = open_page(size, rounds).await?;
        let (base_n, base) = *first.get_or_insert((n, took));
        println!(
            "  {n:>8} events  {:>8.1} ms  {:>5.2}x the {base_n}-event session's",
            ms(took),
            took.as_secs_f64() / base.as_secs_f64(),
        );
    }
    println!("  target: flat (the page reads a window, whatever the session's length)");
    Ok(())
}
