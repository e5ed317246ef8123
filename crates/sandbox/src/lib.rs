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
pub mod conformance;
pub mod egress;
mod env;
mod inside;
mod intercept;
mod local;
mod masked;
mod orphans;
pub mod outbound;
pub mod paths;
mod policy;
pub mod proxy;
pub mod reconcile;
pub mod shell;
mod tenure;
pub mod tools;

use std::future::Future;
use std::path::Path;

pub use any::{describe, isolates, isolation, ready, AnySandbox, Backend};
pub use bwrap::{bwrap_available, leave_running, BwrapSandbox};
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
///
/// A sandbox made to outlive its holder ([`SandboxOptions::hold`]) whose agent still
/// runs is not killed but adopted under `epoch` (given `grace` to be provisioned by
/// this holder; a zero `grace` kills it like any other): from then on it refuses the
/// old holder, and what it runs for a call the old holder had begun is this holder's
/// to [`Sandbox::attach`] to.
pub fn take_over(
    workspace: &std::path::Path,
    session: &str,
    epoch: u64,
    grace: std::time::Duration,
) -> TakenOver {
    let Ok(root) = workspace.canonicalize() else {
        return TakenOver::default();
    };
    let mut taken = bwrap::take_over(&root, session, epoch, grace);
    taken.killed += orphans::take_over(&root, session, epoch);
    taken
}

/// What [`take_over`] found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TakenOver {
    /// Sandboxes and processes killed.
    pub killed: usize,
    /// Sandboxes adopted, to be provisioned by the new holder with what they run.
    pub adopted: usize,
}
pub use policy::{HostRule, NetworkPolicy, ResourceLimits};
pub use proxy::Injection;
pub use tenure::Hold;
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
    /// The sandbox is there and refused what was asked of it, saying why (no program
    /// listens on the port asked for, a network it shares with the host).
    #[error("{0}")]
    Refused(String),
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

    /// Runs tool call `call_id`: [`Sandbox::execute`], except that a sandbox that
    /// outlives its holder keeps the command by the call's id, so that the next holder
    /// can [`Sandbox::attach`] to it if this one dies first.
    fn execute_call(
        &self,
        call_id: &str,
        tool: &str,
        input: &serde_json::Value,
    ) -> impl Future<Output = Result<ToolOutput>> + Send {
        let _ = call_id;
        self.execute(tool, input)
    }

    /// Whether this sandbox was adopted from the session's last holder, still running
    /// (with its services and its kept commands), rather than started for this one.
    fn adopted(&self) -> bool {
        false
    }

    /// The calls whose commands this sandbox kept from before this holder took it over
    /// (it was adopted from a holder that died): running still, or finished with an
    /// outcome no one has recorded.
    fn kept_calls(&self) -> Vec<String> {
        Vec::new()
    }

    /// Waits for the command kept for `call_id` (one of [`Sandbox::kept_calls`]) to end
    /// and returns its output, whole, as if this holder had started it.
    fn attach(&self, call_id: &str) -> impl Future<Output = Result<ToolOutput>> + Send {
        let why = format!("this sandbox keeps no command of call {call_id}");
        async move { Err(Error::Died(why)) }
    }

    /// The TCP ports programs in the sandbox listen on: what a preview URL may lead
    /// to. A backend whose programs share the host's network has none of its own and
    /// refuses ([`Error::Refused`]), saying why.
    fn ports(&self) -> impl Future<Output = Result<Vec<u16>>> + Send {
        async { Err(Error::Refused(NO_PORTS_OF_ITS_OWN.into())) }
    }

    /// A byte pipe to `port` on the sandbox's own loopback, made without opening the
    /// sandbox's network (see [`Sandbox::ports`]).
    fn connect(&self, port: u16) -> impl Future<Output = Result<tokio::net::UnixStream>> + Send {
        let _ = port;
        async { Err(Error::Refused(NO_PORTS_OF_ITS_OWN.into())) }
    }

    /// A person's shell in the sandbox, on a PTY: a connection carrying
    /// [`shell::Frame`]s both ways. A backend that would have to give a shell on the
    /// host refuses ([`Error::Refused`]).
    fn shell(
        &self,
        request: &shell::ShellRequest,
    ) -> impl Future<Output = Result<tokio::net::UnixStream>> + Send {
        let _ = request;
        async { Err(Error::Refused(NO_SHELL_OF_ITS_OWN.into())) }
    }
}

/// Why a backend whose commands run on the host has no shell to offer.
const NO_SHELL_OF_ITS_OWN: &str = "this sandbox's commands run on the host itself (the local \
     backend): a shell in it would be a shell on the host, which Steadfast does not hand out";

/// Why a backend without a network of its own shows no ports.
const NO_PORTS_OF_ITS_OWN: &str = "this sandbox's commands run in the host's network (the local \
     backend): it has no ports of its own to reach";
