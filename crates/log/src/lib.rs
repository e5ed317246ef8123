//! The session log's data model: events, the record codec, and the fold.
//!
//! A session is an append-only list of [`Event`]s. Everything a harness needs to carry
//! on after a crash is rebuilt by [`fold`] from that list, so this crate holds no I/O:
//! the same bytes always fold to the same [`SessionState`]. Each stored record carries
//! a schema version and a checksum ([`record`]), so a torn or corrupt record is
//! reported, never skipped, and old logs keep replaying under new code.

pub mod agent;
pub mod api;
pub mod approval;
pub mod event;
pub mod fold;
pub mod message;
pub mod money;
pub mod network;
pub mod record;
pub mod status;

pub use agent::Agent;
pub use api::Api;
pub use approval::{ApprovalPolicy, ApprovalRule, HostRule, Verdict};
pub use event::{
    explored_signal, is_workspace_id, tool_result_signal, BlobRef, Breaker, ClientTool,
    EgressCredential, EndState, Event, Explorer, GitSource, Limits, McpServer, ModelSpec, Output,
    RequestParts, ToolClass, ToolResolution, Usage, APPROVAL_SIGNAL, CHECKPOINT_KIND,
    COMPACT_SIGNAL, DENIED, EXPLORED_SIGNAL, INTERRUPTED_OUTCOME_UNKNOWN, INTERRUPTED_ROLLED_BACK,
    INTERRUPTED_ROLLED_BACK_BESIDE, INTERRUPT_SIGNAL, MODEL_DELTA_KIND, PRUNED_KIND, RESUME_SIGNAL,
    TOOL_RESULT_SIGNAL, WORKSPACE_MOUNT,
};
pub use fold::{
    approval_key, fold, Exchange, ExploredAnswer, FoldError, HeldConnection, Next, OpenShell,
    PendingModel, PendingTool, Phase, Retry, SessionState, TurnStart, Wait, WrappedTool,
};
pub use message::{Block, Message, Role, ToolUse};
pub use network::NetworkPolicy;
pub use record::{CodecError, EncodedRecord, Record, SCHEMA_VERSION};
pub use status::{Status, UnknownStatus, STATUSES};
