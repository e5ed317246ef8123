//! The outbox: records that the operator's webhook is to hear of, queued by the store
//! itself in the same transaction as the record (a trigger on the log's table), so a
//! change that is in the log is in the outbox — nothing committed goes unannounced,
//! whichever process appended it — and nothing is announced that did not commit.
//! A deliverer takes due entries for a while ([`crate::World::outbox_take`]), and
//! settles each as delivered or failed with its next attempt
//! ([`crate::World::outbox_settle`]); an entry it took and never settled (its process
//! died) is due again when the hold lapses. Entries stay as the record of their
//! deliveries until pruned.

/// The kinds of record queued for the webhook: a session that waits for a human, is
/// escalated, finished a turn, was interrupted or ended.
pub const OUTBOX_KINDS: &[&str] = &[
    "wait_started",
    "escalated",
    "turn_ended",
    "turn_interrupted",
    "session_ended",
];

/// One queued record, as taken for delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxItem {
    /// The entry's id, unique in the world and increasing: the delivery's
    /// idempotency key is made of it.
    pub id: u64,
    /// The session.
    pub session: String,
    /// The record's position in the session's log.
    pub seq: u64,
    /// The record's kind (one of [`OUTBOX_KINDS`]).
    pub kind: String,
    /// When the record was appended, ms since the Unix epoch.
    pub at_ms: u64,
    /// Failed delivery attempts so far.
    pub attempts: u32,
}

/// How a delivery attempt went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// The receiver took it (a 2xx status).
    Delivered {
        /// The receiver's HTTP status.
        status: u16,
    },
    /// It failed; try again at `retry_at_ms`, or never (`None`: given up).
    Failed {
        /// What went wrong (a status, a connection error).
        error: String,
        /// When the next attempt is due, ms since the Unix epoch.
        retry_at_ms: Option<u64>,
    },
}
