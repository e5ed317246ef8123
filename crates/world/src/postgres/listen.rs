//! `LISTEN/NOTIFY`: every process's appends and posts wake idle workers and stream
//! tails in every other process. Between notifications the same connection looks,
//! a few times a second, for work that became due without one (a lease lapsing, a
//! holder's process dying, a retry's time coming), so idle workers need not poll.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres_rustls::MakeRustlsConnect;

/// Stops the `LISTEN` task when the last handle of the world goes.
pub(super) struct AbortOnDrop(pub(super) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How often the listener looks for work that became due unannounced.
const DUE_WATCH: Duration = Duration::from_millis(250);

/// The channel every append and post notifies, so idle workers and stream tails in
/// every process wake at once instead of polling hot.
pub(super) const CHANNEL: &str = "steadfast";

/// Listens on [`CHANNEL`] and bumps `changes` on every notification, reconnecting
/// with backoff when the database goes away (and bumping once on reconnect, since
/// anything may have happened meanwhile).
/// The liveness token of this process: the backend (`pid@start`) of its notification
/// connection while it is connected. Leases record it; when the process dies its
/// backend goes, and other processes see that at once (see [`HOLDER_GONE`]).
pub(super) type Liveness = Arc<tokio::sync::watch::Sender<Option<String>>>;

/// SQL, over a session row `s`: its holder's notification backend is gone. A backend
/// with the same pid whose start this role may not see (another role's, without
/// `pg_read_all_stats`) counts as alive: the lease then lapses as before.
pub(super) const HOLDER_GONE: &str = "(s.lease_liveness IS NOT NULL AND NOT EXISTS (\
    SELECT 1 FROM pg_stat_activity a WHERE a.pid = split_part(s.lease_liveness, '@', 1)::int \
    AND (a.backend_start IS NULL OR a.backend_start::text = split_part(s.lease_liveness, '@', 2))))";

pub(super) async fn listen(
    config: tokio_postgres::Config,
    tls: MakeRustlsConnect,
    changes: Arc<tokio::sync::watch::Sender<u64>>,
    due: Arc<tokio::sync::watch::Sender<u64>>,
    liveness: Liveness,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        match config.connect(tls.clone()).await {
            Ok((client, mut connection)) => {
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
                let driver = tokio::spawn(async move {
                    while let Some(message) =
                        std::future::poll_fn(|cx| connection.poll_message(cx)).await
                    {
                        match message {
                            Ok(tokio_postgres::AsyncMessage::Notification(_)) => {
                                if tx.send(()).is_err() {
                                    return;
                                }
                            }
                            Ok(_) => {}
                            Err(_) => return,
                        }
                    }
                });
                let me = client
                    .query_one(
                        "SELECT pid::text || '@' || backend_start::text FROM pg_stat_activity WHERE pid = pg_backend_pid()",
                        &[],
                    )
                    .await
                    .ok()
                    .map(|row| row.get::<_, String>(0));
                if client
                    .batch_execute(&format!("LISTEN {CHANNEL}"))
                    .await
                    .is_ok()
                {
                    backoff = Duration::from_millis(100);
                    liveness.send_replace(me);
                    crate::bump(&changes);
                    let mut watch = tokio::time::interval(DUE_WATCH);
                    watch.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    loop {
                        tokio::select! {
                            notified = rx.recv() => match notified {
                                Some(()) => crate::bump(&changes),
                                None => break,
                            },
                            _ = watch.tick() => {
                                match client.query_one(super::ANY_DUE.as_str(), &[]).await {
                                    Ok(row) if row.get::<_, bool>(0) => crate::bump(&due),
                                    Ok(_) => {}
                                    Err(_) => break,
                                }
                            }
                        }
                    }
                }
                driver.abort();
                liveness.send_replace(None);
                tracing::warn!("lost the PostgreSQL notification connection; reconnecting");
            }
            Err(e) => tracing::debug!(error = %e, "cannot reach PostgreSQL for notifications"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}
