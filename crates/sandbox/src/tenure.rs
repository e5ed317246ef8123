//! The host's side of sandboxes that outlive their holder (the agent's side is in
//! [`crate::agent`]): how long a holder vouches for its lease, the note beside each run
//! directory that says whose a sandbox is, and the connection that keeps renewing it.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::agent::{self, Request};
use crate::ToolOutput;

/// How much longer a holder's lease is surely held: what its heartbeat knows. A
/// sandbox that outlives its holder is told this again and again, and ends itself when
/// it runs out unrenewed.
#[derive(Clone)]
pub struct Hold(Arc<dyn Fn() -> Duration + Send + Sync>);

impl Hold {
    /// A hold that asks `remaining` each time.
    pub fn new(remaining: impl Fn() -> Duration + Send + Sync + 'static) -> Self {
        Hold(Arc::new(remaining))
    }

    /// How much longer the lease is surely held.
    pub fn remaining(&self) -> Duration {
        (self.0)()
    }
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Hold({:?})", self.remaining())
    }
}

/// How often a holder renews its hold on a sandbox.
const RENEW_EVERY: Duration = Duration::from_millis(250);
/// How long a control request to an agent may take.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(5);

/// Whose a sandbox is, as noted beside its run directory (`<run>.holds`): the session,
/// the lease epoch, the workspace, and whether it outlives its holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Holds {
    pub session: String,
    pub epoch: u64,
    pub root: String,
    pub outlives: bool,
}

impl Holds {
    /// Reads the note of run directory `run`.
    pub fn read(run: &Path) -> Option<Holds> {
        let text = std::fs::read_to_string(holds_file(run)).ok()?;
        let mut lines = text.lines();
        Some(Holds {
            session: lines.next()?.to_string(),
            epoch: lines.next()?.parse().ok()?,
            root: lines.next()?.to_string(),
            outlives: lines.next() == Some("outlives"),
        })
    }

    /// Writes it (whole, in one rename, so a reader never sees half).
    pub fn write(&self, run: &Path) {
        let text = format!(
            "{}\n{}\n{}\n{}",
            self.session,
            self.epoch,
            self.root,
            if self.outlives { "outlives" } else { "dies" }
        );
        let path = holds_file(run);
        // Beside it too, so that a process killed between the two steps leaves
        // nothing the reaper does not know.
        let tmp = path.with_extension("holds-new");
        if std::fs::write(&tmp, text).is_ok() {
            let _ = std::fs::rename(&tmp, &path);
        }
    }
}

/// Where a run directory's note is kept: beside it (its PID is too), not in it, where
/// the sandbox's commands could change it.
pub(crate) fn holds_file(run: &Path) -> PathBuf {
    run.with_extension("holds")
}

/// Sends one control request to the agent at `socket` and reads its reply, blocking
/// for at most [`CONTROL_TIMEOUT`]. `None`: the agent did not answer.
pub(crate) fn control(socket: &Path, request: &Request) -> Option<ToolOutput> {
    let mut stream = UnixStream::connect(socket).ok()?;
    stream.set_read_timeout(Some(CONTROL_TIMEOUT)).ok()?;
    stream.set_write_timeout(Some(CONTROL_TIMEOUT)).ok()?;
    let mut body = serde_json::to_vec(request).ok()?;
    body.push(b'\n');
    stream.write_all(&body).ok()?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).ok()?;
    serde_json::from_str(&line).ok()
}

/// Makes `lease`'s epoch the newest of the agent at `socket`, which may then live
/// `grace` before its new holder renews the hold. Returns the calls it keeps, or
/// `None` when it refused (a newer holder adopted it already) or did not answer.
pub(crate) fn adopt(socket: &Path, lease: &(String, u64), grace: Duration) -> Option<Vec<String>> {
    let request = Request::new(
        agent::ADOPT,
        serde_json::json!({ "hold_ms": grace.as_millis() as u64 }),
        Some(lease.clone()),
    );
    let reply = control(socket, &request)?;
    if reply.is_error {
        tracing::debug!(reply = %reply.text, "a sandbox refused to be adopted");
        return None;
    }
    serde_json::from_str(&reply.text).ok()
}

/// Keeps renewing a hold on one sandbox until dropped: a thread with an open `hold`
/// connection to its agent, writing how long the lease is surely held.
#[derive(Debug)]
pub(crate) struct Holding {
    stop: Arc<AtomicBool>,
}

impl Holding {
    /// Starts holding the sandbox whose agent is at `socket` under `lease`.
    pub fn start(socket: &Path, lease: (String, u64), hold: Hold) -> std::io::Result<Self> {
        let mut stream = UnixStream::connect(socket)?;
        stream.set_write_timeout(Some(CONTROL_TIMEOUT))?;
        let mut body = serde_json::to_vec(&Request::new(
            agent::HOLD,
            serde_json::Value::Null,
            Some(lease),
        ))
        .map_err(std::io::Error::other)?;
        body.push(b'\n');
        stream.write_all(&body)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::Builder::new()
            .name("steadfast-sandbox-hold".into())
            .spawn(move || {
                while !stopped.load(Ordering::Relaxed) {
                    let ms = hold.remaining().as_millis() as u64;
                    if writeln!(stream, "{ms}").is_err() {
                        break;
                    }
                    std::thread::sleep(RENEW_EVERY);
                }
            })?;
        Ok(Holding { stop })
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
