//! Waking a session from its latest checkpoint: the stored state and only the records
//! after it, so what a worker pays to take a session up does not grow with its history.
//! Every driver (the native loop, a wrapped CLI's turn, the API's state view) loads a
//! session through here.

use steadfast_log::{fold, Record, SessionState, CHECKPOINT_KIND};

use crate::{Blobs, Error, Result, World};

/// A session's state, from its latest checkpoint and the records after it when there
/// is a usable one (this format, its blob intact), else from the whole log; with the
/// records read (from the checkpoint's own on, or all).
pub async fn load_state<W: World>(
    world: &W,
    blobs: &Blobs,
    session: &str,
) -> Result<(SessionState, Vec<Record>)> {
    load_state_at(world, blobs, session, u64::MAX).await
}

/// [`load_state`] as of position `upto`: the state a fork at `upto` begins from
/// (records past it are read only as far as the latest checkpoint before it
/// leaves them unread; the ones returned end at `upto`).
pub async fn load_state_at<W: World>(
    world: &W,
    blobs: &Blobs,
    session: &str,
    upto: u64,
) -> Result<(SessionState, Vec<Record>)> {
    let read = |from: u64| async move {
        let mut records = world.read(session, from).await?;
        records.retain(|r| r.seq <= upto);
        Ok::<_, Error>(records)
    };
    let at = world.last_of_kind(session, CHECKPOINT_KIND, upto).await?;
    if at > 0 {
        let records = read(at).await?;
        if let Some(steadfast_log::Event::Checkpoint { blob, .. }) =
            records.first().map(|r| &r.event)
        {
            match blobs.get(&blob.hash).await {
                Ok(bytes) => {
                    if let Some(state) = steadfast_log::fold::Checkpoint::resume(&bytes, &records) {
                        let state = state.map_err(|e| corrupt(session, &e))?;
                        return Ok((state, records));
                    }
                    tracing::info!(%session, at, "checkpoint of another format: folding the whole log");
                }
                Err(e) => {
                    tracing::warn!(%session, at, error = %e, "checkpoint unreadable: folding the whole log");
                }
            }
        }
    }
    let records = read(1).await?;
    let state = fold(&records).map_err(|e| corrupt(session, &e))?;
    Ok((state, records))
}

/// A log that does not fold is damaged.
pub(crate) fn corrupt(session: &str, e: &steadfast_log::FoldError) -> Error {
    Error::Corrupt {
        session: session.to_string(),
        seq: 0,
        detail: e.to_string(),
    }
}
