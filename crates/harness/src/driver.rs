//! The driver: one harness driving one session, a step at a time.

use steadfast_fault::{point, points};
use steadfast_journal::calls::{Call, CutOff};
use steadfast_journal::{Journal, Ran};
use steadfast_log::fold::Next;
use steadfast_log::{
    EndState, Event, Output, PendingTool, Record, SessionState, ToolClass, ToolUse, Verdict,
};
use steadfast_model::{
    pricing, Delta, ModelClient, ModelRequest, ModelResponse, Prepared, RequestBuilder,
    RequestHead, ToolDef,
};
use steadfast_sandbox::{tool_specs, Sandbox};
use steadfast_world::{now_ms, InboundKind, Lease, LiveSession, World};

use crate::harness::Harness;
use steadfast_world::interrupt;

/// Journal streamed text in pieces of at least this many bytes... (a commit per few
/// hundred bytes made a step's durable cost grow with its reply; readers of the log
/// follow a reply at the interval below either way)
const DELTA_BATCH: usize = 4096;
/// ...or at least this often.
const DELTA_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

/// A read-only tool call that finished within this long has its outcome folded at
/// once but committed with the driver's next append (the next model call's intent,
/// usually): one commit fewer per step. A crash before that commit
/// loses only the outcome, and such a call is run again on wake (never rolled back,
/// never costing a model call); a steer sent while it ran waits at most this long
/// more. Longer calls, and every call that may change anything, commit alone.
pub(crate) const STAGE_WITHIN: std::time::Duration = std::time::Duration::from_millis(50);

/// A read-only tool call that a reply announces runs at once, before the reply is
/// committed; the reply waits this long for it, then commits while it goes on. A
/// read done by then has its outcome staged with the reply: a read step costs one
/// commit, not two. A read has no effect to guard, so its intent need not be durable
/// before it runs (its outcome never goes into the log before its intent). The cost:
/// a crash before that commit loses the reply too, as a crash during a commit does,
/// and waking asks for it again; this bound keeps that window short.
const READ_WITH_REPLY_WITHIN: std::time::Duration = std::time::Duration::from_millis(2);

/// The tool the model calls to ask a human for approval.
pub const APPROVAL_TOOL: &str = "request_approval";
pub use steadfast_log::APPROVAL_SIGNAL;

fn approval_tool() -> ToolDef {
    ToolDef {
        name: APPROVAL_TOOL.into(),
        description: "Pause and ask a human to approve before going on (for risky or irreversible steps). The session sleeps until they answer; the result is their answer.".into(),
        input_schema: serde_json::json!({"type": "object", "properties": {
            "reason": {"type": "string", "description": "what you want to do and why"}
        }, "required": ["reason"]}),
    }
}

/// A message body as text: a JSON string as is, anything else as JSON.
pub(crate) fn body_text(body: &serde_json::Value) -> String {
    match body {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}
use crate::{Error, Result};
use steadfast_world::Heartbeat;

/// Why [`Driver::run`] returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// The turn is done; the session waits for a message.
    Idle,
    /// The session waits for this named signal.
    Waiting(String),
    /// The session has ended.
    Ended(EndState),
}

/// What a driver reports as it works, for progress displays.
#[derive(Debug)]
pub enum Progress<'a> {
    /// A record was appended to the log.
    Appended(&'a Record),
    /// A piece of a model reply arrived.
    Delta(&'a Delta),
    /// The workspace was restored to a snapshot before resolving a call.
    Restored(&'a str),
}

type Observer = Box<dyn FnMut(Progress<'_>) + Send + Sync>;

/// Drives one session under its lease. Dropping it (or the process dying) at any
/// point loses nothing: the next [`Harness::wake`] carries on from the log.
pub struct Driver<'h, W, S> {
    harness: &'h Harness<W, S>,
    lease: Lease,
    /// The session's log and state: every append of this driver (and of the tool
    /// journal) goes through it, and the fold keeps the state.
    live: std::sync::Arc<LiveSession<W>>,
    /// Runs and records the session's tool calls, in its sandbox (or, for the tools
    /// the harness runs itself, outside it).
    journal: std::sync::Arc<Journal<W, S>>,
    model: ModelClient,
    /// A `compact` signal in the inbox, seen at the last read of it.
    compact_signal: Option<u64>,
    /// The conversation's requests, built a message at a time.
    requests: RequestBuilder,
    observer: std::sync::Arc<std::sync::Mutex<Observer>>,
    /// The last holder's sandbox was adopted at wake: a call it cut off may still be
    /// running there, to be waited for rather than resolved by rule 4.
    adopted: bool,
    _heartbeat: Heartbeat,
}

impl<W, S> Drop for Driver<'_, W, S> {
    fn drop(&mut self) {
        // Its tool calls' tasks may hold the journal a while longer (a command being
        // stopped): visitors go to whoever holds the session next.
        self.journal.retire();
    }
}

impl<'h, W: World + Clone, S: Sandbox> Driver<'h, W, S> {
    pub(crate) fn new(
        harness: &'h Harness<W, S>,
        journal: Journal<W, S>,
        model: ModelClient,
        heartbeat: Heartbeat,
    ) -> Self {
        let journal = std::sync::Arc::new(journal);
        journal.reachable();
        Driver {
            harness,
            live: journal.live().clone(),
            lease: journal.live().lease().clone(),
            journal,
            model,
            compact_signal: None,
            requests: RequestBuilder::default(),
            observer: std::sync::Arc::new(std::sync::Mutex::new(Box::new(|_| {}))),
            adopted: false,
            _heartbeat: heartbeat,
        }
    }

    /// Says that the last holder's sandbox was adopted at wake (see
    /// [`steadfast_sandbox::take_over`]).
    pub(crate) fn adopting(mut self, adopted: bool) -> Self {
        self.adopted = adopted;
        self
    }

    /// Reports progress to `observer` from now on.
    pub fn observe(&mut self, observer: impl FnMut(Progress<'_>) + Send + Sync + 'static) {
        *self.observer.lock().unwrap_or_else(|e| e.into_inner()) = Box::new(observer);
        let to = self.observer.clone();
        self.live.observe(Box::new(move |record| {
            (to.lock().unwrap_or_else(|e| e.into_inner()))(Progress::Appended(record))
        }));
    }

    /// Tells the observer of `progress`.
    fn report(&self, progress: Progress<'_>) {
        (self.observer.lock().unwrap_or_else(|e| e.into_inner()))(progress)
    }

    /// The session's state as this driver holds it: the log's, plus a short read's
    /// step (the reply that asked for it, possibly) not yet committed (see
    /// [`Self::step`]).
    pub fn state(&self) -> std::sync::MutexGuard<'_, SessionState> {
        self.live.lock()
    }

    /// The session id.
    pub fn session(&self) -> &str {
        &self.lease.session
    }

    /// Appends events (after any staged ones, in the same commit) and folds them into
    /// the state. Durable when it returns.
    async fn append(&mut self, events: Vec<Event>) -> Result<()> {
        // Messages rewritten by an elision or a compaction: the requests build them again.
        for event in &events {
            match event {
                Event::OutputsElided { before, .. } => {
                    let elided: Vec<usize> = self.live.with(|s| {
                        steadfast_log::fold::elided_messages(&s.conversation, *before).collect()
                    });
                    for i in elided {
                        self.requests.forget(i);
                    }
                }
                Event::Compacted { .. } => self.requests.forget_from(0),
                _ => {}
            }
        }
        self.live.append(&events).await?;
        Ok(())
    }

    /// Sends `request` while `intent` commits, all but its last byte, which follows
    /// once the intent is durable and the `fault` point is passed (see
    /// `steadfast_model::gate`): a failed append drops the opener and the call, and the
    /// provider never has the whole request. Returns the call, and its result if it
    /// already ended (it can only end this early by failing to reach the provider, or
    /// by the provider refusing it before reading it all).
    async fn send_after_intent(
        &mut self,
        intent: Event,
        fault: &'static str,
        request: Prepared,
        mut on_delta: impl FnMut(Delta) + Send + 'static,
    ) -> Result<(ModelCall, Option<steadfast_model::Result<ModelResponse>>)> {
        let (opener, gate) = steadfast_model::gate();
        let model = self.model.clone();
        let mut call: ModelCall =
            Box::pin(async move { model.send_gated(&request, gate, &mut on_delta).await });
        let ended = self.append_polling(vec![intent], call.as_mut()).await?;
        point(fault);
        opener.open();
        Ok((call, ended))
    }

    /// Appends `events` (see [`Self::append`]) while polling `other`, which goes on
    /// meanwhile (a request going out under its gate, a read): returns its output if
    /// it ended first.
    async fn append_polling<F: std::future::Future + ?Sized>(
        &mut self,
        events: Vec<Event>,
        other: std::pin::Pin<&mut F>,
    ) -> Result<Option<F::Output>> {
        let (appended, ended) = steadfast_model::while_polling(self.append(events), other).await;
        appended?;
        Ok(ended)
    }

    /// Commits what is staged, if anything is. Also for a graceful stop after
    /// [`Self::run`] or [`Self::step`] was dropped mid-way: what a short read's step
    /// holds for its next commit (the reply itself, possibly) goes into the log
    /// rather than being asked for again.
    pub async fn commit_staged(&mut self) -> Result<()> {
        Ok(self.live.commit_staged().await?)
    }

    /// Sends a user message, opening a turn.
    pub async fn send(&mut self, text: &str) -> Result<()> {
        let (next, status, turn) = self.live.with(|s| (s.next(), s.phase.status(), s.turn + 1));
        if next != Next::WaitForMessage {
            return Err(Error::Invalid(format!(
                "session {} is {status}; a message can only start a turn when it is idle",
                self.lease.session
            )));
        }
        self.append(vec![Event::UserMessage {
            turn,
            text: text.to_string(),
            inbox_id: None,
        }])
        .await
    }

    /// Ends the session.
    pub async fn end(&mut self, state: EndState, reason: &str) -> Result<()> {
        let diff = self.live.with(|s| self.harness.changes_since_start(s));
        self.append(vec![Event::SessionEnded {
            state,
            reason: reason.to_string(),
            diff,
        }])
        .await
    }

    /// Gives the lease back so another harness need not wait for it to lapse.
    pub async fn release(mut self) -> Result<()> {
        self.commit_staged().await?;
        self.harness.world.release_lease(&self.lease).await?;
        Ok(())
    }

    /// Works until the turn is done or the session ends.
    pub async fn run(&mut self) -> Result<Stop> {
        loop {
            // Never stopping, it returns only with a stop of the agent's own.
            if let Some(stop) = self.run_until(|| false).await? {
                return Ok(stop);
            }
        }
    }

    /// Works as [`Self::run`] does, but once `stopping()` is true it stops at the end
    /// of the step in hand (`Ok(None)`), so a stopping worker can let a model reply or
    /// a command it has paid for finish, and hand the session back between steps.
    pub async fn run_until(&mut self, stopping: impl Fn() -> bool) -> Result<Option<Stop>> {
        loop {
            if stopping() {
                return Ok(None);
            }
            if let Some(stop) = self.step().await? {
                if stop != Stop::Idle {
                    // Waiting on a human (or ended): hold no sandbox meanwhile.
                    self.journal.sandbox().discard().await;
                }
                return Ok(Some(stop));
            }
        }
    }

    /// Takes the next step at the frontier (one call, or one resolution). Returns
    /// `Some` when there is nothing left to do, with everything in the log. After
    /// `None`, a short read's outcome, and the reply that asked for it, may be held
    /// for the next step's first commit (a read done within 2 ms of its reply, or
    /// within 50 ms once the reply is in): call the next step at once, or
    /// [`Self::commit_staged`]. Dropping the driver then is a crash just after the
    /// read ran: waking runs it again, and asks for a held reply again.
    pub async fn step(&mut self) -> Result<Option<Stop>> {
        let stepped = self.step_staged().await;
        if !matches!(stepped, Ok(None)) && !self.live.is_out_of_step() {
            // Stopping (or failing): what is staged goes into the log first.
            let flushed = self.commit_staged().await;
            if stepped.is_ok() {
                flushed?;
            }
        }
        stepped
    }

    async fn step_staged(&mut self) -> Result<Option<Stop>> {
        let max_steps = self.harness.options.max_steps_per_turn;
        let breaker = self.live.with(|s| s.breaker(now_ms(), max_steps));
        if let Some((breaker, reason)) = breaker {
            self.journal.escalate(breaker, reason).await?;
            return Ok(None);
        }
        let next = self.live.with(SessionState::next);
        match next {
            Next::Ended(status) => Ok(Some(Stop::Ended(match status {
                steadfast_log::Status::Failed => EndState::Failed,
                steadfast_log::Status::Escalated => EndState::Escalated,
                steadfast_log::Status::Closed => EndState::Closed,
                _ => EndState::Completed,
            }))),
            Next::WaitForMessage => {
                // A queued message (or a steer sent after the turn ended) opens the next turn.
                let inbox = self.harness.world.inbox(&self.lease.session).await?;
                // An interrupt that came after its turn ended stops nothing; it is
                // recorded (and so taken) rather than left to stop a later turn.
                if let Some(late) = inbox.iter().find(|i| interrupt::is_interrupt(i)) {
                    let turn = self.state().turn;
                    return self
                        .interrupted(late, turn, None, false)
                        .await
                        .map(|()| None);
                }
                match inbox.into_iter().find(|i| i.kind != InboundKind::Signal) {
                    Some(item) => {
                        let turn = self.state().turn + 1;
                        self.append(vec![Event::UserMessage {
                            turn,
                            text: body_text(&item.body),
                            inbox_id: Some(item.id),
                        }])
                        .await?;
                        Ok(None)
                    }
                    None => Ok(Some(Stop::Idle)),
                }
            }
            Next::WaitForSignal(wait) => {
                let inbox = self.harness.world.inbox(&self.lease.session).await?;
                if let Some(item) = inbox.iter().find(|i| interrupt::is_interrupt(i)) {
                    // An escalated session runs nothing: the interrupt stops nothing.
                    let status = self.state().phase.status();
                    if status != steadfast_log::Status::Waiting {
                        let turn = self.state().turn;
                        return self
                            .interrupted(item, turn, None, false)
                            .await
                            .map(|()| None);
                    }
                    // Abandoning the wait: a call waiting for approval is answered first.
                    let pending = wait
                        .call_id
                        .as_ref()
                        .and_then(|id| self.state().pending_tool(id).cloned());
                    if let Some(call) = &pending {
                        let by = interrupt::sender(item);
                        self.append(vec![Event::ToolCallOutcome {
                            call_id: call.call_id.clone(),
                            is_error: true,
                            exit_code: None,
                            output: Output::Inline {
                                text: format!(
                                    "[steadfast] interrupted by {by} while waiting for {}",
                                    wait.name
                                ),
                            },
                            snapshot_after: None,
                            stored_bytes: 0,
                        }])
                        .await?;
                    }
                    let turn = self.state().turn;
                    let call = pending.map(|p| p.call_id);
                    return self
                        .interrupted(item, turn, call, true)
                        .await
                        .map(|()| None);
                }
                match inbox
                    .into_iter()
                    .find(|i| i.kind == InboundKind::Signal && i.name == wait.name)
                {
                    Some(item) => {
                        self.append(vec![Event::SignalReceived {
                            name: item.name,
                            payload: item.body,
                            inbox_id: item.id,
                        }])
                        .await?;
                        Ok(None)
                    }
                    None => Ok(Some(Stop::Waiting(wait.name))),
                }
            }
            Next::ResolveModel(pending) => {
                // The reply (if any) was lost with the process: ask again.
                self.append(vec![Event::ModelCallInterrupted {
                    call_id: pending.call_id,
                }])
                .await?;
                Ok(None)
            }
            Next::ResolveTool(pending) => {
                self.resolve_tool(pending).await?;
                Ok(None)
            }
            Next::RunTool(call) => {
                let mut batch = self.runs_at_once(None);
                match batch.len() {
                    // Not a call the journal runs as it stands: its own path.
                    0 => self.run_tool(call).await?,
                    // Admitted already: class and verdict are not worked out twice.
                    1 => {
                        let class = batch.remove(0).class;
                        self.run_tool_span(call, |d, call| d.run_journaled(call, class, false))
                            .await?;
                    }
                    _ => self.run_at_once(batch).await?,
                }
                Ok(None)
            }
            ref next @ (Next::CallModel { .. } | Next::EndTurn)
                if self.take_steer(next).await? =>
            {
                Ok(None)
            }
            Next::CallModel { step } => {
                let asked = self.harness.options.max_tokens;
                let prepared = self.prepare_call(asked);
                if !self.make_room(prepared.canonical_bytes).await? {
                    let Some(max_tokens) = self.fit_to_spend(prepared.body_len(), asked).await?
                    else {
                        return Ok(None);
                    };
                    let prepared = if max_tokens == asked {
                        prepared
                    } else {
                        self.prepare_call(max_tokens)
                    };
                    if let Some((call, class)) = self.call_model(step, prepared).await? {
                        let batch = self.runs_at_once(Some((call.clone(), class)));
                        if batch.len() > 1 {
                            self.run_at_once(batch).await?;
                        } else {
                            self.run_tool_span(call, |d, call| d.run_journaled(call, class, true))
                                .await?;
                        }
                    }
                }
                Ok(None)
            }
            Next::EndTurn => {
                let turn = self.state().turn;
                self.answer_explored().await?;
                self.append(vec![Event::TurnEnded { turn, reply: None }])
                    .await?;
                self.checkpoint_if_due().await?;
                Ok(None)
            }
        }
    }

    /// Delivers the oldest pending steer to the running turn, if there is one. Called
    /// only between calls, so the call in flight always finishes first.
    /// Also notes a pending `compact` signal, from the same read of the inbox.
    async fn take_steer(&mut self, next: &Next) -> Result<bool> {
        // Before a model call, the inbox the last append found empty need not be read
        // again: a steer sent since is taken before the next call. (Before the turn
        // ends it is read, so a steer sent just now joins this turn.)
        if matches!(next, Next::CallModel { .. })
            && !self.state().compact_asked
            && self.harness.world.inbox_seen_empty(&self.lease)
        {
            self.compact_signal = None;
            return Ok(false);
        }
        let inbox = self.harness.world.inbox(&self.lease.session).await?;
        self.compact_signal = inbox
            .iter()
            .find(|i| i.kind == InboundKind::Signal && i.name == steadfast_log::COMPACT_SIGNAL)
            .map(|i| i.id);
        let Some(item) = inbox.into_iter().find(|i| i.kind == InboundKind::Steer) else {
            return Ok(false);
        };
        self.append(vec![Event::Steered {
            text: body_text(&item.body),
            inbox_id: item.id,
        }])
        .await?;
        Ok(true)
    }

    /// The next model call's request, asking for at most `max_tokens` of output.
    fn prepare_call(&mut self, max_tokens: u32) -> Prepared {
        let tools = self.tools();
        let state = self.live.lock();
        let head = RequestHead {
            model: &state.model.model,
            system: &state.system,
            tools: &tools,
            max_tokens,
        };
        self.requests
            .prepare(&self.model, head, &state.conversation)
    }

    /// The output limit a model call of `request_bytes` asking for `asked` tokens is
    /// made with under the session's spend cap (lowered if need be), or `None` once
    /// the session is escalated instead: the call that would cross the cap is never
    /// made (see `steadfast_journal::spend`).
    async fn fit_to_spend(&mut self, request_bytes: usize, asked: u32) -> Result<Option<u32>> {
        let prices = &self.harness.options.prices;
        let fitted = self
            .live
            .with(|s| steadfast_journal::spend::fit(s, prices, request_bytes, Some(asked)));
        match fitted {
            Ok(lowered) => Ok(Some(lowered.unwrap_or(asked))),
            Err((breaker, reason)) => {
                self.journal.escalate(breaker, reason).await?;
                Ok(None)
            }
        }
    }

    /// The next request, owning its parts (for compaction; calls are built with
    /// `self.requests`).
    fn request(&self) -> ModelRequest {
        let tools = self.tools();
        let state = self.state();
        ModelRequest {
            model: state.model.model.clone(),
            system: state.system.clone(),
            messages: state.conversation.clone(),
            tools,
            max_tokens: self.harness.options.max_tokens,
        }
    }

    /// The tools the model is offered.
    fn tools(&self) -> Vec<ToolDef> {
        let state = self.state();
        tool_specs()
            .into_iter()
            .map(|t| ToolDef {
                name: t.name.to_string(),
                description: t.description.to_string(),
                input_schema: t.input_schema,
            })
            .chain(std::iter::once(approval_tool()))
            .chain(state.git.is_some().then(crate::git::push_tool))
            .chain((state.explorers > 0).then(|| crate::explore::explore_tool(state.explorers)))
            .chain(self.journal.remote_tools().iter().map(|t| ToolDef {
                name: t.name.clone(),
                description: t.description.clone(),
                input_schema: t.input_schema.clone(),
            }))
            .chain(state.client_tools.iter().map(|t| ToolDef {
                name: t.name.clone(),
                description: t.description.clone(),
                input_schema: t.input_schema.clone(),
            }))
            .collect()
    }

    /// One model call, as a span of the turn's trace. Returns the reply's first tool
    /// call when its intent went into the log with the reply (see
    /// [`Self::announced_with_reply`]): the caller runs it next.
    async fn call_model(
        &mut self,
        step: u32,
        request: Prepared,
    ) -> Result<Option<(ToolUse, ToolClass)>> {
        use tracing::Instrument;
        let span = {
            let state = self.state();
            steadfast_metrics::trace::model_call_span(
                &self.lease.session,
                state.turn,
                &state.model.provider,
                &state.model.model,
            )
        };
        self.call_model_in(step, request, span.clone())
            .instrument(span)
            .await
    }

    async fn call_model_in(
        &mut self,
        step: u32,
        request: Prepared,
        span: tracing::Span,
    ) -> Result<Option<(ToolUse, ToolClass)>> {
        if self.harness.options.prewarm_sandbox {
            let sandbox = self.journal.sandbox();
            sandbox.hydrate_to(self.state().last_snapshot.clone());
            sandbox.prewarm();
        }
        let call_id = format!("mc_{}", uuid::Uuid::now_v7().simple());
        let fingerprint = request.fingerprint.clone();
        // The request goes out while its intent commits, all but its last byte, which
        // follows once the intent is durable (see `steadfast_model::gate`): a failed
        // append drops the opener and the call, and the provider never has the whole
        // request. The reply streams into the log as it arrives (batched), so readers
        // of the log can follow it; the outcome below holds the whole reply.
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let intent = Event::ModelCallIntent {
            call_id: call_id.clone(),
            step,
            fingerprint,
        };
        let (mut call, mut ended) = self
            .send_after_intent(intent, points::MODEL_INTENT, request, move |d| {
                let _ = tx.send(d);
            })
            .await?;
        let started = std::time::Instant::now();
        let stop = interrupt::arrives_after_append(self.harness.world.clone(), &self.lease);
        tokio::pin!(stop);
        let mut pending = String::new();
        let mut last_flush = std::time::Instant::now();
        let result = loop {
            if let Some(result) = ended.take() {
                break result;
            }
            tokio::select! {
                biased;
                item = &mut stop => {
                    // The stream is dropped here; its partial reply is not kept.
                    let turn = self.state().turn;
                    return self.interrupted(&item, turn, Some(call_id), true).await.map(|()| None);
                }
                Some(delta) = rx.recv() => {
                    self.report(Progress::Delta(&delta));
                    let restart = match delta {
                        Delta::Text(text) => { pending.push_str(&text); false }
                        Delta::Restart => { pending.clear(); true }
                        Delta::ToolUse { .. } => false,
                    };
                    if restart || pending.len() >= DELTA_BATCH || last_flush.elapsed() >= DELTA_INTERVAL {
                        let text = std::mem::take(&mut pending);
                        if restart || !text.is_empty() {
                            self.append(vec![Event::ModelDelta { call_id: call_id.clone(), text, restart }]).await?;
                        }
                        last_flush = std::time::Instant::now();
                    }
                }
                result = &mut call => break result,
            }
        };
        while let Ok(delta) = rx.try_recv() {
            self.report(Progress::Delta(&delta));
            if let Delta::Text(text) = delta {
                pending.push_str(&text);
            }
        }
        // The reply's last piece goes into the log with its outcome, in one commit.
        let last_piece = (result.is_ok() && !pending.is_empty()).then(|| Event::ModelDelta {
            call_id: call_id.clone(),
            text: pending,
            restart: false,
        });
        let response = match result {
            Ok(r) => r,
            Err(e) if e.is_retryable() => return Err(e.into()), // stays pending
            Err(e) => {
                return self
                    .fail_model_call(call_id, e.to_string(), started)
                    .await
                    .map(|()| None)
            }
        };
        point(points::MODEL_EFFECT);
        let cost = pricing::cost_with(
            &self.harness.options.prices,
            &self.state().model.model,
            &response.usage,
        );
        self.count_model_call(true, Some(&response.usage), cost, started.elapsed());
        steadfast_metrics::trace::record_model_reply(
            &span,
            Some(&response.usage),
            Some(&response.stop_reason),
        );
        let announced = self.announced_with_reply(&response.content);
        let intent = announced
            .as_ref()
            .map(|(call, class)| Event::ToolCallIntent {
                call_id: call.id.clone(),
                tool: call.name.clone(),
                input: call.input.clone(),
                class: *class,
                snapshot_before: None,
            });
        let outcome = Event::ModelCallOutcome {
            call_id,
            content: response.content,
            stop_reason: response.stop_reason,
            usage: response.usage,
            cost_micro_usd: cost,
        };
        let reply: Vec<Event> = last_piece
            .into_iter()
            .chain([outcome])
            .chain(intent)
            .collect();
        match announced {
            Some((call, ToolClass::Read))
                if !self.journal.names_mcp_server(&call.name) && self.journal.sandbox().ready() =>
            {
                self.read_with_reply(reply, call).await?;
                Ok(None)
            }
            announced => {
                self.append(reply).await?;
                point(points::MODEL_OUTCOME);
                if announced.is_some() {
                    point(points::TOOL_INTENT);
                }
                Ok(announced)
            }
        }
    }

    /// Runs a read that `reply` announces at once, in the sandbox already running,
    /// the reply and the read's intent staged (see [`READ_WITH_REPLY_WITHIN`]). A read
    /// done within that bound has its outcome staged too: the whole step then commits
    /// with what comes next, usually the next model call's intent. A slower read goes
    /// on while the reply commits, and an interrupt stops it once the reply is in the
    /// log.
    async fn read_with_reply(&mut self, reply: Vec<Event>, call: ToolUse) -> Result<()> {
        for event in reply {
            self.live.stage(event).await?;
        }
        let call_id = call.id.clone();
        // Owned, so the reply can commit (and the driver be stopped gracefully, its
        // staged records committed) while the read goes on.
        let journal = self.journal.clone();
        let stop = interrupt::arrives_after_append(self.harness.world.clone(), &self.lease);
        let read = async move {
            let call = Call {
                id: call.id,
                tool: call.name,
                input: call.input,
                class: ToolClass::Read,
                announced: true,
            };
            journal.run(call, stop).await
        };
        tokio::pin!(read);
        let ran = match tokio::time::timeout(READ_WITH_REPLY_WITHIN, &mut read).await {
            Ok(ran) => ran,
            Err(_) => match self.append_polling(Vec::new(), read.as_mut()).await? {
                Some(ran) => ran,
                None => read.await,
            },
        };
        self.ran(call_id, ran?).await
    }

    /// Makes room in the conversation before the next model call when the request
    /// would pass the policy's share of the model's context window (see
    /// [`crate::compaction`]): one step, elision or a summary. Returns whether it did.
    /// `bytes`: the length of the request's canonical JSON.
    async fn make_room(&mut self, bytes: usize) -> Result<bool> {
        use crate::compaction::{estimate_tokens, over_share, plan, plan_asked, Plan};
        let policy = &self.harness.options.compaction;
        let window = policy.window_for(&self.state().model.model);
        // A `compact` signal (or one taken whose compaction a crash cut off) asks for
        // a summary now, whatever the size.
        let signal = self.compact_signal.take();
        let asked = signal.is_some() || self.state().compact_asked;
        if !asked && !over_share(policy, window, bytes) {
            return Ok(false);
        }
        let request = &self.request();
        if asked {
            if let Plan::Summarise(upto) = plan_asked(request) {
                self.summarise(request, upto, signal).await?;
                return Ok(true);
            }
        }
        match plan(policy, window, request, bytes) {
            Plan::Nothing => Ok(false),
            Plan::Elide(before) => {
                let tokens_before = estimate_tokens(request);
                let tokens_after = self.tokens_after(
                    request,
                    Event::OutputsElided {
                        before,
                        tokens_before,
                        tokens_after: 0,
                    },
                )?;
                tracing::info!(session = %self.lease.session, tokens_before, tokens_after, "eliding old tool outputs");
                self.append(vec![Event::OutputsElided {
                    before,
                    tokens_before,
                    tokens_after,
                }])
                .await?;
                Ok(true)
            }
            Plan::Summarise(upto) => {
                self.summarise(request, upto, None).await?;
                Ok(true)
            }
        }
    }

    /// Compaction's summary: a journaled model call over the older messages, whose
    /// outcome replaces them. A crash before the outcome asks it again; after, never.
    async fn summarise(
        &mut self,
        request: &ModelRequest,
        upto: u32,
        inbox_id: Option<u64>,
    ) -> Result<()> {
        use crate::compaction::{estimate_tokens, summary_request};
        let tokens_before = estimate_tokens(request);
        let call_id = format!("mc_{}", uuid::Uuid::now_v7().simple());
        tracing::info!(session = %self.lease.session, tokens_before, upto, "compacting the conversation");
        // Sent while its intent commits, its last byte held until then, as every
        // model call is (see `call_model_in`).
        let mut asked = summary_request(request, upto);
        let prepared =
            RequestBuilder::default().prepare(&self.model, asked.head(), &asked.messages);
        let Some(max_tokens) = self
            .fit_to_spend(prepared.body_len(), asked.max_tokens)
            .await?
        else {
            return Ok(());
        };
        let prepared = if max_tokens == asked.max_tokens {
            prepared
        } else {
            asked.max_tokens = max_tokens;
            RequestBuilder::default().prepare(&self.model, asked.head(), &asked.messages)
        };
        let intent = Event::CompactionIntent {
            call_id: call_id.clone(),
            upto,
            tokens_before,
            inbox_id,
        };
        let (call, ended) = self
            .send_after_intent(intent, points::COMPACTION_INTENT, prepared, |_| {})
            .await?;
        let started = std::time::Instant::now();
        let result = match ended {
            Some(result) => result,
            None => call.await,
        };
        let response = match result {
            Ok(response) => response,
            Err(e) if e.is_retryable() => return Err(e.into()), // stays pending
            Err(e) => {
                let message = format!("compacting the conversation: {e}");
                return self.fail_model_call(call_id, message, started).await;
            }
        };
        point(points::COMPACTION_EFFECT);
        let summary = response
            .content
            .iter()
            .filter_map(|b| match b {
                steadfast_log::Block::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n");
        let cost = pricing::cost_with(
            &self.harness.options.prices,
            &self.state().model.model,
            &response.usage,
        );
        self.count_model_call(true, Some(&response.usage), cost, started.elapsed());
        let tokens_after = self.tokens_after(
            request,
            Event::Compacted {
                call_id: call_id.clone(),
                summary: summary.clone(),
                tokens_after: 0,
                usage: response.usage,
                cost_micro_usd: cost,
            },
        )?;
        tracing::info!(session = %self.lease.session, tokens_before, tokens_after, "compacted");
        self.append(vec![Event::Compacted {
            call_id,
            summary,
            tokens_after,
            usage: response.usage,
            cost_micro_usd: cost,
        }])
        .await?;
        self.checkpoint_if_due().await
    }

    /// The estimated size of `request` once `event` (an elision or a compaction) is
    /// folded into the conversation: what the record says it comes to.
    fn tokens_after(&self, request: &ModelRequest, event: Event) -> Result<u64> {
        let mut after = self.live.state();
        after.apply(&Record {
            seq: after.last_seq + 1,
            epoch: 0,
            at_ms: 0,
            event,
        })?;
        Ok(crate::compaction::estimate_tokens(&ModelRequest {
            messages: after.conversation,
            ..request.clone()
        }))
    }

    /// Stores the state as a checkpoint when one is due (see
    /// [`Harness::checkpoint_if_due`]).
    async fn checkpoint_if_due(&mut self) -> Result<()> {
        let due = self
            .live
            .with(|s| self.harness.checkpoint_due(s).then(|| s.clone()));
        let Some(state) = due else {
            return Ok(());
        };
        if let Some(checkpoint) = self.harness.checkpoint_if_due(&state).await? {
            self.append(vec![checkpoint]).await?;
        }
        Ok(())
    }

    /// A model call that failed for good (a 4xx, retries exhausted) ends the session:
    /// counted, and recorded with the reason.
    async fn fail_model_call(
        &mut self,
        call_id: String,
        message: String,
        started: std::time::Instant,
    ) -> Result<()> {
        self.count_model_call(false, None, 0, started.elapsed());
        let state = self.state().clone();
        steadfast_journal::explore::ending(
            &self.harness.world,
            &self.lease.session,
            &state,
            &message,
        )
        .await?;
        self.append(vec![
            Event::ModelCallFailed {
                call_id,
                error: message.clone(),
            },
            Event::SessionEnded {
                state: EndState::Failed,
                reason: message,
                diff: Vec::new(),
            },
        ])
        .await
    }

    /// Counts an answered model call in the process's metrics.
    fn count_model_call(
        &self,
        ok: bool,
        usage: Option<&steadfast_log::Usage>,
        cost_micro_usd: u64,
        took: std::time::Duration,
    ) {
        let state = self.state();
        steadfast_metrics::metrics().model_call(steadfast_metrics::ModelCall {
            provider: &state.model.provider,
            model: &state.model.model,
            ok,
            usage,
            cost_micro_usd,
            took,
        });
    }

    /// Records an interrupt taken from the inbox.
    async fn interrupted(
        &mut self,
        item: &steadfast_world::Inbound,
        turn: u32,
        call_id: Option<String>,
        stopped: bool,
    ) -> Result<()> {
        let by = interrupt::sender(item);
        if stopped {
            tracing::info!(session = %self.lease.session, %by, "turn interrupted");
        }
        // The reply's calls that had not begun are answered as not run: none of them
        // runs in a later turn, and the model finds a result for each call it asked for.
        let not_begun = match stopped {
            true => self.live.with(|s| {
                s.queued_tools
                    .iter()
                    .filter(|t| s.pending_tool(&t.id).is_none())
                    .map(|t| t.id.clone())
                    .collect()
            }),
            false => Vec::new(),
        };
        self.append(vec![Event::TurnInterrupted {
            turn,
            by,
            inbox_id: item.id,
            call_id,
            stopped,
            not_begun,
        }])
        .await
    }

    /// One tool call, as a span of the turn's trace.
    async fn run_tool(&mut self, call: ToolUse) -> Result<()> {
        self.run_tool_span(call, |d, call| d.run_tool_in(call))
            .await
    }

    /// `run` with `call`, as a span of the turn's trace.
    async fn run_tool_span<'d, F>(
        &'d mut self,
        call: ToolUse,
        run: impl FnOnce(&'d mut Self, ToolUse) -> F,
    ) -> Result<()>
    where
        F: std::future::Future<Output = Result<()>> + 'd,
    {
        use tracing::Instrument;
        let span = steadfast_metrics::trace::tool_call_span(
            &self.lease.session,
            self.state().turn,
            &call.name,
            &call.id,
        );
        run(self, call).instrument(span).await
    }

    async fn run_tool_in(&mut self, call: ToolUse) -> Result<()> {
        if call.name == crate::explore::EXPLORE_TOOL && self.state().explorers > 0 {
            return self.explore(call).await;
        }
        if call.name == APPROVAL_TOOL {
            // The intent and the wait go in together: no crash can separate them.
            let reason = call
                .input
                .get("reason")
                .and_then(|r| r.as_str())
                .unwrap_or("")
                .to_string();
            return self
                .append(vec![
                    Event::ToolCallIntent {
                        call_id: call.id.clone(),
                        tool: call.name.clone(),
                        input: call.input.clone(),
                        class: ToolClass::Read,
                        snapshot_before: None,
                    },
                    Event::WaitStarted {
                        name: APPROVAL_SIGNAL.into(),
                        reason,
                        call_id: Some(call.id),
                        before_call: None,
                    },
                ])
                .await;
        }
        let client_tool =
            crate::client_tools::find(&self.state().client_tools, &call.name).cloned();
        if let Some(tool) = client_tool {
            // The client runs it: the intent and the wait for its result go in
            // together, and the session sleeps holding nothing until the result comes.
            let reason = format!("waiting for the client to run `{}`", tool.name);
            return self
                .append(vec![
                    Event::ToolCallIntent {
                        call_id: call.id.clone(),
                        tool: call.name.clone(),
                        input: call.input.clone(),
                        class: ToolClass::External,
                        snapshot_before: None,
                    },
                    Event::WaitStarted {
                        name: steadfast_log::tool_result_signal(&call.id),
                        reason,
                        call_id: Some(call.id),
                        before_call: None,
                    },
                ])
                .await;
        }
        let class = self.journal.class_of(&call.name, &call.input);
        match self.admission(&call, class) {
            Verdict::Allow => self.run_journaled(call, class, false).await,
            Verdict::Ask => {
                let reason = self.journal.approval_reason(&call.name, &call.input);
                self.append(vec![Event::WaitStarted {
                    name: APPROVAL_SIGNAL.into(),
                    reason,
                    call_id: None,
                    before_call: Some(call.id),
                }])
                .await
            }
            Verdict::Deny => {
                let told = steadfast_journal::denied_by_policy(&call.name);
                self.journal
                    .refuse(call.id, &call.name, &call.input, class, told)
                    .await?;
                Ok(())
            }
        }
    }

    /// An `explore` call (see [`crate::explore`]): in the parent, its explorers are
    /// made and the call waits for their answers; in an explorer, the call it was
    /// forked at answers with its task, and any other is refused.
    async fn explore(&mut self, call: ToolUse) -> Result<()> {
        use crate::explore;
        let (explorer, max, session) = {
            let s = self.state();
            (s.explorer.clone(), s.explorers, self.lease.session.clone())
        };
        if let Some(explorer) = explorer {
            let events = match explorer.call_id == call.id {
                true => explore::answered(&call, explore::brief(&explorer), false),
                false => explore::answered(
                    &call,
                    "explore: an explorer forks no explorers of its own; work on your task".into(),
                    true,
                ),
            };
            return self.append(events).await;
        }
        let tasks = match explore::tasks(&call.input, max) {
            Ok(tasks) => tasks,
            Err(why) => return self.append(explore::answered(&call, why, true)).await,
        };
        // The explorers fork at a committed position: whatever is staged goes first.
        self.commit_staged().await?;
        let at = self.state().last_seq;
        let owner = self.harness.world.session(&session).await?.owner;
        let ids = crate::fork::fork_explorers(
            &self.harness.world,
            &self.harness.blobs,
            &session,
            &owner,
            &call.id,
            tasks,
            at,
        )
        .await?;
        self.append(explore::waiting(&call, &ids)).await
    }

    /// In an explorer whose task's turn ends: its answer goes to its parent first
    /// (see [`steadfast_journal::explore::send_answer`]).
    async fn answer_explored(&self) -> Result<()> {
        let state = self.state().clone();
        if state.explorer.is_none() {
            return Ok(());
        }
        let answer = state
            .conversation
            .iter()
            .rev()
            .find(|m| m.role == steadfast_log::Role::Assistant)
            .map(|m| m.text())
            .unwrap_or_default();
        steadfast_journal::explore::send_answer(
            &self.harness.world,
            &self.lease.session,
            &state,
            &answer,
        )
        .await?;
        Ok(())
    }

    /// What the approval policy says of `call` (of `class`) before it runs.
    fn admission(&self, call: &ToolUse, class: ToolClass) -> Verdict {
        self.journal
            .admission(&call.id, &call.name, &call.input, class)
    }

    /// The first tool call of a reply with `content`, with its class, when its intent
    /// can go into the log with the reply itself: it is the next thing due, and nothing
    /// (a wait, a client, a snapshot to take) comes between. One commit fewer per step,
    /// and the intent is as durable before the call runs as ever.
    fn announced_with_reply(
        &self,
        content: &[steadfast_log::Block],
    ) -> Option<(ToolUse, ToolClass)> {
        let (call, client) = self.live.with(|s| {
            let call = s.tool_after_reply(content, now_ms())?;
            let client = crate::client_tools::find(&s.client_tools, &call.name).is_some();
            Some((call, client))
        })?;
        if call.name == APPROVAL_TOOL || call.name == crate::explore::EXPLORE_TOOL || client {
            return None;
        }
        let class = self.journal.class_of(&call.name, &call.input);
        let remote = self.journal.names_mcp_server(&call.name);
        if self.admission(&call, class) != Verdict::Allow || (class.touches_workspace() && !remote)
        {
            return None;
        }
        Some((call, class))
    }

    /// Runs a tool call through the journal (see `steadfast_journal`), its intent
    /// `announced` with the reply that asked for it or not. A sandbox first, hydrated
    /// to the last recorded snapshot if it is new, so the snapshot before the call is
    /// of the workspace it will really run on. (An MCP server's tool runs elsewhere and
    /// leaves the workspace alone: no sandbox.)
    async fn run_journaled(
        &mut self,
        call: ToolUse,
        class: ToolClass,
        announced: bool,
    ) -> Result<()> {
        if !self.journal.names_mcp_server(&call.name) {
            let sandbox = self.journal.sandbox();
            sandbox.hydrate_to(self.state().last_snapshot.clone());
            sandbox.get().await?;
        }
        let call_id = call.id.clone();
        let stop = interrupt::arrives_after_append(self.harness.world.clone(), &self.lease);
        let call = Call {
            id: call.id,
            tool: call.name,
            input: call.input,
            class,
            announced,
        };
        let ran = self.journal.run(call, stop).await?;
        self.ran(call_id, ran).await
    }

    /// The calls of the running reply that run at once: `announced` (its intent went
    /// in with the reply) and the ready calls after it, as far as each is one the
    /// journal runs as it stands, with nothing to come between (the approval tool,
    /// `explore`, a client's tool, a call the policy asks or refuses). Empty when the
    /// first ready call is not such a call: it runs alone.
    fn runs_at_once(&self, announced: Option<(ToolUse, ToolClass)>) -> Vec<Call> {
        let (ready, clients, explorers) = self.live.with(|s| {
            let names: Vec<String> = s.client_tools.iter().map(|t| t.name.clone()).collect();
            (s.ready_tools(), names, s.explorers)
        });
        let plain = |call: &ToolUse| {
            call.name != APPROVAL_TOOL
                && !(call.name == crate::explore::EXPLORE_TOOL && explorers > 0)
                && !clients.contains(&call.name)
        };
        let announced = announced.map(|(call, class)| Call {
            id: call.id,
            tool: call.name,
            input: call.input,
            class,
            announced: true,
        });
        let rest = ready.into_iter().map_while(|call| {
            let class = self.journal.class_of(&call.name, &call.input);
            (plain(&call) && self.admission(&call, class) == Verdict::Allow).then_some(Call {
                id: call.id,
                tool: call.name,
                input: call.input,
                class,
                announced: false,
            })
        });
        announced.into_iter().chain(rest).collect()
    }

    /// Runs the calls of one reply at once through the journal (see **Parallel calls**
    /// in `steadfast_journal`): reads beside everything, calls that may change the
    /// workspace in turn, each with its own outcome. One interrupt stops them all and
    /// ends the turn once every call has its outcome.
    async fn run_at_once(&mut self, batch: Vec<Call>) -> Result<()> {
        use futures_util::FutureExt;
        use tracing::Instrument;
        if batch
            .iter()
            .any(|call| !self.journal.names_mcp_server(&call.tool))
        {
            let sandbox = self.journal.sandbox();
            sandbox.hydrate_to(self.state().last_snapshot.clone());
            sandbox.get().await?;
        }
        let stop = interrupt::arrives_after_append(self.harness.world.clone(), &self.lease)
            .boxed()
            .shared();
        let turn = self.state().turn;
        let runs = batch.into_iter().map(|call| {
            let span = steadfast_metrics::trace::tool_call_span(
                &self.lease.session,
                turn,
                &call.tool,
                &call.id,
            );
            let id = call.id.clone();
            let ran = self.journal.run(call, stop.clone());
            async move { (id, ran.await) }.instrument(span)
        });
        let mut interrupted = None;
        let mut failed = None;
        for (id, ran) in futures_util::future::join_all(runs).await {
            match ran {
                Ok(Ran::Interrupted(item)) if interrupted.is_none() => {
                    interrupted = Some((id, item))
                }
                Ok(_) => {}
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        if let Some(e) = failed {
            return Err(e.into());
        }
        match interrupted {
            Some((id, item)) => self.ran(id, Ran::Interrupted(item)).await,
            None => Ok(()),
        }
    }

    /// What follows a journaled call: after an interrupt, the turn's end.
    async fn ran(&mut self, call_id: String, ran: Ran) -> Result<()> {
        match ran {
            Ran::Done { .. } | Ran::SandboxDied { .. } => Ok(()),
            Ran::Interrupted(item) => {
                let turn = self.state().turn;
                self.interrupted(&item, turn, Some(call_id), true).await
            }
        }
    }

    /// Invariant 4 for a tool call cut off by a crash (one resolution for every agent:
    /// [`steadfast_sandbox::reconcile::resolve`]). The workspace has already been
    /// restored to the last recorded snapshot by `wake`, which for a pending call is
    /// the snapshot taken just before it.
    async fn resolve_tool(&mut self, pending: PendingTool) -> Result<()> {
        // A call seen sending out of the sandbox is an external effect, whatever it
        // was classed as when it began: never rolled back and run again.
        let class = pending.effective_class();
        if self.adopted {
            // Its command may still run in the adopted sandbox: then it is waited for
            // and its outcome recorded, whole, as if no crash had come between.
            let call = Call {
                id: pending.call_id.clone(),
                tool: pending.tool.clone(),
                input: pending.input.clone(),
                class,
                announced: true,
            };
            let stop = interrupt::arrives_after_append(self.harness.world.clone(), &self.lease);
            if let Some(ran) = self.journal.reattach(call, stop).await? {
                return self.ran(pending.call_id, ran).await;
            }
        }
        let sandbox = self.journal.sandbox();
        if class == ToolClass::Mutate {
            if let Some(snapshot) = &pending.snapshot_before {
                // A sandbox first: starting one reaps what the dead driver's left
                // running (a local sandbox's orphans), which would otherwise go on
                // writing into the workspace rolled back here.
                sandbox.hydrate_to(Some(snapshot.clone()));
                sandbox.get().await?;
                self.harness
                    .drive
                    .restore_async(sandbox.workspace(), snapshot)
                    .await?;
                self.report(Progress::Restored(snapshot));
            }
        }
        // Probes (a reconciler's, `git_push`'s) run on the last recorded workspace.
        sandbox.hydrate_to(self.state().last_snapshot.clone());
        let cut = CutOff {
            call_id: pending.call_id.clone(),
            tool: pending.tool.clone(),
            input: pending.input.clone(),
            class,
            snapshot_before: pending.snapshot_before.clone(),
        };
        let reconcilers = self.harness.options.reconcilers.clone();
        self.journal
            .resolve(&cut, pending.snapshot_before, &reconcilers)
            .await?;
        Ok(())
    }

    /// Whether a sandbox is running for this session now.
    pub async fn has_sandbox(&self) -> bool {
        self.journal.sandbox().is_running().await
    }
}

/// A model call on its way (see [`Driver::send_after_intent`]).
type ModelCall = std::pin::Pin<
    Box<dyn std::future::Future<Output = steadfast_model::Result<ModelResponse>> + Send>,
>;
