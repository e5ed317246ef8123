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
    pub(crate) session: String,
    /// One JSON record per line on stdout.
    #[arg(long)]
    pub(crate) json: bool,
    /// Keep printing records as they are appended, until the session ends (or Ctrl-C).
    #[arg(long, short = 'f')]
    pub(crate) follow: bool,
}

pub async fn run(home: &Path, config: &Config, args: LogArgs) -> anyhow::Result<ExitCode> {
    let world = crate::setup::world(home, config, false).await?;
    let records = world.read(&args.session, 1).await.map_err(|e| match e {
        steadfast_world::Error::NotFound(_) => anyhow::anyhow!(
            "no session {} in the home {} (pass --home DIR, or set STEADFAST_HOME, to look elsewhere)",
            args.session,
            home.display()
        ),
        other => other.into(),
    })?;
    print(&records, args.json)?;
    let blobs = crate::setup::blobs(home, config)?;
    let damaged = report_damage(&blobs, &args.session, &records).await;
    if args.follow {
        follow(&world, &args.session, records.len() as u64, args.json).await?;
    }
    Ok(if damaged {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn print(records: &[steadfast_log::Record], json: bool) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    for record in records {
        if json {
            writeln!(out, "{}", serde_json::to_string(record)?)?;
        } else {
            for line in crate::render::timeline(record) {
                writeln!(out, "{line}")?;
            }
        }
    }
    out.flush()?;
    Ok(())
}

/// Prints the records appended after `last` as they come, until the session ends.
async fn follow(
    world: &steadfast_world::AnyWorld,
    session: &str,
    mut last: u64,
    json: bool,
) -> anyhow::Result<()> {
    let mut changes = world.changes();
    let ended = |records: &[steadfast_log::Record]| {
        records.iter().any(|r| {
            matches!(
                r.event,
                steadfast_log::Event::SessionEnded {
                    state: steadfast_log::EndState::Completed
                        | steadfast_log::EndState::Failed
                        | steadfast_log::EndState::Closed,
                    ..
                }
            )
        })
    };
    if ended(&world.read(session, last.max(1)).await?) {
        return Ok(());
    }
    loop {
        // Other processes' appends are seen by polling (SQLite), or at once (PostgreSQL).
        tokio::select! {
            _ = changes.changed() => {}
            _ = tokio::time::sleep(std::time::Duration::from_millis(250)) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
        let records = world.read(session, last + 1).await?;
        print(&records, json)?;
        last += records.len() as u64;
        if ended(&records) {
            return Ok(());
        }
    }
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
