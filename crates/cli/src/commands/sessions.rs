//! `steadfast sessions`.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use clap::Args;
use steadfast_world::World;

use crate::config::Config;

/// Arguments of `steadfast sessions`.
#[derive(Debug, Args)]
pub struct SessionsArgs {
    /// One JSON object per session on stdout.
    #[arg(long)]
    json: bool,
}

pub async fn run(home: &Path, config: &Config, args: SessionsArgs) -> anyhow::Result<ExitCode> {
    let world = crate::setup::world(home, config, false).await?;
    let sessions = world.list_sessions().await?;
    let mut out = std::io::stdout().lock();
    if args.json {
        for s in &sessions {
            writeln!(out, "{}", serde_json::to_string(s)?)?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    if sessions.is_empty() {
        eprintln!("no sessions");
        return Ok(ExitCode::SUCCESS);
    }
    writeln!(
        out,
        "{:<40} {:<10} {:>6}  {:<20} TASK",
        "SESSION", "STATUS", "EVENTS", "UPDATED"
    )?;
    for s in sessions {
        writeln!(
            out,
            "{:<40} {:<10} {:>6}  {:<20} {}",
            s.id,
            s.status,
            s.last_seq,
            crate::render::time(s.updated_at_ms),
            s.title
        )?;
    }
    Ok(ExitCode::SUCCESS)
}
