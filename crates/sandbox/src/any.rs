//! Choosing a backend at run time.

use std::path::Path;
use std::sync::Once;

use serde::{Deserialize, Serialize};

use crate::{
    bwrap_available, BwrapSandbox, LocalSandbox, Result, Sandbox, SandboxOptions, ToolOutput,
};

/// Which sandbox backend runs a session's commands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    /// `bwrap` where it works (and a sandbox agent is configured), else `local` with
    /// a warning.
    #[default]
    Auto,
    /// Plain processes on this machine (development, trusted workloads).
    Local,
    /// Bubblewrap namespaces; an error where they cannot be created.
    Bwrap,
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(Backend::Auto),
            "local" => Ok(Backend::Local),
            "bwrap" => Ok(Backend::Bwrap),
            other => Err(format!(
                "sandbox backend `{other}`: expected auto, local or bwrap"
            )),
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Auto => "auto",
            Backend::Local => "local",
            Backend::Bwrap => "bwrap",
        })
    }
}

/// Whether sandboxes made with `options` isolate their commands (bwrap), rather than
/// run them as plain local processes.
pub fn isolates(options: &SandboxOptions) -> bool {
    match options.backend {
        Backend::Local => false,
        Backend::Bwrap => true,
        Backend::Auto => !options.agent.is_empty() && bwrap_available().is_ok(),
    }
}

/// Why sandboxes made with `options` would not isolate their commands, or `Ok` when
/// they would. A production server checks this at startup and refuses to start.
pub fn isolation(options: &SandboxOptions) -> std::result::Result<(), String> {
    match options.backend {
        Backend::Local => Err(
            "the sandbox backend is `local`, which runs commands as plain \
             processes of this machine"
                .into(),
        ),
        Backend::Bwrap | Backend::Auto if options.agent.is_empty() => {
            Err("no sandbox agent program is configured".into())
        }
        Backend::Bwrap | Backend::Auto => bwrap_available(),
    }
}

/// Whether sandboxes can be made as `options` say, now: the backend named by name
/// works, and where isolation is required, it isolates (`Err` says why not). What a
/// worker's readiness probe reports; `auto` without the requirement falls back, so
/// it is always ready.
pub fn ready(options: &SandboxOptions) -> std::result::Result<(), String> {
    if options.require_isolation {
        return isolation(options);
    }
    match options.backend {
        Backend::Local | Backend::Auto => Ok(()),
        Backend::Bwrap => bwrap_available(),
    }
}

/// How sandboxes made with `options` run commands and what their network policy
/// means, in one line for people: a backend that does not isolate says plainly that
/// the network policy is not enforced.
pub fn describe(options: &SandboxOptions) -> String {
    let network = &options.network;
    match isolation(options) {
        Ok(()) => format!("bwrap (network {network})"),
        Err(why) => format!(
            "local: commands are NOT isolated from this machine and the network policy \
             ({network}) is NOT enforced ({why})"
        ),
    }
}

/// A sandbox of whichever backend the options chose.
#[derive(Debug)]
pub enum AnySandbox {
    /// The `local` backend.
    Local(LocalSandbox),
    /// The `bwrap` backend.
    Bwrap(BwrapSandbox),
}

impl AnySandbox {
    /// Provisions a sandbox over `workspace` with the backend `options` name (timed,
    /// and counted live until it is dropped, in the process's metrics).
    #[tracing::instrument(level = "debug", skip_all, fields(workspace = %workspace.display()))]
    pub fn provision(workspace: &Path, options: &SandboxOptions) -> Result<Self> {
        let started = std::time::Instant::now();
        let sandbox = Self::provision_untimed(workspace, options)?;
        steadfast_metrics::metrics().sandbox_started(sandbox.backend(), started.elapsed());
        Ok(sandbox)
    }

    fn provision_untimed(workspace: &Path, options: &SandboxOptions) -> Result<Self> {
        if options.require_isolation {
            isolation(options).map_err(|why| {
                crate::Error::Unavailable(format!(
                    "production requires an isolating sandbox, and {why}"
                ))
            })?;
        }
        match options.backend {
            Backend::Local => Ok(AnySandbox::Local(LocalSandbox::new(
                workspace,
                options.clone(),
            )?)),
            Backend::Bwrap => Ok(AnySandbox::Bwrap(BwrapSandbox::new(workspace, options)?)),
            Backend::Auto => match (bwrap_available(), options.agent.is_empty()) {
                (Ok(()), false) => Ok(AnySandbox::Bwrap(BwrapSandbox::new(workspace, options)?)),
                (Err(why), false) => {
                    static WARN: Once = Once::new();
                    WARN.call_once(|| {
                        tracing::warn!("sandbox: {why}; falling back to the local backend, which does NOT isolate commands from this machine or enforce any network policy");
                        eprintln!("steadfast: warning: {why}; commands run with the local backend, NOT isolated from this machine, and the network policy is NOT enforced");
                    });
                    Ok(AnySandbox::Local(LocalSandbox::new(
                        workspace,
                        options.clone(),
                    )?))
                }
                (_, true) => Ok(AnySandbox::Local(LocalSandbox::new(
                    workspace,
                    options.clone(),
                )?)),
            },
        }
    }

    /// The backend's name.
    pub fn backend(&self) -> &'static str {
        match self {
            AnySandbox::Local(_) => "local",
            AnySandbox::Bwrap(_) => "bwrap",
        }
    }
}

impl Drop for AnySandbox {
    fn drop(&mut self) {
        steadfast_metrics::metrics().sandbox_stopped(self.backend());
    }
}

impl Sandbox for AnySandbox {
    fn workspace(&self) -> &Path {
        match self {
            AnySandbox::Local(s) => s.workspace(),
            AnySandbox::Bwrap(s) => s.workspace(),
        }
    }

    #[tracing::instrument(level = "debug", skip(self, input), fields(backend = self.backend()))]
    async fn execute(&self, tool: &str, input: &serde_json::Value) -> Result<ToolOutput> {
        match self {
            AnySandbox::Local(s) => s.execute(tool, input).await,
            AnySandbox::Bwrap(s) => s.execute(tool, input).await,
        }
    }

    async fn cancel(&self) {
        match self {
            AnySandbox::Local(s) => s.cancel().await,
            AnySandbox::Bwrap(s) => s.cancel().await,
        }
    }

    async fn execute_call(
        &self,
        call_id: &str,
        tool: &str,
        input: &serde_json::Value,
    ) -> Result<ToolOutput> {
        match self {
            AnySandbox::Local(s) => s.execute_call(call_id, tool, input).await,
            AnySandbox::Bwrap(s) => s.execute_call(call_id, tool, input).await,
        }
    }

    fn adopted(&self) -> bool {
        match self {
            AnySandbox::Local(s) => s.adopted(),
            AnySandbox::Bwrap(s) => s.adopted(),
        }
    }

    fn kept_calls(&self) -> Vec<String> {
        match self {
            AnySandbox::Local(s) => s.kept_calls(),
            AnySandbox::Bwrap(s) => s.kept_calls(),
        }
    }

    async fn attach(&self, call_id: &str) -> Result<ToolOutput> {
        match self {
            AnySandbox::Local(s) => s.attach(call_id).await,
            AnySandbox::Bwrap(s) => s.attach(call_id).await,
        }
    }

    async fn ports(&self) -> Result<Vec<u16>> {
        match self {
            AnySandbox::Local(s) => s.ports().await,
            AnySandbox::Bwrap(s) => s.ports().await,
        }
    }

    async fn connect(&self, port: u16) -> Result<tokio::net::UnixStream> {
        match self {
            AnySandbox::Local(s) => s.connect(port).await,
            AnySandbox::Bwrap(s) => s.connect(port).await,
        }
    }

    async fn shell(&self, request: &crate::shell::ShellRequest) -> Result<tokio::net::UnixStream> {
        match self {
            AnySandbox::Local(s) => s.shell(request).await,
            AnySandbox::Bwrap(s) => s.shell(request).await,
        }
    }
}
