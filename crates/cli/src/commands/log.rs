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
    Ok(ExitCode::SUCCESS)
}
