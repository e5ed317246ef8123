//! Reaching a session's sandbox from outside its tool calls: what its programs listen
//! on, a pipe to one of them (a preview URL's traffic), and a person's shell.
//!
//! A journal holds the session's one sandbox slot, so a visitor goes through the
//! journal too: a sandbox it finds stopped is started again exactly as a tool call
//! would start it, hydrated to the log's snapshot with the session's services started
//! again (and recorded). Every live journal is found here by its session, whichever
//! agent's driver made it; none is found once it is closed or dropped.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::Result;

/// A future a [`Reachable`] returns (the trait is used behind `dyn`).
pub type Reached<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// A session's sandbox as a visitor sees it.
pub trait Reachable: Send + Sync {
    /// The ports programs in the sandbox listen on (starting the sandbox if it stopped).
    fn ports(&self) -> Reached<'_, Vec<u16>>;
    /// A pipe to `port` in the sandbox (starting the sandbox if it stopped).
    fn connect(&self, port: u16) -> Reached<'_, Pipe>;
    /// Whether the run this serves goes on (a closed one refuses visitors).
    fn is_open(&self) -> bool;
    /// Whether this is a driver's, serving a turn (a person's shell is then
    /// read-only), rather than a visitors' hold's.
    fn serves_a_turn(&self) -> bool;
    /// A person's shell in the sandbox (starting the sandbox if it stopped).
    fn shell(&self, request: steadfast_sandbox::shell::ShellRequest) -> Reached<'_, Pipe>;
    /// Counts a person in a writable shell while the guard lives; `None` where no
    /// shell may write (a driver's: see [`Reachable::serves_a_turn`]).
    fn person_in(&self) -> Option<PersonIn>;
    /// Completes once whoever holds the session asks people to leave.
    fn asked_to_leave(&self) -> Reached<'_, ()>;
    /// Records what a person changed (see `Journal::record_person`).
    fn record_person<'a>(
        &'a self,
        by: &'a str,
        since_ms: u64,
        moment: ShellMoment,
    ) -> Reached<'a, Vec<String>>;
}

/// A byte pipe into a sandbox that keeps the sandbox from being stopped as idle while
/// it is open: a preview's connection counts as use.
pub struct Pipe {
    stream: tokio::net::UnixStream,
    _keeps: Box<dyn std::any::Any + Send + Sync>,
}

impl Pipe {
    /// `stream`, keeping `sandbox` (a handle whose count the idle stop reads) alive.
    pub fn new(stream: tokio::net::UnixStream, sandbox: impl std::any::Any + Send + Sync) -> Self {
        Pipe {
            stream,
            _keeps: Box::new(sandbox),
        }
    }
}

impl AsyncRead for Pipe {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Pipe {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// The live journals of this process, by session.
static LIVE: LazyLock<Mutex<HashMap<String, Weak<dyn Reachable>>>> = LazyLock::new(Mutex::default);

/// Makes `journal` the one a visitor of `session` reaches, while it lives.
pub fn register(session: &str, journal: Weak<dyn Reachable>) {
    let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    live.retain(|_, j| j.strong_count() > 0);
    live.insert(session.to_string(), journal);
}

/// The live journal of `session` in this process, if any.
pub fn find(session: &str) -> Option<Arc<dyn Reachable>> {
    let live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    live.get(session)
        .and_then(Weak::upgrade)
        .filter(|journal| journal.is_open())
}

/// When a person's shell is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShellMoment {
    /// It has just opened: recorded always, so a holder that dies with it leaves a
    /// record saying a person was in (the next to wake the session records the rest).
    Opened,
    /// The person stays: recorded only if something changed.
    Staying,
    /// The person has left: recorded always.
    Left,
}

/// A person counted as in the sandbox while this lives (see `Journal::person_in`).
pub struct PersonIn(Arc<tokio::sync::watch::Sender<usize>>);

impl PersonIn {
    /// Counts one more person on `count` until the guard drops.
    pub(crate) fn new(count: Arc<tokio::sync::watch::Sender<usize>>) -> Self {
        PersonIn(count)
    }
}

impl Drop for PersonIn {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}
