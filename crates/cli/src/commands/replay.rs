//! `steadfast replay`: a wrapped agent's recorded session run again through another
//! CLI version, named agent or model, answered from its log, to the first request that
//! differs. How a platform tries a CLI upgrade on its real sessions before rolling it
//! out.

use std::path::Path;
use std::process::ExitCode;

use clap::Args;
use steadfast_harness::{ReplayReport, ReplayRequest};
use steadfast_world::World;

use crate::config::Config;

/// The exit code of a replay that diverged (the run itself worked).
const EXIT_DIVERGED: u8 = 3;

/// Arguments of `steadfast replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The recorded session (a wrapped agent's).
    pub(crate) session: String,
    /// The agent to replay with: `claude-code@2.1.3`, a named agent, or an adapter at
    /// its pinned version (default: the session's agent as configured now). Install
    /// it first with `steadfast install-agent`.
    #[arg(long)]
    pub(crate) agent: Option<String>,
    /// The model to ask instead of the session's, `provider/model`.
    #[arg(long)]
    pub(crate) model: Option<String>,
    /// Instructions to give the CLI on top of its own system prompt in place of the
    /// session's (or the named agent's): how a prompt change is tried on recorded
    /// sessions. `""` replays with none.
    #[arg(long, visible_alias = "system-prompt", value_name = "TEXT")]
    pub(crate) instructions: Option<String>,
    /// Go on live from the first divergence, as a fork that is kept (its id is
    /// printed); without it nothing is asked of a provider.
    #[arg(long = "continue")]
    pub(crate) go_on: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `steadfast replay`: exits 0 when every recorded request was made again as
/// recorded, 3 when the replay diverged (the report says where and how).
pub async fn replay(home: &Path, config: &Config, args: ReplayArgs) -> anyhow::Result<ExitCode> {
    let world = crate::setup::world(home, config, false).await?;
    let summary = world.session(&args.session).await?;
    let state = steadfast_log::fold(&world.read(&args.session, 1).await?)?;
    // A replay that goes on live asks the provider of the model it goes on with.
    let provider = match &args.model {
        Some(model) => model.split('/').next().unwrap_or_default().to_string(),
        None => state.model.provider.clone(),
    };
    let (harness, _fake) = crate::setup::harness(home, config, world, &provider).await?;
    let report = harness
        .replay(&ReplayRequest {
            session: args.session.clone(),
            agent: args.agent.clone(),
            model: args.model.clone(),
            instructions: args.instructions.clone(),
            go_on: args.go_on,
            owner: summary.owner,
        })
        .await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", as_text(&args.session, &report));
    }
    Ok(match report.divergence {
        Some(_) => ExitCode::from(EXIT_DIVERGED),
        None => ExitCode::SUCCESS,
    })
}

fn as_text(session: &str, report: &ReplayReport) -> String {
    let mut out = format!("replay of {session} with {}\n", report.cli);
    if let Some(instructions) = &report.instructions {
        out.push_str(&format!(
            "  instructions: {}\n",
            instructions.chars().take(200).collect::<String>()
        ));
    }
    for turn in &report.turns {
        out.push_str(&format!(
            "  turn {}: {} of {} recorded model requests answered from the log\n",
            turn.turn, turn.replayed, turn.recorded
        ));
        if let Some(answer) = &turn.answer_differs {
            out.push_str(&format!(
                "    its final answer differs: {}\n",
                answer.chars().take(200).collect::<String>()
            ));
        }
    }
    match &report.divergence {
        None => out.push_str("no divergence\n"),
        Some(d) => {
            let at = d
                .position
                .map_or_else(|| "past the record".to_string(), |p| format!("at #{p}"));
            out.push_str(&format!(
                "diverged in turn {} {at}: {}\n",
                d.turn, d.summary
            ));
            if let Some(diff) = &d.diff {
                out.push_str(diff);
            }
        }
    }
    out.push_str(&format!("provider calls: {}\n", report.provider_calls));
    if let Some(fork) = &report.continued {
        out.push_str(&format!("went on live as {fork}\n"));
    }
    out
}
