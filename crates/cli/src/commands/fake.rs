//! `steadfast fake-provider`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use steadfast_testkit::{demo, FakeProvider, Script};

/// Arguments of `steadfast fake-provider`.
#[derive(Debug, Args)]
pub struct FakeArgs {
    /// A script file (JSON: {"steps": [{"text", "tool_calls": [{"name", "input"}]}]});
    /// default: the bundled demo.
    #[arg(long)]
    script: Option<PathBuf>,
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
}

pub async fn run(args: FakeArgs) -> anyhow::Result<ExitCode> {
    let script = match &args.script {
        Some(path) => Script::from_json(
            &std::fs::read_to_string(path).with_context(|| path.display().to_string())?,
        )?,
        None => demo::script(),
    };
    let fake = FakeProvider::start_on(script, &args.listen).await?;
    println!("{}", fake.base_url());
    eprintln!(
        "fake provider: Anthropic at {0}/v1/messages, OpenAI at {0}/v1/chat/completions, counters at {0}/_fake/calls; Ctrl-C stops it",
        fake.base_url()
    );
    tokio::signal::ctrl_c().await?;
    eprintln!("fake provider: {} calls received", fake.calls());
    Ok(ExitCode::SUCCESS)
}
