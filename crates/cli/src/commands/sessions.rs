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
    pub(crate) json: bool,
    /// Only these statuses, comma-separated (`idle,waiting`).
    #[arg(long)]
    pub(crate) status: Option<String>,
    /// Only sessions of this agent.
    #[arg(long)]
    pub(crate) agent: Option<String>,
    /// Only sessions with these labels (`team=infra,env=prod`).
    #[arg(long)]
    pub(crate) label: Option<String>,
    /// Only titles containing this text, ignoring case.
    #[arg(long)]
    pub(crate) title: Option<String>,
    /// At most this many, newest first.
    #[arg(long)]
    pub(crate) limit: Option<usize>,
}

pub async fn run(home: &Path, config: &Config, args: SessionsArgs) -> anyhow::Result<ExitCode> {
    use steadfast_world::listing;
    let json = args.json;
    let statuses = args
        .status
        .iter()
        .flat_map(|s| s.split(','))
        .map(|s| {
            steadfast_log::Status::parse(s).ok_or_else(|| {
                let all: Vec<_> = steadfast_log::STATUSES.map(|s| s.as_str()).into();
                anyhow::anyhow!("--status: `{s}` is not one of {}", all.join(", "))
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let query = steadfast_world::SessionQuery {
        statuses,
        agent: args.agent,
        labels: match &args.label {
            Some(text) => {
                listing::parse_label_filter("--label", text).map_err(anyhow::Error::msg)?
            }
            None => Default::default(),
        },
        title: args.title,
        limit: args.limit,
        ..Default::default()
    };
    let world = crate::setup::world(home, config, false).await?;
    let sessions = world.list_sessions(&query).await?.sessions;
    print(&sessions, json)
}

/// Prints sessions as a table, or as one JSON object each with `json`.
pub(crate) fn print(
    sessions: &[steadfast_world::SessionSummary],
    json: bool,
) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    if json {
        for s in sessions {
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
        let forked = match (&s.parent, s.forked_at) {
            (Some(parent), Some(at)) => format!("  (fork of {parent} at #{at})"),
            _ => String::new(),
        };
        writeln!(
            out,
            "{:<40} {:<10} {:>6}  {:<20} {}{forked}",
            s.id,
            s.status,
            s.last_seq,
            crate::render::time(s.updated_at_ms),
            s.title
        )?;
    }
    Ok(ExitCode::SUCCESS)
}
