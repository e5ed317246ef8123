//! The world: where sessions, their event logs, leases and blobs are stored.
//!
//! A [`World`] is the only durable state of Steadfast. Its contract, which every
//! backend passes through the shared [`conformance`] suite:
//!
//! - **Durable when it returns.** If [`World::append`] returns records, they are
//!   committed and will be read back by any later [`World::read`], in any process.
//! - **Fenced.** Appends carry the [`Lease`] they were made under. Once another holder
//!   has acquired the session's lease (a higher epoch), every append with the old
//!   lease fails with [`Error::StaleFence`], enforced inside the store's transaction,
//!   so two harnesses can never interleave writes to one log.
//! - **Gap-free.** Positions run 1, 2, 3, ... per session; an append is all or nothing.
//! - **Verified.** Every record read is checked against its checksum; a damaged one is
//!   [`Error::Corrupt`] with the session and position, never skipped.

pub mod access;
mod any;
pub mod blobs;
pub mod bucket;
mod checkpoint;
pub mod conformance;
mod heartbeat;
pub mod hooks;
mod lineage;
pub mod listing;
mod live;
pub mod outbox;
#[cfg(feature = "postgres")]
mod postgres;
pub mod rate;
mod sqlite;
pub mod vault;

use std::future::Future;
use std::time::Duration;

use serde::Serialize;
use steadfast_log::record;
use steadfast_log::{Event, Record, Status};

pub mod interrupt;
pub mod work;
pub use access::{AuditEntry, Scope, ServiceToken};
pub use any::{redacted, AnyWorld};
pub use checkpoint::{load_state, load_state_at};
pub use heartbeat::{Heartbeat, LeaseWatch};
pub use hooks::{Hook, HookCheck, HookSecret, HookThen};
pub use lineage::{Fork, Rewind};
pub use listing::{Cursor, SessionPage, SessionPatch, SessionQuery};
pub use live::LiveSession;
pub use outbox::{OutboxItem, Settled, OUTBOX_KINDS};
pub use vault::{Sealed, VaultEntry, VaultError, VaultKeys};

/// Bumps a change counter (see [`World::changes`]).
pub(crate) fn bump(tx: &tokio::sync::watch::Sender<u64>) {
    tx.send_modify(|n| *n = n.wrapping_add(1));
}
pub use blobs::{strip_ansi, BlobDamage, Blobs, DriveObjects, INLINE_LIMIT};
#[cfg(feature = "postgres")]
pub use postgres::PostgresWorld;
pub use sqlite::SqliteWorld;

/// Everything a world can report.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No session with this id.
    #[error("session {0} not found")]
    NotFound(String),
    /// A session with this id already exists.
    #[error("session {0} already exists")]
    AlreadyExists(String),
    /// The lease this append was made under has been taken by another holder.
    #[error("stale fence on session {session}: append under epoch {epoch}, but the lease is at epoch {current}")]
    StaleFence {
        /// The session.
        session: String,
        /// The epoch the caller held.
        epoch: u64,
        /// The session's current epoch.
        current: u64,
    },
    /// The session has ended and takes nothing more.
    #[error("session {0} has ended")]
    Ended(String),
    /// Another live holder has the session's lease.
    #[error("session {session} is being driven by {holder} (lease expires in {expires_in_ms} ms)")]
    LeaseHeld {
        /// The session.
        session: String,
        /// Who holds it.
        holder: String,
        /// How long until it lapses unless renewed.
        expires_in_ms: u64,
    },
    /// This holder could not renew its lease in time (see [`Heartbeat`]): it appends
    /// nothing more and has stopped its commands; whoever takes the lease next goes on.
    #[error("session {0}: the lease could not be renewed in time, so this driver stopped")]
    LeaseLost(String),
    /// An append failed after records were folded into the live state ahead of the
    /// log ([`LiveSession::stage`]): the state may say what the log does not, so the
    /// driver appends nothing more; waking the session again carries on from the log.
    #[error("session {0}: an earlier append failed with records staged; wake the session again")]
    OutOfStep(String),
    /// A stored record failed verification.
    #[error("corrupt log record in session {session} at position {seq}: {detail}")]
    Corrupt {
        /// The session.
        session: String,
        /// The position.
        seq: u64,
        /// What is wrong.
        detail: String,
    },
    /// The store itself is damaged (an empty or truncated database file): reported,
    /// never taken for a new, empty world.
    #[error("the world's store is damaged: {}", with_cause(.detail, .source))]
    CorruptStore {
        /// What is wrong.
        detail: String,
        /// What reading it failed with, if anything did.
        #[source]
        source: Option<Cause>,
    },
    /// The store was written by a newer Steadfast.
    #[error("{store} is at schema version {found}, newer than this build's {supported}; upgrade steadfast")]
    TooNew {
        /// The store (a database file, or the database).
        store: String,
        /// The version it is at.
        found: i64,
        /// The newest this build reads.
        supported: i64,
    },
    /// The blob store failed.
    #[error("blob store: {}", with_cause(.context, .source))]
    Blob {
        /// What was being done, where.
        context: String,
        /// The failure.
        #[source]
        source: Option<Cause>,
    },
    /// A change the caller asked for breaks a bound (too many labels, say); the
    /// message names the field.
    #[error("{0}")]
    Invalid(String),
    /// The database failed (I/O, locking); may succeed if retried.
    #[error("world backend: {}", with_cause(.context, .source))]
    Backend {
        /// What was being done, where.
        context: String,
        /// The failure.
        #[source]
        source: Option<Cause>,
    },
}

/// What a store's failure was caused by, kept as the error's source, so a log line or
/// a caller can walk the chain down to the database's or the object store's own error.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `context: cause: its cause: ...`, down the whole chain ("error performing TLS
/// handshake: invalid peer certificate: UnknownIssuer"), each part once.
fn with_cause(context: &str, cause: &Option<Cause>) -> String {
    let mut text = context.to_string();
    let mut next: Option<&(dyn std::error::Error + 'static)> = cause.as_deref().map(|c| c as _);
    while let Some(c) = next {
        let more = c.to_string();
        if !text.ends_with(&more) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&more);
        }
        next = c.source();
    }
    text
}

impl Error {
    /// The database failed with `source`.
    pub fn backend(source: impl Into<Cause>) -> Self {
        Error::Backend {
            context: String::new(),
            source: Some(source.into()),
        }
    }

    /// The database failed with `source` while doing `context`.
    pub fn backend_in(context: impl Into<String>, source: impl Into<Cause>) -> Self {
        Error::Backend {
            context: context.into(),
            source: Some(source.into()),
        }
    }

    /// The database cannot be used, for a reason of its own (no lower error says it).
    pub fn backend_says(context: impl Into<String>) -> Self {
        Error::Backend {
            context: context.into(),
            source: None,
        }
    }

    /// The blob store failed with `source`.
    pub fn blob(source: impl Into<Cause>) -> Self {
        Error::Blob {
            context: String::new(),
            source: Some(source.into()),
        }
    }

    /// The blob store failed with `source` while doing `context`.
    pub fn blob_in(context: impl Into<String>, source: impl Into<Cause>) -> Self {
        Error::Blob {
            context: context.into(),
            source: Some(source.into()),
        }
    }

    /// The blob store cannot be used, for a reason of its own.
    pub fn blob_says(context: impl Into<String>) -> Self {
        Error::Blob {
            context: context.into(),
            source: None,
        }
    }

    /// The store is damaged, as `detail` says.
    pub fn corrupt_store(detail: impl Into<String>) -> Self {
        Error::CorruptStore {
            detail: detail.into(),
            source: None,
        }
    }
}

impl Error {
    /// Whether retrying the same call may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Backend { .. } | Error::Blob { .. } | Error::LeaseHeld { .. }
        )
    }
}

/// The world's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Who is asking for a lease: a unique id plus where it runs, so a holder that died
/// on this host can be recognised without waiting out its lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Unique per harness instance.
    pub id: String,
    /// The host it runs on.
    pub host: String,
    /// Its process id.
    pub pid: u32,
}

/// Overrides the host identity holders record (default: the hostname). Set it to
/// something distinct per machine where hostnames are shared by processes that do not
/// share a process namespace (containers on the host network, say); a holder's pid is
/// only ever checked by processes of the same host identity.
pub const HOST_ID_ENV: &str = "STEADFAST_HOST_ID";

impl Holder {
    /// A new holder identity for this process.
    pub fn new(id: impl Into<String>) -> Self {
        Holder {
            id: id.into(),
            host: host_id(),
            pid: std::process::id(),
        }
    }
}

/// This process's host identity: [`HOST_ID_ENV`] if set, else the hostname. What
/// lease holders record, and what binds a workspace given as a directory to the
/// machine it is on.
pub fn host_id() -> String {
    match std::env::var(HOST_ID_ENV) {
        Ok(id) if !id.trim().is_empty() => id.trim().to_string(),
        _ => nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_default(),
    }
}

/// The right to append to one session, valid until another holder takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The session.
    pub session: String,
    /// The holder's id.
    pub holder: String,
    /// The fencing token: strictly increasing per session.
    pub epoch: u64,
}

/// A row of `steadfast sessions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct SessionSummary {
    /// The session id.
    pub id: String,
    /// Who owns it.
    pub owner: String,
    /// Where it stands.
    pub status: Status,
    /// The first user message, shortened.
    pub title: String,
    /// The last log position.
    pub last_seq: u64,
    /// Created, ms since the Unix epoch.
    pub created_at_ms: u64,
    /// Last appended to, ms since the Unix epoch.
    pub updated_at_ms: u64,
    /// The agent it runs (as `session_started` names it; empty before that).
    pub agent: String,
    /// Labels: what listings filter on.
    pub labels: std::collections::BTreeMap<String, String>,
    /// The owner's own notes on it.
    pub metadata: std::collections::BTreeMap<String, String>,
    /// The session this one was forked from, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// The parent's last position this session shares (its own records follow).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_at: Option<u64>,
}

/// The world's sessions counted, as of one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Census {
    /// Sessions per status (`new`, `idle`, `running`, ...), the statuses present.
    pub by_status: Vec<(String, u64)>,
    /// Sessions with work due (a turn left running, a queued message, an awaited
    /// signal) that no holder keeps: waiting for a worker.
    pub queued: u64,
}

/// What can be sent to a session from outside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InboundKind {
    /// A user message: starts the next turn (queued while one runs).
    Message,
    /// A user message for the running turn, taken at its next step.
    Steer,
    /// A named signal (an approval, a webhook payload) a session may be waiting on.
    Signal,
}

impl InboundKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            InboundKind::Message => "message",
            InboundKind::Steer => "steer",
            InboundKind::Signal => "signal",
        }
    }

    pub(crate) fn parse(s: &str) -> Self {
        match s {
            "steer" => InboundKind::Steer,
            "signal" => InboundKind::Signal,
            _ => InboundKind::Message,
        }
    }
}

/// An entry of a session's inbox, waiting for a driver to take it into the log.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Inbound {
    /// Increasing per world; the log records which entries were taken.
    pub id: u64,
    /// What it is.
    pub kind: InboundKind,
    /// A signal's name (empty for messages).
    pub name: String,
    /// A message's text, or a signal's JSON payload.
    pub body: serde_json::Value,
}

/// The session store. See the crate docs for the contract.
pub trait World: Send + Sync + 'static {
    /// Creates an empty session owned by `owner`.
    fn create_session(&self, session: &str, owner: &str)
        -> impl Future<Output = Result<()>> + Send;

    /// Takes the session's lease for `ttl`, raising its epoch. Succeeds if the lease is
    /// free, lapsed, already this holder's, or held by a process of this host that no
    /// longer exists; otherwise [`Error::LeaseHeld`].
    fn acquire_lease(
        &self,
        session: &str,
        holder: &Holder,
        ttl: Duration,
    ) -> impl Future<Output = Result<Lease>> + Send;

    /// Extends a held lease; [`Error::StaleFence`] if it was taken.
    fn renew_lease(&self, lease: &Lease, ttl: Duration) -> impl Future<Output = Result<()>> + Send;

    /// Gives a lease up so another holder need not wait for it to lapse.
    fn release_lease(&self, lease: &Lease) -> impl Future<Output = Result<()>> + Send;

    /// Appends events at the next positions, under `lease`. Durable when it returns.
    fn append(
        &self,
        lease: &Lease,
        events: &[Event],
    ) -> impl Future<Output = Result<Vec<Record>>> + Send;

    /// Reads the session's records from position `from` (1 for all), verified.
    fn read(&self, session: &str, from: u64) -> impl Future<Output = Result<Vec<Record>>> + Send;

    /// The position of the last `user_message` at or before `at` (0 if there is none):
    /// where the turn open at `at` began, so a reader joining at `at` can learn the
    /// turn's state from its start instead of from the whole log.
    fn turn_began(&self, session: &str, at: u64) -> impl Future<Output = Result<u64>> + Send;

    /// The position of the session's last record of `kind` at or before `upto` (0 if
    /// there is none): where a reader that needs only what follows it (the latest
    /// checkpoint, or the latest before a fork point) starts. A fork's log is searched
    /// through the records it shares with its ancestors too.
    fn last_of_kind(
        &self,
        session: &str,
        kind: &str,
        upto: u64,
    ) -> impl Future<Output = Result<u64>> + Send;

    /// Creates `fork.child`, whose log is `fork.parent`'s up to `fork.at`, shared and
    /// not copied, followed by `fork.event` as its own first record: one transaction,
    /// so a crash leaves no child or a whole one. The child copies the parent's
    /// agent, labels and metadata (and title, unless given one) and starts with no
    /// holder. [`Error::NotFound`] for no such parent, [`Error::Invalid`] for an `at`
    /// outside its log, [`Error::AlreadyExists`] for a child id in use.
    fn fork_session(&self, fork: &Fork) -> impl Future<Output = Result<SessionSummary>> + Send;

    /// Rewinds a session held under `rewind.lease` to position `rewind.to`: from now on
    /// its log reads as its records up to there followed by `rewind.event`, stored
    /// after all it had (positions never go back, so a reader's cursor stays valid);
    /// the records in between stay stored as long as the session is. One transaction.
    /// [`Error::StaleFence`] if the lease is not current, [`Error::Invalid`] for a `to`
    /// that keeps nothing or drops nothing.
    fn rewind_session(&self, rewind: &Rewind) -> impl Future<Output = Result<Record>> + Send;

    /// The sessions forked from `session` (its direct children), oldest first.
    fn forks(&self, session: &str) -> impl Future<Output = Result<Vec<String>>> + Send;

    /// Retention: replaces each streamed piece of a reply (`model_delta`) before
    /// position `before` with an [`Event::Pruned`] record at the same position, epoch
    /// and time, its checksum over the new body, so the log keeps every position and
    /// still verifies. The caller picks `before` past the end of turns whose replies'
    /// outcomes hold those pieces whole. Returns how many records were pruned.
    fn prune_deltas(&self, session: &str, before: u64) -> impl Future<Output = Result<u64>> + Send;

    /// The blobs holding this session's records too big to keep inline (their bodies
    /// live in the blob store), for garbage collection.
    fn spilled(&self, session: &str) -> impl Future<Output = Result<Vec<String>>> + Send;

    /// One page of the sessions `query` selects, newest first (see [`listing`]).
    fn list_sessions(
        &self,
        query: &SessionQuery,
    ) -> impl Future<Output = Result<SessionPage>> + Send;

    /// Renames, labels or annotates a session ([`SessionPatch`], checked by the
    /// caller); [`Error::Invalid`] if the result would carry too many labels or
    /// metadata entries. A title set here is kept over the one the first message gives.
    fn update_session(
        &self,
        session: &str,
        patch: &SessionPatch,
    ) -> impl Future<Output = Result<()>> + Send;

    /// One session's summary.
    fn session(&self, session: &str) -> impl Future<Output = Result<SessionSummary>> + Send;

    /// Queues something for a session; durable when it returns. Returns its id.
    /// [`Error::NotFound`] for an unknown session, [`Error::Ended`] for an ended one.
    fn post(
        &self,
        session: &str,
        kind: InboundKind,
        name: &str,
        body: &serde_json::Value,
    ) -> impl Future<Output = Result<u64>> + Send;

    /// The session's inbox entries not yet taken, oldest first. (An append whose
    /// events carry an `inbox_id` marks that entry taken in the same transaction.)
    fn inbox(&self, session: &str) -> impl Future<Output = Result<Vec<Inbound>>> + Send;

    /// The turn queue: takes the lease of one session that needs driving (a turn
    /// left running, a queued message for an idle session, or the signal a waiting
    /// session awaits) whose lease is free. `None` if there is no such session.
    fn claim(
        &self,
        holder: &Holder,
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<Lease>>> + Send;

    /// Removes a session: its log, inbox and summary.
    fn delete_session(&self, session: &str) -> impl Future<Output = Result<()>> + Send;

    /// How many sessions are in each status, and how many have work due that no
    /// holder keeps (the queue's depth): what the metrics' census gauges show.
    fn census(&self) -> impl Future<Output = Result<Census>> + Send;

    /// Bytes the histories of every session of `session`'s owner keep together (what
    /// their tool calls' snapshots stored and their outputs offloaded; see
    /// [`Event::kept_bytes`]): what the per-owner history quota is checked against.
    /// Deleting a session takes its share off.
    fn owner_kept_bytes(&self, session: &str) -> impl Future<Output = Result<u64>> + Send;

    /// Takes `draw.amount` from the rate bucket `draw.key`, shared by every process on
    /// this world: false, taking nothing, when the bucket holds less. See [`rate`].
    fn take_tokens(&self, draw: &rate::Draw) -> impl Future<Output = Result<bool>> + Send;

    /// Takes up to `limit` outbox entries that are due at `now_ms` (oldest first) and
    /// holds them until `now_ms + hold_ms`: no other taker gets them meanwhile, and
    /// one its taker never settles is due again when the hold lapses. See
    /// [`outbox`].
    fn outbox_take(
        &self,
        now_ms: u64,
        hold_ms: u64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<OutboxItem>>> + Send;

    /// Records how an attempt to deliver entry `id` went.
    fn outbox_settle(&self, id: u64, settled: &Settled) -> impl Future<Output = Result<()>> + Send;

    /// Forgets the outbox entries of records appended before `before_ms`, delivered
    /// or not. Returns how many.
    fn outbox_prune(&self, before_ms: u64) -> impl Future<Output = Result<u64>> + Send;

    /// Stores owner `owner`'s credential `name` (replacing one of that name), sealed
    /// ([`vault`]); the store never sees the value.
    fn vault_put(
        &self,
        owner: &str,
        name: &str,
        sealed: &Sealed,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Owner `owner`'s credential `name`, sealed, if there is one.
    fn vault_get(
        &self,
        owner: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<VaultEntry>>> + Send;

    /// The credentials of `owner` (of every owner with `None`, for a re-key), by name.
    fn vault_list(
        &self,
        owner: Option<&str>,
    ) -> impl Future<Output = Result<Vec<VaultEntry>>> + Send;

    /// Forgets owner `owner`'s credential `name`; whether there was one.
    fn vault_delete(&self, owner: &str, name: &str) -> impl Future<Output = Result<bool>> + Send;

    /// Adds an inbound hook ([`hooks`]); false when the session already has one of that
    /// name (a hook is replaced by deleting it first, which revokes its secret).
    fn hook_create(&self, hook: &Hook) -> impl Future<Output = Result<bool>> + Send;

    /// The hooks of `session` (of every session with `None`, for a re-key), by
    /// session and name.
    fn hooks(&self, session: Option<&str>) -> impl Future<Output = Result<Vec<Hook>>> + Send;

    /// Replaces the sealed key of `session`'s hook `name` (a re-key); whether there
    /// was one with a sealed key.
    fn hook_reseal(
        &self,
        session: &str,
        name: &str,
        sealed: &Sealed,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Revokes `session`'s hook `name` and forgets its deliveries; whether there was one.
    fn hook_delete(&self, session: &str, name: &str) -> impl Future<Output = Result<bool>> + Send;

    /// Takes delivery `delivery` of `session`'s hook `name` at `at_ms`: true the first
    /// time, false for a replay. Deliveries taken before `forget_before_ms` are
    /// forgotten (a sender's replay window is shorter).
    fn hook_take_delivery(
        &self,
        session: &str,
        name: &str,
        delivery: &str,
        at_ms: u64,
        forget_before_ms: u64,
    ) -> impl Future<Output = Result<bool>> + Send;

    /// Forgets a delivery taken by [`World::hook_take_delivery`] that its session did
    /// not take (it was not waiting), so the sender's retry is not called a replay.
    fn hook_untake_delivery(
        &self,
        session: &str,
        name: &str,
        delivery: &str,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Stores a token issued through the API ([`access`]); its id is new.
    fn token_issue(&self, token: &ServiceToken) -> impl Future<Output = Result<()>> + Send;

    /// Every issued token, revoked ones too, newest first.
    fn tokens(&self) -> impl Future<Output = Result<Vec<ServiceToken>>> + Send;

    /// The issued token with this hash, live or not.
    fn token_by_hash(
        &self,
        hash: &str,
    ) -> impl Future<Output = Result<Option<ServiceToken>>> + Send;

    /// Revokes token `id` at `at_ms` (kept, listed as revoked); whether there was a
    /// live one.
    fn token_revoke(&self, id: &str, at_ms: u64) -> impl Future<Output = Result<bool>> + Send;

    /// Appends an entry to the audit log (its id and time are the store's).
    fn audit(
        &self,
        actor: &str,
        action: &str,
        target: &str,
        detail: &serde_json::Value,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Up to `limit` audit entries after id `after`, oldest first; with `about`, only
    /// those about that session (its target, and an action on a session, its hooks or
    /// its preview URLs, its shells: `session.*`, `hook.*`, `preview.*`,
    /// `shell.*`), which its owner may read.
    fn audit_log(
        &self,
        after: u64,
        limit: usize,
        about: Option<&str>,
    ) -> impl Future<Output = Result<Vec<AuditEntry>>> + Send;

    /// A counter that moves when sessions change, so stream tails and idle workers
    /// wake at once. SQLite: this process's appends and posts (other processes' are
    /// seen by polling). PostgreSQL: every process's, through `LISTEN/NOTIFY`.
    fn changes(&self) -> tokio::sync::watch::Receiver<u64>;

    /// A counter that moves when work is due that no change announced: a lease
    /// lapsing, a holder's process dying, a retry's time coming. Idle workers wait on
    /// it and [`World::changes`] instead of polling the queue. A world that cannot
    /// tell moves it with `changes` alone, and its workers look again as they back
    /// off.
    fn due(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes()
    }

    /// Whether this process's last append under `lease` found the session's inbox
    /// empty as it committed, and this process has posted nothing to it since
    /// (`false`: it did not, or it is not known). A driver that looks for steers
    /// before each model call, and for interrupts as each call starts, may skip
    /// those reads: what another process sent since is seen at the next look, one
    /// step later (or within an interrupt watch's poll). Each append answers it in
    /// its own transaction, saving a round trip to the store per look.
    fn inbox_seen_empty(&self, lease: &Lease) -> bool;

    /// Reads from the store once: `Ok` if it can be reached and its schema is there
    /// (a readiness check, and the first thing a server or worker does).
    fn ping(&self) -> impl Future<Output = Result<()>> + Send;
}

/// Counts a successful append in the process's metrics (its latency, and what its
/// records say happened), on every store alike.
pub(crate) fn observe_append(
    store: &'static str,
    lease: &Lease,
    started: std::time::Instant,
    appended: Result<Vec<Record>>,
) -> Result<Vec<Record>> {
    if let Ok(records) = &appended {
        steadfast_metrics::metrics().appended(store, &lease.session, records, started.elapsed());
    }
    appended
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A session's lease as stored.
pub(crate) struct LeaseRow {
    pub epoch: u64,
    pub holder: Option<String>,
    pub host: Option<String>,
    pub pid: Option<u32>,
    pub expires_ms: u64,
    /// The holder's connection to the world is gone (its process died), wherever it
    /// ran (PostgreSQL: see `lease_liveness`).
    pub gone: bool,
}

impl LeaseRow {
    /// Whether `holder` may take the lease at time `now`: it is free, lapsed, already
    /// theirs, or held by a process of this host that no longer exists.
    pub(crate) fn is_free_for(&self, holder: &Holder, now: u64) -> bool {
        match &self.holder {
            None => true,
            Some(h) if *h == holder.id => true,
            Some(_) if self.expires_ms <= now || self.gone => true,
            Some(_) => {
                self.host.as_deref() == Some(holder.host.as_str())
                    && self
                        .pid
                        .is_some_and(|p| p != holder.pid && process_is_gone(p))
            }
        }
    }
}

/// Whether process `pid` of this host has exited (a zombie not yet reaped by its
/// parent counts as exited: it will never write again).
fn process_is_gone(pid: u32) -> bool {
    let target = nix::unistd::Pid::from_raw(pid as i32);
    if matches!(
        nix::sys::signal::kill(target, None),
        Err(nix::errno::Errno::ESRCH)
    ) {
        return true;
    }
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let after = &stat[stat.rfind(')')? + 1..];
            after
                .split_whitespace()
                .next()
                .map(|state| state == "Z" || state == "X")
        })
        .unwrap_or(false)
}

/// What a batch of events changes in a session's summary row.
#[derive(Debug, Default)]
pub(crate) struct Summary {
    pub status: Option<Status>,
    pub title: Option<String>,
    /// The agent `session_started` names.
    pub agent: Option<String>,
    /// `Some(None)` clears the awaited signal.
    pub waiting_for: Option<Option<String>>,
    /// Inbox entries these events took.
    pub taken: Vec<u64>,
    /// Until when no worker may take the session (0: at once): a retry's time after
    /// a failure, cleared by whatever the session records next.
    pub retry_at_ms: u64,
    /// Bytes these events add to what the session's history keeps (see
    /// [`Event::kept_bytes`]).
    pub kept_bytes: u64,
}

/// A status as a store keeps it, read back: text no status is means a damaged store.
pub(crate) fn stored_status(text: &str) -> Result<Status> {
    text.parse().map_err(|e| Error::CorruptStore {
        detail: "a session's status".into(),
        source: Some(Box::new(e)),
    })
}

/// The summary changes these events make.
pub(crate) fn summarize(events: &[Event]) -> Summary {
    let mut s = Summary::default();
    for e in events {
        s.kept_bytes = s.kept_bytes.saturating_add(e.kept_bytes());
        s.retry_at_ms = match e {
            Event::DriveFailed { retry_at_ms, .. } => retry_at_ms.unwrap_or(0),
            _ => 0,
        };
        if let Some(status) = Status::after(e) {
            s.status = Some(status);
        }
        match e {
            Event::SessionStarted { agent, .. } => s.agent = Some(agent.to_string()),
            Event::UserMessage {
                turn,
                text,
                inbox_id,
            } => {
                if *turn == 1 {
                    s.title = Some(text.chars().take(80).collect());
                }
                s.taken.extend(inbox_id);
            }
            Event::Steered { inbox_id, .. } => s.taken.push(*inbox_id),
            Event::CompactionIntent { inbox_id, .. } => s.taken.extend(inbox_id),
            Event::TurnInterrupted {
                inbox_id, stopped, ..
            } => {
                s.taken.push(*inbox_id);
                if *stopped {
                    s.waiting_for = Some(None);
                }
            }
            Event::WaitStarted { name, .. } => s.waiting_for = Some(Some(name.clone())),
            Event::SignalReceived { inbox_id, .. } => {
                s.waiting_for = Some(None);
                s.taken.push(*inbox_id);
            }
            Event::Escalated { .. } => {
                s.waiting_for = Some(Some(steadfast_log::RESUME_SIGNAL.to_string()));
            }
            Event::SessionEnded { .. } => s.waiting_for = Some(None),
            _ => {}
        }
    }
    s
}

/// Events ready to store: each serialised once, and the bodies larger than
/// [`INLINE_LIMIT`] stored in the blob store (if one is configured).
pub(crate) struct Serialized {
    /// Per event, its JSON body.
    pub bodies: Vec<Vec<u8>>,
    /// Per event, the blob hash of a spilled body (stored empty in the log).
    pub spilled: Vec<Option<String>>,
}

impl Serialized {
    /// The body to store for event `i`: empty if it was spilled.
    pub fn stored(&self, i: usize) -> &[u8] {
        if self.spilled[i].is_some() {
            &[]
        } else {
            &self.bodies[i]
        }
    }
}

/// Serialises `events` and spills their large bodies to `spill`.
pub(crate) async fn serialize_and_spill(
    spill: Option<&Blobs>,
    events: &[Event],
) -> Result<Serialized> {
    let mut bodies = Vec::with_capacity(events.len());
    let mut spilled = Vec::with_capacity(events.len());
    for event in events {
        let body = serde_json::to_vec(event).map_err(Error::backend)?;
        spilled.push(match spill {
            Some(blobs) if body.len() > INLINE_LIMIT => Some(blobs.put_raw(&body).await?),
            _ => None,
        });
        bodies.push(body);
    }
    Ok(Serialized { bodies, spilled })
}

/// Puts the spilled bodies back into records read with an empty body and a blob hash.
pub(crate) async fn unspill(
    session: &str,
    spill: Option<&Blobs>,
    raw: &mut [(RawRecord, Option<String>)],
) -> Result<()> {
    for ((seq, _, _, enc), blob) in raw.iter_mut() {
        let Some(hash) = blob else { continue };
        let corrupt = |detail: String| Error::Corrupt {
            session: session.to_string(),
            seq: *seq,
            detail,
        };
        let blobs = spill.ok_or_else(|| {
            corrupt(format!(
                "the record's body is in blob {hash}, but no blob store is configured"
            ))
        })?;
        enc.body = blobs.get(hash).await.map_err(|e| {
            corrupt(format!(
                "the record's body (blob {hash}) cannot be read: {e}"
            ))
        })?;
    }
    Ok(())
}

/// A stored record as read: position, epoch, time, encoded body.
pub(crate) type RawRecord = (u64, u64, u64, steadfast_log::EncodedRecord);

/// Verifies and decodes records, on every core for long logs (waking a long session
/// is dominated by this).
pub(crate) fn decode_all(session: &str, raw: Vec<RawRecord>) -> Result<Vec<Record>> {
    let decode = |chunk: &[RawRecord]| -> Result<Vec<Record>> {
        chunk
            .iter()
            .map(|(seq, epoch, at_ms, enc)| {
                record::decode(session, *seq, *epoch, *at_ms, enc).map_err(|e| Error::Corrupt {
                    session: session.to_string(),
                    seq: *seq,
                    detail: e.to_string(),
                })
            })
            .collect()
    };
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8);
    if raw.len() < 2048 || threads == 1 {
        return decode(&raw);
    }
    let chunk = raw.len().div_ceil(threads);
    let parts: Vec<Result<Vec<Record>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = raw
            .chunks(chunk)
            .map(|c| scope.spawn(move || decode(c)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::backend_says("decoder thread panicked")))
            })
            .collect()
    });
    let mut out = Vec::with_capacity(raw.len());
    for part in parts {
        out.extend(part?);
    }
    Ok(out)
}

/// [`verify`] off the async threads for big reads: a few at a time on blocking
/// threads (the permit travels with the work), so many readers (a thousand event
/// streams) share a handful of threads. Small reads, the common tail of a stream, are
/// decoded in place.
pub(crate) async fn verify_off_thread(
    session: String,
    from: u64,
    last_seq: u64,
    raw: Vec<RawRecord>,
) -> Result<Vec<Record>> {
    /// Records decoded in place rather than on a blocking thread.
    const IN_PLACE: usize = 16;
    /// Reads decoded on blocking threads at once, per process.
    static DECODERS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(4);
    if raw.len() <= IN_PLACE {
        return verify(&session, from, last_seq, raw);
    }
    let permit = DECODERS
        .acquire()
        .await
        .map_err(|e| Error::backend_in("decode task failed", e))?;
    let permit = SendPermit(permit);
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        verify(&session, from, last_seq, raw)
    })
    .await
    .map_err(|e| Error::backend_in("decode task failed", e))?
}

/// A permit of a `'static` semaphore, held by the blocking work it admits.
struct SendPermit(#[allow(dead_code)] tokio::sync::SemaphorePermit<'static>);

/// The stored form of the [`Event::Pruned`] record that replaces a record of kind
/// `was` whose body was `bytes` long, at the same coordinates.
pub(crate) fn pruned_record(
    session: &str,
    seq: u64,
    epoch: u64,
    at_ms: u64,
    was: &str,
    bytes: u64,
) -> record::EncodedRecord {
    let record = Record {
        seq,
        epoch,
        at_ms,
        event: Event::Pruned {
            was: was.to_string(),
            bytes,
        },
    };
    record::encode(session, &record)
}

/// Checks that rows run `from`, `from + 1`, ... up to the session's `last_seq` without
/// gaps, then verifies and decodes them.
pub(crate) fn verify(
    session: &str,
    from: u64,
    last_seq: u64,
    raw: Vec<RawRecord>,
) -> Result<Vec<Record>> {
    let mut expected = from;
    for (seq, ..) in &raw {
        if *seq != expected {
            return Err(Error::Corrupt {
                session: session.to_string(),
                seq: expected,
                detail: format!("record missing (next stored is {seq})"),
            });
        }
        expected += 1;
    }
    if expected <= last_seq {
        return Err(Error::Corrupt {
            session: session.to_string(),
            seq: expected,
            detail: format!("log ends early; the session records {last_seq} events"),
        });
    }
    decode_all(session, raw)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_killed_process_is_gone_even_before_it_is_reaped() {
        let mut child = std::process::Command::new("sleep")
            .arg("100")
            .spawn()
            .unwrap();
        let pid = child.id();
        assert!(!super::process_is_gone(pid));
        child.kill().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(super::process_is_gone(pid), "a zombie is gone");
        child.wait().unwrap();
        assert!(super::process_is_gone(pid));
    }
}
