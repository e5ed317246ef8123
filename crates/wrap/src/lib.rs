//! Wrapped agents: Claude Code, Codex, Pi (or any CLI that speaks the Anthropic or
//! OpenAI APIs) run unchanged and durably.
//!
//! The CLI runs in a sandbox of its own whose only ways out are two loopback ports: the
//! [gateway](steadfast_gateway) (its model calls, recorded and replayed) and an MCP
//! server ([`mcp`]) offering the sandbox tools through the journal ([`steadfast_journal`]). After a crash
//! the CLI is started again from the beginning of its turn: the gateway answers every
//! recorded request from the log and the journal every recorded tool call, so it
//! walks back to where it was without a model call paid twice or a command run twice,
//! and carries on from there.

pub mod adapters;
pub mod mcp;
pub mod run;

pub use adapters::Adapter;
pub use run::{drive_turn, TurnReport, WrappedOptions};

/// Failures of a wrapped run.
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
    /// The log does not fold.
    #[error("session log: {0}")]
    Log(#[from] steadfast_log::FoldError),
    /// A background task failed.
    #[error("task failed: {0}")]
    Task(String),
    /// Bad configuration or request.
    #[error("{0}")]
    Invalid(String),
}

impl From<steadfast_journal::Error> for Error {
    fn from(e: steadfast_journal::Error) -> Self {
        match e {
            steadfast_journal::Error::World(e) => Error::World(e),
            steadfast_journal::Error::Drive(e) => Error::Drive(e),
            steadfast_journal::Error::Sandbox(e) => Error::Sandbox(e),
            steadfast_journal::Error::Task(e) => Error::Task(e.to_string()),
        }
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
