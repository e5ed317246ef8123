//! `steadfast install-agent <name>[@<version>]`: installs a wrapped CLI's npm package;
//! `steadfast agents`: lists the agents sessions can run.
//! (Sessions of wrapped agents are driven by the harness, like every other session.)

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;

use crate::config::Config;

/// Installs the CLI an agent runs: at the version named after `@`, else the named
/// agent's configured version, else the adapter's pinned one.
pub async fn install(home: &Path, config: &Config, spec: &str) -> anyhow::Result<ExitCode> {
    let (name, version) = match spec.split_once('@') {
        Some((name, version)) => (name, Some(version)),
        None => (spec, None),
    };
    let agents = config.harness_options().agents;
    if steadfast_log::agent::is_native(name) {
        anyhow::bail!("the native agent is built in: nothing to install");
    }
    let mut adapter = agents.adapter(name)?;
    if let Some(version) = version {
        adapter = adapter
            .at_version(Some(version))
            .map_err(anyhow::Error::msg)?;
    }
    let dir = agents.install_dir_under(Some(home));
    if adapter.is_installed(&dir) {
        eprintln!(
            "steadfast: {}@{} is already installed at {}",
            adapter.package,
            adapter.version,
            adapter.executable(&dir).display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!("steadfast: {}", adapter.install_command(&dir));
    let installing = adapter.clone();
    let into = dir.clone();
    tokio::task::spawn_blocking(move || installing.install(&into))
        .await
        .context("the install task")?
        .map_err(anyhow::Error::msg)?;
    eprintln!(
        "steadfast: {}@{} installed at {} (tested: {})",
        adapter.package,
        adapter.version,
        adapter.executable(&dir).display(),
        adapter.tested
    );
    if adapter.version != adapter.pinned {
        eprintln!(
            "steadfast: sessions use it when the agent is configured at this version: [[agents.named]] name = \"...\", adapter = \"{name}\", version = \"{}\"",
            adapter.version
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `steadfast agents`: every agent sessions can name, its version and the range its
/// adapter is tested with, and whether it is installed.
pub fn list(home: &Path, config: &Config, json: bool) -> anyhow::Result<ExitCode> {
    let agents = config.harness_options().agents;
    let dir = agents.install_dir_under(Some(home));
    for info in agents.list(&dir) {
        if json {
            println!("{}", serde_json::to_string(&info)?);
        } else {
            println!(
                "{:<16} {:<12} {:<40} {}",
                info.name,
                info.adapter,
                info.package.as_ref().map_or_else(
                    || "built in".to_string(),
                    |p| format!(
                        "{p}@{} (tested: {})",
                        info.version.as_deref().unwrap_or_default(),
                        info.tested.as_deref().unwrap_or_default()
                    )
                ),
                if info.installed {
                    "installed"
                } else {
                    "not installed"
                }
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
