//! Webhooks out: the operator's endpoint hears of every session that waits for a
//! human, is escalated, finishes a turn, is interrupted or ends.
//!
//! The source is the world's outbox ([`steadfast_world::outbox`]), which the store
//! fills in the same transaction as the record, so nothing committed goes unannounced
//! whichever process appended it, and a restart of the deliverer loses nothing: an
//! entry it took and never settled is due again when its hold lapses. Each attempt is
//! a `POST` of a JSON body (the session, the record's position and its public event)
//! with an HMAC-SHA256 signature (`Steadfast-Signature: t=<ms>,v1=<hex>` over
//! `"<t>.<body>"`, as Stripe signs) and an idempotency key that is the same on every
//! attempt (`Idempotency-Key: <session>.<seq>`), so a receiver can verify it and take
//! it once. A 2xx answer delivers it; anything else is retried with exponential
//! backoff and jitter, and given up after `max_attempts` (recorded in the outbox,
//! counted in the metrics).

use std::time::{Duration, Instant};

use hmac::{KeyInit, Mac};
use serde::Serialize;
use steadfast_harness::Backoff;
use steadfast_log::{EndState, Event};
use steadfast_world::{OutboxItem, Settled, World};

use crate::public::{self, PublicEvent};

/// Where and how session changes are announced.
#[derive(Clone)]
pub struct WebhookOptions {
    /// The endpoint, `http://` or `https://`.
    pub url: String,
    /// The key of the HMAC signature (from the operator's environment, never the
    /// configuration file).
    pub secret: String,
    /// Attempts before a delivery is given up.
    pub max_attempts: u32,
    /// The delay after each failure.
    pub backoff: Backoff,
    /// How long one attempt may take.
    pub timeout: Duration,
    /// How long delivered and given-up entries are kept as the record of their
    /// deliveries.
    pub retention: Duration,
}

impl WebhookOptions {
    /// Options for `url` signed with `secret`, with the default retries: 12 attempts
    /// from 2 s apart up to 5 minutes, 10 s each, entries kept 7 days.
    pub fn new(url: &str, secret: &str) -> Self {
        WebhookOptions {
            url: url.to_string(),
            secret: secret.to_string(),
            max_attempts: 12,
            backoff: Backoff::default(),
            timeout: Duration::from_secs(10),
            retention: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

/// The signature header's name.
pub const SIGNATURE_HEADER: &str = "steadfast-signature";

/// The signature of `body` sent at `t_ms` under `secret`: the value of the
/// [`SIGNATURE_HEADER`]. Receivers compute the same over the body they got and
/// compare (in constant time), and refuse timestamps too far from their clock.
pub fn signature(secret: &str, t_ms: u64, body: &[u8]) -> String {
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes())
        .expect("HMAC takes a key of any length");
    mac.update(t_ms.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("t={t_ms},v1={}", hex::encode(mac.finalize().into_bytes()))
}

/// What a delivery's body says.
#[derive(Debug, Serialize)]
struct Payload<'a> {
    /// The same on every attempt: `<session>.<seq>`.
    id: String,
    /// `session.waiting`, `session.escalated`, `session.idle` (a turn finished),
    /// `session.interrupted`, `session.completed`, `session.failed`.
    #[serde(rename = "type")]
    kind: &'static str,
    session: &'a str,
    seq: u64,
    at_ms: u64,
    /// Which attempt this is, from 1.
    attempt: u32,
    /// The record's public event.
    event: PublicEvent,
}

/// The payload type of a record.
fn kind_of(event: &Event) -> &'static str {
    match event {
        Event::WaitStarted { .. } => "session.waiting",
        Event::Escalated { .. } => "session.escalated",
        Event::TurnEnded { .. } => "session.idle",
        Event::TurnInterrupted { .. } => "session.interrupted",
        Event::SessionEnded {
            state: EndState::Completed,
            ..
        } => "session.completed",
        Event::SessionEnded {
            state: EndState::Failed,
            ..
        } => "session.failed",
        Event::SessionEnded {
            state: EndState::Escalated,
            ..
        } => "session.escalated",
        Event::SessionEnded {
            state: EndState::Closed,
            ..
        } => "session.closed",
        _ => "session.changed",
    }
}

/// Delivers the outbox to the endpoint until `stop` turns true.
pub async fn deliver<W: World + Clone>(
    world: W,
    options: WebhookOptions,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    // No redirect is followed: it would hand a signed, replayable body to whatever
    // host the endpoint names.
    let client = match reqwest::Client::builder()
        .timeout(options.timeout)
        .tcp_nodelay(true)
        .redirect(reqwest::redirect::Policy::none())
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "webhooks: cannot build an HTTP client; none are delivered");
            return;
        }
    };
    let mut changes = world.changes();
    let mut pruned = Instant::now() - Duration::from_secs(3600);
    let hold = options.timeout + Duration::from_secs(5);
    tracing::info!(url = %options.url, "webhooks: delivering session changes");
    while !*stop.borrow() {
        let now = steadfast_world::now_ms();
        if pruned.elapsed() >= Duration::from_secs(3600) {
            let before = now.saturating_sub(options.retention.as_millis() as u64);
            if let Err(e) = world.outbox_prune(before).await {
                tracing::warn!(error = %e, "webhooks: pruning the outbox failed");
            }
            pruned = Instant::now();
        }
        let due = match world.outbox_take(now, hold.as_millis() as u64, 32).await {
            Ok(due) => due,
            Err(e) => {
                tracing::warn!(error = %e, "webhooks: reading the outbox failed");
                Vec::new()
            }
        };
        for item in &due {
            let settled = attempt(&world, &client, &options, item).await;
            if let Err(e) = world.outbox_settle(item.id, &settled).await {
                // Not settled: the entry is due again when its hold lapses.
                tracing::warn!(error = %e, session = %item.session, "webhooks: recording a delivery failed");
            }
        }
        if due.is_empty() {
            tokio::select! {
                _ = changes.changed() => {}
                _ = stop.changed() => {}
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
    }
}

/// One attempt to deliver `item`, and how it went.
#[tracing::instrument(skip_all, fields(session = %item.session, seq = item.seq, attempt = item.attempts + 1))]
async fn attempt<W: World>(
    world: &W,
    client: &reqwest::Client,
    options: &WebhookOptions,
    item: &OutboxItem,
) -> Settled {
    let started = Instant::now();
    let record = match world.read(&item.session, item.seq).await {
        Ok(records) => records.into_iter().find(|r| r.seq == item.seq),
        Err(steadfast_world::Error::NotFound(_)) => None,
        Err(e) => {
            return failed(options, item, format!("reading the record: {e}"), started);
        }
    };
    let Some(record) = record else {
        tracing::info!("webhooks: the session is gone; its change is not announced");
        steadfast_metrics::metrics().webhook_delivery("abandoned", started.elapsed());
        return Settled::Failed {
            error: "the session was deleted".into(),
            retry_at_ms: None,
        };
    };
    let payload = Payload {
        id: format!("{}.{}", item.session, item.seq),
        kind: kind_of(&record.event),
        session: &item.session,
        seq: item.seq,
        at_ms: record.at_ms,
        attempt: item.attempts + 1,
        event: public::event(&record),
    };
    let body = serde_json::to_vec(&payload).expect("payloads serialize");
    let t_ms = steadfast_world::now_ms();
    let sent = client
        .post(&options.url)
        .header("content-type", "application/json")
        .header("idempotency-key", &payload.id)
        .header("steadfast-event", payload.kind)
        .header(SIGNATURE_HEADER, signature(&options.secret, t_ms, &body))
        .body(body)
        .send()
        .await;
    match sent {
        Ok(resp) if resp.status().is_success() => {
            steadfast_metrics::metrics().webhook_delivery("delivered", started.elapsed());
            tracing::info!(status = resp.status().as_u16(), "webhooks: delivered");
            Settled::Delivered {
                status: resp.status().as_u16(),
            }
        }
        Ok(resp) => failed(
            options,
            item,
            format!("the receiver answered {}", resp.status()),
            started,
        ),
        Err(e) => failed(options, item, format!("sending: {e}"), started),
    }
}

/// A failed attempt: retried after the backoff, or given up after the last one.
fn failed(options: &WebhookOptions, item: &OutboxItem, error: String, started: Instant) -> Settled {
    let attempts = item.attempts + 1;
    let metrics = steadfast_metrics::metrics();
    if attempts >= options.max_attempts {
        tracing::warn!(%error, attempts, "webhooks: given up");
        metrics.webhook_delivery("abandoned", started.elapsed());
        return Settled::Failed {
            error,
            retry_at_ms: None,
        };
    }
    let delay = options
        .backoff
        .delay(attempts, item.id ^ u64::from(attempts));
    tracing::info!(%error, attempts, retry_in_ms = delay.as_millis() as u64, "webhooks: failed; retrying later");
    metrics.webhook_delivery("failed", started.elapsed());
    Settled::Failed {
        error,
        retry_at_ms: Some(steadfast_world::now_ms() + delay.as_millis() as u64),
    }
}
