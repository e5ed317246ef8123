//! Sandboxes: where a session's commands run and its files change.
//!
//! A [`Sandbox`] executes the built-in tools (`bash`, `read`, `write`, `edit`, `glob`,
//! `grep`) against one workspace directory. File tools are confined to the workspace:
//! `..`, absolute paths outside it and symlinks that lead out are refused with a tool
//! error the model can read. Commands run with a scrubbed environment that carries
//! none of the harness's credentials. Each call is classified ([`classify`]) as read,
//! mutate or external, which decides how the harness resolves it after a crash.

mod addresses;
pub mod agent;
mod any;
mod bwrap;
mod cgroup;
mod classify;
pub mod egress;
mod env;
mod local;
mod orphans;
pub mod outbound;
pub mod paths;
mod policy;
pub mod proxy;
pub mod reconcile;
pub mod tools;

use std::future::Future;
use std::path::Path;

pub use any::{describe, isolates, isolation, ready, AnySandbox, Backend};
pub use bwrap::{bwrap_available, BwrapSandbox};
pub use classify::{classify, classify_command};
pub use local::{looks_secret, LocalSandbox, SandboxOptions, WORKSPACE_MOUNT};
pub use paths::confine;

/// Makes the workspace `workspace` of `session` the lease `epoch`'s alone: kills every
/// sandbox and command on this host that runs there for the session under an earlier
/// epoch, in any process (another worker, another slot of this one). Call it once the
/// lease is taken, before the workspace is read or restored: a holder that lost the
/// lease alive (stopped, hung, cut off from the store past the lease) may not have
/// stopped its own commands, and one still writing after the restore would leave its
/// effect in a workspace the log says it never touched (and, run again, twice).
/// Returns how many sandboxes and processes were killed; blocks until they are gone.
pub fn take_over(workspace: &std::path::Path, session: &str, epoch: u64) -> usize {
    let Ok(root) = workspace.canonicalize() else {
        return 0;
    };
    bwrap::take_over(&root, session, epoch) + orphans::take_over(&root, session, epoch)
}
pub use policy::{HostRule, NetworkPolicy, ResourceLimits};
pub use proxy::Injection;
pub use tools::{tool_specs, ToolSpec};

/// What a tool call produced. Tool failures (a missing file, a non-zero exit) are
/// outputs with `is_error` set: the model sees them and decides what to do.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ToolOutput {
    /// The text shown to the model (before any blob offload).
    pub text: String,
    /// Whether the call failed.
    pub is_error: bool,
    /// The exit status of a command.
    pub exit_code: Option<i32>,
}

impl ToolOutput {
    /// A successful output.
    pub fn ok(text: impl Into<String>) -> Self {
        ToolOutput {
            text: text.into(),
            is_error: false,
            exit_code: None,
        }
    }

    /// A tool error the model should read.
    pub fn error(text: impl Into<String>) -> Self {
        ToolOutput {
            text: text.into(),
            is_error: true,
            exit_code: None,
        }
    }
}

/// Failures of the sandbox itself (not of the tool call), which the harness handles.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The sandbox could not be set up or used.
    #[error("sandbox unavailable: {0}")]
    Unavailable(String),
    /// The sandbox died (killed, out of memory, evicted) while a call ran in it. The
    /// call's effect is unknown; the harness resolves it and provisions a new one.
    #[error("sandbox died: {0}")]
    Died(String),
}

/// The sandbox's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A place where tools run against one workspace.
pub trait Sandbox: Send + Sync + 'static {
    /// The workspace directory, as the harness sees it.
    fn workspace(&self) -> &Path;

    /// Runs one tool call. Tool failures come back as `Ok` with `is_error`; `Err` means
    /// the sandbox itself failed ([`Error::Died`] if it is gone for good).
    fn execute(
        &self,
        tool: &str,
        input: &serde_json::Value,
    ) -> impl Future<Output = Result<ToolOutput>> + Send;

    /// Stops whatever command runs in the sandbox now (an interrupt). A command whose
    /// `execute` future is dropped is killed with it where the command is this
    /// process's child; a backend whose commands run elsewhere (in the sandbox's agent)
    /// kills them here.
    fn cancel(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}
