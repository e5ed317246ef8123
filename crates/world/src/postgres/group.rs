//! Group commit for lean appends.
//!
//! Most appends insert their events and nothing else (see `LEAN_APPEND`). When many
//! sessions append at once, each in a transaction of its own, the database spends
//! more on the transactions (a round trip, a parse, a commit record, a wake-up) than
//! on the rows. So at most [`LANES`] lean-append statements are in flight per
//! process; an append that finds every lane busy waits in a queue, and the next free
//! lane takes the whole queue as one statement and one commit.
//!
//! Nothing about an append's durability changes: it returns only once the
//! transaction holding its rows has committed, each row still passes the fence
//! trigger under its own session's epoch, and an append alone (the common case with
//! few sessions) goes out at once as the same single-session statement as before.
//! When a batch is refused (a stale fence or a position someone else took), its
//! appends are tried again one by one, so each gets its own answer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use deadpool_postgres::Pool;
use tokio::sync::{oneshot, Semaphore};

use super::{db, inserted, LEAN_APPEND, LEAN_APPEND_ONE, STALE_FENCE, UNIQUE_VIOLATION};
use crate::{Error, Result};

/// Lean-append statements in flight at once (the pool holds 16 connections; the
/// rest serve leases, reads and heartbeats).
const LANES: usize = 2;

/// The most appends one batch takes (bounding one statement's size and latency).
const MOST_PER_BATCH: usize = 64;

/// Lean appends of several sessions as one statement: each row carries its own
/// session, epoch and time, the fence trigger checks each, and each row answers
/// whether its session's inbox is empty.
const GROUP_APPEND: &str = "
INSERT INTO steadfast_events (session_id, seq, epoch, at_ms, schema, kind, body, checksum, blob)
SELECT e.session_id, e.seq, e.epoch, e.at_ms, $1::smallint, e.kind, e.body, e.checksum, e.blob
  FROM unnest($2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::text[], $7::bytea[],
              $8::text[], $9::text[])
       AS e(session_id, seq, epoch, at_ms, kind, body, checksum, blob)
RETURNING session_id,
          NOT EXISTS (SELECT 1 FROM steadfast_inbox i
                       WHERE i.session_id = steadfast_events.session_id AND NOT i.taken)";

/// One session's lean append: its events, already numbered, checksummed and
/// serialised.
pub(super) struct LeanAppend {
    pub session: String,
    pub epoch: i64,
    pub at_ms: i64,
    pub schema: i16,
    pub seqs: Vec<i64>,
    pub kinds: Vec<&'static str>,
    pub bodies: Vec<Vec<u8>>,
    pub sums: Vec<String>,
    pub blobs: Vec<Option<String>>,
}

/// What became of a lean append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Landed {
    /// Its rows committed; whether the session's inbox had nothing untaken.
    Appended { inbox_empty: bool },
    /// Refused: the lease's epoch or the log's position moved (the caller takes the
    /// locking path, which says which).
    Moved,
}

type Waiting = (u64, LeanAppend, oneshot::Sender<Result<Landed>>);

/// The queue of lean appends waiting for a lane, and the lanes.
#[derive(Clone)]
pub(super) struct GroupCommit {
    queue: Arc<Mutex<Vec<Waiting>>>,
    lanes: Arc<Semaphore>,
    ids: Arc<AtomicU64>,
}

impl Default for GroupCommit {
    fn default() -> Self {
        GroupCommit {
            queue: Arc::default(),
            lanes: Arc::new(Semaphore::new(LANES)),
            ids: Arc::default(),
        }
    }
}

impl GroupCommit {
    /// Appends `append`, alone or with whatever else is waiting, and returns once
    /// the transaction holding its rows has committed (or was refused).
    pub(super) async fn append(&self, pool: &Pool, append: LeanAppend) -> Result<Landed> {
        let id = self.ids.fetch_add(1, Ordering::Relaxed);
        let (sent, mut answer) = oneshot::channel();
        self.lock().push((id, append, sent));
        loop {
            tokio::select! {
                biased;
                landed = &mut answer => return landed.unwrap_or_else(|_| Err(dropped())),
                permit = self.lanes.clone().acquire_owned() => {
                    let permit = permit.map_err(|_| dropped())?;
                    let batch = self.take();
                    if batch.is_empty() {
                        // Another lane took ours; its answer is on the way.
                        drop(permit);
                        return answer.await.unwrap_or_else(|_| Err(dropped()));
                    }
                    if batch.len() == 1 && batch[0].0 == id {
                        // Alone: run it here (a dropped caller then drops only its
                        // own append, as any dropped append would).
                        let (_, append, _) = batch.into_iter().next().expect("one");
                        let landed = alone(pool, &append).await;
                        drop(permit);
                        return landed;
                    }
                    // Others' appends too: run them where no caller's cancellation
                    // can cut them off.
                    let pool = pool.clone();
                    tokio::spawn(async move {
                        run(&pool, batch).await;
                        drop(permit);
                    });
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Waiting>> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next batch: up to [`MOST_PER_BATCH`] waiting appends, leaving out any
    /// whose caller has gone (an append dropped before it went out never goes out).
    fn take(&self) -> Vec<Waiting> {
        let mut queue = self.lock();
        queue.retain(|(_, _, sent)| !sent.is_closed());
        let n = queue.len().min(MOST_PER_BATCH);
        queue.drain(..n).collect()
    }
}

fn dropped() -> Error {
    Error::backend_says("the append's group commit was dropped")
}

/// Runs `batch` as one statement, or one by one if it was refused, and answers
/// each append.
async fn run(pool: &Pool, mut batch: Vec<Waiting>) {
    // One lock order for the fence's session rows, whatever order appends came in.
    batch.sort_by(|a, b| a.1.session.cmp(&b.1.session));
    let appends: Vec<&LeanAppend> = batch.iter().map(|(_, a, _)| a).collect();
    match together(pool, &appends).await {
        Ok(Some(empties)) => {
            for ((_, append, sent), (session, empty)) in batch.into_iter().zip(empties) {
                debug_assert_eq!(append.session, session);
                let _ = sent.send(Ok(Landed::Appended { inbox_empty: empty }));
            }
        }
        Ok(None) => {
            for (_, append, sent) in batch {
                let _ = sent.send(alone(pool, &append).await);
            }
        }
        Err(e) => {
            let message = e.to_string();
            for (_, _, sent) in batch {
                let _ = sent.send(Err(Error::backend_says(message.clone())));
            }
        }
    }
}

/// Whether a failed append was refused by the fence or the log's key (the lease or
/// the position moved), rather than failing.
pub(super) fn refused(e: &tokio_postgres::Error) -> bool {
    matches!(
        e.code().map(|c| c.code()),
        Some(STALE_FENCE | UNIQUE_VIOLATION)
    )
}

/// Several sessions' appends as one statement: per append (in `appends`' order),
/// its session and whether its inbox is empty; `None` if any was refused.
async fn together(pool: &Pool, appends: &[&LeanAppend]) -> Result<Option<Vec<(String, bool)>>> {
    let mut sessions: Vec<&str> = Vec::new();
    let (mut seqs, mut epochs, mut at) = (Vec::new(), Vec::new(), Vec::new());
    let (mut kinds, mut bodies, mut sums, mut blobs) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for a in appends {
        for i in 0..a.seqs.len() {
            sessions.push(&a.session);
            seqs.push(a.seqs[i]);
            epochs.push(a.epoch);
            at.push(a.at_ms);
            kinds.push(a.kinds[i]);
            bodies.push(a.bodies[i].as_slice());
            sums.push(a.sums[i].as_str());
            blobs.push(a.blobs[i].as_deref());
        }
    }
    let schema = appends.first().map_or(0, |a| a.schema);
    let client = pool.get().await.map_err(super::backend)?;
    let statement = client.prepare_cached(GROUP_APPEND).await.map_err(db)?;
    let rows = match client
        .query(
            &statement,
            &[
                &schema, &sessions, &seqs, &epochs, &at, &kinds, &bodies, &sums, &blobs,
            ],
        )
        .await
    {
        Ok(rows) => rows,
        Err(e) if refused(&e) => return Ok(None),
        Err(e) => return Err(db(e)),
    };
    let empty: std::collections::HashMap<String, bool> =
        rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    appends
        .iter()
        .map(|a| match empty.get(&a.session) {
            Some(e) => Ok((a.session.clone(), *e)),
            None => Err(Error::backend_says(format!(
                "a group append returned no row for session {}",
                a.session
            ))),
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// One session's append as its own statement.
async fn alone(pool: &Pool, a: &LeanAppend) -> Result<Landed> {
    let client = pool.get().await.map_err(super::backend)?;
    let outcome = if a.seqs.len() == 1 {
        let statement = client.prepare_cached(LEAN_APPEND_ONE).await.map_err(db)?;
        client
            .query(
                &statement,
                &[
                    &a.session,
                    &a.epoch,
                    &a.at_ms,
                    &a.seqs[0],
                    &a.schema,
                    &a.kinds[0],
                    &a.bodies[0],
                    &a.sums[0],
                    &a.blobs[0],
                ],
            )
            .await
    } else {
        let schemas = vec![a.schema; a.seqs.len()];
        let statement = client.prepare_cached(LEAN_APPEND).await.map_err(db)?;
        client
            .query(
                &statement,
                &[
                    &a.session, &a.epoch, &a.at_ms, &a.seqs, &schemas, &a.kinds, &a.bodies,
                    &a.sums, &a.blobs,
                ],
            )
            .await
    };
    match outcome {
        Ok(rows) => {
            let (n, inbox_empty) = inserted(&rows);
            Ok(if n == 0 {
                Landed::Moved
            } else {
                Landed::Appended { inbox_empty }
            })
        }
        Err(e) if refused(&e) => Ok(Landed::Moved),
        Err(e) => Err(db(e)),
    }
}
