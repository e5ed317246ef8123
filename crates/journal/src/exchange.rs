//! A wrapped agent's model calls, journaled: admission against the session's bounds,
//! the intent (with the request kept by content, [`crate::kept`]), the outcome, and
//! the replay of a restarted agent's requests from the record. The gateway is their
//! HTTP face: it normalizes requests, relays replies and streams their text; every
//! record of an exchange is made here, as every record of a tool call is made in
//! [`crate::calls`].
//!
//! **Replay.** Exchanges opened over a session whose open turn already has some (a
//! wrapped agent restarted after a crash) answer each request that matches the record
//! from the log — the same bytes, so the same events and ids — without calling the
//! provider. A request matches the recorded exchange at the replay cursor, or one of
//! the next few still unanswered ones (a client may send side requests concurrently,
//! in any order), when the fingerprints of their normalized requests agree. A request
//! that matches nothing while recorded exchanges remain is a **divergence**: an
//! [`Event::ReplayDiverged`] supersedes the record from the cursor on, the workspace is
//! restored to the snapshot recorded with that exchange, and the request goes to the
//! provider. A recorded request whose reply was cut off by a crash is asked again.
//!
//! **Replay against something new.** Opened with [`Mismatch::Stop`], the exchanges
//! check a run of another CLI (or model) against the record: the first request that
//! matches nothing is noted ([`Exchanges::divergence`]) and refused, and nothing is
//! asked of the provider.

use std::collections::HashSet;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex as StdMutex};

use serde_json::Value;
use steadfast_drive::Drive;
use steadfast_fault::{point, points};
use steadfast_log::{Breaker, Event, Usage};
use steadfast_model::pricing::PriceTable;
use steadfast_world::{Blobs, LiveSession, World};
use tokio::sync::Mutex;

use crate::kept;

/// How many recorded exchanges past the cursor a request may match (concurrent side
/// requests arrive in any order).
const REPLAY_WINDOW: usize = 4;

/// What a request the record does not have does while recorded exchanges remain (or,
/// replaying against something new, past the record).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mismatch {
    /// Supersede the record from there and ask the provider: a restarted agent that
    /// went another way.
    #[default]
    Diverge,
    /// Note it ([`Exchanges::divergence`]), then as [`Mismatch::Diverge`]: a replay
    /// that goes on live from where it diverged.
    NoteAndDiverge,
    /// Note it and refuse the request: nothing is asked of the provider or recorded,
    /// and [`Exchanges::stopped`] resolves. A replay that only checks.
    Stop,
}

/// The first request of a replay that the record did not have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Divergence {
    /// The recorded exchange it was expected to be (the replay's cursor): `None` when
    /// the record had no more.
    pub expected: Option<String>,
    /// How many of the turn's recorded requests this run was answered from before it.
    pub index: usize,
    /// The API it was sent to.
    pub api: steadfast_log::Api,
    /// The request, normalized as fingerprints see it.
    pub request: Value,
}

/// What the exchanges of one run did, for tests and progress displays.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Requests answered from the log.
    pub replayed: u64,
    /// Requests sent to the provider.
    pub live: u64,
    /// Divergences declared.
    pub diverged: u64,
}

/// A bound check beyond the session's own: the breaker and reason if the session must
/// stop (a wrapped agent's loop breaker, counted by its tool journal).
pub type BoundCheck = Arc<dyn Fn() -> Option<(Breaker, String)> + Send + Sync>;

/// What [`Exchanges`] are opened with.
pub struct ExchangesConfig<W> {
    /// The session's log under the wrapped agent's driver's lease.
    pub live: Arc<LiveSession<W>>,
    /// The drive, for restoring the workspace on a divergence.
    pub drive: Drive,
    /// The session's workspace.
    pub workspace: PathBuf,
    /// Where the workspace is now (it moves as a replay answers recorded tool calls),
    /// shared with the tool journal, so each exchange notes where its divergence
    /// would restore to.
    pub last_snapshot: Arc<StdMutex<Option<String>>>,
    /// Where requests are kept by content.
    pub blobs: Blobs,
    /// The most exchanges the session's turn may have: past it, or past any of the
    /// session's bounds (money, tokens, turns, wall clock), requests are refused and
    /// [`Exchanges::escalation`] says why, for the driver to escalate.
    pub max_exchanges: Option<usize>,
    /// A further bound checked before each model call.
    pub extra_bound: Option<BoundCheck>,
    /// Model prices overriding the built-in table (what the cost bound counts).
    pub prices: PriceTable,
    /// What a request the record does not have does.
    pub mismatch: Mismatch,
}

/// The replay pass of one run of the wrapped agent: which of the open turn's recorded
/// exchanges this run has been answered from (or has re-asked, or made itself).
#[derive(Default)]
struct Pass {
    consumed: HashSet<String>,
    /// The requests this run kept.
    keeper: kept::Keeper,
    /// The first request the record did not have (noted replaying against something
    /// new).
    divergence: Option<Divergence>,
}

/// Where one request goes, as the record says.
enum Plan {
    /// Answered from the record at this index.
    Replay(usize, (u16, String, String)),
    /// Recorded at this index but cut off before its reply: asked again in its place.
    Reask(usize),
    /// Nothing recorded matches while recorded exchanges remain from this index, whose
    /// snapshot the workspace goes back to.
    Diverge(usize, Option<String>),
    /// Past the record: a new exchange at this index.
    New(usize),
}

/// A model request, as the journal sees it.
pub struct Asked<'a> {
    /// Which API.
    pub api: steadfast_log::Api,
    /// The request, normalized (what the record keeps and a divergence report shows).
    pub request: &'a Value,
    /// The fingerprint of the normalized request, what replay matches on.
    pub fingerprint: String,
    /// Whether the reply streams.
    pub stream: bool,
    /// What the request may cost, `None` for one the provider does not bill (a token
    /// count).
    pub billed: Option<Billed>,
}

/// What a billed request's worst case is counted from.
#[derive(Debug, Clone, Copy)]
pub struct Billed {
    /// The length of the body the provider is sent.
    pub bytes: usize,
    /// The most output tokens the request asks for (`None`: it sets no limit).
    pub max_output: Option<u32>,
}

/// Where a request went.
pub enum Begun<F: Future> {
    /// Answered from the record: status, content type, body.
    Replayed {
        /// Its exchange's index.
        index: usize,
        /// The recorded reply.
        reply: (u16, String, String),
    },
    /// Its intent is in the log: the request may be sent whole now.
    Live {
        /// Its exchange's index.
        index: usize,
        /// The intent's id, for [`Exchanges::outcome`].
        call_id: String,
        /// The request on its way, started before the intent was appended.
        sending: F,
        /// The request's answer, if it came while the intent was appended.
        answered: Option<F::Output>,
    },
}

/// Why a request was not sent.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// A replay that only checks met a request the record did not have.
    #[error("this replay stops here: the recorded session made no such request")]
    Stopped,
    /// A bound is crossed: the session must escalate ([`Exchanges::escalation`]).
    #[error("{0}; the session is escalated")]
    Bound(String),
    /// A divergence could not put the workspace back.
    #[error("restoring the workspace: {0}")]
    Restore(#[from] steadfast_drive::Error),
    /// The log would not take the record, so the call was not made.
    #[error(transparent)]
    Log(#[from] steadfast_world::Error),
}

/// The journaled model calls of one run of a wrapped agent.
pub struct Exchanges<W> {
    live: Arc<LiveSession<W>>,
    drive: Drive,
    workspace: PathBuf,
    last_snapshot: Arc<StdMutex<Option<String>>>,
    blobs: Blobs,
    max_exchanges: Option<usize>,
    extra_bound: Option<BoundCheck>,
    prices: PriceTable,
    mismatch: Mismatch,
    /// Held from a request's plan to its intent in the log: one index per exchange.
    pass: Mutex<Pass>,
    escalation: StdMutex<Option<(Breaker, String)>>,
    escalated: tokio::sync::watch::Sender<bool>,
    stopped: tokio::sync::watch::Sender<bool>,
    counters: StdMutex<Counters>,
}

impl<W: World + Clone> Exchanges<W> {
    /// The exchanges of a (new) run of the session's wrapped agent: its replay pass
    /// starts at the open turn's first recorded exchange (a restarted CLI starts its
    /// turn over; earlier turns' exchanges are history it never asks for again).
    pub fn new(config: ExchangesConfig<W>) -> Self {
        Exchanges {
            live: config.live,
            drive: config.drive,
            workspace: config.workspace,
            last_snapshot: config.last_snapshot,
            blobs: config.blobs,
            max_exchanges: config.max_exchanges,
            extra_bound: config.extra_bound,
            prices: config.prices,
            mismatch: config.mismatch,
            pass: Mutex::new(Pass::default()),
            escalation: StdMutex::new(None),
            escalated: tokio::sync::watch::Sender::new(false),
            stopped: tokio::sync::watch::Sender::new(false),
            counters: StdMutex::default(),
        }
    }

    /// The session's log these exchanges are recorded in.
    pub fn live(&self) -> &Arc<LiveSession<W>> {
        &self.live
    }

    /// The session's workspace.
    pub fn workspace(&self) -> &Path {
        &self.workspace
    }

    /// Admits a request and records its intent, or answers it from the record. The
    /// request is sent by `start`, under a gate the caller opens once this returns
    /// [`Begun::Live`]: it goes out while the intent is appended, all but its last
    /// byte, so a failed append means the provider never had the whole request.
    /// `start` is given the output limit the request must be sent with instead of its
    /// own when the session's spend cap leaves room for less (see [`crate::spend`]).
    pub async fn begin<F: Future + Unpin>(
        &self,
        asked: Asked<'_>,
        start: impl FnOnce(Option<u32>) -> F,
    ) -> Result<Begun<F>, Refusal> {
        let mut pass = self.pass.lock().await;
        let plan = self.plan(&pass, &asked.fingerprint);
        if self.mismatch != Mismatch::Diverge && pass.divergence.is_none() {
            let expected = match &plan {
                Plan::Diverge(at, _) => Some(Some(*at)),
                Plan::New(_) => Some(None),
                _ => None,
            };
            if let Some(expected) = expected {
                pass.divergence = Some(Divergence {
                    expected: expected.map(|i| self.live.with(|s| s.exchanges[i].call_id.clone())),
                    index: pass.consumed.len(),
                    api: asked.api,
                    request: asked.request.clone(),
                });
            }
        }
        if self.mismatch == Mismatch::Stop && matches!(plan, Plan::Diverge(..) | Plan::New(_)) {
            self.stopped.send_replace(true);
            return Err(Refusal::Stopped);
        }
        let index = match plan {
            Plan::Replay(index, reply) => {
                let call_id = self.live.with(|s| s.exchanges[index].call_id.clone());
                pass.consumed.insert(call_id);
                self.count(|c| c.replayed += 1);
                steadfast_metrics::metrics().gateway(steadfast_metrics::GatewayAnswer::Replayed);
                return Ok(Begun::Replayed { index, reply });
            }
            // Recorded but cut off before its reply: ask again, in its place (it was
            // admitted when it was first asked).
            Plan::Reask(index) => {
                let output = self.fit_to_spend(&asked)?;
                return self
                    .record_intent(&mut pass, index, asked, || start(output))
                    .await;
            }
            Plan::Diverge(at, snapshot) => {
                self.diverge(at, snapshot).await?;
                at
            }
            Plan::New(index) => index,
        };
        if let Some(hit) = self.bound_hit(index) {
            return Err(self.escalate(hit));
        }
        let output = self.fit_to_spend(&asked)?;
        self.record_intent(&mut pass, index, asked, || start(output))
            .await
    }

    /// The output limit `asked` is sent with under the session's spend cap (`None`: its
    /// own), or the escalation that refuses it.
    fn fit_to_spend(&self, asked: &Asked<'_>) -> Result<Option<u32>, Refusal> {
        let Some(billed) = asked.billed else {
            return Ok(None);
        };
        self.live
            .with(|s| crate::spend::fit(s, &self.prices, billed.bytes, billed.max_output))
            .map_err(|hit| self.escalate(hit))
    }

    /// Notes that a request was refused for crossing a bound, so the session escalates.
    fn escalate(&self, hit: (Breaker, String)) -> Refusal {
        let message = hit.1.clone();
        *self.escalation.lock().unwrap_or_else(|e| e.into_inner()) = Some(hit);
        self.escalated.send_replace(true);
        Refusal::Bound(message)
    }

    /// Records a reply read to its end as its exchange's outcome; returns what it
    /// cost. The fold counts the spend as the outcome is applied: the bounds see it
    /// at the next request.
    pub async fn outcome(
        &self,
        call_id: String,
        (status, content_type, body): (u16, String, String),
        usage: Option<Usage>,
    ) -> Result<u64, steadfast_world::Error> {
        point(points::MODEL_EFFECT);
        let model = self.live.with(|s| s.model.model.clone());
        let cost_micro_usd = usage.map_or(0, |u| {
            steadfast_model::pricing::cost_with(&self.prices, &model, &u)
        });
        let event = Event::ExchangeOutcome {
            call_id,
            status,
            content_type,
            body,
            usage,
            cost_micro_usd,
        };
        self.live.append(&[event]).await?;
        point(points::MODEL_OUTCOME);
        Ok(cost_micro_usd)
    }

    /// Resolves once a request has been refused for crossing a bound (the driver then
    /// stops the CLI rather than let it retry).
    pub async fn escalated(&self) {
        let mut rx = self.escalated.subscribe();
        let _ = rx.wait_for(|e| *e).await;
    }

    /// Resolves once a replay opened with [`Mismatch::Stop`] has refused a request the
    /// record did not have (the driver then stops the CLI).
    pub async fn stopped(&self) {
        let mut rx = self.stopped.subscribe();
        let _ = rx.wait_for(|e| *e).await;
    }

    /// The first request the record did not have, when opened to note it
    /// ([`Mismatch::NoteAndDiverge`], [`Mismatch::Stop`]).
    pub async fn divergence(&self) -> Option<Divergence> {
        self.pass.lock().await.divergence.clone()
    }

    /// How many of the open turn's recorded exchanges this run has not been answered
    /// from (a replay that ended with some left went another way).
    pub async fn unanswered(&self) -> usize {
        let pass = self.pass.lock().await;
        self.live.with(|s| {
            let from = (s.turn_start.exchanges as usize).min(s.exchanges.len());
            s.exchanges[from..]
                .iter()
                .filter(|e| !pass.consumed.contains(&e.call_id))
                .count()
        })
    }

    /// The bound a refused request hit, if one was: the session must escalate.
    pub fn escalation(&self) -> Option<(Breaker, String)> {
        self.escalation
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// What this run's exchanges have done so far.
    pub fn counters(&self) -> Counters {
        *self.counters.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count(&self, f: impl FnOnce(&mut Counters)) {
        f(&mut self.counters.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// What the record says of a request with `fingerprint`.
    fn plan(&self, pass: &Pass, fingerprint: &str) -> Plan {
        self.live.with(|s| {
            let from = (s.turn_start.exchanges as usize).min(s.exchanges.len());
            let open = |i: &usize| !pass.consumed.contains(&s.exchanges[*i].call_id);
            let Some(cursor) = (from..s.exchanges.len()).find(open) else {
                return Plan::New(s.exchanges.len());
            };
            let end = (cursor + REPLAY_WINDOW).min(s.exchanges.len());
            match (cursor..end)
                .filter(open)
                .find(|&i| s.exchanges[i].fingerprint == fingerprint)
            {
                Some(i) => match &s.exchanges[i].reply {
                    Some(reply) => Plan::Replay(i, reply.clone()),
                    None => Plan::Reask(i),
                },
                None => Plan::Diverge(cursor, s.exchanges[cursor].snapshot.clone()),
            }
        })
    }

    async fn diverge(&self, at: usize, snapshot: Option<String>) -> Result<(), Refusal> {
        tracing::warn!(
            index = at,
            "replay diverged: superseding the record from here"
        );
        if let Some(snap) = &snapshot {
            // Never under a lost lease: another holder may be driving the workspace.
            self.live.ensure_lease()?;
            self.drive.restore_async(&self.workspace, snap).await?;
        }
        self.live
            .append(&[Event::ReplayDiverged {
                index: at as u32,
                snapshot: snapshot.clone(),
            }])
            .await?;
        *self.last_snapshot.lock().unwrap_or_else(|e| e.into_inner()) = snapshot;
        self.count(|c| c.diverged += 1);
        Ok(())
    }

    /// Records a live exchange's intent, the request already on its way to the
    /// provider but for its last byte, which follows once the intent is in the log.
    async fn record_intent<F: Future + Unpin>(
        &self,
        pass: &mut Pass,
        index: usize,
        asked: Asked<'_>,
        start: impl FnOnce() -> F,
    ) -> Result<Begun<F>, Refusal> {
        let split = kept::split(asked.request);
        let (parts, unwritten) = pass.keeper.parts(&split);
        let call_id = format!("gx_{}", uuid::Uuid::now_v7().simple());
        let mut sending = start();
        let snapshot = self
            .last_snapshot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let intent = [Event::ExchangeIntent {
            call_id: call_id.clone(),
            index: index as u32,
            api: asked.api,
            fingerprint: asked.fingerprint,
            stream: asked.stream,
            snapshot,
            request: Some(parts),
        }];
        // The request's new parts are stored before the record that names them.
        let kept_and_recorded = async {
            kept::write(&self.blobs, &unwritten).await?;
            self.live.append(&intent).await
        };
        let (recorded, answered) =
            steadfast_model::while_polling(kept_and_recorded, std::pin::Pin::new(&mut sending))
                .await;
        recorded?;
        pass.keeper.kept(&call_id, &split);
        pass.consumed.insert(call_id.clone());
        point(points::MODEL_INTENT);
        self.count(|c| c.live += 1);
        Ok(Begun::Live {
            index,
            call_id,
            sending,
            answered,
        })
    }

    /// The bound a new model call at exchange `index` would cross, if any.
    fn bound_hit(&self, index: usize) -> Option<(Breaker, String)> {
        let (hit, used, turn) = self.live.with(|s| {
            (
                s.bound_hit(steadfast_world::now_ms()),
                index.saturating_sub(s.exchanges_from as usize),
                s.turn,
            )
        });
        if let Some(hit) = hit {
            return Some(hit);
        }
        if let Some(hit) = self.extra_bound.as_ref().and_then(|check| check()) {
            return Some(hit);
        }
        let max = self.max_exchanges?;
        (used >= max).then(|| {
            (
                Breaker::Steps,
                format!("step budget exhausted: {used} model calls in turn {turn}"),
            )
        })
    }
}
