//! Where a session stands, as one type: the fold's phase reads as it, the world's
//! summaries store it, streams and the API say it.

use serde::{Deserialize, Serialize};

use crate::event::{EndState, Event};

/// Where a session stands. `new`: created, no turn yet; `retrying`: a failure that
/// retrying may fix, with the next attempt scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(as = SessionStatus)]
pub enum Status {
    /// Created; no turn has run yet (only listings say it: a session's folded state
    /// reads `idle` then).
    New,
    /// Between turns, waiting for a user message.
    Idle,
    /// A turn is open (or, in the API, a message waits for a worker to open one).
    Running,
    /// Paused until a named signal arrives.
    Waiting,
    /// A worker failed to drive it; another attempt is scheduled.
    Retrying,
    /// Ended: completed.
    Completed,
    /// Ended: failed.
    Failed,
    /// Stopped by a bound and escalated to a human: waits for a `resume` signal
    /// (or, in logs that ended it, over for good).
    Escalated,
    /// Ended: closed by a person.
    Closed,
}

/// Every status, in the order listings count them.
pub const STATUSES: [Status; 9] = [
    Status::New,
    Status::Idle,
    Status::Running,
    Status::Waiting,
    Status::Retrying,
    Status::Completed,
    Status::Failed,
    Status::Escalated,
    Status::Closed,
];

impl Status {
    /// How it is written: in the API, in the stores' columns, in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::New => "new",
            Status::Idle => "idle",
            Status::Running => "running",
            Status::Waiting => "waiting",
            Status::Retrying => "retrying",
            Status::Completed => "completed",
            Status::Failed => "failed",
            Status::Escalated => "escalated",
            Status::Closed => "closed",
        }
    }

    /// The status written as `text`, if it is one.
    pub fn parse(text: &str) -> Option<Status> {
        STATUSES.into_iter().find(|s| s.as_str() == text)
    }

    /// The status of a session that ended in `state`.
    pub fn ended(state: EndState) -> Status {
        match state {
            EndState::Completed => Status::Completed,
            EndState::Failed => Status::Failed,
            EndState::Escalated => Status::Escalated,
            EndState::Closed => Status::Closed,
        }
    }

    /// The status `event` moves a session to, read from the event alone (what a
    /// store's summary and a stream keep as records go by), or `None` when it leaves
    /// the status as it was. It agrees with the fold's phase after every event but an
    /// explorer's answer, which the fold counts (see `fold::signals`): the first one
    /// reads as running here, while the `explore` call still waits for the rest.
    pub fn after(event: &Event) -> Option<Status> {
        Some(match event {
            Event::SessionStarted { .. } | Event::TurnEnded { .. } => Status::Idle,
            Event::TurnInterrupted { stopped: true, .. } => Status::Idle,
            Event::UserMessage { .. } | Event::SignalReceived { .. } => Status::Running,
            Event::WaitStarted { .. } => Status::Waiting,
            Event::Escalated { .. } => Status::Escalated,
            Event::SessionEnded { state, .. } => Status::ended(*state),
            _ => return None,
        })
    }
}

impl Status {
    /// Whether a session in this status has ended for good, as far as its status
    /// says: an escalated session may have ended too, which only its log tells.
    pub fn is_over(self) -> bool {
        matches!(self, Status::Completed | Status::Failed | Status::Closed)
    }
}

impl Status {
    /// Whether something runs that an interrupt can stop: a turn (running, or
    /// paused in a wait), or a retry of one.
    pub fn is_interruptible(self) -> bool {
        matches!(self, Status::Running | Status::Waiting | Status::Retrying)
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Status {
    type Err = UnknownStatus;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Status::parse(text).ok_or_else(|| UnknownStatus(text.to_string()))
    }
}

/// A status name that is none of [`Status`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown session status `{0}`")]
pub struct UnknownStatus(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_reads_back_as_itself() {
        for status in STATUSES {
            assert_eq!(Status::parse(status.as_str()), Some(status));
            assert_eq!(
                serde_json::to_value(status).unwrap(),
                serde_json::json!(status.as_str())
            );
        }
        assert_eq!(Status::parse("ended"), None);
    }
}
