//! The history quota: what a session's history may keep beyond its log.
//!
//! Every call that changes the workspace leaves a snapshot, and the drive keeps each
//! one's new objects for as long as the log names it; a big output is kept as a blob.
//! A workspace quota bounds the workspace at any one moment, not what its history
//! piles up: five steps that each write a different 90 MB file under a 100 MB
//! workspace quota keep 450 MB. So each outcome records the bytes its snapshots stored
//! ([`Event::ToolCallOutcome`]'s `stored_bytes`, with its output's, summed as
//! [`Event::kept_bytes`]), the fold sums a session's, and the world sums an owner's
//! ([`World::owner_kept_bytes`]).
//!
//! A call starts only while both sums are under their quotas; past either, the call
//! is answered with an error that says so and nothing runs, for every agent alike.
//! One call that starts under the quota can pass it by what it writes, which the
//! workspace quota bounds.
//!
//! [`Event::ToolCallOutcome`]: steadfast_log::Event::ToolCallOutcome
//! [`Event::kept_bytes`]: steadfast_log::Event::kept_bytes
//! [`World::owner_kept_bytes`]: steadfast_world::World::owner_kept_bytes

use steadfast_sandbox::{ResourceLimits, Sandbox};
use steadfast_world::World;

use crate::{Journal, Result};

/// The operator's history quotas, in bytes (none: no quota).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HistoryQuota {
    /// What one session's history may keep.
    pub session: Option<u64>,
    /// What the histories of all of one owner's sessions may keep together.
    pub owner: Option<u64>,
}

const MIB: u64 = 1024 * 1024;

impl HistoryQuota {
    /// The quotas `limits` set (`history_mb`, `owner_history_mb`; 0 is no quota, as
    /// for the upload quota, not a session that may run nothing).
    pub fn of(limits: &ResourceLimits) -> Self {
        let bytes = |mb: Option<u64>| mb.filter(|mb| *mb > 0).map(|mb| mb.saturating_mul(MIB));
        HistoryQuota {
            session: bytes(limits.history_mb),
            owner: bytes(limits.owner_history_mb),
        }
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / MIB as f64)
}

impl<W: World + Clone, S: Sandbox> Journal<W, S> {
    /// Why no call may start now, if none may: the session's history, or its owner's
    /// sessions' together, keep as much as their quota allows.
    pub(crate) async fn history_full(&self) -> Result<Option<String>> {
        let quota = self.history_quota();
        let kept = self.live().with(|s| s.kept_bytes);
        if let Some(limit) = quota.session.filter(|limit| kept >= *limit) {
            return Ok(Some(format!(
                "[steadfast] this call did not run: this session's history is full. Its \
                 snapshots and outputs keep {}, and the operator allows {} per session. \
                 Nothing was changed. Finish with what you have and tell the user; a new \
                 session starts a new history.",
                mib(kept),
                mib(limit)
            )));
        }
        if let Some(limit) = quota.owner {
            let session = &self.live().lease().session;
            let all = self.live().world().owner_kept_bytes(session).await?;
            if all >= limit {
                return Ok(Some(format!(
                    "[steadfast] this call did not run: the histories of this user's \
                     sessions are full. Together they keep {}, and the operator allows {} \
                     per user; deleting sessions frees it. Nothing was changed. Finish with \
                     what you have and tell the user.",
                    mib(all),
                    mib(limit)
                )));
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotas_are_read_in_mib_and_zero_is_none() {
        let limits = ResourceLimits {
            history_mb: Some(2),
            owner_history_mb: Some(0),
            ..ResourceLimits::default()
        };
        assert_eq!(
            HistoryQuota::of(&limits),
            HistoryQuota {
                session: Some(2 * MIB),
                owner: None
            }
        );
        let unset = ResourceLimits {
            history_mb: None,
            ..ResourceLimits::default()
        };
        assert_eq!(HistoryQuota::of(&unset), HistoryQuota::default());
    }
}
