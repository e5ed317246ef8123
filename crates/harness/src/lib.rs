//! The native harness: a stateless agent loop over the session log.
//!
//! A [`Harness`] holds nothing about any session in memory. [`Harness::wake`] takes
//! the session's lease, folds its log, brings the workspace back to the last recorded
//! snapshot and returns a [`Driver`] positioned at the frontier of uncommitted work.
//! Every model and tool call is an intent appended (durably) before the call and an
//! outcome after it; calls cut off by a crash are resolved by docs/ARCHITECTURE.md rule 4:
//! a model call is issued again, a read is run again, a workspace mutation is rolled
//! back and reported, an external effect is reported as outcome-unknown, never re-run.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> anyhow::Result<()> {
//! use steadfast_harness::{Harness, HarnessOptions, NewSession, Stop};
//! use steadfast_testkit::{demo, FakeProvider};
//!
//! let dir = tempfile::tempdir()?;
//! let workspace = dir.path().join("project");
//! demo::write_project(&workspace)?;
//! let fake = FakeProvider::start(demo::script()).await?; // a scripted model on loopback
//! let options = HarnessOptions::fake_provider(&fake.base_url());
//! let home = dir.path().join(".steadfast");
//!
//! // Open a world, start a session, run part of a turn, then drop everything.
//! // (Here the driver hands its lease back; after a real crash the next wake takes
//! // it over once the dead process is detected or the lease lapses.)
//! let session = {
//!     let harness = Harness::open_local(&home, options.clone())?;
//!     let id = harness.start_session(NewSession::native("fake/demo", &workspace)).await?;
//!     let mut driver = harness.wake_native(&id).await?;
//!     driver.send(demo::TASK).await?;
//!     for _ in 0..5 {
//!         driver.step().await?;
//!     }
//!     driver.release().await?;
//!     id
//! };
//!
//! // A new harness wakes the session and finishes the turn from the log.
//! let harness = Harness::open_local(&home, options)?;
//! let mut driver = harness.wake_native(&session).await?;
//! assert_eq!(driver.run().await?, Stop::Idle);
//! assert!(std::fs::read_to_string(workspace.join("CHANGELOG.md"))?.contains("off-by-one"));
//! // One model call per step: nothing was asked twice.
//! assert_eq!(fake.calls(), driver.state().model_attempts);
//! # Ok(())
//! # }
//! ```

mod backoff;
pub mod client_tools;
pub mod compaction;
mod control;
mod diff;
mod driver;
pub mod explore;
mod fork;
mod harness;
mod prompt;
mod replay;
mod rewind;
mod visit;
mod worker;
mod workspace;
mod wrapped;

pub use backoff::Backoff;
pub use control::{SignalTarget, STOP_WAIT};
pub use diff::{FileDiff, WorkspaceDiff, WorkspaceEntry, WorkspaceListing};
pub use driver::{Driver, Progress, Stop, APPROVAL_SIGNAL, APPROVAL_TOOL};
pub use fork::{ForkRequest, MAX_FORKS};
pub use harness::{
    open_drive, parse_model, Awake, Harness, HarnessOptions, ModelResolver, NewSession,
    Provisioner, DRIVE_CACHE_BYTES, STOP_GRACE,
};
pub use replay::{ReplayDivergence, ReplayReport, ReplayRequest, TurnReplay};
pub use rewind::{external_facts, RewindReport};
/// A session's sandbox as a visitor (a preview URL) reaches it; see [`Harness::reach`].
pub use steadfast_journal::reach;
pub use steadfast_journal::{git, remote, Error as JournalError};
pub use steadfast_sandbox::reconcile;
pub use visit::Visit;
pub use workspace::{new_workspace_id, workspace_root};
pub use wrapped::{AgentInfo, AgentOptions, NamedAgent, WrappedDriver};

/// Everything that can stop the harness.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The world failed (including a lost lease: [`steadfast_world::Error::StaleFence`]).
    #[error(transparent)]
    World(#[from] steadfast_world::Error),
    /// The drive failed.
    #[error("workspace snapshot: {0}")]
    Drive(#[from] steadfast_drive::Error),
    /// The sandbox failed.
    #[error(transparent)]
    Sandbox(#[from] steadfast_sandbox::Error),
    /// The model could not be reached (the call stays pending; waking again retries).
    #[error(transparent)]
    Model(#[from] steadfast_model::Error),
    /// The log does not fold.
    #[error("session log: {0}")]
    Log(#[from] steadfast_log::FoldError),
    /// A wrapped agent's run failed.
    #[error(transparent)]
    Wrapped(#[from] steadfast_wrap::Error),
    /// A journaled tool call's task failed (the journal's other failures are the
    /// world's, the drive's or the sandbox's, and reported as theirs).
    #[error(transparent)]
    Journal(steadfast_journal::Error),
    /// A task of the harness's own failed (it panicked, or its runtime is shutting
    /// down): a fault of this process, never of the request.
    #[error("a harness task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// The request does not fit the session's state.
    #[error("{0}")]
    Invalid(String),
    /// No such file in the workspace at the position asked for.
    #[error("{0}")]
    NoFile(String),
    /// Stored data the log refers to is gone or damaged (a snapshot's object).
    #[error("{0}")]
    DataLost(String),
    /// A signal for a wait that is not in progress (see [`Harness::signal`]).
    #[error("{0}")]
    NotWaiting(String),
    /// This host cannot drive the session (its agent's CLI is not installed here),
    /// though another may: the session is left as it is.
    #[error("{0}")]
    NotHere(String),
    /// The session is between owners for a moment (a worker is picking its turn up):
    /// the same request succeeds shortly.
    #[error("{0}")]
    Busy(String),
}

impl From<steadfast_journal::Error> for Error {
    fn from(e: steadfast_journal::Error) -> Self {
        match e {
            steadfast_journal::Error::World(e) => Error::World(e),
            steadfast_journal::Error::Drive(e) => Error::Drive(e),
            steadfast_journal::Error::Sandbox(e) => Error::Sandbox(e),
            other => Error::Journal(other),
        }
    }
}

/// Whether a journaled call's failure may pass if the session is woken again later.
fn journal_retryable(e: &steadfast_journal::Error) -> bool {
    match e {
        steadfast_journal::Error::World(e) => e.is_retryable(),
        steadfast_journal::Error::Sandbox(_) | steadfast_journal::Error::Task(_) => true,
        steadfast_journal::Error::Drive(e) => matches!(
            e,
            steadfast_drive::Error::Io { .. } | steadfast_drive::Error::Store(_)
        ),
    }
}

impl Error {
    /// Whether the driver lost its lease (another holder took it, or it could not be
    /// renewed in time): nothing is to be recorded under it any more, not even the
    /// failure; whoever holds the lease next goes on.
    pub fn is_lease_lost(&self) -> bool {
        let world = match self {
            Error::World(e) => Some(e),
            Error::Journal(steadfast_journal::Error::World(e)) => Some(e),
            Error::Wrapped(steadfast_wrap::Error::World(e)) => Some(e),
            _ => None,
        };
        matches!(
            world,
            Some(steadfast_world::Error::StaleFence { .. } | steadfast_world::Error::LeaseLost(_))
        )
    }

    /// Whether waking the session again later may get further.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::World(e) => e.is_retryable(),
            Error::Model(e) => e.is_retryable(),
            Error::Sandbox(_) | Error::NotHere(_) => true,
            // A filesystem error (a full disk, a slow mount) or a shared store that
            // failed may pass; a snapshot that is missing or corrupt will not here
            // (the worker leaves it to other hosts).
            Error::Drive(steadfast_drive::Error::Io { .. } | steadfast_drive::Error::Store(_)) => {
                true
            }
            Error::Wrapped(e) => match e {
                steadfast_wrap::Error::World(e) => e.is_retryable(),
                steadfast_wrap::Error::Sandbox(_) | steadfast_wrap::Error::Task(_) => true,
                _ => false,
            },
            Error::Journal(e) => journal_retryable(e),
            _ => false,
        }
    }
}

/// The harness's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
