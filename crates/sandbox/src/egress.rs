//! Effects observed, not guessed (docs/ARCHITECTURE.md rule 11): what the egress proxy
//! sees a sandbox's commands open, recorded against the tool calls running before the
//! first byte leaves, and judged by the session's approval policy.
//!
//! The proxy is the only way out of an isolating sandbox under an allow-list, and the
//! harness runs it. So whether a call had an external effect need not be guessed from
//! its command text: a call that opened a connection had one. Before the proxy opens a
//! connection it asks the session's [`EgressDesk`], which records an
//! [`Event::Egress`] naming the calls running then (every one may have opened it:
//! calls of one reply may run at once in one sandbox) and only then lets it through.
//! From that record on, a call cut off by a crash is *outcome unknown* rather than
//! rolled back and run again, and the same call is classed external when it is made
//! again. Under an approval policy each connection of a call not yet approved is
//! judged by where it goes ([`Judge`]): let through, held back for a person (refused
//! now, the record says so, and when the call is made again it waits for approval
//! first), or denied outright (refused, and no one is asked).
//!
//! A connection opened while no call runs (a server a command left running in the
//! background) is let through unrecorded: there is no call to charge it to, and the
//! network policy allows it.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use steadfast_log::{Event, Verdict};

use crate::proxy::{EgressAttempt, EgressWatch};

/// Appends an event to the session's log; `true` once it is durable.
pub type RecordEgress =
    Arc<dyn Fn(Event) -> Pin<Box<dyn Future<Output = bool> + Send>> + Send + Sync>;

/// The approval policy's verdict on one connection of one call, by its destination
/// (`host:port`).
pub type Judge = Arc<dyn Fn(&str) -> Verdict + Send + Sync>;

/// What a call under an approval policy is told when its connection is held back.
pub const HELD_BACK: &str = "held back: under this session's approval policy a person approves \
an external effect before anything leaves the sandbox, and nothing was sent; made again, this \
call waits for that approval first";

/// What a call is told when the approval policy denies its connection.
pub const DENIED_BY_POLICY: &str = "denied: this session's approval policy does not let \
commands reach this destination, and nothing was sent";

/// The tool calls running in one session's sandbox, and the one place a connection
/// the egress proxy would open is decided on and recorded.
#[derive(Default)]
pub struct EgressDesk {
    calls: Mutex<Vec<RunningCall>>,
}

struct RunningCall {
    id: String,
    /// How its connections are judged (`None`: all let through).
    judge: Option<Judge>,
    /// Destinations already recorded for it.
    seen: Vec<String>,
}

/// A call counted as running until dropped.
#[must_use = "the call counts as running only while this is held"]
pub struct Running {
    desk: Arc<EgressDesk>,
    id: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.desk.lock().retain(|c| c.id != self.id);
    }
}

impl EgressDesk {
    /// A desk with no call running.
    pub fn new() -> Arc<Self> {
        Arc::new(EgressDesk::default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<RunningCall>> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The watch to give a sandbox's proxy (in its options): each connection it would
    /// open is decided here, and recorded with `record` first. Served by a task that
    /// ends once every copy of the watch is gone.
    pub fn watch(self: &Arc<Self>, record: RecordEgress) -> EgressWatch {
        let (watch, mut attempts) = tokio::sync::mpsc::channel::<EgressAttempt>(16);
        let desk = self.clone();
        tokio::spawn(async move {
            while let Some(attempt) = attempts.recv().await {
                let answer = desk.decide(&record, &attempt.destination).await;
                let _ = attempt.reply.send(answer);
            }
        });
        watch
    }

    /// Counts the call `id` as running in the sandbox until the guard drops; `judge`
    /// decides on each connection opened meanwhile (`None`: all let through).
    pub fn running(self: &Arc<Self>, id: &str, judge: Option<Judge>) -> Running {
        self.lock().push(RunningCall {
            id: id.to_string(),
            judge,
            seen: Vec::new(),
        });
        Running {
            desk: self.clone(),
            id: id.to_string(),
        }
    }

    /// Decides on one connection to `destination`, recording it first.
    async fn decide(&self, record: &RecordEgress, destination: &str) -> Result<(), String> {
        let (call_ids, verdict) = {
            let mut calls = self.lock();
            if calls.is_empty() {
                return Ok(());
            }
            // Every running call may have opened it: the strictest verdict stands.
            let verdict = calls
                .iter()
                .filter_map(|c| c.judge.as_ref().map(|judge| judge(destination)))
                .max()
                .unwrap_or(Verdict::Allow);
            if verdict == Verdict::Allow
                && calls
                    .iter()
                    .all(|c| c.seen.iter().any(|d| d == destination))
            {
                return Ok(());
            }
            for call in calls.iter_mut() {
                call.seen.push(destination.to_string());
            }
            (calls.iter().map(|c| c.id.clone()).collect(), verdict)
        };
        let recorded = record(Event::Egress {
            call_ids,
            destination: destination.to_string(),
            admitted: verdict == Verdict::Allow,
            denied: verdict == Verdict::Deny,
        })
        .await;
        if !recorded {
            return Err(
                "the harness could not record this connection in the session's log, so it was not opened"
                    .into(),
            );
        }
        match verdict {
            Verdict::Allow => Ok(()),
            Verdict::Ask => Err(HELD_BACK.into()),
            Verdict::Deny => Err(DENIED_BY_POLICY.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorder() -> (RecordEgress, Arc<Mutex<Vec<Event>>>) {
        let log = Arc::new(Mutex::new(Vec::new()));
        let kept = log.clone();
        let record: RecordEgress = Arc::new(move |event| {
            kept.lock().unwrap().push(event);
            Box::pin(async { true })
        });
        (record, log)
    }

    async fn ask(watch: &EgressWatch, destination: &str) -> Result<(), String> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        watch
            .send(EgressAttempt {
                destination: destination.into(),
                reply,
            })
            .await
            .unwrap();
        answer.await.unwrap()
    }

    #[tokio::test]
    async fn a_connection_is_recorded_against_every_running_call_once_before_it_opens() {
        let desk = EgressDesk::new();
        let (record, log) = recorder();
        let watch = desk.watch(record);

        // Nothing running: let through, nothing to record.
        ask(&watch, "example.com:443").await.unwrap();
        assert!(log.lock().unwrap().is_empty());

        let a = desk.running("a", None);
        let b = desk.running("b", None);
        ask(&watch, "example.com:443").await.unwrap();
        ask(&watch, "example.com:443").await.unwrap();
        drop(b);
        ask(&watch, "pypi.org:443").await.unwrap();
        drop(a);
        ask(&watch, "pypi.org:443").await.unwrap();
        let log = log.lock().unwrap();
        assert_eq!(log.len(), 2, "{log:?}");
        assert!(
            matches!(&log[0], Event::Egress { call_ids, destination, admitted: true, .. }
            if call_ids == &["a", "b"] && destination == "example.com:443")
        );
        assert!(
            matches!(&log[1], Event::Egress { call_ids, admitted: true, .. } if call_ids == &["a"])
        );
    }

    #[tokio::test]
    async fn a_held_call_gets_nothing_through_and_the_refusal_is_recorded() {
        let desk = EgressDesk::new();
        let (record, log) = recorder();
        let watch = desk.watch(record);
        let judge: Judge = Arc::new(|destination| match destination {
            "pypi.org:443" => Verdict::Allow,
            "evil.test:443" => Verdict::Deny,
            _ => Verdict::Ask,
        });
        let _held = desk.running("a", Some(judge));
        let _free = desk.running("b", None);
        let why = ask(&watch, "hooks.example.com:443").await.unwrap_err();
        assert_eq!(why, HELD_BACK);
        assert_eq!(
            ask(&watch, "evil.test:443").await.unwrap_err(),
            DENIED_BY_POLICY
        );
        ask(&watch, "pypi.org:443").await.unwrap();
        let log = log.lock().unwrap();
        assert!(
            matches!(
                &log[..],
                [
                    Event::Egress {
                        admitted: false,
                        denied: false,
                        ..
                    },
                    Event::Egress {
                        admitted: false,
                        denied: true,
                        ..
                    },
                    Event::Egress {
                        admitted: true,
                        denied: false,
                        ..
                    },
                ]
            ),
            "{log:?}"
        );
    }

    #[tokio::test]
    async fn a_connection_that_cannot_be_recorded_is_not_opened() {
        let desk = EgressDesk::new();
        let record: RecordEgress = Arc::new(|_| Box::pin(async { false }));
        let watch = desk.watch(record);
        let _a = desk.running("a", None);
        assert!(ask(&watch, "example.com:443").await.is_err());
    }
}
