//! `steadfast log`.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use clap::Args;
use steadfast_world::World;

use crate::config::Config;

/// Arguments of `steadfast log`.
#[derive(Debug, Args)]
pub struct LogArgs {
    /// The session.
    session: String,
    /// One JSON record per line on stdout.
    #[arg(long)]
    json: bool,
}

pub async fn run(home: &Path, config: &Config, args: LogArgs) -> anyhow::Result<ExitCode> {
    let world = crate::setup::world(home, config, false).await?;
    let records = world.read(&args.session, 1).await?;
    let mut out = std::io::stdout().lock();
    for record in &records {
        if args.json {
            writeln!(out, "{}", serde_json::to_string(record)?)?;
        } else {
            for line in crate::render::timeline(record) {
                writeln!(out, "{line}")?;
            }
        }
    }
    drop(out);
    let blobs = crate::setup::blobs(home, config)?;
    if report_damage(&blobs, &args.session, &records).await {
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// Says on stderr which records of `session` lost their blob (by position); whether
/// any did.
pub async fn report_damage(
    blobs: &steadfast_world::Blobs,
    session: &str,
    records: &[steadfast_log::Record],
) -> bool {
    let damage = blobs.damaged(records).await;
    for d in &damage {
        eprintln!(
            "steadfast: DATA LOST in session {session} at #{}: the output blob {} is {}",
            d.seq, d.blob, d.problem
        );
    }
    !damage.is_empty()
}
