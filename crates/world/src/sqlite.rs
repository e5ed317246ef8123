//! The embedded world: one SQLite file in WAL mode with `synchronous = FULL`, so a
//! committed append survives a process crash and a power cut.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use steadfast_log::record::{self, EncodedRecord};
use steadfast_log::{Event, Record, Status, MODEL_DELTA_KIND, PRUNED_KIND};

use crate::lineage;
use crate::listing::Param;
use crate::{
    now_ms, summarize, Error, Holder, Inbound, InboundKind, Lease, LeaseRow, RawRecord, Result,
    SessionPage, SessionPatch, SessionQuery, SessionSummary, World,
};

/// Schema migrations, applied in order; `PRAGMA user_version` records the last.
const MIGRATIONS: &[&str] = &[
    SCHEMA_V1, SCHEMA_V2, SCHEMA_V3, SCHEMA_V4, SCHEMA_V5, SCHEMA_V6, SCHEMA_V7, SCHEMA_V8,
    SCHEMA_V9, SCHEMA_V10, SCHEMA_V11, SCHEMA_V12,
];

/// Inbound hooks ([`crate::hooks`]) and the deliveries they took.
const SCHEMA_V12: &str = r#"
CREATE TABLE hooks (
    session       TEXT NOT NULL,
    name          TEXT NOT NULL,
    verify        TEXT NOT NULL,
    then_do       TEXT NOT NULL,
    token_hash    TEXT,
    key_id        TEXT,
    nonce         BLOB,
    ciphertext    BLOB,
    created_at_ms INTEGER NOT NULL,
    created_by    TEXT NOT NULL,
    PRIMARY KEY (session, name)
) WITHOUT ROWID;
CREATE TABLE hook_deliveries (
    session  TEXT NOT NULL,
    name     TEXT NOT NULL,
    delivery TEXT NOT NULL,
    at_ms    INTEGER NOT NULL,
    PRIMARY KEY (session, name, delivery)
) WITHOUT ROWID;
CREATE INDEX audit_by_target ON audit (target, id);
"#;

/// What each session's history keeps beyond its log ([`World::owner_kept_bytes`]).
/// Sessions recorded before it count from here on.
const SCHEMA_V11: &str = r#"
ALTER TABLE sessions ADD COLUMN kept_bytes INTEGER NOT NULL DEFAULT 0;
"#;

/// Rate buckets shared by every process on this world ([`World::take_tokens`]).
const SCHEMA_V10: &str = r#"
CREATE TABLE rate_buckets (
    key    TEXT PRIMARY KEY,
    tokens REAL NOT NULL,
    at_ms  INTEGER NOT NULL
);
CREATE INDEX rate_buckets_by_age ON rate_buckets (at_ms);
"#;

/// Forks ([`crate::lineage`]): a session's parent and fork point, and the segments of
/// its ancestors' logs it reads as the start of its own.
const SCHEMA_V9: &str = r#"
ALTER TABLE sessions ADD COLUMN parent TEXT;
ALTER TABLE sessions ADD COLUMN forked_at INTEGER;
ALTER TABLE sessions ADD COLUMN own_from INTEGER NOT NULL DEFAULT 1;
CREATE INDEX sessions_by_parent ON sessions (parent) WHERE parent IS NOT NULL;
CREATE TABLE lineage (
    session_id TEXT NOT NULL,
    ancestor   TEXT NOT NULL,
    lo         INTEGER NOT NULL,
    hi         INTEGER NOT NULL,
    PRIMARY KEY (session_id, lo)
) WITHOUT ROWID;
CREATE INDEX lineage_by_ancestor ON lineage (ancestor, hi);
"#;

/// Tokens issued through the API, and the audit log ([`crate::access`]).
const SCHEMA_V8: &str = r#"
CREATE TABLE tokens (
    id            TEXT PRIMARY KEY,
    name          TEXT NOT NULL,
    owner         TEXT NOT NULL,
    scopes        TEXT NOT NULL,
    hash          TEXT NOT NULL UNIQUE,
    created_at_ms INTEGER NOT NULL,
    created_by    TEXT NOT NULL,
    expires_at_ms INTEGER,
    revoked_at_ms INTEGER
);
CREATE TABLE audit (
    id     INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms  INTEGER NOT NULL,
    actor  TEXT NOT NULL,
    action TEXT NOT NULL,
    target TEXT NOT NULL,
    detail TEXT NOT NULL
);
"#;

/// Sessions listed by owner a page at a time ([`crate::listing`]): what they run,
/// their labels and metadata, a title the owner set, and the index a page reads.
const SCHEMA_V7: &str = r#"
ALTER TABLE sessions ADD COLUMN agent TEXT NOT NULL DEFAULT '';
ALTER TABLE sessions ADD COLUMN labels TEXT NOT NULL DEFAULT '{}';
ALTER TABLE sessions ADD COLUMN metadata TEXT NOT NULL DEFAULT '{}';
ALTER TABLE sessions ADD COLUMN title_set INTEGER NOT NULL DEFAULT 0;
UPDATE sessions SET agent = coalesce((SELECT json_extract(CAST(e.body AS TEXT), '$.session_started.agent') FROM events e
    WHERE e.session_id = sessions.id AND e.seq = 1 AND e.kind = 'session_started'
      AND json_valid(CAST(e.body AS TEXT))), '');
CREATE INDEX sessions_by_owner ON sessions (owner, created_at_ms DESC, id DESC);
CREATE INDEX sessions_by_time ON sessions (created_at_ms DESC, id DESC);
"#;

/// Vaults ([`crate::vault`]): each owner's credentials, sealed.
const SCHEMA_V6: &str = r#"
CREATE TABLE vault (
    owner         TEXT NOT NULL,
    name          TEXT NOT NULL,
    key_id        TEXT NOT NULL,
    nonce         BLOB NOT NULL,
    ciphertext    BLOB NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    PRIMARY KEY (owner, name)
) WITHOUT ROWID;
"#;

/// The outbox ([`crate::outbox`]): a trigger queues each record of a kind in
/// [`crate::OUTBOX_KINDS`] in the transaction that appends it.
const SCHEMA_V5: &str = r#"
CREATE TABLE outbox (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id      TEXT NOT NULL,
    seq             INTEGER NOT NULL,
    kind            TEXT NOT NULL,
    at_ms           INTEGER NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_at_ms      INTEGER NOT NULL DEFAULT 0,
    delivered_at_ms INTEGER,
    status          INTEGER,
    last_error      TEXT,
    abandoned       INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX outbox_due ON outbox (next_at_ms, id) WHERE delivered_at_ms IS NULL AND abandoned = 0;
CREATE TRIGGER outbox_queue AFTER INSERT ON events
    WHEN NEW.kind IN ('wait_started', 'escalated', 'turn_ended', 'turn_interrupted', 'session_ended')
BEGIN
    INSERT INTO outbox (session_id, seq, kind, at_ms) VALUES (NEW.session_id, NEW.seq, NEW.kind, NEW.at_ms);
END;
"#;

/// A session whose driving failed in a way retrying may fix waits until its retry
/// time before any worker takes it (0: at once).
const SCHEMA_V4: &str = "ALTER TABLE sessions ADD COLUMN retry_at_ms INTEGER NOT NULL DEFAULT 0;";

/// Records too big to keep inline keep their body in the blob store.
const SCHEMA_V3: &str = "ALTER TABLE events ADD COLUMN blob TEXT;";

const SCHEMA_V1: &str = r#"
CREATE TABLE IF NOT EXISTS sessions (
    id               TEXT PRIMARY KEY,
    owner            TEXT NOT NULL,
    created_at_ms    INTEGER NOT NULL,
    updated_at_ms    INTEGER NOT NULL,
    status           TEXT NOT NULL DEFAULT 'new',
    title            TEXT NOT NULL DEFAULT '',
    last_seq         INTEGER NOT NULL DEFAULT 0,
    lease_epoch      INTEGER NOT NULL DEFAULT 0,
    lease_holder     TEXT,
    lease_host       TEXT,
    lease_pid        INTEGER,
    lease_expires_ms INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    epoch      INTEGER NOT NULL,
    at_ms      INTEGER NOT NULL,
    schema     INTEGER NOT NULL,
    kind       TEXT NOT NULL,
    body       BLOB NOT NULL,
    checksum   TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
"#;
const SCHEMA_V2: &str = r#"
ALTER TABLE sessions ADD COLUMN waiting_for TEXT;
CREATE TABLE inbox (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    kind       TEXT NOT NULL,
    name       TEXT NOT NULL,
    body       TEXT NOT NULL,
    at_ms      INTEGER NOT NULL,
    taken      INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX inbox_pending ON inbox (session_id, taken, id);
"#;
const USER_VERSION: i64 = MIGRATIONS.len() as i64;

/// A [`World`] in one SQLite file.
#[derive(Clone)]
pub struct SqliteWorld {
    /// The one connection, owned by a thread of its own that runs the calls sent to
    /// it in order: callers wait as tasks, so any number of them (a thousand event
    /// streams, say) occupy one thread, not one each of the blocking pool.
    jobs: Arc<ConnectionThread>,
    /// Sessions whose last append here found their inbox empty, by the lease epoch
    /// it was made under (see [`World::inbox_seen_empty`]).
    inbox_seen_empty: Arc<std::sync::Mutex<std::collections::HashMap<String, u64>>>,
    path: PathBuf,
    changes: Arc<tokio::sync::watch::Sender<u64>>,
    /// Whether a task watches for other processes' commits (see
    /// [`SqliteWorld::watch_other_processes`]).
    watching: Arc<std::sync::atomic::AtomicBool>,
    spill: Option<crate::Blobs>,
}

/// How often a process looks whether another one committed to the database.
const OTHERS_WATCH: Duration = Duration::from_millis(100);

fn backend(e: rusqlite::Error) -> Error {
    Error::backend(e)
}

/// A call for the connection's thread.
type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// The thread that owns the connection. Dropping the last handle closes the
/// connection before the drop returns (so the file is whole and checkpointed once a
/// world is gone).
struct ConnectionThread {
    jobs: Option<std::sync::mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ConnectionThread {
    fn start(mut conn: Connection, path: &Path) -> Result<Self> {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name("steadfast-sqlite".into())
            .spawn(move || {
                for job in rx {
                    // A call that panics fails alone (its caller sees the answer go
                    // missing); the connection goes on serving the others.
                    let _ =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&mut conn)));
                }
            })
            .map_err(|e| {
                Error::backend_in(format!("{}: cannot start its thread", path.display()), e)
            })?;
        Ok(ConnectionThread {
            jobs: Some(tx),
            thread: Some(thread),
        })
    }

    fn send(&self, job: Job) -> Result<()> {
        self.jobs
            .as_ref()
            .and_then(|jobs| jobs.send(job).ok())
            .ok_or_else(|| Error::backend_says("the world's connection thread is gone"))
    }
}

impl Drop for ConnectionThread {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(thread) = self.thread.take() {
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

/// Makes a new world file that is never seen half made: the database is created
/// (WAL mode set) under a temporary name and linked into place, which fails if another
/// process got there first (whose file is then used). So an existing file is always
/// a database someone finished creating, and an empty one is damage.
fn create_atomically(path: &Path) -> Result<()> {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("new-{}-{n}", std::process::id()));
    {
        let conn = Connection::open(&tmp).map_err(backend)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(backend)?;
        // Write the header page now, so the file is a database even before migrations.
        conn.execute_batch("CREATE TABLE steadfast_created (x); DROP TABLE steadfast_created;")
            .map_err(backend)?;
    }
    let linked = std::fs::hard_link(&tmp, path);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", tmp.display()));
    }
    match linked {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(Error::backend_in(format!("creating {}", path.display()), e)),
    }
}

/// Refuses a world file that is empty, not a SQLite database, or shorter than its own
/// header says (truncated), rather than letting SQLite take it for a new database.
fn check_file(path: &Path) -> Result<()> {
    use std::io::Read;
    let damaged = |why: String| {
        Error::corrupt_store(format!(
            "{} {why}; it is not re-initialised: restore it from a backup, or move it \
             away to start a new world",
            path.display()
        ))
    };
    let mut file =
        std::fs::File::open(path).map_err(|e| Error::backend_in(path.display().to_string(), e))?;
    let len = file
        .metadata()
        .map_err(|e| Error::backend_in(path.display().to_string(), e))?
        .len();
    if len == 0 {
        return Err(damaged("is empty (0 bytes)".into()));
    }
    let mut header = [0u8; 100];
    if len < 100 || file.read_exact(&mut header).is_err() || &header[..16] != b"SQLite format 3\0" {
        return Err(damaged(format!("is not a SQLite database ({len} bytes)")));
    }
    let page_size = match u16::from_be_bytes([header[16], header[17]]) {
        1 => 65536,
        n => u64::from(n),
    };
    let pages = u64::from(u32::from_be_bytes([
        header[28], header[29], header[30], header[31],
    ]));
    // The page count is valid when the change counter matches "version valid for".
    let valid = header[24..28] == header[92..96];
    if valid && pages > 0 && len < pages * page_size {
        return Err(damaged(format!(
            "is truncated: {len} bytes where its header counts {pages} pages of {page_size}"
        )));
    }
    Ok(())
}

impl SqliteWorld {
    /// Opens (creating and migrating if needed) the world database at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::backend_in(dir.display().to_string(), e))?;
        }
        match std::fs::metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => create_atomically(&path)?,
            Err(e) => return Err(Error::backend_in(path.display().to_string(), e)),
            Ok(_) => check_file(&path)?,
        }
        let conn = Connection::open_with_flags(
            &path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(backend)?;
        conn.busy_timeout(Duration::from_secs(10))
            .map_err(backend)?;
        // Switching a new file to WAL takes an exclusive lock for which SQLite does not
        // call the busy handler: processes opening one world at once (a server and its
        // workers started together) wait their turn here instead of failing.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match conn.pragma_update(None, "journal_mode", "WAL") {
                Ok(()) => break,
                Err(rusqlite::Error::SqliteFailure(e, _))
                    if e.code == rusqlite::ErrorCode::DatabaseBusy
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(backend(e)),
            }
        }
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(backend)?;
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(backend)?;
        if version > USER_VERSION {
            return Err(Error::TooNew {
                store: path.display().to_string(),
                found: version,
                supported: USER_VERSION,
            });
        }
        let mut conn = conn;
        loop {
            // One migration per write transaction; re-read the version inside it, so
            // processes opening a new file at once apply each migration exactly once.
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(backend)?;
            let version: i64 = tx
                .pragma_query_value(None, "user_version", |r| r.get(0))
                .map_err(backend)?;
            let Some(sql) = MIGRATIONS.get(version as usize) else {
                break;
            };
            tx.execute_batch(sql).map_err(backend)?;
            tx.pragma_update(None, "user_version", version + 1)
                .map_err(backend)?;
            tx.commit().map_err(backend)?;
        }
        Ok(SqliteWorld {
            jobs: Arc::new(ConnectionThread::start(conn, &path)?),
            inbox_seen_empty: Arc::default(),
            path,
            changes: Arc::new(tokio::sync::watch::channel(0).0),
            watching: Arc::default(),
            spill: None,
        })
    }

    /// Bumps [`World::changes`] when another process commits: SQLite's
    /// `data_version` moves on every commit made through any other connection, and
    /// reading it touches no table, so a process's idle workers and stream tails see
    /// a `steadfast send` or another worker's append within [`OTHERS_WATCH`] instead
    /// of polling the queue. Started by the first subscriber; it ends with the world.
    fn watch_other_processes(&self) {
        use std::sync::atomic::Ordering;
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.watching.swap(true, Ordering::AcqRel) {
            return;
        }
        let jobs = Arc::downgrade(&self.jobs);
        let changes = Arc::downgrade(&self.changes);
        runtime.spawn(async move {
            let mut seen = None;
            loop {
                tokio::time::sleep(OTHERS_WATCH).await;
                let (Some(thread), Some(changes)) = (jobs.upgrade(), changes.upgrade()) else {
                    return;
                };
                let (reply, answer) = tokio::sync::oneshot::channel();
                let asked = thread.send(Box::new(move |conn| {
                    let _ = reply
                        .send(conn.query_row("PRAGMA data_version", [], |r| r.get::<_, i64>(0)));
                }));
                drop(thread);
                if asked.is_err() {
                    return;
                }
                let Ok(Ok(version)) = answer.await else {
                    continue;
                };
                if seen.is_some_and(|before| before != version) {
                    crate::bump(&changes);
                }
                seen = Some(version);
            }
        });
    }

    /// Keeps records whose body is over 64 KiB in `blobs` (hash in the log).
    pub fn with_spill(mut self, blobs: crate::Blobs) -> Self {
        self.spill = Some(blobs);
        self
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |conn| {
            // A caller that gave up does not stop the call; its answer is dropped.
            let _ = reply.send(f(conn));
        });
        self.jobs.send(job)?;
        answer
            .await
            .map_err(|_| Error::backend_says("the world's connection thread is gone"))?
    }
}

fn lease_row(tx: &Connection, session: &str) -> Result<LeaseRow> {
    tx.query_row(
        "SELECT lease_epoch, lease_holder, lease_host, lease_pid, lease_expires_ms FROM sessions WHERE id = ?1",
        [session],
        |r| {
            Ok(LeaseRow {
                epoch: r.get(0)?,
                holder: r.get(1)?,
                host: r.get(2)?,
                pid: r.get(3)?,
                expires_ms: r.get(4)?,
                gone: false,
            })
        },
    )
    .optional()
    .map_err(backend)?
    .ok_or_else(|| Error::NotFound(session.to_string()))
}

/// Records `holder` as the session's lease holder at `epoch` until `expires_ms`.
fn take_lease(
    tx: &Connection,
    session: &str,
    holder: &Holder,
    epoch: u64,
    expires_ms: u64,
) -> Result<()> {
    tx.execute(
        "UPDATE sessions SET lease_epoch = ?2, lease_holder = ?3, lease_host = ?4, lease_pid = ?5, lease_expires_ms = ?6 WHERE id = ?1",
        params![session, epoch, holder.id, holder.host, holder.pid, expires_ms],
    )
    .map_err(backend)?;
    Ok(())
}

fn check_fence(tx: &Connection, lease: &Lease) -> Result<()> {
    let row = lease_row(tx, &lease.session)?;
    if row.epoch != lease.epoch || row.holder.as_deref() != Some(lease.holder.as_str()) {
        return Err(Error::StaleFence {
            session: lease.session.clone(),
            epoch: lease.epoch,
            current: row.epoch,
        });
    }
    Ok(())
}

/// A session's last position and the segments its log reads from.
fn segments_of(conn: &Connection, session: &str) -> Result<(u64, Vec<lineage::Segment>)> {
    let row: Option<(u64, u64)> = conn
        .prepare_cached("SELECT last_seq, own_from FROM sessions WHERE id = ?1")
        .map_err(backend)?
        .query_row([session], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()
        .map_err(backend)?;
    let Some((last_seq, own_lo)) = row else {
        return Err(Error::NotFound(session.to_string()));
    };
    let ancestry = if own_lo > 1 {
        let mut stmt = conn
            .prepare_cached(
                "SELECT ancestor, lo, hi FROM lineage WHERE session_id = ?1 ORDER BY lo",
            )
            .map_err(backend)?;
        let rows = stmt
            .query_map([session], |r| {
                Ok(lineage::Segment {
                    session: r.get(0)?,
                    lo: r.get(1)?,
                    hi: r.get(2)?,
                })
            })
            .map_err(backend)?;
        rows.collect::<rusqlite::Result<Vec<_>>>()
            .map_err(backend)?
    } else {
        Vec::new()
    };
    Ok((last_seq, lineage::segments(session, ancestry, own_lo)))
}

/// The position of the last record of `kind` at or before `upto` in a session's log,
/// through the segments it shares (0 if none).
fn last_in_segments(conn: &Connection, session: &str, kind: &str, upto: u64) -> Result<u64> {
    let (_, segments) = segments_of(conn, session)?;
    let mut stmt = conn
        .prepare_cached(
            "SELECT seq FROM events WHERE session_id = ?1 AND seq >= ?2 AND seq <= ?3 AND kind = ?4 ORDER BY seq DESC LIMIT 1",
        )
        .map_err(backend)?;
    for s in segments.iter().rev().filter(|s| s.lo <= upto) {
        let found = stmt
            .query_row(
                params![
                    s.session,
                    lineage::sql_position(s.lo),
                    lineage::sql_position(s.hi.min(upto)),
                    kind
                ],
                |r| r.get::<_, u64>(0),
            )
            .optional()
            .map_err(backend)?;
        if let Some(seq) = found {
            return Ok(seq);
        }
    }
    Ok(0)
}

/// Stores one record of `session` whose body is `body` (a fork's or a rewind's own,
/// written outside an append).
fn insert_record(tx: &Connection, session: &str, record: &Record, body: &[u8]) -> Result<()> {
    tx.execute(
        "INSERT INTO events (session_id, seq, epoch, at_ms, schema, kind, body, checksum) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            session,
            record.seq,
            record.epoch,
            record.at_ms,
            record::SCHEMA_VERSION,
            record.event.kind(),
            body,
            record::checksum_of(session, record, body)
        ],
    )
    .map_err(backend)?;
    Ok(())
}

/// Makes `ancestry` the segments `session` reads before its own records.
fn write_lineage(tx: &Connection, session: &str, ancestry: &[lineage::Segment]) -> Result<()> {
    tx.execute("DELETE FROM lineage WHERE session_id = ?1", [session])
        .map_err(backend)?;
    for s in ancestry {
        tx.execute(
            "INSERT INTO lineage (session_id, ancestor, lo, hi) VALUES (?1, ?2, ?3, ?4)",
            params![session, s.session, s.lo, s.hi],
        )
        .map_err(backend)?;
    }
    Ok(())
}

/// Deletes the records of `session` (whose row is gone) that no fork reads.
fn trim_unread(tx: &Connection, session: &str) -> Result<()> {
    tx.execute(
        "DELETE FROM events WHERE session_id = ?1 AND seq > coalesce((SELECT max(hi) FROM lineage WHERE ancestor = ?1), 0)",
        [session],
    )
    .map_err(backend)?;
    Ok(())
}

fn summary(r: &rusqlite::Row<'_>) -> rusqlite::Result<SessionSummary> {
    Ok(SessionSummary {
        id: r.get(0)?,
        owner: r.get(1)?,
        status: r.get::<_, String>(2)?.parse().map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(2, rusqlite::types::Type::Text, Box::new(e))
        })?,
        title: r.get(3)?,
        last_seq: r.get(4)?,
        created_at_ms: r.get(5)?,
        updated_at_ms: r.get(6)?,
        agent: r.get(7)?,
        labels: crate::listing::parse_map(&r.get::<_, String>(8)?),
        metadata: crate::listing::parse_map(&r.get::<_, String>(9)?),
        parent: r.get(10)?,
        forked_at: r.get(11)?,
    })
}

const TOKEN_COLUMNS: &str =
    "id, name, owner, scopes, hash, created_at_ms, created_by, expires_at_ms, revoked_at_ms";

fn service_token(r: &rusqlite::Row<'_>) -> rusqlite::Result<crate::ServiceToken> {
    Ok(crate::ServiceToken {
        id: r.get(0)?,
        name: r.get(1)?,
        owner: r.get(2)?,
        scopes: crate::access::scopes_of(&r.get::<_, String>(3)?),
        hash: r.get(4)?,
        created_at_ms: r.get(5)?,
        created_by: r.get(6)?,
        expires_at_ms: r.get(7)?,
        revoked_at_ms: r.get(8)?,
    })
}

/// A session with a retry scheduled shows as `retrying`.
const STATUS: &str = "CASE WHEN retry_at_ms > 0 THEN 'retrying' ELSE status END";

const SUMMARY_COLUMNS: &str =
    "id, owner, CASE WHEN retry_at_ms > 0 THEN 'retrying' ELSE status END, \
     title, last_seq, created_at_ms, updated_at_ms, agent, labels, metadata, parent, forked_at \
     FROM sessions";

/// How SQLite spells a listing's filters.
const DIALECT: crate::listing::Dialect = crate::listing::Dialect {
    status: STATUS,
    updated: "updated_at_ms",
    placeholder: |n| format!("?{n}"),
    label: |k, v| {
        format!("EXISTS (SELECT 1 FROM json_each(labels) WHERE key = {k} AND value = {v})")
    },
    title: |t| format!("instr(lower(title), lower({t})) > 0"),
};

impl World for SqliteWorld {
    async fn create_session(&self, session: &str, owner: &str) -> Result<()> {
        let (session, owner) = (session.to_string(), owner.to_string());
        self.with(move |conn| {
            let now = now_ms();
            let inserted = conn
                .execute(
                    "INSERT INTO sessions (id, owner, created_at_ms, updated_at_ms) VALUES (?1, ?2, ?3, ?3) ON CONFLICT DO NOTHING",
                    params![session, owner, now],
                )
                .map_err(backend)?;
            if inserted == 0 {
                return Err(Error::AlreadyExists(session));
            }
            Ok(())
        })
        .await
    }

    async fn acquire_lease(&self, session: &str, holder: &Holder, ttl: Duration) -> Result<Lease> {
        let (session, holder) = (session.to_string(), holder.clone());
        self.with(move |conn| {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(backend)?;
            let row = lease_row(&tx, &session)?;
            let now = now_ms();
            let free = row.is_free_for(&holder, now);
            if !free {
                return Err(Error::LeaseHeld {
                    session,
                    holder: row.holder.unwrap_or_default(),
                    expires_in_ms: row.expires_ms.saturating_sub(now),
                });
            }
            let epoch = row.epoch + 1;
            take_lease(&tx, &session, &holder, epoch, now + ttl.as_millis() as u64)?;
            tx.commit().map_err(backend)?;
            Ok(Lease {
                session,
                holder: holder.id,
                epoch,
            })
        })
        .await
    }

    async fn renew_lease(&self, lease: &Lease, ttl: Duration) -> Result<()> {
        let lease = lease.clone();
        self.with(move |conn| {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(backend)?;
            check_fence(&tx, &lease)?;
            tx.execute(
                "UPDATE sessions SET lease_expires_ms = ?2 WHERE id = ?1",
                params![lease.session, now_ms() + ttl.as_millis() as u64],
            )
            .map_err(backend)?;
            tx.commit().map_err(backend)
        })
        .await
    }

    async fn release_lease(&self, lease: &Lease) -> Result<()> {
        let lease = lease.clone();
        self.with(move |conn| {
            conn.execute(
                "UPDATE sessions SET lease_holder = NULL, lease_host = NULL, lease_pid = NULL, lease_expires_ms = 0 WHERE id = ?1 AND lease_epoch = ?2 AND lease_holder = ?3",
                params![lease.session, lease.epoch, lease.holder],
            )
            .map_err(backend)?;
            Ok(())
        })
        .await
    }

    #[tracing::instrument(level = "trace", skip_all, fields(session = %lease.session, events = events.len()))]
    async fn append(&self, lease: &Lease, events: &[Event]) -> Result<Vec<Record>> {
        let started = std::time::Instant::now();
        let serialized = crate::serialize_and_spill(self.spill.as_ref(), events).await?;
        let fenced = lease;
        let (lease, events) = (lease.clone(), events.to_vec());
        let result = self.with(move |conn| {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(backend)?;
            // The fence and the position in one cached statement: this is every
            // append's path.
            let (epoch, holder, last): (u64, Option<String>, u64) = tx
                .prepare_cached("SELECT lease_epoch, lease_holder, last_seq FROM sessions WHERE id = ?1")
                .map_err(backend)?
                .query_row([&lease.session], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .optional()
                .map_err(backend)?
                .ok_or_else(|| Error::NotFound(lease.session.clone()))?;
            if epoch != lease.epoch || holder.as_deref() != Some(lease.holder.as_str()) {
                return Err(Error::StaleFence {
                    session: lease.session.clone(),
                    epoch: lease.epoch,
                    current: epoch,
                });
            }
            let at_ms = now_ms();
            let mut records = Vec::with_capacity(events.len());
            {
                let mut insert = tx
                    .prepare_cached(
                        "INSERT INTO events (session_id, seq, epoch, at_ms, schema, kind, body, checksum, blob) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                    )
                    .map_err(backend)?;
                for (i, event) in events.into_iter().enumerate() {
                    let record = Record {
                        seq: last + 1 + i as u64,
                        epoch: lease.epoch,
                        at_ms,
                        event,
                    };
                    let checksum = record::checksum_of(&lease.session, &record, &serialized.bodies[i]);
                    insert
                        .execute(params![
                            lease.session,
                            record.seq,
                            record.epoch,
                            at_ms,
                            record::SCHEMA_VERSION,
                            record.event.kind(),
                            serialized.stored(i),
                            checksum,
                            serialized.spilled[i]
                        ])
                        .map_err(backend)?;
                    records.push(record);
                }
            }
            let events: Vec<Event> = records.iter().map(|r| r.event.clone()).collect();
            let summary = summarize(&events);
            tx.prepare_cached(
                "UPDATE sessions SET last_seq = ?2, updated_at_ms = ?3, status = COALESCE(?4, status), title = CASE WHEN title_set THEN title ELSE COALESCE(?5, title) END, retry_at_ms = ?6, agent = COALESCE(?7, agent), kept_bytes = kept_bytes + ?8 WHERE id = ?1",
            )
            .map_err(backend)?
            .execute(params![lease.session, last + records.len() as u64, at_ms, summary.status.map(Status::as_str), summary.title, summary.retry_at_ms, summary.agent, summary.kept_bytes as i64])
            .map_err(backend)?;
            if let Some(waiting_for) = &summary.waiting_for {
                tx.execute(
                    "UPDATE sessions SET waiting_for = ?2 WHERE id = ?1",
                    params![lease.session, waiting_for],
                )
                .map_err(backend)?;
            }
            for id in &summary.taken {
                tx.execute(
                    "UPDATE inbox SET taken = 1 WHERE id = ?1 AND session_id = ?2",
                    params![id, lease.session],
                )
                .map_err(backend)?;
            }
            // Asked here, in the append's own transaction, so the driver need not
            // ask again before its next call (each ask is a trip to this thread).
            let inbox_empty: bool = tx
                .prepare_cached(
                    "SELECT NOT EXISTS (SELECT 1 FROM inbox WHERE session_id = ?1 AND taken = 0)",
                )
                .map_err(backend)?
                .query_row([&lease.session], |r| r.get(0))
                .map_err(backend)?;
            tx.commit().map_err(backend)?;
            Ok((records, inbox_empty))
        })
        .await;
        let result = result.map(|(records, inbox_empty)| {
            let mut seen = self
                .inbox_seen_empty
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if inbox_empty {
                seen.insert(fenced.session.clone(), fenced.epoch);
            } else {
                seen.remove(&fenced.session);
            }
            records
        });
        if result.is_ok() {
            crate::bump(&self.changes);
        }
        crate::observe_append("sqlite", fenced, started, result)
    }

    async fn read(&self, session: &str, from: u64) -> Result<Vec<Record>> {
        let session = session.to_string();
        let from = from.max(1);
        let (last_seq, mut parts) = self
            .with(move |conn| {
                let (last_seq, segments) = segments_of(conn, &session)?;
                let mut stmt = conn
                    .prepare_cached(
                        "SELECT seq, epoch, at_ms, schema, body, checksum, blob FROM events WHERE session_id = ?1 AND seq >= ?2 AND seq <= ?3 ORDER BY seq",
                    )
                    .map_err(backend)?;
                let mut parts = Vec::new();
                for segment in segments {
                    let Some((lo, hi)) = lineage::window(&segment, from) else {
                        continue;
                    };
                    let rows = stmt
                        .query_map(
                            params![segment.session, lineage::sql_position(lo), lineage::sql_position(hi)],
                            |r| {
                                Ok((
                                    (
                                        r.get::<_, u64>(0)?,
                                        r.get::<_, u64>(1)?,
                                        r.get::<_, u64>(2)?,
                                        EncodedRecord {
                                            schema: r.get(3)?,
                                            body: r.get(4)?,
                                            checksum: r.get(5)?,
                                        },
                                    ),
                                    r.get::<_, Option<String>>(6)?,
                                ))
                            },
                        )
                        .map_err(backend)?;
                    let raw = rows
                        .collect::<rusqlite::Result<Vec<(RawRecord, Option<String>)>>>()
                        .map_err(backend)?;
                    parts.push((segment, lo, raw));
                }
                Ok((last_seq, parts))
            })
            .await?;
        let mut verified = Vec::with_capacity(parts.len());
        for (segment, lo, raw) in &mut parts {
            crate::unspill(&segment.session, self.spill.as_ref(), raw).await?;
            let raw: Vec<RawRecord> = std::mem::take(raw).into_iter().map(|(r, _)| r).collect();
            verified.push((segment.clone(), *lo, raw));
        }
        lineage::verify_segments(last_seq, verified).await
    }

    async fn list_sessions(&self, query: &SessionQuery) -> Result<SessionPage> {
        let (filter, params) = query.sql(&DIALECT);
        let rows = self
            .with(move |conn| {
                let mut stmt = conn
                    .prepare_cached(&format!("SELECT {SUMMARY_COLUMNS}{filter}"))
                    .map_err(backend)?;
                let values: Vec<rusqlite::types::Value> = params
                    .into_iter()
                    .map(|p| match p {
                        Param::Text(t) => rusqlite::types::Value::Text(t),
                        Param::Int(i) => rusqlite::types::Value::Integer(i),
                    })
                    .collect();
                let rows = stmt
                    .query_map(rusqlite::params_from_iter(values), summary)
                    .map_err(backend)?;
                rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend)
            })
            .await?;
        Ok(query.page(rows))
    }

    async fn update_session(&self, session: &str, patch: &SessionPatch) -> Result<()> {
        let (session, patch) = (session.to_string(), patch.clone());
        self.with(move |conn| {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(backend)?;
            let (labels, metadata): (String, String) = tx
                .query_row(
                    "SELECT labels, metadata FROM sessions WHERE id = ?1",
                    [&session],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()
                .map_err(backend)?
                .ok_or_else(|| Error::NotFound(session.clone()))?;
            let (labels, metadata) = patch.merged(&labels, &metadata)?;
            tx.execute(
                "UPDATE sessions SET labels = ?2, metadata = ?3, \
                 title = coalesce(?4, title), title_set = title_set OR ?4 IS NOT NULL WHERE id = ?1",
                params![session, labels, metadata, patch.title],
            )
            .map_err(backend)?;
            tx.commit().map_err(backend)
        })
        .await
    }

    async fn session(&self, session: &str) -> Result<SessionSummary> {
        let session = session.to_string();
        self.with(move |conn| {
            conn.query_row(
                &format!("SELECT {SUMMARY_COLUMNS} WHERE id = ?1"),
                [&session],
                summary,
            )
            .optional()
            .map_err(backend)?
            .ok_or(Error::NotFound(session))
        })
        .await
    }

    async fn post(
        &self,
        session: &str,
        kind: InboundKind,
        name: &str,
        body: &serde_json::Value,
    ) -> Result<u64> {
        let (session, name, body) = (session.to_string(), name.to_string(), body.to_string());
        let session_key = session.clone();
        let id = self
            .with(move |conn| {
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(backend)?;
                let status: Option<String> = tx
                    .query_row("SELECT status FROM sessions WHERE id = ?1", [&session], |r| r.get(0))
                    .optional()
                    .map_err(backend)?;
                match status.as_deref().map(crate::stored_status).transpose()? {
                    None => return Err(Error::NotFound(session)),
                    Some(status) if status.is_over() => return Err(Error::Ended(session)),
                    _ => {}
                }
                tx.execute(
                    "INSERT INTO inbox (session_id, kind, name, body, at_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![session, kind.as_str(), name, body, now_ms()],
                )
                .map_err(backend)?;
                let id = tx.last_insert_rowid() as u64;
                tx.commit().map_err(backend)?;
                Ok(id)
            })
            .await?;
        // A post from this process is seen at the next step, not one later.
        self.inbox_seen_empty
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&session_key);
        crate::bump(&self.changes);
        Ok(id)
    }

    async fn turn_began(&self, session: &str, at: u64) -> Result<u64> {
        let session = session.to_string();
        self.with(move |conn| {
            // Walks the primary key backwards from `at`: as far as the turn is long.
            last_in_segments(conn, &session, "user_message", at)
        })
        .await
    }

    async fn last_of_kind(&self, session: &str, kind: &str, upto: u64) -> Result<u64> {
        let (session, kind) = (session.to_string(), kind.to_string());
        self.with(move |conn| last_in_segments(conn, &session, &kind, upto))
            .await
    }

    async fn prune_deltas(&self, session: &str, before: u64) -> Result<u64> {
        let session = session.to_string();
        self.with(move |conn| {
            let tx = conn.transaction().map_err(backend)?;
            let rows = {
                let mut stmt = tx
                    .prepare_cached(
                        "SELECT seq, epoch, at_ms, length(body) FROM events WHERE session_id = ?1 AND kind = ?2 AND seq < ?3",
                    )
                    .map_err(backend)?;
                let rows = stmt
                    .query_map(params![session, MODEL_DELTA_KIND, before], |r| {
                        Ok((r.get::<_, u64>(0)?, r.get::<_, u64>(1)?, r.get::<_, u64>(2)?, r.get::<_, u64>(3)?))
                    })
                    .map_err(backend)?;
                rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend)?
            };
            {
                let mut update = tx
                    .prepare_cached(
                        "UPDATE events SET kind = ?3, schema = ?4, body = ?5, checksum = ?6, blob = NULL WHERE session_id = ?1 AND seq = ?2",
                    )
                    .map_err(backend)?;
                for (seq, epoch, at_ms, bytes) in &rows {
                    let pruned = crate::pruned_record(&session, *seq, *epoch, *at_ms, MODEL_DELTA_KIND, *bytes);
                    update
                        .execute(params![session, seq, PRUNED_KIND, pruned.schema, pruned.body, pruned.checksum])
                        .map_err(backend)?;
                }
            }
            tx.commit().map_err(backend)?;
            Ok(rows.len() as u64)
        })
        .await
    }

    async fn spilled(&self, session: &str) -> Result<Vec<String>> {
        let session = session.to_string();
        self.with(move |conn| {
            let (_, segments) = segments_of(conn, &session)?;
            let mut stmt = conn
                .prepare_cached(
                    "SELECT blob FROM events WHERE session_id = ?1 AND seq >= ?2 AND seq <= ?3 AND blob IS NOT NULL",
                )
                .map_err(backend)?;
            let mut out = Vec::new();
            for s in segments {
                let rows = stmt
                    .query_map(
                        params![s.session, lineage::sql_position(s.lo), lineage::sql_position(s.hi)],
                        |r| r.get::<_, String>(0),
                    )
                    .map_err(backend)?;
                out.extend(rows.collect::<rusqlite::Result<Vec<_>>>().map_err(backend)?);
            }
            Ok(out)
        })
        .await
    }

    async fn inbox(&self, session: &str) -> Result<Vec<Inbound>> {
        let session = session.to_string();
        self.with(move |conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT id, kind, name, body FROM inbox WHERE session_id = ?1 AND taken = 0 ORDER BY id",
                )
                .map_err(backend)?;
            let rows = stmt
                .query_map([&session], |r| {
                    Ok((r.get::<_, u64>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?, r.get::<_, String>(3)?))
                })
                .map_err(backend)?;
            let mut out = Vec::new();
            for row in rows {
                let (id, kind, name, body) = row.map_err(backend)?;
                out.push(Inbound {
                    id,
                    kind: InboundKind::parse(&kind),
                    name,
                    body: serde_json::from_str(&body).unwrap_or(serde_json::Value::String(body)),
                });
            }
            Ok(out)
        })
        .await
    }

    #[tracing::instrument(level = "trace", skip_all, fields(holder = %holder.id))]
    async fn claim(&self, holder: &Holder, ttl: Duration) -> Result<Option<Lease>> {
        let holder = holder.clone();
        self.with(move |conn| {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(backend)?;
            let now = now_ms();
            let candidates: Vec<String> = {
                let mut stmt = tx.prepare_cached(&CLAIMABLE).map_err(backend)?;
                let rows = stmt
                    .query_map(params![now, holder.host], |r| r.get(0))
                    .map_err(backend)?;
                rows.collect::<rusqlite::Result<_>>().map_err(backend)?
            };
            for session in candidates {
                let row = lease_row(&tx, &session)?;
                // A session this holder keeps (cooling down after a failure) is
                // not new work until its lease lapses: a failure that could not be
                // recorded must not leave it held for good.
                if (row.holder.as_deref() == Some(holder.id.as_str()) && row.expires_ms > now)
                    || !row.is_free_for(&holder, now)
                {
                    continue;
                }
                let epoch = row.epoch + 1;
                take_lease(&tx, &session, &holder, epoch, now + ttl.as_millis() as u64)?;
                tx.commit().map_err(backend)?;
                return Ok(Some(Lease {
                    session,
                    holder: holder.id,
                    epoch,
                }));
            }
            Ok(None)
        })
        .await
    }

    async fn delete_session(&self, session: &str) -> Result<()> {
        let session = session.to_string();
        self.with(move |conn| {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(backend)?;
            let n = tx
                .execute("DELETE FROM sessions WHERE id = ?1", [&session])
                .map_err(backend)?;
            if n == 0 {
                return Err(Error::NotFound(session));
            }
            tx.execute("DELETE FROM inbox WHERE session_id = ?1", [&session])
                .map_err(backend)?;
            tx.execute("DELETE FROM hooks WHERE session = ?1", [&session])
                .map_err(backend)?;
            tx.execute("DELETE FROM hook_deliveries WHERE session = ?1", [&session])
                .map_err(backend)?;
            let ancestors: Vec<String> = {
                let mut stmt = tx
                    .prepare("DELETE FROM lineage WHERE session_id = ?1 RETURNING ancestor")
                    .map_err(backend)?;
                let rows = stmt.query_map([&session], |r| r.get(0)).map_err(backend)?;
                rows.collect::<rusqlite::Result<_>>().map_err(backend)?
            };
            // Its records go but those forks still read; so do its ancestors' that
            // were kept for it alone, once they are deleted themselves.
            trim_unread(&tx, &session)?;
            for ancestor in ancestors {
                let gone: bool = tx
                    .query_row(
                        "SELECT NOT EXISTS (SELECT 1 FROM sessions WHERE id = ?1)",
                        [&ancestor],
                        |r| r.get(0),
                    )
                    .map_err(backend)?;
                if gone {
                    trim_unread(&tx, &ancestor)?;
                }
            }
            tx.commit().map_err(backend)
        })
        .await
    }

    async fn fork_session(&self, fork: &crate::Fork) -> Result<SessionSummary> {
        let fork = fork.clone();
        let body = serde_json::to_vec(&fork.event).map_err(Error::backend)?;
        let summary = self
            .with(move |conn| {
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(backend)?;
                let (last_seq, parent_segments) = segments_of(&tx, &fork.parent)?;
                lineage::check_fork_point(&fork.parent, fork.at, last_seq)?;
                let epoch: u64 = tx
                    .query_row("SELECT lease_epoch FROM sessions WHERE id = ?1", [&fork.parent], |r| r.get(0))
                    .map_err(backend)?;
                let now = now_ms();
                let inserted = tx
                    .execute(
                        "INSERT INTO sessions (id, owner, created_at_ms, updated_at_ms, status, title, title_set, \
                         last_seq, lease_epoch, waiting_for, agent, labels, metadata, parent, forked_at, own_from) \
                         SELECT ?1, ?2, ?3, ?3, ?4, coalesce(?5, title), ?5 IS NOT NULL OR title_set, ?6, lease_epoch, ?7, \
                         agent, labels, metadata, id, ?8, ?6 FROM sessions WHERE id = ?9 \
                         ON CONFLICT DO NOTHING",
                        params![
                            fork.child,
                            fork.owner,
                            now,
                            fork.status.as_str(),
                            fork.title,
                            fork.at + 1,
                            fork.waiting_for,
                            fork.at,
                            fork.parent
                        ],
                    )
                    .map_err(backend)?;
                if inserted == 0 {
                    return Err(Error::AlreadyExists(fork.child));
                }
                write_lineage(&tx, &fork.child, &lineage::ancestry_at(&parent_segments, fork.at))?;
                let record = Record {
                    seq: fork.at + 1,
                    epoch,
                    at_ms: now,
                    event: fork.event.clone(),
                };
                insert_record(&tx, &fork.child, &record, &body)?;
                let summary = tx
                    .query_row(&format!("SELECT {SUMMARY_COLUMNS} WHERE id = ?1"), [&fork.child], summary)
                    .map_err(backend)?;
                steadfast_fault::point(steadfast_fault::points::FORK_WRITTEN);
                tx.commit().map_err(backend)?;
                Ok(summary)
            })
            .await?;
        crate::bump(&self.changes);
        Ok(summary)
    }

    async fn rewind_session(&self, rewind: &crate::Rewind) -> Result<Record> {
        let rewind = rewind.clone();
        let body = serde_json::to_vec(&rewind.event).map_err(Error::backend)?;
        let record = self
            .with(move |conn| {
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .map_err(backend)?;
                let session = rewind.lease.session.clone();
                check_fence(&tx, &rewind.lease)?;
                let (last_seq, segments) = segments_of(&tx, &session)?;
                lineage::check_rewind_point(&session, rewind.to, last_seq)?;
                write_lineage(&tx, &session, &lineage::ancestry_at(&segments, rewind.to))?;
                let now = now_ms();
                let record = Record {
                    seq: last_seq + 1,
                    epoch: rewind.lease.epoch,
                    at_ms: now,
                    event: rewind.event.clone(),
                };
                insert_record(&tx, &session, &record, &body)?;
                tx.execute(
                    "UPDATE sessions SET own_from = ?2, last_seq = ?2, updated_at_ms = ?3, status = ?4, waiting_for = ?5, retry_at_ms = 0 WHERE id = ?1",
                    params![session, record.seq, now, rewind.status.as_str(), rewind.waiting_for],
                )
                .map_err(backend)?;
                tx.commit().map_err(backend)?;
                Ok(record)
            })
            .await?;
        crate::bump(&self.changes);
        Ok(record)
    }

    async fn forks(&self, session: &str) -> Result<Vec<String>> {
        let session = session.to_string();
        self.with(move |conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT id FROM sessions WHERE parent = ?1 ORDER BY created_at_ms, id",
                )
                .map_err(backend)?;
            let rows = stmt.query_map([&session], |r| r.get(0)).map_err(backend)?;
            rows.collect::<rusqlite::Result<Vec<String>>>()
                .map_err(backend)
        })
        .await
    }

    async fn outbox_take(
        &self,
        now_ms: u64,
        hold_ms: u64,
        limit: usize,
    ) -> Result<Vec<crate::OutboxItem>> {
        self.with(move |conn| {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(backend)?;
            let items = tx
                .prepare_cached(
                    "SELECT id, session_id, seq, kind, at_ms, attempts FROM outbox \
                     WHERE delivered_at_ms IS NULL AND abandoned = 0 AND next_at_ms <= ?1 \
                     ORDER BY id LIMIT ?2",
                )
                .map_err(backend)?
                .query_map(params![now_ms, limit as u64], |r| {
                    Ok(crate::OutboxItem {
                        id: r.get(0)?,
                        session: r.get(1)?,
                        seq: r.get(2)?,
                        kind: r.get(3)?,
                        at_ms: r.get(4)?,
                        attempts: r.get(5)?,
                    })
                })
                .map_err(backend)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(backend)?;
            for item in &items {
                tx.execute(
                    "UPDATE outbox SET next_at_ms = ?2 WHERE id = ?1",
                    params![item.id, now_ms + hold_ms],
                )
                .map_err(backend)?;
            }
            tx.commit().map_err(backend)?;
            Ok(items)
        })
        .await
    }

    async fn outbox_settle(&self, id: u64, settled: &crate::Settled) -> Result<()> {
        let settled = settled.clone();
        self.with(move |conn| {
            match settled {
                crate::Settled::Delivered { status } => conn.execute(
                    "UPDATE outbox SET delivered_at_ms = ?2, status = ?3 WHERE id = ?1",
                    params![id, now_ms(), status],
                ),
                crate::Settled::Failed { error, retry_at_ms } => conn.execute(
                    "UPDATE outbox SET attempts = attempts + 1, last_error = ?2, \
                     next_at_ms = ?3, abandoned = ?4 WHERE id = ?1",
                    params![id, error, retry_at_ms.unwrap_or(0), retry_at_ms.is_none()],
                ),
            }
            .map_err(backend)?;
            Ok(())
        })
        .await
    }

    async fn outbox_prune(&self, before_ms: u64) -> Result<u64> {
        self.with(move |conn| {
            let n = conn
                .execute("DELETE FROM outbox WHERE at_ms < ?1", [before_ms])
                .map_err(backend)?;
            Ok(n as u64)
        })
        .await
    }

    async fn vault_put(&self, owner: &str, name: &str, sealed: &crate::Sealed) -> Result<()> {
        let (owner, name, sealed) = (owner.to_string(), name.to_string(), sealed.clone());
        self.with(move |conn| {
            conn.execute(
                "INSERT INTO vault (owner, name, key_id, nonce, ciphertext, updated_at_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (owner, name) DO UPDATE SET \
                 key_id = excluded.key_id, nonce = excluded.nonce, \
                 ciphertext = excluded.ciphertext, updated_at_ms = excluded.updated_at_ms",
                params![
                    owner,
                    name,
                    sealed.key_id,
                    sealed.nonce,
                    sealed.ciphertext,
                    now_ms()
                ],
            )
            .map_err(backend)?;
            Ok(())
        })
        .await
    }

    async fn vault_get(&self, owner: &str, name: &str) -> Result<Option<crate::VaultEntry>> {
        let (owner, name) = (owner.to_string(), name.to_string());
        self.with(move |conn| {
            conn.query_row(
                "SELECT owner, name, updated_at_ms, key_id, nonce, ciphertext FROM vault \
                 WHERE owner = ?1 AND name = ?2",
                params![owner, name],
                vault_entry,
            )
            .optional()
            .map_err(backend)
        })
        .await
    }

    async fn vault_list(&self, owner: Option<&str>) -> Result<Vec<crate::VaultEntry>> {
        let owner = owner.map(str::to_string);
        self.with(move |conn| {
            conn.prepare_cached(
                "SELECT owner, name, updated_at_ms, key_id, nonce, ciphertext FROM vault \
                 WHERE ?1 IS NULL OR owner = ?1 ORDER BY owner, name",
            )
            .map_err(backend)?
            .query_map(params![owner], vault_entry)
            .map_err(backend)?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(backend)
        })
        .await
    }

    async fn vault_delete(&self, owner: &str, name: &str) -> Result<bool> {
        let (owner, name) = (owner.to_string(), name.to_string());
        self.with(move |conn| {
            let n = conn
                .execute(
                    "DELETE FROM vault WHERE owner = ?1 AND name = ?2",
                    params![owner, name],
                )
                .map_err(backend)?;
            Ok(n > 0)
        })
        .await
    }

    async fn hook_create(&self, hook: &crate::Hook) -> Result<bool> {
        let hook = hook.clone();
        self.with(move |conn| {
            let (token_hash, sealed) = crate::hooks::stored_secret(&hook.secret);
            let n = conn
                .execute(
                    "INSERT INTO hooks (session, name, verify, then_do, token_hash, key_id, nonce, \
                     ciphertext, created_at_ms, created_by) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) ON CONFLICT DO NOTHING",
                    params![
                        hook.session,
                        hook.name,
                        hook.check.as_str(),
                        hook.then.as_str(),
                        token_hash,
                        sealed.map(|s| s.key_id.clone()),
                        sealed.map(|s| s.nonce.clone()),
                        sealed.map(|s| s.ciphertext.clone()),
                        hook.created_at_ms,
                        hook.created_by,
                    ],
                )
                .map_err(backend)?;
            Ok(n > 0)
        })
        .await
    }

    async fn hooks(&self, session: Option<&str>) -> Result<Vec<crate::Hook>> {
        let session = session.map(str::to_string);
        self.with(move |conn| {
            let rows = conn
                .prepare_cached(
                    "SELECT session, name, verify, then_do, token_hash, key_id, nonce, ciphertext, \
                     created_at_ms, created_by FROM hooks WHERE ?1 IS NULL OR session = ?1 \
                     ORDER BY session, name",
                )
                .map_err(backend)?
                .query_map(params![session], |r| {
                    Ok(crate::hooks::StoredHook {
                        session: r.get(0)?,
                        name: r.get(1)?,
                        check: r.get(2)?,
                        then: r.get(3)?,
                        token_hash: r.get(4)?,
                        key_id: r.get(5)?,
                        nonce: r.get(6)?,
                        ciphertext: r.get(7)?,
                        created_at_ms: r.get(8)?,
                        created_by: r.get(9)?,
                    })
                })
                .map_err(backend)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(backend)?;
            rows.into_iter()
                .map(crate::hooks::StoredHook::into_hook)
                .collect()
        })
        .await
    }

    async fn hook_reseal(&self, session: &str, name: &str, sealed: &crate::Sealed) -> Result<bool> {
        let (session, name, sealed) = (session.to_string(), name.to_string(), sealed.clone());
        self.with(move |conn| {
            let n = conn
                .execute(
                    "UPDATE hooks SET key_id = ?3, nonce = ?4, ciphertext = ?5 \
                     WHERE session = ?1 AND name = ?2 AND key_id IS NOT NULL",
                    params![
                        session,
                        name,
                        sealed.key_id,
                        sealed.nonce,
                        sealed.ciphertext
                    ],
                )
                .map_err(backend)?;
            Ok(n > 0)
        })
        .await
    }

    async fn hook_delete(&self, session: &str, name: &str) -> Result<bool> {
        let (session, name) = (session.to_string(), name.to_string());
        self.with(move |conn| {
            let tx = conn.transaction().map_err(backend)?;
            let n = tx
                .execute(
                    "DELETE FROM hooks WHERE session = ?1 AND name = ?2",
                    params![session, name],
                )
                .map_err(backend)?;
            tx.execute(
                "DELETE FROM hook_deliveries WHERE session = ?1 AND name = ?2",
                params![session, name],
            )
            .map_err(backend)?;
            tx.commit().map_err(backend)?;
            Ok(n > 0)
        })
        .await
    }

    async fn hook_take_delivery(
        &self,
        session: &str,
        name: &str,
        delivery: &str,
        at_ms: u64,
        forget_before_ms: u64,
    ) -> Result<bool> {
        let (session, name, delivery) =
            (session.to_string(), name.to_string(), delivery.to_string());
        self.with(move |conn| {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(backend)?;
            tx.execute(
                "DELETE FROM hook_deliveries WHERE session = ?1 AND name = ?2 AND at_ms < ?3",
                params![session, name, forget_before_ms],
            )
            .map_err(backend)?;
            let n = tx
                .execute(
                    "INSERT INTO hook_deliveries (session, name, delivery, at_ms) \
                     VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING",
                    params![session, name, delivery, at_ms],
                )
                .map_err(backend)?;
            tx.commit().map_err(backend)?;
            Ok(n > 0)
        })
        .await
    }

    async fn hook_untake_delivery(&self, session: &str, name: &str, delivery: &str) -> Result<()> {
        let (session, name, delivery) =
            (session.to_string(), name.to_string(), delivery.to_string());
        self.with(move |conn| {
            conn.execute(
                "DELETE FROM hook_deliveries WHERE session = ?1 AND name = ?2 AND delivery = ?3",
                params![session, name, delivery],
            )
            .map_err(backend)?;
            Ok(())
        })
        .await
    }

    async fn token_issue(&self, token: &crate::ServiceToken) -> Result<()> {
        let t = token.clone();
        self.with(move |conn| {
            conn.execute(
                "INSERT INTO tokens (id, name, owner, scopes, hash, created_at_ms, created_by, expires_at_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    t.id,
                    t.name,
                    t.owner,
                    crate::access::scopes_text(&t.scopes),
                    t.hash,
                    t.created_at_ms,
                    t.created_by,
                    t.expires_at_ms
                ],
            )
            .map_err(backend)?;
            Ok(())
        })
        .await
    }

    async fn tokens(&self) -> Result<Vec<crate::ServiceToken>> {
        self.with(|conn| {
            conn.prepare_cached(&format!(
                "SELECT {TOKEN_COLUMNS} FROM tokens ORDER BY created_at_ms DESC, id DESC"
            ))
            .map_err(backend)?
            .query_map([], service_token)
            .map_err(backend)?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(backend)
        })
        .await
    }

    async fn token_by_hash(&self, hash: &str) -> Result<Option<crate::ServiceToken>> {
        let hash = hash.to_string();
        self.with(move |conn| {
            conn.prepare_cached(&format!(
                "SELECT {TOKEN_COLUMNS} FROM tokens WHERE hash = ?1"
            ))
            .map_err(backend)?
            .query_row([hash], service_token)
            .optional()
            .map_err(backend)
        })
        .await
    }

    async fn token_revoke(&self, id: &str, at_ms: u64) -> Result<bool> {
        let id = id.to_string();
        self.with(move |conn| {
            let n = conn
                .execute(
                    "UPDATE tokens SET revoked_at_ms = ?2 WHERE id = ?1 AND revoked_at_ms IS NULL",
                    params![id, at_ms],
                )
                .map_err(backend)?;
            Ok(n > 0)
        })
        .await
    }

    async fn audit(
        &self,
        actor: &str,
        action: &str,
        target: &str,
        detail: &serde_json::Value,
    ) -> Result<()> {
        let (actor, action, target, detail) = (
            actor.to_string(),
            action.to_string(),
            target.to_string(),
            detail.to_string(),
        );
        self.with(move |conn| {
            conn.execute(
                "INSERT INTO audit (at_ms, actor, action, target, detail) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![now_ms(), actor, action, target, detail],
            )
            .map_err(backend)?;
            Ok(())
        })
        .await
    }

    async fn audit_log(
        &self,
        after: u64,
        limit: usize,
        about: Option<&str>,
    ) -> Result<Vec<crate::AuditEntry>> {
        let about = about.map(str::to_string);
        self.with(move |conn| {
            conn.prepare_cached(
                "SELECT id, at_ms, actor, action, target, detail FROM audit WHERE id > ?1 \
                 AND (?3 IS NULL OR (target = ?3 AND (action LIKE 'session.%' OR action LIKE 'hook.%' OR action LIKE 'preview.%' OR action LIKE 'shell.%'))) \
                 ORDER BY id LIMIT ?2",
            )
            .map_err(backend)?
            // Ids are SQLite integers: one past them all is past every entry.
            .query_map(params![after.min(i64::MAX as u64) as i64, limit as i64, about], |r| {
                Ok(crate::AuditEntry {
                    id: r.get(0)?,
                    at_ms: r.get(1)?,
                    actor: r.get(2)?,
                    action: r.get(3)?,
                    target: r.get(4)?,
                    detail: serde_json::from_str(&r.get::<_, String>(5)?)
                        .unwrap_or(serde_json::Value::Null),
                })
            })
            .map_err(backend)?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(backend)
        })
        .await
    }

    async fn owner_kept_bytes(&self, session: &str) -> Result<u64> {
        let session = session.to_string();
        self.with(move |conn| {
            conn.prepare_cached(
                "SELECT COALESCE(SUM(kept_bytes), 0) FROM sessions \
                 WHERE owner = (SELECT owner FROM sessions WHERE id = ?1)",
            )
            .map_err(backend)?
            .query_row([&session], |r| r.get::<_, i64>(0))
            .map(|n| n.max(0) as u64)
            .map_err(backend)
        })
        .await
    }

    async fn take_tokens(&self, draw: &crate::rate::Draw) -> Result<bool> {
        let draw = draw.clone();
        self.with(move |conn| {
            let now = now_ms();
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(backend)?;
            let row: Option<(f64, i64)> = tx
                .prepare_cached("SELECT tokens, at_ms FROM rate_buckets WHERE key = ?1")
                .map_err(backend)?
                .query_row([&draw.key], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
                .map_err(backend)?;
            let held = row.map_or(draw.capacity, |(tokens, at)| {
                draw.refilled(tokens, at.max(0) as u64, now)
            });
            let taken = held >= draw.amount;
            if taken {
                tx.prepare_cached(
                    "INSERT INTO rate_buckets (key, tokens, at_ms) VALUES (?1, ?2, ?3) \
                     ON CONFLICT (key) DO UPDATE SET tokens = excluded.tokens, at_ms = excluded.at_ms",
                )
                .map_err(backend)?
                .execute(params![draw.key, held - draw.amount, now as i64])
                .map_err(backend)?;
            }
            if crate::rate::prune_due() {
                tx.execute(
                    "DELETE FROM rate_buckets WHERE at_ms < ?1",
                    [now.saturating_sub(crate::rate::PRUNE_AFTER_MS) as i64],
                )
                .map_err(backend)?;
            }
            tx.commit().map_err(backend)?;
            Ok(taken)
        })
        .await
    }

    async fn census(&self) -> Result<crate::Census> {
        self.with(|conn| {
            let by_status = conn
                .prepare_cached(
                    "SELECT status, count(*) FROM sessions GROUP BY status ORDER BY status",
                )
                .map_err(backend)?
                .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, u64>(1)?)))
                .map_err(backend)?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(backend)?;
            let queued = conn
                .prepare_cached(&QUEUED)
                .map_err(backend)?
                .query_row([now_ms()], |r| r.get(0))
                .map_err(backend)?;
            Ok(crate::Census { by_status, queued })
        })
        .await
    }

    fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.watch_other_processes();
        self.changes.subscribe()
    }

    fn inbox_seen_empty(&self, lease: &Lease) -> bool {
        self.inbox_seen_empty
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&lease.session)
            == Some(&lease.epoch)
    }

    async fn ping(&self) -> Result<()> {
        self.with(|conn| {
            conn.query_row("SELECT count(*) FROM sessions WHERE 0", [], |_| Ok(()))
                .map_err(backend)
        })
        .await
    }
}

/// Sessions with work due: a turn left running, a queued message for an idle one, the
/// signal a waiting one awaits (an interrupt is due at once, even in a retry's wait).
const HAS_WORK: &str = "
  s.status IN ('running', 'idle', 'waiting', 'escalated')
  AND (s.retry_at_ms <= ?1 OR EXISTS (
        SELECT 1 FROM inbox i WHERE i.session_id = s.id AND i.taken = 0 AND i.kind = 'signal' AND i.name = 'interrupt'))
  AND (
    s.status = 'running'
    OR (s.status = 'idle' AND EXISTS (
        SELECT 1 FROM inbox i WHERE i.session_id = s.id AND i.taken = 0 AND i.kind IN ('message', 'steer')))
    OR (s.status IN ('waiting', 'escalated') AND EXISTS (
        SELECT 1 FROM inbox i WHERE i.session_id = s.id AND i.taken = 0 AND i.kind = 'signal'
          AND (i.name = s.waiting_for OR (s.status = 'waiting' AND i.name = 'interrupt'))))
  )";

/// Sessions that need a driver, oldest activity first: work due and a lease that is
/// free or held on this host (`?2`; `?1` is now). The lease is checked again in Rust
/// (a holder on this host whose process is gone counts as free).
static CLAIMABLE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT s.id FROM sessions s WHERE {HAS_WORK}
  AND (s.lease_holder IS NULL OR s.lease_expires_ms <= ?1 OR s.lease_host = ?2)
ORDER BY (s.lease_holder IS NOT NULL), s.updated_at_ms
LIMIT 16"
    )
});

/// How many sessions have work due that no holder keeps: the queue's depth.
static QUEUED: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!("SELECT count(*) FROM sessions s WHERE {HAS_WORK} AND (s.lease_holder IS NULL OR s.lease_expires_ms <= ?1)")
});

fn vault_entry(r: &rusqlite::Row<'_>) -> rusqlite::Result<crate::VaultEntry> {
    Ok(crate::VaultEntry {
        owner: r.get(0)?,
        name: r.get(1)?,
        updated_at_ms: r.get(2)?,
        sealed: crate::Sealed {
            key_id: r.get(3)?,
            nonce: r.get(4)?,
            ciphertext: r.get(5)?,
        },
    })
}
