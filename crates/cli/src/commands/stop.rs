//! `steadfast stop`: interrupt a session's running turn.

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use steadfast_world::{InboundKind, World};

use crate::config::Config;

/// How long `stop` waits to see the turn stopped.
const WAIT: Duration = Duration::from_secs(15);

pub async fn run(home: &Path, config: &Config, session: &str) -> anyhow::Result<ExitCode> {
    let world = crate::setup::world(home, config, false).await?;
    let summary = world.session(session).await?;
    if !matches!(summary.status.as_str(), "running" | "waiting") {
        eprintln!(
            "steadfast: session {session} is {}; nothing runs, so there is nothing to stop",
            summary.status
        );
        return Ok(ExitCode::from(1));
    }
    let by = format!(
        "cli:{}",
        std::env::var("USER").unwrap_or_else(|_| "unknown".into())
    );
    let id = world
        .post(
            session,
            InboundKind::Signal,
            steadfast_log::INTERRUPT_SIGNAL,
            &serde_json::json!({ "by": by }),
        )
        .await?;
    let started = Instant::now();
    while started.elapsed() < WAIT {
        let now = world.session(session).await?;
        if !matches!(now.status.as_str(), "running" | "waiting") {
            eprintln!(
                "steadfast: session {session} stopped ({}, #{}) in {} ms; carry on with a new message, or `steadfast resume {session}`",
                now.status,
                now.last_seq,
                started.elapsed().as_millis()
            );
            return Ok(ExitCode::SUCCESS);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "steadfast: interrupt #{id} queued for {session}; its driver has not taken it yet (is one running?)"
    );
    Ok(ExitCode::from(1))
}
