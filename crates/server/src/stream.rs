//! Session event streams: the log as server-sent events, ids = log positions.
//!
//! Every record becomes one default (`message`) event, so a browser's
//! `EventSource.onmessage` sees them all: `id` = its position, `data` = the record's
//! public event ([`crate::public`]: its kind in `type`, never storage internals). A model call cut off by a crash (or a dropped provider
//! connection) becomes `{"type": "restart", "text": ...}`, carrying the text the client
//! should show in place of the turn's text so far; a log that cannot be read becomes
//! `{"type": "error", ...}`, and so does a failure the log records (a model call that
//! failed for good, a worker that could not drive the session: `error.code` is
//! `failed`, or `retrying` with the next attempt's time). Only the close is named (`event: end`). The frames are a
//! pure function of the log, so every client, whenever and wherever it connects, sees
//! the same bytes.

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::Event as SseEvent;
use futures_util::stream::{self, Stream, StreamExt};
use steadfast_log::{Block, Event, Record, Status};
use steadfast_world::{InboundKind, World};

use crate::public::{self, ErrorCode, EventBody, PublicEvent, StreamError};

/// When a stream ends (with an `end` event). A wait for a signal (an approval, a
/// client tool's result, a named signal) is part of its turn: the stream stays open
/// through it, so a client sees the answer and what follows, unless it asked to stop
/// there ([`Until::Quiet`] with `at_wait`). An escalation, which stops the turn for a
/// human, ends it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Until {
    /// When no turn is running and nothing is queued to start one; with `at_wait`,
    /// also when the turn waits for a signal.
    Quiet {
        /// End at a wait too.
        at_wait: bool,
    },
    /// When the turn that took this inbox entry is over.
    Taken(u64),
    /// Only when the session ends: a watcher's view of everything it does.
    Ended,
}

/// What the stream knows of the session from the records it has passed.
#[derive(Default)]
struct Tracker {
    turn_text: String,
    /// The session's status after the records passed (`None` before the first).
    status: Option<Status>,
    /// Whether a record ended the session (an escalated one may or may not have).
    ended: bool,
    seen_inbox: Vec<u64>,
    /// A wrapped agent's exchanges in the open turn: index, and whether answered (an
    /// intent at an index still unanswered asks again for a reply a crash cut off).
    exchanges: std::collections::BTreeMap<u32, bool>,
    /// Each exchange attempt's index, and the text it has streamed so far.
    exchange_calls: std::collections::HashMap<String, (u32, String)>,
    /// The text of each answered exchange of the open turn, by index (what a diverged
    /// replay keeps of the turn's text: the exchanges before the divergence).
    answered: std::collections::BTreeMap<u32, String>,
}

impl Tracker {
    fn observe(&mut self, record: &Record) {
        if let Some(status) = Status::after(&record.event) {
            self.status = Some(status);
        }
        match &record.event {
            Event::UserMessage { inbox_id, .. } => {
                self.turn_text.clear();
                self.exchanges.clear();
                self.exchange_calls.clear();
                self.answered.clear();
                self.seen_inbox.extend(inbox_id);
            }
            Event::Steered { inbox_id, .. } => self.seen_inbox.push(*inbox_id),
            Event::SignalReceived { inbox_id, .. } => self.seen_inbox.push(*inbox_id),
            Event::SessionEnded { .. } => self.ended = true,
            Event::ExchangeIntent { index, call_id, .. } => {
                self.exchanges.insert(*index, false);
                self.exchange_calls
                    .insert(call_id.clone(), (*index, String::new()));
            }
            Event::ModelDelta {
                call_id,
                text,
                restart: false,
            } => {
                if let Some((_, streamed)) = self.exchange_calls.get_mut(call_id) {
                    streamed.push_str(text);
                }
            }
            Event::ExchangeOutcome { call_id, .. } => {
                if let Some((index, streamed)) = self.exchange_calls.remove(call_id) {
                    self.exchanges.insert(index, true);
                    self.answered.insert(index, streamed.clone());
                    if !streamed.is_empty() {
                        if !self.turn_text.is_empty() {
                            self.turn_text.push('\n');
                        }
                        self.turn_text.push_str(&streamed);
                    }
                }
            }
            Event::ReplayDiverged { index, .. } => {
                // The exchanges from `index` on are superseded: asked again, they
                // stream again, and the turn's text is what came before.
                self.exchanges.retain(|i, _| i < index);
                self.answered.retain(|i, _| i < index);
                self.turn_text = self.text_before(*index);
            }
            Event::ModelCallOutcome { content, .. } => {
                for block in content {
                    if let Block::Text { text } = block {
                        if !self.turn_text.is_empty() {
                            self.turn_text.push('\n');
                        }
                        self.turn_text.push_str(text);
                    }
                }
            }
            _ => {}
        }
    }

    /// The open turn's answered exchanges' text before exchange `index`.
    fn text_before(&self, index: u32) -> String {
        let kept: Vec<&str> = self
            .answered
            .range(..index)
            .map(|(_, text)| text.as_str())
            .filter(|text| !text.is_empty())
            .collect();
        kept.join("\n")
    }

    fn frame(&self, record: &Record) -> SseEvent {
        let data = serde_json::to_string(&self.data(record)).expect("events serialize");
        SseEvent::default().id(record.seq.to_string()).data(data)
    }

    /// What a client is sent for `record`, seen after the records observed so far.
    fn data(&self, record: &Record) -> PublicEvent {
        let restart = matches!(
            record.event,
            Event::ModelCallInterrupted { .. } | Event::ModelDelta { restart: true, .. }
        ) || matches!(&record.event, Event::ExchangeIntent { index, .. }
                if self.exchanges.get(index) == Some(&false));
        if let Event::ReplayDiverged { index, .. } = &record.event {
            // A client drops what it showed of the superseded exchanges.
            PublicEvent {
                seq: record.seq,
                at_ms: record.at_ms,
                body: EventBody::Restart {
                    text: self.text_before(*index),
                },
            }
        } else if restart {
            PublicEvent {
                seq: record.seq,
                at_ms: record.at_ms,
                body: EventBody::Restart {
                    text: self.turn_text.clone(),
                },
            }
        } else if let Some(error) = public::error(&record.event) {
            PublicEvent {
                seq: record.seq,
                at_ms: record.at_ms,
                body: error,
            }
        } else {
            public::event(record)
        }
    }
}

/// One page of `session`'s events after position `after`: at most `limit`, exactly
/// as the event stream sends them, and whether more follow.
pub(crate) async fn page<W: World>(
    world: &W,
    session: &str,
    after: u64,
    limit: usize,
) -> steadfast_world::Result<(Vec<PublicEvent>, bool)> {
    let from = world.turn_began(session, after).await?.max(1);
    let records = world.read(session, from).await?;
    let mut tracker = Tracker::default();
    let mut events = Vec::new();
    for record in &records {
        if record.seq > after {
            if events.len() == limit {
                return Ok((events, true));
            }
            events.push(tracker.data(record));
        }
        tracker.observe(record);
    }
    Ok((events, false))
}

struct State<W> {
    world: W,
    session: String,
    cursor: u64,
    until: Until,
    tracker: Tracker,
    changes: tokio::sync::watch::Receiver<u64>,
    /// Where the next read starts: first the beginning of the turn open at the
    /// cursor (the tracker learns the turn's state from there), then after the cursor.
    from: u64,
    done: bool,
}

const POLL: Duration = Duration::from_millis(250);

/// The events of `session` after position `cursor`, then the live tail, ending as
/// `until` says.
pub(crate) fn events<W: World + Clone>(
    world: W,
    session: String,
    cursor: u64,
    until: Until,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let state = State {
        changes: world.changes(),
        world,
        session,
        cursor,
        until,
        tracker: Tracker::default(),
        from: 0,
        done: false,
    };
    stream::unfold(state, |mut s| async move {
        if s.done {
            return None;
        }
        let batch = s.next_batch().await;
        Some((batch, s))
    })
    .flat_map(|batch| stream::iter(batch.into_iter().map(Ok)))
}

impl<W: World + Clone> State<W> {
    async fn next_batch(&mut self) -> Vec<SseEvent> {
        loop {
            let read = async {
                if self.from == 0 {
                    self.from = self
                        .world
                        .turn_began(&self.session, self.cursor)
                        .await?
                        .max(1);
                }
                self.world.read(&self.session, self.from).await
            };
            let records = match read.await {
                Ok(r) => r,
                Err(e) => {
                    self.done = true;
                    let unreadable = PublicEvent {
                        seq: self.cursor,
                        at_ms: steadfast_world::now_ms(),
                        body: EventBody::Error {
                            error: StreamError {
                                code: ErrorCode::LogUnreadable,
                                message: e.to_string(),
                                attempt: None,
                                next_attempt_at_ms: None,
                            },
                            call_id: None,
                        },
                    };
                    let data = serde_json::to_string(&unreadable).expect("events serialize");
                    return vec![SseEvent::default().data(data)];
                }
            };
            let mut out = Vec::new();
            for record in &records {
                // The frame comes first: a restart shows the turn's text before it.
                if record.seq > self.cursor {
                    out.push(self.tracker.frame(record));
                    self.cursor = record.seq;
                }
                self.tracker.observe(record);
            }
            self.from = self.cursor + 1;
            if self.finished().await {
                self.done = true;
                out.push(SseEvent::default().event("end").data("{}"));
                return out;
            }
            if !out.is_empty() {
                return out;
            }
            tokio::select! {
                _ = self.changes.changed() => {}
                _ = tokio::time::sleep(POLL) => {}
            }
        }
    }

    async fn finished(&self) -> bool {
        let t = &self.tracker;
        if t.ended {
            return true;
        }
        let ends_at_wait = matches!(self.until, Until::Quiet { at_wait: true });
        match t.status {
            Some(Status::Running) => return false,
            Some(Status::Waiting) if !ends_at_wait => return false,
            _ => {}
        }
        match self.until {
            Until::Ended => false,
            Until::Taken(id) => t.seen_inbox.contains(&id),
            Until::Quiet { .. } => match self.world.inbox(&self.session).await {
                Ok(inbox) => !inbox.iter().any(|i| i.kind != InboundKind::Signal),
                Err(_) => true,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(seq: u64, event: Event) -> Record {
        Record {
            seq,
            epoch: 1,
            at_ms: seq,
            event,
        }
    }

    fn exchange(seq: u64, index: u32, text: &str) -> Vec<Record> {
        let call_id = format!("gx_{seq}");
        vec![
            record(
                seq,
                Event::ExchangeIntent {
                    call_id: call_id.clone(),
                    index,
                    api: steadfast_log::Api::AnthropicMessages,
                    fingerprint: String::new(),
                    stream: true,
                    snapshot: None,
                    request: None,
                },
            ),
            record(
                seq + 1,
                Event::ModelDelta {
                    call_id: call_id.clone(),
                    text: text.into(),
                    restart: false,
                },
            ),
            record(
                seq + 2,
                Event::ExchangeOutcome {
                    call_id,
                    status: 200,
                    content_type: "text/event-stream".into(),
                    body: String::new(),
                    usage: None,
                    cost_micro_usd: 0,
                },
            ),
        ]
    }

    /// After a diverged replay the stream says to show only the text from before the
    /// divergence, so the superseded replies, streamed again, are not shown twice.
    #[test]
    fn a_diverged_replay_restarts_the_text_from_before_it() {
        let mut log = vec![record(
            1,
            Event::UserMessage {
                turn: 1,
                text: "go".into(),
                inbox_id: None,
            },
        )];
        log.extend(exchange(2, 0, "first"));
        log.extend(exchange(5, 1, "second"));
        log.push(record(
            8,
            Event::ReplayDiverged {
                index: 1,
                snapshot: None,
            },
        ));
        log.extend(exchange(9, 1, "second, again"));
        log.extend(exchange(12, 2, "third"));
        let mut tracker = Tracker::default();
        let mut frames = Vec::new();
        for r in &log {
            frames.push(serde_json::to_value(tracker.data(r)).unwrap());
            tracker.observe(r);
        }
        let restarts: Vec<&serde_json::Value> =
            frames.iter().filter(|f| f["type"] == "restart").collect();
        assert_eq!(restarts.len(), 1, "{frames:?}");
        assert_eq!(restarts[0]["seq"], 8);
        assert_eq!(restarts[0]["text"], "first");
        assert_eq!(tracker.turn_text, "first\nsecond, again\nthird");
    }
}
