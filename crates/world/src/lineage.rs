//! Forks: a session whose log begins as another's, shared rather than copied.
//!
//! A fork's row names its ancestry as *segments*: "positions `lo..=hi` of my log are
//! positions `lo..=hi` of session `ancestor`'s". A child of a child inherits its
//! parent's segments, clipped at the fork point, so the list is as long as the
//! chain of forks, never as long as the history: forking costs the same at ten
//! records and at a million. Each record keeps the checksum its own session wrote
//! it under, so a fork's log reads as one continuous log that verifies record by
//! record. A session that forks share is kept, records and all, while any fork
//! needs it; deleting it removes only what no fork reads.

use steadfast_log::{Event, Record};

use crate::{Error, RawRecord, Result};

/// Positions `lo..=hi` of a log, stored as `session`'s records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Segment {
    /// The session whose rows hold these records (and whose id their checksums cover).
    pub session: String,
    /// The first position.
    pub lo: u64,
    /// The last position (`u64::MAX` for a session's own open end).
    pub hi: u64,
}

/// What a new fork is: the caller has checked `at` against the parent's log and
/// folded `event` onto the parent's state there, which gives `status` and
/// `waiting_for`.
#[derive(Debug, Clone)]
pub struct Fork {
    /// The session forked.
    pub parent: String,
    /// The new session's id.
    pub child: String,
    /// Who owns the new session.
    pub owner: String,
    /// The parent's last position the child shares (at least 1).
    pub at: u64,
    /// The child's first record of its own, stored at `at + 1`
    /// ([`Event::Forked`]).
    pub event: Event,
    /// The child's status with `event` folded in.
    pub status: steadfast_log::Status,
    /// The signal the child waits for, if it waits.
    pub waiting_for: Option<String>,
    /// A title for the child; `None` keeps the parent's.
    pub title: Option<String>,
}

/// A rewind of a session whose lease the caller holds: its log reads as its records
/// up to `to` followed by `event` (an [`Event::Rewound`]), stored after every record
/// it had, which stay where they are (a fork taken first keeps them readable).
#[derive(Debug, Clone)]
pub struct Rewind {
    /// The lease the session is held under.
    pub lease: crate::Lease,
    /// The last position the session keeps in its log.
    pub to: u64,
    /// The record that follows it.
    pub event: Event,
    /// The session's status with `event` folded in.
    pub status: steadfast_log::Status,
    /// The signal it waits for, if it waits.
    pub waiting_for: Option<String>,
}

/// `to` must keep at least the first record and drop at least one.
pub(crate) fn check_rewind_point(session: &str, to: u64, last_seq: u64) -> Result<()> {
    if to == 0 || to >= last_seq {
        return Err(Error::Invalid(format!(
            "to: session {session} has records 1 to {last_seq}; rewind to one from 1 to {}",
            last_seq.saturating_sub(1)
        )));
    }
    Ok(())
}

/// The segments a session's log reads from, oldest first: its ancestors' (stored in
/// its row's lineage) and then its own rows, from `own_lo` on.
pub(crate) fn segments(session: &str, ancestry: Vec<Segment>, own_lo: u64) -> Vec<Segment> {
    let mut all = ancestry;
    all.push(Segment {
        session: session.to_string(),
        lo: own_lo,
        hi: u64::MAX,
    });
    all
}

/// The ancestry of a fork of a session with `parent_segments` (all of them, its own
/// open one last) at position `at`: each clipped at `at`, those past it dropped.
pub(crate) fn ancestry_at(parent_segments: &[Segment], at: u64) -> Vec<Segment> {
    parent_segments
        .iter()
        .filter(|s| s.lo <= at)
        .map(|s| Segment {
            session: s.session.clone(),
            lo: s.lo,
            hi: s.hi.min(at),
        })
        .collect()
}

/// The part of `segment` a read from position `from` covers, if any: `(lo, hi)`.
pub(crate) fn window(segment: &Segment, from: u64) -> Option<(u64, u64)> {
    let lo = segment.lo.max(from);
    (lo <= segment.hi).then_some((lo, segment.hi))
}

/// Stored positions are SQL integers: an open end is the largest one.
pub(crate) fn sql_position(seq: u64) -> i64 {
    i64::try_from(seq).unwrap_or(i64::MAX)
}

/// Verifies and decodes a read that spans segments: each segment's rows must run
/// without gaps from the read's start in it to its end (the session's `last_seq` for
/// its own), and are checked against the checksums of the session that wrote them.
pub(crate) async fn verify_segments(
    last_seq: u64,
    parts: Vec<(Segment, u64, Vec<RawRecord>)>,
) -> Result<Vec<Record>> {
    let mut out = Vec::new();
    for (segment, from, raw) in parts {
        let last = segment.hi.min(last_seq);
        out.extend(crate::verify_off_thread(segment.session, from, last, raw).await?);
    }
    Ok(out)
}

/// `at` must name a record the parent has: from its first (`session_started`) to its
/// last committed one.
pub(crate) fn check_fork_point(parent: &str, at: u64, last_seq: u64) -> Result<()> {
    if at == 0 || at > last_seq {
        return Err(Error::Invalid(format!(
            "at: session {parent} has records 1 to {last_seq}; cannot fork at {at}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(session: &str, lo: u64, hi: u64) -> Segment {
        Segment {
            session: session.into(),
            lo,
            hi,
        }
    }

    #[test]
    fn a_fork_of_a_fork_keeps_the_chain_clipped_at_its_point() {
        // b forked a at 10; c forks b at 15, inside b's own records.
        let b = segments("b", vec![seg("a", 1, 10)], 11);
        assert_eq!(ancestry_at(&b, 15), [seg("a", 1, 10), seg("b", 11, 15)]);
        // d forks b at 7, inside what b shares with a: only a's part.
        assert_eq!(ancestry_at(&b, 7), [seg("a", 1, 7)]);
    }

    #[test]
    fn a_read_covers_only_the_segments_it_reaches() {
        let s = seg("a", 1, 10);
        assert_eq!(window(&s, 1), Some((1, 10)));
        assert_eq!(window(&s, 10), Some((10, 10)));
        assert_eq!(window(&s, 11), None);
    }
}
