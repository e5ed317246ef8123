//! A person's shell in a session's sandbox, over a WebSocket: `GET
//! /v1/sessions/{id}/shell`, the session's owner's (a token that may run it).
//!
//! Between turns the shell may write: the session's lease is kept for the person
//! (a visitors' hold; a message sent meanwhile waits), and what they change is
//! recorded in the log as `human_shell` when they leave, and every few minutes while
//! they stay, and told to the model with its next turn. While a turn runs the shell is
//! read-only (confined by the kernel, see `steadfast_sandbox::shell`) unless the owner
//! forces it (`?force=true`), which interrupts the turn first.
//!
//! **The protocol.** Binary messages from the client are keystrokes; text messages are
//! JSON: `{"type": "resize", "rows": R, "cols": C}`, `{"type": "input", "data": "…"}`
//! for clients that send text only, and `{"type": "detach"}` to leave (the shell is
//! recorded, and `exit` sent, before the socket closes). Binary messages to the client are what the
//! terminal shows; text messages are JSON notices: `attached` (with the `mode`) first,
//! `recorded` (with `changes`) after a record taken while attached, `leave` (with the
//! `reason`) when the session's holder needs the shell gone, and `exit` (with the
//! shell's `code` and the `changes` recorded) last.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::Deserialize;
use steadfast_harness::reach::{Reachable, ShellMoment};
use steadfast_sandbox::shell::{Frame, ShellRequest, WindowSize};
use steadfast_world::World;
use tokio::io::AsyncWriteExt;
use utoipa::IntoParams;

use super::previews::{no_public, reach};
use super::{owned, Shared};
use crate::error::ApiError;
use crate::wire;

/// How often a writable shell's changes are recorded while the person stays.
const RECORD_EVERY: Duration = Duration::from_secs(180);

/// The most rows or columns a terminal may ask for.
const MAX_CELLS: u16 = 1000;

/// The shell's terminal, and whether to take the sandbox from a running turn.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct ShellQuery {
    /// Terminal rows (24 if not given).
    rows: Option<u16>,
    /// Terminal columns (80 if not given).
    cols: Option<u16>,
    /// The terminal type, `TERM` (`xterm-256color` if not given).
    term: Option<String>,
    /// While a turn runs: interrupt it and open a writable shell, rather than a
    /// read-only one.
    force: Option<bool>,
    /// Whether the shell edits lines itself (default true). A client that types a
    /// script rather than keys sends `false`: Ctrl-D at a line's start then ends the
    /// shell's input.
    editing: Option<bool>,
}

/// Attach a shell to a session's sandbox
///
/// A WebSocket carrying an interactive shell on a PTY in the session's sandbox, with
/// its isolation and no credentials (see the module's doc for the messages). Between
/// turns the shell may write, and what the person changes is recorded (`human_shell`)
/// and told to the model with its next turn; while a turn runs it is read-only unless
/// `force=true` interrupts the turn first. A session with no running sandbox has one
/// started for it. Needs a token that may run the session.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/shell",
    operation_id = "attach_shell",
    params(("id" = String, Path, description = "The session's id"), ShellQuery),
    responses(
        (status = 101, description = "The WebSocket is open; the shell runs"),
        (status = 400, description = "The path or query does not parse", body = wire::Error),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 403, description = "Public mode, or a token that may not run the session", body = wire::Error),
        (status = 404, description = "No such session, or not the caller's", body = wire::Error),
        (status = 409, description = "The session has ended, or its sandbox gives no shell (the `local` backend)", body = wire::Error),
        (status = 422, description = "A terminal size out of range", body = wire::Error),
        (status = 426, description = "Not a WebSocket request", body = wire::Error),
        (status = 503, description = "The sandbox could not be started here now, or a forced turn did not stop in time", body = wire::Error),
    )
)]
pub(crate) async fn attach<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    query: Result<Query<ShellQuery>, axum::extract::rejection::QueryRejection>,
    upgrade: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let owner = state.owner(&headers, steadfast_world::Scope::Run).await?;
    no_public(&state)?;
    owned(&state, &id, &owner).await?;
    let Query(query) = query.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_query",
            format!("rows, cols, term, force, editing: {}", e.body_text()),
        )
    })?;
    let size = WindowSize {
        rows: cells("rows", query.rows, 24)?,
        cols: cells("cols", query.cols, 80)?,
    };
    let upgrade = upgrade.map_err(|e| {
        ApiError::new(
            StatusCode::UPGRADE_REQUIRED,
            "upgrade_required",
            format!("a shell is a WebSocket: {e}"),
        )
    })?;
    let mut sandbox = reach(&state, &id, None, &owner).await?;
    if sandbox.serves_a_turn() && query.force == Some(true) {
        sandbox = take_from_turn(&state, &id, &owner).await?;
    }
    let person = match sandbox.serves_a_turn() {
        true => None,
        false => sandbox.person_in(),
    };
    let read_only = person.is_none();
    let request = ShellRequest {
        size,
        term: query.term,
        read_only,
        line_editing: query.editing.unwrap_or(true),
    };
    let since_ms = steadfast_world::now_ms();
    if person.is_some() {
        // In the log before the first key: a holder that dies with the shell leaves
        // it open there, and the next to wake the session records what it changed.
        sandbox
            .record_person(&owner, since_ms, ShellMoment::Opened)
            .await
            .map_err(shell_error)?;
    }
    let pipe = match sandbox.shell(request).await {
        Ok(pipe) => pipe,
        Err(e) => {
            if person.is_some() {
                let _ = sandbox
                    .record_person(&owner, since_ms, ShellMoment::Left)
                    .await;
            }
            return Err(shell_error(e));
        }
    };
    let mode = if read_only { "read-only" } else { "read-write" };
    state
        .audit(
            &owner,
            "shell.attached",
            &id,
            serde_json::json!({ "mode": mode }),
        )
        .await;
    tracing::info!(session = %id, by = %owner, mode, "a person attached a shell");
    let attached = Attached {
        session: id,
        by: owner,
        since_ms,
        mode,
        sandbox,
        person,
    };
    // Keys and resizes are small; a message past what the agent takes in one frame
    // ends the connection rather than reach it.
    let upgrade = upgrade
        .max_message_size(steadfast_sandbox::shell::MAX_FRAME as usize)
        .max_frame_size(steadfast_sandbox::shell::MAX_FRAME as usize);
    Ok(upgrade.on_upgrade(move |socket| async move {
        let gauge = steadfast_metrics::metrics().shell_opened(mode);
        attached.run(socket, pipe, &state).await;
        drop(gauge);
    }))
}

/// A terminal dimension asked for, in range.
fn cells(field: &str, asked: Option<u16>, default: u16) -> Result<u16, ApiError> {
    match asked {
        None => Ok(default),
        Some(n) if (1..=MAX_CELLS).contains(&n) => Ok(n),
        Some(n) => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
            format!("{field}: {n} is not between 1 and {MAX_CELLS}"),
        )),
    }
}

/// Interrupts `id`'s turn (by `owner`) and waits for the visitors' hold that follows
/// it, within the wait a close gives a turn.
async fn take_from_turn<W: World + Clone>(
    state: &Shared<W>,
    id: &str,
    owner: &str,
) -> Result<Arc<dyn Reachable>, ApiError> {
    state.harness.interrupt(id, owner).await?;
    let deadline = tokio::time::Instant::now() + steadfast_harness::STOP_WAIT;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        match reach(state, id, None, owner).await {
            Ok(sandbox) if !sandbox.serves_a_turn() => return Ok(sandbox),
            Ok(_) | Err(_) if tokio::time::Instant::now() < deadline => {}
            Ok(_) => {
                return Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "turn_running",
                    format!(
                        "session {id}'s turn did not stop within {:?}; attach read-only, or \
                         try again",
                        steadfast_harness::STOP_WAIT
                    ),
                ))
            }
            Err(e) => return Err(e),
        }
    }
}

/// A failure starting the shell, as the caller is told it.
fn shell_error(e: steadfast_harness::JournalError) -> ApiError {
    match e {
        steadfast_harness::JournalError::Sandbox(steadfast_sandbox::Error::Refused(why)) => {
            ApiError::new(StatusCode::CONFLICT, "no_shell", why)
        }
        steadfast_harness::JournalError::Sandbox(e) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "sandbox_unavailable",
            e.to_string(),
        ),
        steadfast_harness::JournalError::World(e) => e.into(),
        other => ApiError::internal(other),
    }
}

/// A shell attached: who, since when, and what keeps it (the sandbox it runs in, and
/// for a writable one the count that keeps the session's lease for the person).
struct Attached {
    session: String,
    by: String,
    since_ms: u64,
    mode: &'static str,
    sandbox: Arc<dyn Reachable>,
    person: Option<steadfast_harness::reach::PersonIn>,
}

/// How a shell's connection ended.
enum Ended {
    /// The shell exited with this code.
    Exited(i32),
    /// The person closed the connection.
    Left,
    /// The session's holder asked the person to leave.
    Asked,
}

impl Attached {
    /// Carries the shell between `socket` and `pipe` until either ends, recording a
    /// writable shell's changes as it goes and at the end.
    async fn run<W: World + Clone>(
        self,
        mut socket: WebSocket,
        pipe: steadfast_harness::reach::Pipe,
        state: &Shared<W>,
    ) {
        let _ = notice(
            &mut socket,
            serde_json::json!({"type": "attached", "mode": self.mode}),
        )
        .await;
        let ended = self.pump(&mut socket, pipe).await;
        let changes = match self.person.is_some() {
            true => self.record(ShellMoment::Left).await,
            false => Vec::new(),
        };
        // Recorded first: the hold gives the lease back only once the record is in.
        drop(self.person);
        let (code, why) = match ended {
            Ended::Exited(code) => (Some(code), "exited"),
            Ended::Left => (None, "left"),
            Ended::Asked => (None, "asked to leave"),
        };
        let detail = serde_json::json!({
            "mode": self.mode, "ended": why, "exit_code": code, "changes": changes.len(),
        });
        state
            .audit(&self.by, "shell.detached", &self.session, detail)
            .await;
        tracing::info!(session = %self.session, by = %self.by, ended = why, changed = changes.len(), "a person's shell ended");
        let exit = serde_json::json!({"type": "exit", "code": code, "changes": changes});
        let _ = notice(&mut socket, exit).await;
        let _ = socket.send(Message::Close(None)).await;
    }

    /// Carries bytes both ways until the shell ends, the person leaves, or they are
    /// asked to.
    async fn pump(&self, socket: &mut WebSocket, pipe: steadfast_harness::reach::Pipe) -> Ended {
        let (mut from_shell, mut to_shell) = tokio::io::split(pipe);
        let mut every = tokio::time::interval(RECORD_EVERY);
        every.tick().await;
        let asked = self.sandbox.asked_to_leave();
        tokio::pin!(asked);
        loop {
            tokio::select! {
                frame = Frame::read(&mut from_shell) => match frame {
                    Ok(Some(Frame::Output(bytes))) => {
                        if socket.send(Message::Binary(bytes.into())).await.is_err() {
                            return Ended::Left;
                        }
                    }
                    Ok(Some(Frame::Exit(code))) => return Ended::Exited(code),
                    // The sandbox went (or its agent sent what only a host sends).
                    Ok(_) | Err(_) => return Ended::Exited(-1),
                },
                message = socket.recv() => {
                    let Some(Ok(message)) = message else { return Ended::Left };
                    let frame = match message {
                        Message::Binary(bytes) => Some(Frame::Input(bytes.to_vec())),
                        Message::Text(text) => match control(text.as_str()) {
                            Some(Control::Detach) => return Ended::Left,
                            Some(Control::Resize { rows, cols }) => Some(Frame::Resize(WindowSize {
                                rows: rows.clamp(1, MAX_CELLS),
                                cols: cols.clamp(1, MAX_CELLS),
                            })),
                            Some(Control::Input { data }) => Some(Frame::Input(data.into_bytes())),
                            None => None,
                        },
                        Message::Close(_) => return Ended::Left,
                        Message::Ping(_) | Message::Pong(_) => None,
                    };
                    if let Some(frame) = frame {
                        if to_shell.write_all(&frame.encode()).await.is_err() {
                            return Ended::Exited(-1);
                        }
                    }
                }
                _ = every.tick(), if self.person.is_some() => {
                    let changes = self.record(ShellMoment::Staying).await;
                    if !changes.is_empty() {
                        let recorded = serde_json::json!({"type": "recorded", "changes": changes});
                        let _ = notice(socket, recorded).await;
                    }
                }
                _ = &mut asked, if self.person.is_some() => {
                    let leave = serde_json::json!({
                        "type": "leave",
                        "reason": "the session is needed (closed, deleted or rewound): your \
                                   shell is recorded and closed",
                    });
                    let _ = notice(socket, leave).await;
                    return Ended::Asked;
                }
            }
        }
    }

    /// Records what the person changed (see `Journal::record_person`); a failure is
    /// logged, and the changes stay in the workspace for the next record to find.
    async fn record(&self, moment: ShellMoment) -> Vec<String> {
        match self
            .sandbox
            .record_person(&self.by, self.since_ms, moment)
            .await
        {
            Ok(changes) => changes,
            Err(e) => {
                tracing::warn!(session = %self.session, error = %e, "a person's shell could not be recorded");
                Vec::new()
            }
        }
    }
}

/// What a client's text message asks for.
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Control {
    /// The terminal's new size.
    Resize { rows: u16, cols: u16 },
    /// Text typed.
    Input { data: String },
    /// The person leaves: the shell is recorded and ended, and an `exit` notice sent
    /// before the socket closes.
    Detach,
}

/// A client's text message, if it is one of [`Control`]'s.
fn control(text: &str) -> Option<Control> {
    serde_json::from_str(text).ok()
}

async fn notice(socket: &mut WebSocket, body: serde_json::Value) -> Result<(), axum::Error> {
    socket.send(Message::Text(body.to_string().into())).await
}
