//! The PostgreSQL world: many stateless workers on many machines against one database.
//!
//! Appends and lease changes lock the session's row (`FOR UPDATE`), and a trigger
//! rejects any event whose epoch is not the session's current lease epoch, so a stale
//! holder can never commit, even racing. Lease times use the database's clock, so
//! machines with skewed clocks agree on when a lease lapses. Connections are pooled;
//! a connection broken by a database restart is replaced on next use.

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use steadfast_log::record::{self, EncodedRecord};
use steadfast_log::{Event, Record, Status, MODEL_DELTA_KIND, PRUNED_KIND};
use tokio_postgres::{Row, Transaction};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::lineage;
use crate::listing::Param;
use crate::{
    now_ms, summarize, Error, Holder, Inbound, InboundKind, Lease, LeaseRow, RawRecord, Result,
    SessionPage, SessionPatch, SessionQuery, SessionSummary, World,
};

mod group;
mod listen;
mod tls;

use listen::{listen, AbortOnDrop, Liveness, CHANNEL, HOLDER_GONE};

/// Versioned migrations, applied in order by [`PostgresWorld::migrate`].
const MIGRATIONS: &[(i32, &str)] = &[
    (1, include_str!("postgres/001_init.sql")),
    (2, include_str!("postgres/002_inbox.sql")),
    (3, include_str!("postgres/003_hot_updates.sql")),
    (4, include_str!("postgres/004_spill.sql")),
    (5, include_str!("postgres/005_escalated_resumes.sql")),
    (6, include_str!("postgres/006_retry_at.sql")),
    (7, include_str!("postgres/007_lease_liveness.sql")),
    (8, include_str!("postgres/008_lean_appends.sql")),
    (
        9,
        include_str!("postgres/009_released_leases_are_fenced.sql"),
    ),
    (10, include_str!("postgres/010_outbox.sql")),
    (11, include_str!("postgres/011_vault.sql")),
    (12, include_str!("postgres/012_listing.sql")),
    (13, include_str!("postgres/013_access.sql")),
    (14, include_str!("postgres/014_forks.sql")),
    (15, include_str!("postgres/015_rate_buckets.sql")),
    (16, include_str!("postgres/016_kept_bytes.sql")),
    (17, include_str!("postgres/017_hooks.sql")),
];
const UNIQUE_VIOLATION: &str = "23505";
const STALE_FENCE: &str = "SF001";
/// How long connecting waits for the notification connection (see
/// [`PostgresWorld::await_liveness`]).
const LIVENESS_WAIT: Duration = Duration::from_secs(5);
/// Serialises concurrent `migrate` runs (an arbitrary, fixed advisory-lock key).
const MIGRATION_LOCK: i64 = 0x5354_4544_4641_5354;

/// A [`World`] in PostgreSQL.
#[derive(Clone)]
pub struct PostgresWorld {
    pool: Pool,
    changes: std::sync::Arc<tokio::sync::watch::Sender<u64>>,
    /// Moves when work is due that no notification announced (see [`World::due`]).
    due: std::sync::Arc<tokio::sync::watch::Sender<u64>>,
    _listener: Option<std::sync::Arc<AbortOnDrop>>,
    /// This process's liveness token, recorded in the leases it takes.
    liveness: Liveness,
    /// The last position this process appended per session and lease epoch: the
    /// holder of a lease is the only writer, so its next append can be one
    /// conditional statement instead of a locking transaction.
    positions: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, Position>>>,
    spill: Option<crate::Blobs>,
    /// Lean appends of this process's sessions, committed together when they queue.
    group: group::GroupCommit,
}

/// Whether an append changes what other processes should act on (a turn starting,
/// ending or pausing; inbox entries taken). Only those are announced with NOTIFY:
/// NOTIFY serialises committing transactions across the whole database, so
/// announcing every streamed delta would cap append throughput. Stream tails in other
/// processes see the rest by polling.
fn wakes_others(summary: &crate::Summary) -> bool {
    summary.status.is_some() || summary.waiting_for.is_some() || !summary.taken.is_empty()
}

/// An append that changes the session row (status, title, awaited signal, retry
/// time, taken inbox entries) as one statement: it commits only if the lease still
/// holds (the trigger re-checks the epoch, the primary key the position), marks taken
/// inbox entries, moves the row's position watermark and notifies listeners.
const ROW_APPEND: &str = "
WITH s AS (
    UPDATE steadfast_sessions
       SET last_seq = $4::bigint + $5::bigint, updated_at_ms = $6,
           status = coalesce($7, status),
           title = CASE WHEN title_set THEN title ELSE coalesce($8, title) END,
           waiting_for = CASE WHEN $9 THEN $10 ELSE waiting_for END,
           retry_at_ms = $19, agent = coalesce($20, agent),
           kept_bytes = kept_bytes + $21
     WHERE id = $1 AND lease_epoch = $2 AND lease_holder = $3
 RETURNING id),
ins AS (
    INSERT INTO steadfast_events (session_id, seq, epoch, at_ms, schema, kind, body, checksum, blob)
    SELECT s.id, e.seq, $2, $6, e.schema, e.kind, e.body, e.checksum, e.blob
      FROM s, unnest($11::bigint[], $12::smallint[], $13::text[], $14::bytea[], $15::text[], $18::text[])
           AS e(seq, schema, kind, body, checksum, blob)
 RETURNING 1),
taken AS (
    UPDATE steadfast_inbox SET taken = true
     WHERE session_id = $1 AND id = ANY($16::bigint[]) AND EXISTS (SELECT 1 FROM s)
 RETURNING 1),
note AS (SELECT pg_notify('steadfast', id) FROM s WHERE $17)
SELECT (SELECT count(*) FROM s), (SELECT count(*) FROM note),
       NOT EXISTS (SELECT 1 FROM steadfast_inbox
                    WHERE session_id = $1 AND NOT taken AND NOT (id = ANY($16::bigint[])))";

/// An append that changes nothing but the log (most of them: deltas, model calls,
/// tool calls) is its events' insert alone. The fence trigger refuses a stale epoch and
/// the primary key a position someone else took, both inside the database.
/// Every append also answers whether the session's inbox is empty (see
/// [`World::inbox_seen_empty`]), so a driver need not ask before each call.
const LEAN_APPEND: &str = "
INSERT INTO steadfast_events (session_id, seq, epoch, at_ms, schema, kind, body, checksum, blob)
SELECT $1::text, e.seq, $2::bigint, $3::bigint, e.schema, e.kind, e.body, e.checksum, e.blob
  FROM unnest($4::bigint[], $5::smallint[], $6::text[], $7::bytea[], $8::text[], $9::text[])
       AS e(seq, schema, kind, body, checksum, blob)
RETURNING NOT EXISTS (SELECT 1 FROM steadfast_inbox WHERE session_id = $1 AND NOT taken)";

/// [`LEAN_APPEND`] for the commonest case, one event, without the arrays.
const LEAN_APPEND_ONE: &str = "
INSERT INTO steadfast_events (session_id, seq, epoch, at_ms, schema, kind, body, checksum, blob)
VALUES ($1, $4, $2, $3, $5, $6, $7, $8, $9)
RETURNING NOT EXISTS (SELECT 1 FROM steadfast_inbox WHERE session_id = $1 AND NOT taken)";

/// What a lean append's rows say: how many were inserted, and whether the inbox was
/// empty.
fn inserted(rows: &[tokio_postgres::Row]) -> (u64, bool) {
    let empty = rows.last().is_some_and(|r| r.get::<_, bool>(0));
    (rows.len() as u64, empty)
}

/// What this process last appended to a session under one lease epoch.
#[derive(Debug, Clone, Copy)]
struct Position {
    epoch: u64,
    last: u64,
    /// Whether the session row holds a retry time that the next append must clear.
    retry_pending: bool,
    /// Whether the inbox had nothing untaken when that append committed.
    inbox_empty: bool,
}

impl std::fmt::Debug for PostgresWorld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresWorld").finish_non_exhaustive()
    }
}

fn backend(e: impl Into<crate::Cause>) -> Error {
    Error::backend(e)
}

fn db(e: tokio_postgres::Error) -> Error {
    if e.code().map(|c| c.code()) == Some(STALE_FENCE) {
        return Error::StaleFence {
            session: String::new(),
            epoch: 0,
            current: 0,
        };
    }
    match e.as_db_error() {
        // "db error" alone says nothing; the server's message says what went wrong.
        Some(d) => Error::backend_in(d.message().to_string(), e),
        // Nor does "error performing TLS handshake": its causes do, and the message
        // names them all.
        None => Error::backend(e),
    }
}

const NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

fn to_u64(v: i64) -> u64 {
    v.max(0) as u64
}

impl PostgresWorld {
    /// Connects to `url` (`postgres://user@host:port/db`). Fails with a clear message
    /// if the schema is missing or old (run [`PostgresWorld::migrate`]) or newer than
    /// this build.
    pub async fn connect(url: &str) -> Result<Self> {
        let world = Self::connect_unchecked(url)?;
        let (current, latest) = world.schema_version().await?;
        if current < latest {
            return Err(Error::backend_says(format!(
                "the database schema is at version {current}, this build needs {latest}: run `steadfast migrate`"
            )));
        }
        if current > latest {
            return Err(Error::TooNew {
                store: "the database".into(),
                found: current.into(),
                supported: latest.into(),
            });
        }
        Ok(world.await_liveness(LIVENESS_WAIT).await)
    }

    /// Connects and applies any pending migrations first.
    pub async fn connect_and_migrate(url: &str) -> Result<Self> {
        let world = Self::connect_unchecked(url)?;
        world.migrate().await?;
        Ok(world.await_liveness(LIVENESS_WAIT).await)
    }

    /// Keeps records whose body is over 64 KiB in `blobs` (hash in the log).
    pub fn with_spill(mut self, blobs: crate::Blobs) -> Self {
        self.spill = Some(blobs);
        self
    }

    /// This process's liveness token, if its notification connection is up.
    fn liveness(&self) -> Option<String> {
        self.liveness.borrow().clone()
    }

    /// Waits (up to `limit`) for the notification connection to be up, so the leases
    /// this process takes carry its liveness token from the first: a worker killed
    /// right after it started is then found dead at once, not when its lease lapses.
    async fn await_liveness(self, limit: Duration) -> Self {
        let mut up = self.liveness.subscribe();
        if tokio::time::timeout(limit, up.wait_for(Option::is_some))
            .await
            .is_err()
        {
            tracing::warn!("the PostgreSQL notification connection is not up yet; leases taken meanwhile lapse by time alone");
        }
        self
    }

    fn with_listener(mut self, config: tokio_postgres::Config, tls: MakeRustlsConnect) -> Self {
        let task = tokio::spawn(listen(
            config,
            tls,
            self.changes.clone(),
            self.due.clone(),
            self.liveness.clone(),
        ));
        self._listener = Some(std::sync::Arc::new(AbortOnDrop(task)));
        self
    }

    fn connect_unchecked(url: &str) -> Result<Self> {
        let (config, tls) = tls::configure(url)?;
        let listen_config = config.clone();
        let manager = Manager::from_config(
            config,
            tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(16)
            .wait_timeout(Some(Duration::from_secs(30)))
            .create_timeout(Some(Duration::from_secs(10)))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(backend)?;
        let world = PostgresWorld {
            pool,
            changes: std::sync::Arc::new(tokio::sync::watch::channel(0).0),
            due: std::sync::Arc::new(tokio::sync::watch::channel(0).0),
            _listener: None,
            liveness: std::sync::Arc::new(tokio::sync::watch::channel(None).0),
            positions: Default::default(),
            spill: None,
            group: Default::default(),
        };
        Ok(world.with_listener(listen_config, tls))
    }

    async fn client(&self) -> Result<deadpool_postgres::Object> {
        self.pool.get().await.map_err(|e| match e {
            // Why a new connection failed, not only that it did.
            deadpool_postgres::PoolError::Backend(e) => db(e),
            deadpool_postgres::PoolError::Timeout(_) => Error::backend_says(
                "timed out waiting for a connection to PostgreSQL (is the server reachable?)",
            ),
            other => backend(other),
        })
    }

    /// A connection from the world's own pool, for tools and benchmarks that must
    /// measure against exactly the same connections.
    pub async fn pooled_connection(&self) -> Result<deadpool_postgres::Object> {
        self.client().await
    }

    /// The schema version applied and the latest this build knows.
    pub async fn schema_version(&self) -> Result<(i32, i32)> {
        let client = self.client().await?;
        let latest = MIGRATIONS.last().map_or(0, |m| m.0);
        let exists: bool = client
            .query_one("SELECT to_regclass('steadfast_schema') IS NOT NULL", &[])
            .await
            .map_err(db)?
            .get(0);
        if !exists {
            return Ok((0, latest));
        }
        let current: Option<i32> = client
            .query_one("SELECT max(version) FROM steadfast_schema", &[])
            .await
            .map_err(db)?
            .get(0);
        Ok((current.unwrap_or(0), latest))
    }

    /// Applies pending migrations, each in its own transaction, one runner at a time.
    /// Returns the versions applied.
    pub async fn migrate(&self) -> Result<Vec<i32>> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db)?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(db)?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS steadfast_schema (version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
        )
        .await
        .map_err(db)?;
        let current: i32 = tx
            .query_one(
                "SELECT coalesce(max(version), 0) FROM steadfast_schema",
                &[],
            )
            .await
            .map_err(db)?
            .get(0);
        let mut applied = Vec::new();
        for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > current) {
            tx.batch_execute(sql)
                .await
                .map_err(|e| Error::backend_in(format!("migration {version}"), e))?;
            tx.execute(
                "INSERT INTO steadfast_schema (version) VALUES ($1)",
                &[version],
            )
            .await
            .map_err(db)?;
            applied.push(*version);
        }
        tx.commit().await.map_err(db)?;
        Ok(applied)
    }
}

async fn lease_row(tx: &Transaction<'_>, session: &str) -> Result<(LeaseRow, u64)> {
    let row = tx
        .query_opt(
            &format!(
                "SELECT lease_epoch, lease_holder, lease_host, lease_pid, lease_expires_ms, {NOW_MS}, {HOLDER_GONE}
                 FROM steadfast_sessions s WHERE id = $1 FOR UPDATE"
            ),
            &[&session],
        )
        .await
        .map_err(db)?
        .ok_or_else(|| Error::NotFound(session.to_string()))?;
    Ok((
        LeaseRow {
            epoch: to_u64(row.get(0)),
            holder: row.get(1),
            host: row.get(2),
            pid: row.get::<_, Option<i32>>(3).map(|p| p as u32),
            expires_ms: to_u64(row.get(4)),
            gone: row.get(6),
        },
        to_u64(row.get(5)),
    ))
}

/// Records `holder` as the session's lease holder at `epoch` until `expires_ms`.
async fn take_lease(
    tx: &Transaction<'_>,
    session: &str,
    holder: &Holder,
    epoch: u64,
    expires_ms: u64,
    liveness: Option<String>,
) -> Result<()> {
    tx.execute(
        "UPDATE steadfast_sessions SET lease_epoch = $2, lease_holder = $3, lease_host = $4, lease_pid = $5, lease_expires_ms = $6, lease_liveness = $7 WHERE id = $1",
        &[&session, &(epoch as i64), &holder.id, &holder.host, &(holder.pid as i32), &(expires_ms as i64), &liveness],
    )
    .await
    .map_err(db)?;
    Ok(())
}

async fn check_fence(tx: &Transaction<'_>, lease: &Lease) -> Result<u64> {
    let (row, now) = lease_row(tx, &lease.session).await?;
    if row.epoch != lease.epoch || row.holder.as_deref() != Some(lease.holder.as_str()) {
        return Err(Error::StaleFence {
            session: lease.session.clone(),
            epoch: lease.epoch,
            current: row.epoch,
        });
    }
    Ok(now)
}

fn summary(r: &Row) -> Result<SessionSummary> {
    Ok(SessionSummary {
        id: r.get(0),
        owner: r.get(1),
        status: crate::stored_status(r.get(2))?,
        title: r.get(3),
        last_seq: to_u64(r.get(4)),
        created_at_ms: to_u64(r.get(5)),
        updated_at_ms: to_u64(r.get(6)),
        agent: r.get(7),
        labels: crate::listing::parse_map(r.get(8)),
        metadata: crate::listing::parse_map(r.get(9)),
        parent: r.get(10),
        forked_at: r.get::<_, Option<i64>>(11).map(to_u64),
    })
}

/// A session with a retry scheduled shows as `retrying`. Its position and last
/// change come from the log's tail (the row's own are a watermark, written only
/// when the row changes).
const SUMMARY_COLUMNS: &str =
    "id, owner, CASE WHEN retry_at_ms > 0 THEN 'retrying' ELSE status END, \
     title, greatest(last_seq, coalesce(tail.seq, 0)), created_at_ms, \
     greatest(updated_at_ms, coalesce(tail.at_ms, 0)), agent, labels::text, metadata::text, \
     parent, forked_at FROM steadfast_sessions s LEFT JOIN LATERAL (\
       SELECT e.seq, e.at_ms FROM steadfast_events e WHERE e.session_id = s.id \
       ORDER BY e.seq DESC LIMIT 1) tail ON true";

const TOKEN_COLUMNS: &str =
    "id, name, owner, scopes, hash, created_at_ms, created_by, expires_at_ms, revoked_at_ms";

fn service_token(r: &Row) -> crate::ServiceToken {
    crate::ServiceToken {
        id: r.get(0),
        name: r.get(1),
        owner: r.get(2),
        scopes: crate::access::scopes_of(r.get(3)),
        hash: r.get(4),
        created_at_ms: to_u64(r.get(5)),
        created_by: r.get(6),
        expires_at_ms: r.get::<_, Option<i64>>(7).map(to_u64),
        revoked_at_ms: r.get::<_, Option<i64>>(8).map(to_u64),
    }
}

/// How PostgreSQL spells a listing's filters.
const DIALECT: crate::listing::Dialect = crate::listing::Dialect {
    status: "CASE WHEN retry_at_ms > 0 THEN 'retrying' ELSE status END",
    updated: "greatest(updated_at_ms, coalesce(tail.at_ms, 0))",
    placeholder: |n| format!("${n}"),
    label: |k, v| format!("labels @> jsonb_build_object({k}::text, {v}::text)"),
    title: |t| format!("strpos(lower(title), lower({t}::text)) > 0"),
};

impl PostgresWorld {
    /// The one-statement append from a position this process knows. `None` if the
    /// lease or position moved (the caller then takes the locking path, which says
    /// which).
    async fn append_fast(
        &self,
        lease: &Lease,
        known: Position,
        events: &[Event],
        serialized: &crate::Serialized,
    ) -> Result<Option<Vec<Record>>> {
        let spilled = &serialized.spilled;
        let at_ms = now_ms();
        let records: Vec<Record> = events
            .iter()
            .enumerate()
            .map(|(i, event)| Record {
                seq: known.last + 1 + i as u64,
                epoch: lease.epoch,
                at_ms,
                event: event.clone(),
            })
            .collect();
        let sums: Vec<String> = records
            .iter()
            .zip(&serialized.bodies)
            .map(|(r, body)| record::checksum_of(&lease.session, r, body))
            .collect();
        let bodies: Vec<&[u8]> = (0..records.len()).map(|i| serialized.stored(i)).collect();
        let schema = record::SCHEMA_VERSION as i16;
        let summary = summarize(events);
        let lean = summary.status.is_none()
            && summary.title.is_none()
            && summary.agent.is_none()
            && summary.waiting_for.is_none()
            && summary.taken.is_empty()
            && summary.retry_at_ms == 0
            && summary.kept_bytes == 0
            && !known.retry_pending;
        let outcome = if lean {
            let append = group::LeanAppend {
                session: lease.session.clone(),
                epoch: lease.epoch as i64,
                at_ms: at_ms as i64,
                schema,
                seqs: records.iter().map(|r| r.seq as i64).collect(),
                kinds: records.iter().map(|r| r.event.kind()).collect(),
                bodies: bodies.iter().map(|b| b.to_vec()).collect(),
                sums,
                blobs: spilled.clone(),
            };
            self.group.append(&self.pool, append).await?
        } else {
            let seqs: Vec<i64> = records.iter().map(|r| r.seq as i64).collect();
            let schemas: Vec<i16> = vec![schema; records.len()];
            let kinds: Vec<&str> = records.iter().map(|r| r.event.kind()).collect();
            let taken: Vec<i64> = summary.taken.iter().map(|t| *t as i64).collect();
            let (wset, wval) = match &summary.waiting_for {
                Some(v) => (true, v.clone()),
                None => (false, None),
            };
            let notify = wakes_others(&summary);
            let client = self.client().await?;
            let statement = client.prepare_cached(ROW_APPEND).await.map_err(db)?;
            match client
                .query_one(
                    &statement,
                    &[
                        &lease.session,
                        &(lease.epoch as i64),
                        &lease.holder,
                        &(known.last as i64),
                        &(records.len() as i64),
                        &(at_ms as i64),
                        &summary.status.map(Status::as_str),
                        &summary.title,
                        &wset,
                        &wval,
                        &seqs,
                        &schemas,
                        &kinds,
                        &bodies,
                        &sums,
                        &taken,
                        &notify,
                        &spilled,
                        &(summary.retry_at_ms as i64),
                        &summary.agent,
                        &(summary.kept_bytes.min(i64::MAX as u64) as i64),
                    ],
                )
                .await
            {
                Ok(row) if row.get::<_, i64>(0) > 0 => group::Landed::Appended {
                    inbox_empty: row.get::<_, bool>(2),
                },
                Ok(_) => group::Landed::Moved,
                Err(e) if group::refused(&e) => group::Landed::Moved,
                Err(e) => return Err(db(e)),
            }
        };
        let inbox_empty = match outcome {
            group::Landed::Appended { inbox_empty } => inbox_empty,
            group::Landed::Moved => {
                self.positions
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&lease.session);
                return Ok(None);
            }
        };
        let mut positions = self.positions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = records.last() {
            positions.insert(
                lease.session.clone(),
                Position {
                    epoch: lease.epoch,
                    last: r.seq,
                    retry_pending: summary.retry_at_ms > 0,
                    inbox_empty,
                },
            );
        }
        drop(positions);
        crate::bump(&self.changes);
        Ok(Some(records))
    }

    async fn append_locked(
        &self,
        lease: &Lease,
        events: &[Event],
        serialized: &crate::Serialized,
    ) -> Result<Vec<Record>> {
        let mut client = self.client().await?;

        let tx = client.transaction().await.map_err(db)?;
        check_fence(&tx, lease).await?;
        // The row's last_seq is a watermark; the log's primary key has the position
        // (no one else can insert while this transaction holds the row).
        let last: i64 = tx
            .query_one(
                "SELECT coalesce(max(seq), 0) FROM steadfast_events WHERE session_id = $1",
                &[&lease.session],
            )
            .await
            .map_err(db)?
            .get(0);
        let last = to_u64(last);
        let at_ms = now_ms();
        let insert = tx
            .prepare_cached(
                "INSERT INTO steadfast_events (session_id, seq, epoch, at_ms, schema, kind, body, checksum, blob) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            )
            .await
            .map_err(db)?;
        let mut records = Vec::with_capacity(events.len());
        for (i, event) in events.iter().enumerate() {
            let record = Record {
                seq: last + 1 + i as u64,
                epoch: lease.epoch,
                at_ms,
                event: event.clone(),
            };
            let checksum = record::checksum_of(&lease.session, &record, &serialized.bodies[i]);
            let body = serialized.stored(i);
            let blob = &serialized.spilled[i];
            tx.execute(
                &insert,
                &[
                    &lease.session,
                    &(record.seq as i64),
                    &(record.epoch as i64),
                    &(at_ms as i64),
                    &(record::SCHEMA_VERSION as i16),
                    &record.event.kind(),
                    &body,
                    &checksum,
                    blob,
                ],
            )
            .await
            .map_err(|e| match db(e) {
                Error::StaleFence { .. } => Error::StaleFence {
                    session: lease.session.clone(),
                    epoch: lease.epoch,
                    current: 0,
                },
                other => other,
            })?;
            records.push(record);
        }
        let summary = summarize(events);
        tx.execute(
            "UPDATE steadfast_sessions SET last_seq = $2, updated_at_ms = $3, status = coalesce($4, status), \
             title = CASE WHEN title_set THEN title ELSE coalesce($5, title) END, retry_at_ms = $6, \
             agent = coalesce($7, agent), kept_bytes = kept_bytes + $8 WHERE id = $1",
            &[
                &lease.session,
                &((last + records.len() as u64) as i64),
                &(at_ms as i64),
                &summary.status.map(Status::as_str),
                &summary.title,
                &(summary.retry_at_ms as i64),
                &summary.agent,
                &(summary.kept_bytes.min(i64::MAX as u64) as i64),
            ],
        )
        .await
        .map_err(db)?;
        if let Some(waiting_for) = &summary.waiting_for {
            tx.execute(
                "UPDATE steadfast_sessions SET waiting_for = $2 WHERE id = $1",
                &[&lease.session, waiting_for],
            )
            .await
            .map_err(db)?;
        }
        for id in &summary.taken {
            tx.execute(
                "UPDATE steadfast_inbox SET taken = true WHERE id = $1 AND session_id = $2",
                &[&(*id as i64), &lease.session],
            )
            .await
            .map_err(db)?;
        }
        if wakes_others(&summary) {
            tx.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &lease.session])
                .await
                .map_err(db)?;
        }
        tx.commit().await.map_err(db)?;
        crate::bump(&self.changes);
        Ok(records)
    }

    async fn read_verified(&self, session: &str, from: u64) -> Result<Vec<Record>> {
        let mut client = self.client().await?;
        // One snapshot for every query, so the position and the rows agree.
        let tx = client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(db)?;
        let (last_seq, segments) = segments_of(&tx, session).await?;
        let from = from.max(1);
        let statement = tx
            .prepare_cached(
                "SELECT seq, epoch, at_ms, schema, body, checksum, blob FROM steadfast_events WHERE session_id = $1 AND seq >= $2 AND seq <= $3 ORDER BY seq",
            )
            .await
            .map_err(db)?;
        let mut fetched = Vec::new();
        for segment in segments {
            let Some((lo, hi)) = lineage::window(&segment, from) else {
                continue;
            };
            let rows = tx
                .query(
                    &statement,
                    &[
                        &segment.session,
                        &lineage::sql_position(lo),
                        &lineage::sql_position(hi),
                    ],
                )
                .await
                .map_err(db)?;
            fetched.push((segment, lo, rows));
        }
        tx.commit().await.map_err(db)?;
        let mut parts = Vec::with_capacity(fetched.len());
        for (segment, lo, rows) in fetched {
            let mut raw: Vec<(RawRecord, Option<String>)> = rows
                .into_iter()
                .map(|r| {
                    (
                        (
                            to_u64(r.get(0)),
                            to_u64(r.get(1)),
                            to_u64(r.get(2)),
                            EncodedRecord {
                                schema: r.get::<_, i16>(3) as u16,
                                body: r.get(4),
                                checksum: r.get(5),
                            },
                        ),
                        r.get(6),
                    )
                })
                .collect();
            crate::unspill(&segment.session, self.spill.as_ref(), &mut raw).await?;
            let raw: Vec<RawRecord> = raw.into_iter().map(|(r, _)| r).collect();
            parts.push((segment, lo, raw));
        }
        lineage::verify_segments(last_seq, parts).await
    }
}

/// A session's last position (the log's tail, past the row's watermark) and the
/// segments its log reads from.
async fn segments_of(tx: &Transaction<'_>, session: &str) -> Result<(u64, Vec<lineage::Segment>)> {
    let row = tx
        .query_opt(
            "SELECT greatest(s.last_seq, coalesce((SELECT max(e.seq) FROM steadfast_events e WHERE e.session_id = s.id), 0)), \
             s.own_from FROM steadfast_sessions s WHERE s.id = $1",
            &[&session],
        )
        .await
        .map_err(db)?
        .ok_or_else(|| Error::NotFound(session.to_string()))?;
    let (last_seq, own_lo): (i64, i64) = (row.get(0), row.get(1));
    let own_lo = to_u64(own_lo);
    let ancestry = if own_lo > 1 {
        tx.query(
            "SELECT ancestor, lo, hi FROM steadfast_lineage WHERE session_id = $1 ORDER BY lo",
            &[&session],
        )
        .await
        .map_err(db)?
        .iter()
        .map(|r| lineage::Segment {
            session: r.get(0),
            lo: to_u64(r.get(1)),
            hi: to_u64(r.get(2)),
        })
        .collect()
    } else {
        Vec::new()
    };
    Ok((
        to_u64(last_seq),
        lineage::segments(session, ancestry, own_lo),
    ))
}

/// The position of the last record of `kind` at or before `upto` in a session's log,
/// through the segments it shares (0 if none).
async fn last_in_segments(
    tx: &Transaction<'_>,
    session: &str,
    kind: &str,
    upto: u64,
) -> Result<u64> {
    let (_, segments) = segments_of(tx, session).await?;
    for s in segments.iter().rev().filter(|s| s.lo <= upto) {
        let row = tx
            .query_opt(
                "SELECT seq FROM steadfast_events WHERE session_id = $1 AND seq >= $2 AND seq <= $3 AND kind = $4 ORDER BY seq DESC LIMIT 1",
                &[&s.session, &lineage::sql_position(s.lo), &lineage::sql_position(s.hi.min(upto)), &kind],
            )
            .await
            .map_err(db)?;
        if let Some(r) = row {
            return Ok(to_u64(r.get(0)));
        }
    }
    Ok(0)
}

/// Stores one record of `session` whose body is `body` (a fork's or a rewind's own,
/// written outside an append; the fence must let the record's epoch through).
async fn insert_record(
    tx: &Transaction<'_>,
    session: &str,
    record: &Record,
    body: &[u8],
) -> Result<()> {
    tx.execute(
        "INSERT INTO steadfast_events (session_id, seq, epoch, at_ms, schema, kind, body, checksum) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        &[
            &session,
            &lineage::sql_position(record.seq),
            &(record.epoch as i64),
            &(record.at_ms as i64),
            &(record::SCHEMA_VERSION as i16),
            &record.event.kind(),
            &body,
            &record::checksum_of(session, record, body),
        ],
    )
    .await
    .map_err(db)?;
    Ok(())
}

/// Makes `ancestry` the segments `session` reads before its own records.
async fn write_lineage(
    tx: &Transaction<'_>,
    session: &str,
    ancestry: &[lineage::Segment],
) -> Result<()> {
    tx.execute(
        "DELETE FROM steadfast_lineage WHERE session_id = $1",
        &[&session],
    )
    .await
    .map_err(db)?;
    for s in ancestry {
        tx.execute(
            "INSERT INTO steadfast_lineage (session_id, ancestor, lo, hi) VALUES ($1, $2, $3, $4)",
            &[
                &session,
                &s.session,
                &lineage::sql_position(s.lo),
                &lineage::sql_position(s.hi),
            ],
        )
        .await
        .map_err(db)?;
    }
    Ok(())
}

/// Deletes the records of `session` (whose row is gone) that no fork reads.
async fn trim_unread(tx: &Transaction<'_>, session: &str) -> Result<()> {
    tx.execute(
        "DELETE FROM steadfast_events WHERE session_id = $1 AND seq > coalesce((SELECT max(hi) FROM steadfast_lineage WHERE ancestor = $1), 0)",
        &[&session],
    )
    .await
    .map_err(db)?;
    Ok(())
}

impl PostgresWorld {
    /// An append by whichever path fits: the fast one while this process knows the
    /// session's position under the lease, else the locked one.
    async fn append_any_path(&self, lease: &Lease, events: &[Event]) -> Result<Vec<Record>> {
        let known = self
            .positions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&lease.session)
            .filter(|p| p.epoch == lease.epoch)
            .copied();
        let serialized = crate::serialize_and_spill(self.spill.as_ref(), events).await?;
        if let Some(known) = known {
            if let Some(records) = self.append_fast(lease, known, events, &serialized).await? {
                return Ok(records);
            }
        }
        let records = self.append_locked(lease, events, &serialized).await?;
        if let Some(last) = records.last() {
            self.positions
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(
                    lease.session.clone(),
                    Position {
                        epoch: lease.epoch,
                        last: last.seq,
                        retry_pending: summarize(events).retry_at_ms > 0,
                        // Not asked on this path.
                        inbox_empty: false,
                    },
                );
        }
        Ok(records)
    }
}

impl World for PostgresWorld {
    async fn create_session(&self, session: &str, owner: &str) -> Result<()> {
        let client = self.client().await?;
        let now = now_ms() as i64;
        let inserted = client
            .execute(
                "INSERT INTO steadfast_sessions (id, owner, created_at_ms, updated_at_ms) VALUES ($1, $2, $3, $3) ON CONFLICT DO NOTHING",
                &[&session, &owner, &now],
            )
            .await
            .map_err(db)?;
        if inserted == 0 {
            return Err(Error::AlreadyExists(session.to_string()));
        }
        Ok(())
    }

    async fn acquire_lease(&self, session: &str, holder: &Holder, ttl: Duration) -> Result<Lease> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db)?;
        let (row, now) = lease_row(&tx, session).await?;
        if !row.is_free_for(holder, now) {
            return Err(Error::LeaseHeld {
                session: session.to_string(),
                holder: row.holder.unwrap_or_default(),
                expires_in_ms: row.expires_ms.saturating_sub(now),
            });
        }
        let epoch = row.epoch + 1;
        take_lease(
            &tx,
            session,
            holder,
            epoch,
            now + ttl.as_millis() as u64,
            self.liveness(),
        )
        .await?;
        tx.commit().await.map_err(db)?;
        Ok(Lease {
            session: session.to_string(),
            holder: holder.id.clone(),
            epoch,
        })
    }

    async fn renew_lease(&self, lease: &Lease, ttl: Duration) -> Result<()> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db)?;
        let now = check_fence(&tx, lease).await?;
        tx.execute(
            // A reconnected notification connection is a new liveness token.
            "UPDATE steadfast_sessions SET lease_expires_ms = $2, lease_liveness = coalesce($3, lease_liveness) WHERE id = $1",
            &[&lease.session, &((now + ttl.as_millis() as u64) as i64), &self.liveness()],
        )
        .await
        .map_err(db)?;
        tx.commit().await.map_err(db)
    }

    async fn release_lease(&self, lease: &Lease) -> Result<()> {
        let client = self.client().await?;
        client
            .execute(
                "UPDATE steadfast_sessions SET lease_holder = NULL, lease_host = NULL, lease_pid = NULL, lease_expires_ms = 0, lease_liveness = NULL WHERE id = $1 AND lease_epoch = $2 AND lease_holder = $3",
                &[&lease.session, &(lease.epoch as i64), &lease.holder],
            )
            .await
            .map_err(db)?;
        // Its next append, if any, takes the locking path and is told why it fails.
        let mut positions = self.positions.lock().unwrap_or_else(|e| e.into_inner());
        if positions
            .get(&lease.session)
            .is_some_and(|p| p.epoch == lease.epoch)
        {
            positions.remove(&lease.session);
        }
        Ok(())
    }

    #[tracing::instrument(level = "trace", skip_all, fields(session = %lease.session, events = events.len()))]
    async fn append(&self, lease: &Lease, events: &[Event]) -> Result<Vec<Record>> {
        let started = std::time::Instant::now();
        let appended = self.append_any_path(lease, events).await;
        crate::observe_append("postgres", lease, started, appended)
    }

    async fn read(&self, session: &str, from: u64) -> Result<Vec<Record>> {
        self.read_verified(session, from).await
    }
    async fn list_sessions(&self, query: &SessionQuery) -> Result<SessionPage> {
        let (filter, params) = query.sql(&DIALECT);
        let values: Vec<Box<dyn tokio_postgres::types::ToSql + Sync + Send>> = params
            .into_iter()
            .map(|p| -> Box<dyn tokio_postgres::types::ToSql + Sync + Send> {
                match p {
                    Param::Text(t) => Box::new(t),
                    Param::Int(i) => Box::new(i),
                }
            })
            .collect();
        let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = values
            .iter()
            .map(|v| v.as_ref() as &(dyn tokio_postgres::types::ToSql + Sync))
            .collect();
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&format!("SELECT {SUMMARY_COLUMNS}{filter}"))
            .await
            .map_err(db)?;
        let rows = client.query(&statement, &refs).await.map_err(db)?;
        Ok(query.page(rows.iter().map(summary).collect::<Result<_>>()?))
    }

    async fn update_session(&self, session: &str, patch: &SessionPatch) -> Result<()> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db)?;
        let row = tx
            .query_opt(
                "SELECT labels::text, metadata::text FROM steadfast_sessions WHERE id = $1 FOR UPDATE",
                &[&session],
            )
            .await
            .map_err(db)?
            .ok_or_else(|| Error::NotFound(session.to_string()))?;
        let (labels, metadata) = patch.merged(row.get(0), row.get(1))?;
        tx.execute(
            "UPDATE steadfast_sessions SET labels = $2::text::jsonb, metadata = $3::text::jsonb, \
             title = coalesce($4::text, title), title_set = title_set OR $4::text IS NOT NULL WHERE id = $1",
            &[&session, &labels, &metadata, &patch.title],
        )
        .await
        .map_err(db)?;
        tx.commit().await.map_err(db)
    }

    async fn session(&self, session: &str) -> Result<SessionSummary> {
        let client = self.client().await?;
        client
            .query_opt(
                &format!("SELECT {SUMMARY_COLUMNS} WHERE id = $1"),
                &[&session],
            )
            .await
            .map_err(db)?
            .map(|r| summary(&r))
            .ok_or_else(|| Error::NotFound(session.to_string()))?
    }

    async fn post(
        &self,
        session: &str,
        kind: InboundKind,
        name: &str,
        body: &serde_json::Value,
    ) -> Result<u64> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db)?;
        let status: Option<String> = tx
            .query_opt(
                "SELECT status FROM steadfast_sessions WHERE id = $1 FOR SHARE",
                &[&session],
            )
            .await
            .map_err(db)?
            .map(|r| r.get(0));
        match status.as_deref().map(crate::stored_status).transpose()? {
            None => return Err(Error::NotFound(session.to_string())),
            Some(status) if status.is_over() => return Err(Error::Ended(session.to_string())),
            _ => {}
        }
        let id: i64 = tx
            .query_one(
                "INSERT INTO steadfast_inbox (session_id, kind, name, body, at_ms) VALUES ($1, $2, $3, $4, $5) RETURNING id",
                &[&session, &kind.as_str(), &name, &body.to_string(), &(now_ms() as i64)],
            )
            .await
            .map_err(db)?
            .get(0);
        tx.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &session])
            .await
            .map_err(db)?;
        tx.commit().await.map_err(db)?;
        // A post from this process is seen at the next step, not one later.
        if let Some(known) = self
            .positions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(session)
        {
            known.inbox_empty = false;
        }
        crate::bump(&self.changes);
        Ok(to_u64(id))
    }

    async fn turn_began(&self, session: &str, at: u64) -> Result<u64> {
        // Walks the primary key backwards from `at`: as far as the turn is long.
        self.last_of_kind(session, "user_message", at).await
    }

    async fn last_of_kind(&self, session: &str, kind: &str, upto: u64) -> Result<u64> {
        let mut client = self.client().await?;
        let tx = client
            .build_transaction()
            .read_only(true)
            .start()
            .await
            .map_err(db)?;
        let found = last_in_segments(&tx, session, kind, upto).await?;
        tx.commit().await.map_err(db)?;
        Ok(found)
    }

    async fn prune_deltas(&self, session: &str, before: u64) -> Result<u64> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db)?;
        let rows = tx
            .query(
                "SELECT seq, epoch, at_ms, octet_length(body) FROM steadfast_events WHERE session_id = $1 AND kind = $2 AND seq < $3",
                &[&session, &MODEL_DELTA_KIND, &(before as i64)],
            )
            .await
            .map_err(db)?;
        let update = tx
            .prepare_cached(
                "UPDATE steadfast_events SET kind = $3, schema = $4, body = $5, checksum = $6, blob = NULL WHERE session_id = $1 AND seq = $2",
            )
            .await
            .map_err(db)?;
        for row in &rows {
            let (seq, epoch, at_ms, bytes): (i64, i64, i64, i32) =
                (row.get(0), row.get(1), row.get(2), row.get(3));
            let pruned = crate::pruned_record(
                session,
                to_u64(seq),
                to_u64(epoch),
                to_u64(at_ms),
                MODEL_DELTA_KIND,
                bytes.max(0) as u64,
            );
            tx.execute(
                &update,
                &[
                    &session,
                    &seq,
                    &PRUNED_KIND,
                    &(pruned.schema as i16),
                    &pruned.body,
                    &pruned.checksum,
                ],
            )
            .await
            .map_err(db)?;
        }
        tx.commit().await.map_err(db)?;
        Ok(rows.len() as u64)
    }

    async fn spilled(&self, session: &str) -> Result<Vec<String>> {
        let mut client = self.client().await?;
        let tx = client
            .build_transaction()
            .read_only(true)
            .start()
            .await
            .map_err(db)?;
        let (_, segments) = segments_of(&tx, session).await?;
        let mut out = Vec::new();
        for s in segments {
            let rows = tx
                .query(
                    "SELECT blob FROM steadfast_events WHERE session_id = $1 AND seq >= $2 AND seq <= $3 AND blob IS NOT NULL",
                    &[&s.session, &lineage::sql_position(s.lo), &lineage::sql_position(s.hi)],
                )
                .await
                .map_err(db)?;
            out.extend(rows.iter().map(|r| r.get::<_, String>(0)));
        }
        tx.commit().await.map_err(db)?;
        Ok(out)
    }

    async fn inbox(&self, session: &str) -> Result<Vec<Inbound>> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT id, kind, name, body FROM steadfast_inbox WHERE session_id = $1 AND NOT taken ORDER BY id",
                &[&session],
            )
            .await
            .map_err(db)?;
        Ok(rows
            .iter()
            .map(|r| {
                let body: String = r.get(3);
                Inbound {
                    id: to_u64(r.get(0)),
                    kind: InboundKind::parse(r.get(1)),
                    name: r.get(2),
                    body: serde_json::from_str(&body).unwrap_or(serde_json::Value::String(body)),
                }
            })
            .collect())
    }

    #[tracing::instrument(level = "trace", skip_all, fields(holder = %holder.id))]
    async fn claim(&self, holder: &Holder, ttl: Duration) -> Result<Option<Lease>> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db)?;
        // Competing workers skip each other's locked rows instead of queueing on them.
        let rows = tx
            .query(CLAIMABLE.as_str(), &[&holder.host])
            .await
            .map_err(db)?;
        for row in rows {
            let session: String = row.get(0);
            let (lease, now) = lease_row(&tx, &session).await?;
            // A session this holder keeps (cooling down after a failure) is not
            // new work until its lease lapses: a failure that could not be recorded
            // must not leave it held for good.
            if (lease.holder.as_deref() == Some(holder.id.as_str()) && lease.expires_ms > now)
                || !lease.is_free_for(holder, now)
            {
                continue;
            }
            let epoch = lease.epoch + 1;
            take_lease(
                &tx,
                &session,
                holder,
                epoch,
                now + ttl.as_millis() as u64,
                self.liveness(),
            )
            .await?;
            tx.commit().await.map_err(db)?;
            return Ok(Some(Lease {
                session,
                holder: holder.id.clone(),
                epoch,
            }));
        }
        Ok(None)
    }

    async fn delete_session(&self, session: &str) -> Result<()> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db)?;
        // The row first: it waits out an append in flight (the fence trigger holds it
        // shared), and once it is gone no append can commit; then its events, but for
        // those forks still read.
        let n = tx
            .execute("DELETE FROM steadfast_sessions WHERE id = $1", &[&session])
            .await
            .map_err(db)?;
        if n == 0 {
            return Err(Error::NotFound(session.to_string()));
        }
        for table in ["steadfast_hooks", "steadfast_hook_deliveries"] {
            tx.execute(
                &format!("DELETE FROM {table} WHERE session = $1"),
                &[&session],
            )
            .await
            .map_err(db)?;
        }
        let ancestors: Vec<String> = tx
            .query(
                "DELETE FROM steadfast_lineage WHERE session_id = $1 RETURNING ancestor",
                &[&session],
            )
            .await
            .map_err(db)?
            .iter()
            .map(|r| r.get(0))
            .collect();
        trim_unread(&tx, session).await?;
        for ancestor in ancestors {
            let gone: bool = tx
                .query_one(
                    "SELECT NOT EXISTS (SELECT 1 FROM steadfast_sessions WHERE id = $1)",
                    &[&ancestor],
                )
                .await
                .map_err(db)?
                .get(0);
            if gone {
                trim_unread(&tx, &ancestor).await?;
            }
        }
        tx.commit().await.map_err(db)?;
        // A session made again under this id starts from nothing, not from the
        // position this process knew.
        self.positions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(session);
        Ok(())
    }

    async fn fork_session(&self, fork: &crate::Fork) -> Result<SessionSummary> {
        let body = serde_json::to_vec(&fork.event).map_err(Error::backend)?;
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db)?;
        // The parent's row is locked against a concurrent delete while its records are
        // made shared.
        let epoch: i64 = tx
            .query_opt(
                "SELECT lease_epoch FROM steadfast_sessions WHERE id = $1 FOR SHARE",
                &[&fork.parent],
            )
            .await
            .map_err(db)?
            .ok_or_else(|| Error::NotFound(fork.parent.clone()))?
            .get(0);
        let (last_seq, parent_segments) = segments_of(&tx, &fork.parent).await?;
        lineage::check_fork_point(&fork.parent, fork.at, last_seq)?;
        let now = now_ms() as i64;
        let at = lineage::sql_position(fork.at);
        // Made held by the fork itself for the one insert the fence must let through,
        // then released: the child starts with no holder.
        let inserted = tx
            .execute(
                "INSERT INTO steadfast_sessions (id, owner, created_at_ms, updated_at_ms, status, title, title_set, \
                 last_seq, lease_epoch, lease_holder, waiting_for, agent, labels, metadata, parent, forked_at, own_from) \
                 SELECT $1, $2, $3, $3, $4, coalesce($5::text, title), $5::text IS NOT NULL OR title_set, $6::bigint + 1, \
                 lease_epoch, 'fork', $7, agent, labels, metadata, id, $6::bigint, $6::bigint + 1 FROM steadfast_sessions WHERE id = $8 \
                 ON CONFLICT DO NOTHING",
                &[
                    &fork.child,
                    &fork.owner,
                    &now,
                    &fork.status.as_str(),
                    &fork.title,
                    &at,
                    &fork.waiting_for,
                    &fork.parent,
                ],
            )
            .await
            .map_err(db)?;
        if inserted == 0 {
            return Err(Error::AlreadyExists(fork.child.clone()));
        }
        write_lineage(
            &tx,
            &fork.child,
            &lineage::ancestry_at(&parent_segments, fork.at),
        )
        .await?;
        let record = Record {
            seq: fork.at + 1,
            epoch: to_u64(epoch),
            at_ms: to_u64(now),
            event: fork.event.clone(),
        };
        insert_record(&tx, &fork.child, &record, &body).await?;
        tx.execute(
            "UPDATE steadfast_sessions SET lease_holder = NULL WHERE id = $1",
            &[&fork.child],
        )
        .await
        .map_err(db)?;
        tx.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &fork.child])
            .await
            .map_err(db)?;
        let row = tx
            .query_one(
                &format!("SELECT {SUMMARY_COLUMNS} WHERE id = $1"),
                &[&fork.child],
            )
            .await
            .map_err(db)?;
        steadfast_fault::point(steadfast_fault::points::FORK_WRITTEN);
        tx.commit().await.map_err(db)?;
        crate::bump(&self.changes);
        summary(&row)
    }

    async fn rewind_session(&self, rewind: &crate::Rewind) -> Result<Record> {
        let body = serde_json::to_vec(&rewind.event).map_err(Error::backend)?;
        let session = rewind.lease.session.as_str();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db)?;
        let now = check_fence(&tx, &rewind.lease).await?;
        let (last_seq, segments) = segments_of(&tx, session).await?;
        lineage::check_rewind_point(session, rewind.to, last_seq)?;
        write_lineage(&tx, session, &lineage::ancestry_at(&segments, rewind.to)).await?;
        let record = Record {
            seq: last_seq + 1,
            epoch: rewind.lease.epoch,
            at_ms: now,
            event: rewind.event.clone(),
        };
        let seq = lineage::sql_position(record.seq);
        insert_record(&tx, session, &record, &body).await?;
        tx.execute(
            "UPDATE steadfast_sessions SET own_from = $2, last_seq = $2, updated_at_ms = $3, status = $4, waiting_for = $5, retry_at_ms = 0 WHERE id = $1",
            &[&session, &seq, &(now as i64), &rewind.status.as_str(), &rewind.waiting_for],
        )
        .await
        .map_err(db)?;
        tx.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &session])
            .await
            .map_err(db)?;
        tx.commit().await.map_err(db)?;
        // The holder's next append learns the new position from the row.
        self.positions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(session);
        crate::bump(&self.changes);
        Ok(record)
    }

    async fn forks(&self, session: &str) -> Result<Vec<String>> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT id FROM steadfast_sessions WHERE parent = $1 ORDER BY created_at_ms, id",
                &[&session],
            )
            .await
            .map_err(db)?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn outbox_take(
        &self,
        now_ms: u64,
        hold_ms: u64,
        limit: usize,
    ) -> Result<Vec<crate::OutboxItem>> {
        let client = self.client().await?;
        let rows = client
            .query(
                "UPDATE steadfast_outbox SET next_at_ms = $2 WHERE id IN ( \
                   SELECT id FROM steadfast_outbox \
                    WHERE delivered_at_ms IS NULL AND NOT abandoned AND next_at_ms <= $1 \
                    ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED) \
                 RETURNING id, session_id, seq, kind, at_ms, attempts",
                &[
                    &(now_ms as i64),
                    &((now_ms + hold_ms) as i64),
                    &(limit as i64),
                ],
            )
            .await
            .map_err(db)?;
        let mut items: Vec<crate::OutboxItem> = rows
            .iter()
            .map(|r| crate::OutboxItem {
                id: r.get::<_, i64>(0) as u64,
                session: r.get(1),
                seq: r.get::<_, i64>(2) as u64,
                kind: r.get(3),
                at_ms: r.get::<_, i64>(4) as u64,
                attempts: r.get::<_, i32>(5) as u32,
            })
            .collect();
        items.sort_by_key(|i| i.id);
        Ok(items)
    }

    async fn outbox_settle(&self, id: u64, settled: &crate::Settled) -> Result<()> {
        let client = self.client().await?;
        let id = id as i64;
        match settled {
            crate::Settled::Delivered { status } => {
                let (at, status) = (now_ms() as i64, i32::from(*status));
                client
                    .execute(
                        "UPDATE steadfast_outbox SET delivered_at_ms = $2, status = $3 WHERE id = $1",
                        &[&id, &at, &status],
                    )
                    .await
            }
            crate::Settled::Failed { error, retry_at_ms } => {
                let (next, abandoned) = (retry_at_ms.unwrap_or(0) as i64, retry_at_ms.is_none());
                client
                    .execute(
                        "UPDATE steadfast_outbox SET attempts = attempts + 1, last_error = $2, \
                         next_at_ms = $3, abandoned = $4 WHERE id = $1",
                        &[&id, error, &next, &abandoned],
                    )
                    .await
            }
        }
        .map_err(db)?;
        Ok(())
    }

    async fn outbox_prune(&self, before_ms: u64) -> Result<u64> {
        let client = self.client().await?;
        client
            .execute(
                "DELETE FROM steadfast_outbox WHERE at_ms < $1",
                &[&(before_ms as i64)],
            )
            .await
            .map_err(db)
    }

    async fn vault_put(&self, owner: &str, name: &str, sealed: &crate::Sealed) -> Result<()> {
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO steadfast_vault (owner, name, key_id, nonce, ciphertext, updated_at_ms) \
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (owner, name) DO UPDATE SET \
                 key_id = excluded.key_id, nonce = excluded.nonce, \
                 ciphertext = excluded.ciphertext, updated_at_ms = excluded.updated_at_ms",
                &[
                    &owner,
                    &name,
                    &sealed.key_id,
                    &sealed.nonce,
                    &sealed.ciphertext,
                    &(now_ms() as i64),
                ],
            )
            .await
            .map_err(db)?;
        Ok(())
    }

    async fn vault_get(&self, owner: &str, name: &str) -> Result<Option<crate::VaultEntry>> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT owner, name, updated_at_ms, key_id, nonce, ciphertext FROM steadfast_vault \
                 WHERE owner = $1 AND name = $2",
                &[&owner, &name],
            )
            .await
            .map_err(db)?;
        Ok(row.as_ref().map(vault_entry))
    }

    async fn vault_list(&self, owner: Option<&str>) -> Result<Vec<crate::VaultEntry>> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT owner, name, updated_at_ms, key_id, nonce, ciphertext FROM steadfast_vault \
                 WHERE $1::text IS NULL OR owner = $1 ORDER BY owner, name",
                &[&owner],
            )
            .await
            .map_err(db)?;
        Ok(rows.iter().map(vault_entry).collect())
    }

    async fn vault_delete(&self, owner: &str, name: &str) -> Result<bool> {
        let client = self.client().await?;
        let n = client
            .execute(
                "DELETE FROM steadfast_vault WHERE owner = $1 AND name = $2",
                &[&owner, &name],
            )
            .await
            .map_err(db)?;
        Ok(n > 0)
    }

    async fn hook_create(&self, hook: &crate::Hook) -> Result<bool> {
        let client = self.client().await?;
        let (token_hash, sealed) = crate::hooks::stored_secret(&hook.secret);
        let n = client
            .execute(
                "INSERT INTO steadfast_hooks (session, name, verify, then_do, token_hash, key_id, \
                 nonce, ciphertext, created_at_ms, created_by) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT DO NOTHING",
                &[
                    &hook.session,
                    &hook.name,
                    &hook.check.as_str(),
                    &hook.then.as_str(),
                    &token_hash,
                    &sealed.map(|s| s.key_id.as_str()),
                    &sealed.map(|s| s.nonce.as_slice()),
                    &sealed.map(|s| s.ciphertext.as_slice()),
                    &(hook.created_at_ms as i64),
                    &hook.created_by,
                ],
            )
            .await
            .map_err(db)?;
        Ok(n > 0)
    }

    async fn hooks(&self, session: Option<&str>) -> Result<Vec<crate::Hook>> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT session, name, verify, then_do, token_hash, key_id, nonce, ciphertext, \
                 created_at_ms, created_by FROM steadfast_hooks WHERE $1::text IS NULL OR session = $1 \
                 ORDER BY session, name",
                &[&session],
            )
            .await
            .map_err(db)?;
        rows.iter()
            .map(|r| {
                crate::hooks::StoredHook {
                    session: r.get(0),
                    name: r.get(1),
                    check: r.get(2),
                    then: r.get(3),
                    token_hash: r.get(4),
                    key_id: r.get(5),
                    nonce: r.get(6),
                    ciphertext: r.get(7),
                    created_at_ms: r.get(8),
                    created_by: r.get(9),
                }
                .into_hook()
            })
            .collect()
    }

    async fn hook_reseal(&self, session: &str, name: &str, sealed: &crate::Sealed) -> Result<bool> {
        let client = self.client().await?;
        let n = client
            .execute(
                "UPDATE steadfast_hooks SET key_id = $3, nonce = $4, ciphertext = $5 \
                 WHERE session = $1 AND name = $2 AND key_id IS NOT NULL",
                &[
                    &session,
                    &name,
                    &sealed.key_id,
                    &sealed.nonce,
                    &sealed.ciphertext,
                ],
            )
            .await
            .map_err(db)?;
        Ok(n > 0)
    }

    async fn hook_delete(&self, session: &str, name: &str) -> Result<bool> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db)?;
        let n = tx
            .execute(
                "DELETE FROM steadfast_hooks WHERE session = $1 AND name = $2",
                &[&session, &name],
            )
            .await
            .map_err(db)?;
        tx.execute(
            "DELETE FROM steadfast_hook_deliveries WHERE session = $1 AND name = $2",
            &[&session, &name],
        )
        .await
        .map_err(db)?;
        tx.commit().await.map_err(db)?;
        Ok(n > 0)
    }

    async fn hook_take_delivery(
        &self,
        session: &str,
        name: &str,
        delivery: &str,
        at_ms: u64,
        forget_before_ms: u64,
    ) -> Result<bool> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db)?;
        tx.execute(
            "DELETE FROM steadfast_hook_deliveries WHERE session = $1 AND name = $2 AND at_ms < $3",
            &[&session, &name, &(forget_before_ms as i64)],
        )
        .await
        .map_err(db)?;
        let n = tx
            .execute(
                "INSERT INTO steadfast_hook_deliveries (session, name, delivery, at_ms) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                &[&session, &name, &delivery, &(at_ms as i64)],
            )
            .await
            .map_err(db)?;
        tx.commit().await.map_err(db)?;
        Ok(n > 0)
    }

    async fn hook_untake_delivery(&self, session: &str, name: &str, delivery: &str) -> Result<()> {
        let client = self.client().await?;
        client
            .execute(
                "DELETE FROM steadfast_hook_deliveries WHERE session = $1 AND name = $2 AND delivery = $3",
                &[&session, &name, &delivery],
            )
            .await
            .map_err(db)?;
        Ok(())
    }

    async fn token_issue(&self, token: &crate::ServiceToken) -> Result<()> {
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO steadfast_tokens (id, name, owner, scopes, hash, created_at_ms, created_by, expires_at_ms) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                &[
                    &token.id,
                    &token.name,
                    &token.owner,
                    &crate::access::scopes_text(&token.scopes),
                    &token.hash,
                    &(token.created_at_ms as i64),
                    &token.created_by,
                    &token.expires_at_ms.map(|t| t as i64),
                ],
            )
            .await
            .map_err(db)?;
        Ok(())
    }

    async fn tokens(&self) -> Result<Vec<crate::ServiceToken>> {
        let client = self.client().await?;
        let rows = client
            .query(
                &format!("SELECT {TOKEN_COLUMNS} FROM steadfast_tokens ORDER BY created_at_ms DESC, id DESC"),
                &[],
            )
            .await
            .map_err(db)?;
        Ok(rows.iter().map(service_token).collect())
    }

    async fn token_by_hash(&self, hash: &str) -> Result<Option<crate::ServiceToken>> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(&format!(
                "SELECT {TOKEN_COLUMNS} FROM steadfast_tokens WHERE hash = $1"
            ))
            .await
            .map_err(db)?;
        let row = client.query_opt(&statement, &[&hash]).await.map_err(db)?;
        Ok(row.as_ref().map(service_token))
    }

    async fn token_revoke(&self, id: &str, at_ms: u64) -> Result<bool> {
        let client = self.client().await?;
        let n = client
            .execute(
                "UPDATE steadfast_tokens SET revoked_at_ms = $2 WHERE id = $1 AND revoked_at_ms IS NULL",
                &[&id, &(at_ms as i64)],
            )
            .await
            .map_err(db)?;
        Ok(n > 0)
    }

    async fn audit(
        &self,
        actor: &str,
        action: &str,
        target: &str,
        detail: &serde_json::Value,
    ) -> Result<()> {
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO steadfast_audit (at_ms, actor, action, target, detail) VALUES ($1, $2, $3, $4, $5)",
                &[&(now_ms() as i64), &actor, &action, &target, &detail.to_string()],
            )
            .await
            .map_err(db)?;
        Ok(())
    }

    async fn audit_log(
        &self,
        after: u64,
        limit: usize,
        about: Option<&str>,
    ) -> Result<Vec<crate::AuditEntry>> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT id, at_ms, actor, action, target, detail FROM steadfast_audit WHERE id > $1 \
                 AND ($3::text IS NULL OR (target = $3 AND (action LIKE 'session.%' OR action LIKE 'hook.%' OR action LIKE 'preview.%' OR action LIKE 'shell.%'))) \
                 ORDER BY id LIMIT $2",
                &[&(after.min(i64::MAX as u64) as i64), &(limit as i64), &about],
            )
            .await
            .map_err(db)?;
        Ok(rows
            .iter()
            .map(|r| crate::AuditEntry {
                id: to_u64(r.get(0)),
                at_ms: to_u64(r.get(1)),
                actor: r.get(2),
                action: r.get(3),
                target: r.get(4),
                detail: serde_json::from_str(r.get(5)).unwrap_or(serde_json::Value::Null),
            })
            .collect())
    }

    async fn owner_kept_bytes(&self, session: &str) -> Result<u64> {
        let client = self.client().await?;
        let statement = client
            .prepare_cached(
                "SELECT coalesce(sum(kept_bytes), 0)::bigint FROM steadfast_sessions \
                 WHERE owner = (SELECT owner FROM steadfast_sessions WHERE id = $1)",
            )
            .await
            .map_err(db)?;
        let row = client
            .query_one(&statement, &[&session])
            .await
            .map_err(db)?;
        Ok(row.get::<_, i64>(0).max(0) as u64)
    }

    async fn take_tokens(&self, draw: &crate::rate::Draw) -> Result<bool> {
        if draw.amount > draw.capacity {
            return Ok(false);
        }
        let client = self.client().await?;
        let now = now_ms() as i64;
        // One statement: the bucket is refilled and drawn on under its row's lock, or
        // left as it was (no row returned) when it holds too little.
        let taken = client
            .query_opt(
                "INSERT INTO steadfast_rate_buckets AS b (key, tokens, at_ms) \
                 VALUES ($1, $2::float8 - $3::float8, $4) \
                 ON CONFLICT (key) DO UPDATE SET \
                   tokens = LEAST($2::float8, b.tokens + GREATEST($4 - b.at_ms, 0) * $2::float8 / $5::float8) - $3::float8, \
                   at_ms = $4 \
                 WHERE LEAST($2::float8, b.tokens + GREATEST($4 - b.at_ms, 0) * $2::float8 / $5::float8) >= $3::float8 \
                 RETURNING tokens",
                &[
                    &draw.key,
                    &draw.capacity,
                    &draw.amount,
                    &now,
                    &(draw.window_ms.max(1) as f64),
                ],
            )
            .await
            .map_err(db)?
            .is_some();
        if crate::rate::prune_due() {
            client
                .execute(
                    "DELETE FROM steadfast_rate_buckets WHERE at_ms < $1",
                    &[&(now - crate::rate::PRUNE_AFTER_MS as i64)],
                )
                .await
                .map_err(db)?;
        }
        Ok(taken)
    }

    async fn census(&self) -> Result<crate::Census> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT status, count(*) FROM steadfast_sessions GROUP BY status ORDER BY status",
                &[],
            )
            .await
            .map_err(db)?;
        let by_status = rows
            .iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1) as u64))
            .collect();
        let queued: i64 = client
            .query_one(QUEUED.as_str(), &[])
            .await
            .map_err(db)?
            .get(0);
        Ok(crate::Census {
            by_status,
            queued: queued as u64,
        })
    }

    fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn due(&self) -> tokio::sync::watch::Receiver<u64> {
        self.due.subscribe()
    }

    fn inbox_seen_empty(&self, lease: &Lease) -> bool {
        let positions = self.positions.lock().unwrap_or_else(|e| e.into_inner());
        positions
            .get(&lease.session)
            .is_some_and(|p| p.epoch == lease.epoch && p.inbox_empty)
    }

    async fn ping(&self) -> Result<()> {
        self.client()
            .await?
            .query_one("SELECT 1 FROM steadfast_schema LIMIT 1", &[])
            .await
            .map_err(db)?;
        Ok(())
    }
}

/// Sessions with work due: a turn left running, a queued message for an idle one, the
/// signal a waiting one awaits (an interrupt is due at once, even in a retry's wait).
const HAS_WORK: &str = "
  s.status IN ('running', 'idle', 'waiting', 'escalated')
  AND (s.retry_at_ms <= (extract(epoch from clock_timestamp()) * 1000)::bigint OR EXISTS (
        SELECT 1 FROM steadfast_inbox i WHERE i.session_id = s.id AND NOT i.taken AND i.kind = 'signal' AND i.name = 'interrupt'))
  AND (
    s.status = 'running'
    OR (s.status = 'idle' AND EXISTS (
        SELECT 1 FROM steadfast_inbox i WHERE i.session_id = s.id AND NOT i.taken AND i.kind IN ('message', 'steer')))
    OR (s.status IN ('waiting', 'escalated') AND EXISTS (
        SELECT 1 FROM steadfast_inbox i WHERE i.session_id = s.id AND NOT i.taken AND i.kind = 'signal'
          AND (i.name = s.waiting_for OR (s.status = 'waiting' AND i.name = 'interrupt'))))
  )";

/// A lease no live holder keeps.
const LEASE_FREE: &str = "(s.lease_holder IS NULL
       OR s.lease_expires_ms <= (extract(epoch from clock_timestamp()) * 1000)::bigint
       OR {HOLDER_GONE})";

/// Sessions that need a driver, locked with `SKIP LOCKED` so competing workers each
/// get a different one (this host's own leases included: a holder here that is gone
/// is known at once).
static CLAIMABLE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT s.id FROM steadfast_sessions s WHERE {HAS_WORK}
  AND ({LEASE_FREE} OR s.lease_host = $1)
ORDER BY (s.lease_holder IS NOT NULL), s.updated_at_ms
LIMIT 16
FOR UPDATE SKIP LOCKED"
    )
    .replace("{HOLDER_GONE}", HOLDER_GONE)
});

/// Whether any session has work due that no live holder keeps: what the listener
/// looks for between notifications (a lease lapsing, a holder's process dying, a
/// retry's time coming announce themselves to no one).
pub(super) static ANY_DUE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!("SELECT EXISTS (SELECT 1 FROM steadfast_sessions s WHERE {HAS_WORK} AND {LEASE_FREE})")
        .replace("{HOLDER_GONE}", HOLDER_GONE)
});

/// How many sessions have work due that no live holder keeps: the queue's depth.
static QUEUED: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!("SELECT count(*) FROM steadfast_sessions s WHERE {HAS_WORK} AND {LEASE_FREE}")
        .replace("{HOLDER_GONE}", HOLDER_GONE)
});

fn vault_entry(r: &Row) -> crate::VaultEntry {
    crate::VaultEntry {
        owner: r.get(0),
        name: r.get(1),
        updated_at_ms: r.get::<_, i64>(2) as u64,
        sealed: crate::Sealed {
            key_id: r.get(3),
            nonce: r.get(4),
            ciphertext: r.get(5),
        },
    }
}
