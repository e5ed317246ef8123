//! The journaled tool call, one for every agent.
//!
//! A tool call goes: admission → snapshot before → intent → execute in the sandbox →
//! snapshot after → outcome (with any steer that arrived, in the same append). The
//! native loop and the MCP server of a wrapped CLI both run their calls through one
//! [`Journal`], over one [`LiveSession`](steadfast_world::LiveSession): one file holds
//! each step, and a policy written here holds for every agent. A call a crash cut off
//! is resolved here too ([`resolve_cut_off`], invariant 4), with the reconcilers of
//! `steadfast_sandbox::reconcile` and `git_push`'s own ([`git::GitPusher`]).
//!
//! A wrapped agent's model calls are journaled here as well ([`exchange`]): the
//! gateway is only their HTTP face, as the MCP server is its tool calls'.
//!
//! The tools the harness runs outside the sandbox live here as well, since the journal
//! runs them: the session's own MCP servers' ([`remote`]) and `git_push` ([`git`]).

pub mod calls;
pub mod escalate;
pub mod exchange;
pub mod explore;
pub mod git;
pub mod history;
pub mod kept;
pub mod people;
pub mod reach;
pub mod remote;
pub mod slot;
pub mod spend;

pub use calls::{denied_by_policy, resolve_cut_off, HeldBack, Hosted, Journal, Ran};
pub use slot::{MakeSandbox, SandboxSlot};

/// Failures of a journaled call (what the call itself failed with is its outcome, not
/// an error: these are failures of the journal's own work).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The world failed.
    #[error(transparent)]
    World(#[from] steadfast_world::Error),
    /// The drive failed.
    #[error("workspace snapshot: {0}")]
    Drive(#[from] steadfast_drive::Error),
    /// The sandbox failed.
    #[error(transparent)]
    Sandbox(#[from] steadfast_sandbox::Error),
    /// A background task failed (it panicked or was cancelled).
    #[error("task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
