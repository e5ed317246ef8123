//! A world chosen at run time from configuration: SQLite (default) or PostgreSQL.

use std::path::Path;
use std::time::Duration;

use steadfast_log::{Event, Record};

use crate::{
    Error, Holder, Lease, Result, SessionPage, SessionPatch, SessionQuery, SessionSummary,
    SqliteWorld, World,
};

/// Any of the world backends, selected by [`AnyWorld::open`].
#[derive(Clone)]
pub enum AnyWorld {
    /// The embedded SQLite world.
    Sqlite(SqliteWorld),
    /// The PostgreSQL world.
    #[cfg(feature = "postgres")]
    Postgres(crate::PostgresWorld),
}

/// A home whose world file is gone while it holds what a world's sessions left (the
/// drive's snapshots, session workspaces) lost its world: refused, rather than a new,
/// empty world made over it that says there are no sessions.
fn refuse_lost_world(home: &Path, file: &Path) -> Result<()> {
    if file.exists() {
        return Ok(());
    }
    let holds = |dir: &str| {
        std::fs::read_dir(home.join(dir)).is_ok_and(|mut entries| entries.next().is_some())
    };
    match ["drive", "workspaces"].into_iter().find(|dir| holds(dir)) {
        None => Ok(()),
        Some(dir) => Err(Error::corrupt_store(format!(
            "{} is missing, but {} holds a world's {dir}: restore the file (or name the \
             world with --world / STEADFAST_WORLD); a new, empty world is not made over it",
            file.display(),
            home.display()
        ))),
    }
}

impl AnyWorld {
    /// Opens the world `spec` names: `postgres://...` (or `postgresql://...`, or
    /// libpq's `host=... dbname=...` pairs), a `sqlite:PATH`, or nothing for
    /// `home/world.db`. With `migrate`, pending
    /// PostgreSQL migrations are applied first.
    pub async fn open(spec: Option<&str>, home: &Path, migrate: bool) -> Result<Self> {
        match spec.filter(|s| !s.is_empty()) {
            None => {
                let file = home.join("world.db");
                refuse_lost_world(home, &file)?;
                Ok(AnyWorld::Sqlite(SqliteWorld::open(file)?))
            }
            Some(s) if is_postgres(s) => {
                #[cfg(feature = "postgres")]
                {
                    let world = if migrate {
                        crate::PostgresWorld::connect_and_migrate(s).await?
                    } else {
                        crate::PostgresWorld::connect(s).await?
                    };
                    Ok(AnyWorld::Postgres(world))
                }
                #[cfg(not(feature = "postgres"))]
                {
                    let _ = migrate;
                    Err(Error::backend_says("this build has no PostgreSQL support"))
                }
            }
            Some(s) => match s.strip_prefix("sqlite:") {
                Some(path) => Ok(AnyWorld::Sqlite(SqliteWorld::open(path)?)),
                None => Err(Error::backend_says(format!(
                    "unknown world `{}`: use postgres://..., sqlite:PATH, or leave it unset for the embedded default",
                    redacted(s)
                ))),
            },
        }
    }

    /// Keeps records whose body is over 64 KiB in `blobs` (hash in the log).
    pub fn with_spill(self, blobs: crate::Blobs) -> Self {
        match self {
            AnyWorld::Sqlite(w) => AnyWorld::Sqlite(w.with_spill(blobs)),
            #[cfg(feature = "postgres")]
            AnyWorld::Postgres(w) => AnyWorld::Postgres(w.with_spill(blobs)),
        }
    }

    /// Applies pending migrations (PostgreSQL; SQLite migrates on open). Returns the
    /// versions applied.
    pub async fn migrate(&self) -> Result<Vec<i32>> {
        match self {
            AnyWorld::Sqlite(_) => Ok(Vec::new()),
            #[cfg(feature = "postgres")]
            AnyWorld::Postgres(w) => w.migrate().await,
        }
    }
}

/// Whether `spec` names a PostgreSQL database: a URL, or key=value pairs naming a
/// host or a database.
fn is_postgres(spec: &str) -> bool {
    if spec.starts_with("postgres://") || spec.starts_with("postgresql://") {
        return true;
    }
    let pairs: Vec<(&str, &str)> = spec
        .split_whitespace()
        .filter_map(|p| p.split_once('='))
        .collect();
    pairs.len() == spec.split_whitespace().count()
        && pairs
            .iter()
            .any(|(k, _)| matches!(*k, "host" | "hostaddr" | "dbname"))
}

/// A world's connection string as it may be shown (in an error, a log line, a dump of
/// the configuration): any password replaced by `***`, in a URL's user part, in its
/// query (`?password=`) or in key=value form (`password=`).
pub fn redacted(spec: &str) -> String {
    let hide_pairs = |text: &str, sep: char| -> String {
        text.split(sep)
            .map(|pair| match pair.split_once('=') {
                Some((key, _)) if key.eq_ignore_ascii_case("password") => format!("{key}=***"),
                _ => pair.to_string(),
            })
            .collect::<Vec<_>>()
            .join(&sep.to_string())
    };
    let Some((scheme, rest)) = spec.split_once("://") else {
        return hide_pairs(spec, ' ');
    };
    let (before_query, query) = match rest.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (rest, None),
    };
    let authority_end = before_query.find('/').unwrap_or(before_query.len());
    let (authority, path) = before_query.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((user, host)) => match user.split_once(':') {
            Some((name, _)) => format!("{name}:***@{host}"),
            None => authority.to_string(),
        },
        None => authority.to_string(),
    };
    let mut shown = format!("{scheme}://{authority}{path}");
    if let Some(query) = query {
        shown.push('?');
        shown.push_str(&hide_pairs(query, '&'));
    }
    shown
}

impl AnyWorld {
    /// A line describing the backend and its schema version, for humans.
    pub async fn describe(&self) -> Result<String> {
        match self {
            AnyWorld::Sqlite(w) => Ok(format!("SQLite world at {}", w.path().display())),
            #[cfg(feature = "postgres")]
            AnyWorld::Postgres(w) => {
                let (current, _) = w.schema_version().await?;
                Ok(format!("PostgreSQL world at schema version {current}"))
            }
        }
    }
}

macro_rules! delegate {
    ($self:ident, $w:ident => $call:expr) => {
        match $self {
            AnyWorld::Sqlite($w) => $call.await,
            #[cfg(feature = "postgres")]
            AnyWorld::Postgres($w) => $call.await,
        }
    };
}

impl World for AnyWorld {
    async fn create_session(&self, session: &str, owner: &str) -> Result<()> {
        delegate!(self, w => w.create_session(session, owner))
    }

    async fn acquire_lease(&self, session: &str, holder: &Holder, ttl: Duration) -> Result<Lease> {
        delegate!(self, w => w.acquire_lease(session, holder, ttl))
    }

    async fn renew_lease(&self, lease: &Lease, ttl: Duration) -> Result<()> {
        delegate!(self, w => w.renew_lease(lease, ttl))
    }

    async fn release_lease(&self, lease: &Lease) -> Result<()> {
        delegate!(self, w => w.release_lease(lease))
    }

    async fn append(&self, lease: &Lease, events: &[Event]) -> Result<Vec<Record>> {
        delegate!(self, w => w.append(lease, events))
    }

    async fn read(&self, session: &str, from: u64) -> Result<Vec<Record>> {
        delegate!(self, w => w.read(session, from))
    }

    async fn turn_began(&self, session: &str, at: u64) -> Result<u64> {
        delegate!(self, w => w.turn_began(session, at))
    }

    async fn last_of_kind(&self, session: &str, kind: &str, upto: u64) -> Result<u64> {
        delegate!(self, w => w.last_of_kind(session, kind, upto))
    }

    async fn fork_session(&self, fork: &crate::Fork) -> Result<SessionSummary> {
        delegate!(self, w => w.fork_session(fork))
    }

    async fn rewind_session(&self, rewind: &crate::Rewind) -> Result<Record> {
        delegate!(self, w => w.rewind_session(rewind))
    }

    async fn forks(&self, session: &str) -> Result<Vec<String>> {
        delegate!(self, w => w.forks(session))
    }

    async fn prune_deltas(&self, session: &str, before: u64) -> Result<u64> {
        delegate!(self, w => w.prune_deltas(session, before))
    }

    async fn spilled(&self, session: &str) -> Result<Vec<String>> {
        delegate!(self, w => w.spilled(session))
    }

    async fn census(&self) -> Result<crate::Census> {
        delegate!(self, w => w.census())
    }

    async fn owner_kept_bytes(&self, session: &str) -> Result<u64> {
        delegate!(self, w => w.owner_kept_bytes(session))
    }

    async fn take_tokens(&self, draw: &crate::rate::Draw) -> Result<bool> {
        delegate!(self, w => w.take_tokens(draw))
    }

    async fn outbox_take(
        &self,
        now_ms: u64,
        hold_ms: u64,
        limit: usize,
    ) -> Result<Vec<crate::OutboxItem>> {
        delegate!(self, w => w.outbox_take(now_ms, hold_ms, limit))
    }

    async fn outbox_settle(&self, id: u64, settled: &crate::Settled) -> Result<()> {
        delegate!(self, w => w.outbox_settle(id, settled))
    }

    async fn outbox_prune(&self, before_ms: u64) -> Result<u64> {
        delegate!(self, w => w.outbox_prune(before_ms))
    }

    async fn vault_put(&self, owner: &str, name: &str, sealed: &crate::Sealed) -> Result<()> {
        delegate!(self, w => w.vault_put(owner, name, sealed))
    }

    async fn vault_get(&self, owner: &str, name: &str) -> Result<Option<crate::VaultEntry>> {
        delegate!(self, w => w.vault_get(owner, name))
    }

    async fn vault_list(&self, owner: Option<&str>) -> Result<Vec<crate::VaultEntry>> {
        delegate!(self, w => w.vault_list(owner))
    }

    async fn vault_delete(&self, owner: &str, name: &str) -> Result<bool> {
        delegate!(self, w => w.vault_delete(owner, name))
    }

    async fn hook_create(&self, hook: &crate::Hook) -> Result<bool> {
        delegate!(self, w => w.hook_create(hook))
    }

    async fn hooks(&self, session: Option<&str>) -> Result<Vec<crate::Hook>> {
        delegate!(self, w => w.hooks(session))
    }

    async fn hook_reseal(&self, session: &str, name: &str, sealed: &crate::Sealed) -> Result<bool> {
        delegate!(self, w => w.hook_reseal(session, name, sealed))
    }

    async fn hook_delete(&self, session: &str, name: &str) -> Result<bool> {
        delegate!(self, w => w.hook_delete(session, name))
    }

    async fn hook_take_delivery(
        &self,
        session: &str,
        name: &str,
        delivery: &str,
        at_ms: u64,
        forget_before_ms: u64,
    ) -> Result<bool> {
        delegate!(self, w => w.hook_take_delivery(session, name, delivery, at_ms, forget_before_ms))
    }

    async fn hook_untake_delivery(&self, session: &str, name: &str, delivery: &str) -> Result<()> {
        delegate!(self, w => w.hook_untake_delivery(session, name, delivery))
    }

    async fn list_sessions(&self, query: &SessionQuery) -> Result<SessionPage> {
        delegate!(self, w => w.list_sessions(query))
    }

    async fn token_issue(&self, token: &crate::ServiceToken) -> Result<()> {
        delegate!(self, w => w.token_issue(token))
    }

    async fn tokens(&self) -> Result<Vec<crate::ServiceToken>> {
        delegate!(self, w => w.tokens())
    }

    async fn token_by_hash(&self, hash: &str) -> Result<Option<crate::ServiceToken>> {
        delegate!(self, w => w.token_by_hash(hash))
    }

    async fn token_revoke(&self, id: &str, at_ms: u64) -> Result<bool> {
        delegate!(self, w => w.token_revoke(id, at_ms))
    }

    async fn audit(
        &self,
        actor: &str,
        action: &str,
        target: &str,
        detail: &serde_json::Value,
    ) -> Result<()> {
        delegate!(self, w => w.audit(actor, action, target, detail))
    }

    async fn audit_log(
        &self,
        after: u64,
        limit: usize,
        about: Option<&str>,
    ) -> Result<Vec<crate::AuditEntry>> {
        delegate!(self, w => w.audit_log(after, limit, about))
    }

    async fn update_session(&self, session: &str, patch: &SessionPatch) -> Result<()> {
        delegate!(self, w => w.update_session(session, patch))
    }

    async fn session(&self, session: &str) -> Result<SessionSummary> {
        delegate!(self, w => w.session(session))
    }

    async fn post(
        &self,
        session: &str,
        kind: crate::InboundKind,
        name: &str,
        body: &serde_json::Value,
    ) -> Result<u64> {
        delegate!(self, w => w.post(session, kind, name, body))
    }

    async fn inbox(&self, session: &str) -> Result<Vec<crate::Inbound>> {
        delegate!(self, w => w.inbox(session))
    }

    async fn claim(&self, holder: &Holder, ttl: Duration) -> Result<Option<Lease>> {
        delegate!(self, w => w.claim(holder, ttl))
    }

    async fn delete_session(&self, session: &str) -> Result<()> {
        delegate!(self, w => w.delete_session(session))
    }

    fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        match self {
            AnyWorld::Sqlite(w) => w.changes(),
            #[cfg(feature = "postgres")]
            AnyWorld::Postgres(w) => w.changes(),
        }
    }

    fn due(&self) -> tokio::sync::watch::Receiver<u64> {
        match self {
            AnyWorld::Sqlite(w) => w.due(),
            #[cfg(feature = "postgres")]
            AnyWorld::Postgres(w) => w.due(),
        }
    }

    fn inbox_seen_empty(&self, lease: &Lease) -> bool {
        match self {
            AnyWorld::Sqlite(w) => w.inbox_seen_empty(lease),
            #[cfg(feature = "postgres")]
            AnyWorld::Postgres(w) => w.inbox_seen_empty(lease),
        }
    }

    async fn ping(&self) -> Result<()> {
        match self {
            AnyWorld::Sqlite(w) => w.ping().await,
            #[cfg(feature = "postgres")]
            AnyWorld::Postgres(w) => w.ping().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::redacted;

    #[test]
    fn a_password_is_never_shown_in_any_form_of_connection_string() {
        for (spec, shown) in [
            (
                "postgres://app:s3cr%40t@db.example.com:5432/steadfast?sslmode=require",
                "postgres://app:***@db.example.com:5432/steadfast?sslmode=require",
            ),
            (
                "postgresql://app@db/steadfast?password=s3cret&sslmode=verify-full",
                "postgresql://app@db/steadfast?password=***&sslmode=verify-full",
            ),
            (
                "host=db user=app password=s3cret dbname=steadfast",
                "host=db user=app password=*** dbname=steadfast",
            ),
            (
                "postgres://app:p@ss:w@rd@db/steadfast",
                "postgres://app:***@db/steadfast",
            ),
            ("postgres://app@db/steadfast", "postgres://app@db/steadfast"),
            ("sqlite:/var/lib/world.db", "sqlite:/var/lib/world.db"),
        ] {
            assert_eq!(redacted(spec), shown, "{spec}");
        }
    }
}
