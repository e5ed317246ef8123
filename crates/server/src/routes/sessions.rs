//! Creating, listing, showing, closing and deleting sessions.

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use steadfast_harness::NewSession;
use steadfast_world::World;

use super::{owned, Shared};
use crate::auth::AuthMode;
use crate::error::ApiError;
use crate::extract::Body;

/// `POST /v1/sessions`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateSession {
    /// The agent: `native`, a wrapped CLI (`claude-code`, `codex`, `pi`) or a name
    /// from `[[agents.named]]` (see `GET /v1/agents`).
    #[serde(default)]
    agent: Option<String>,
    /// `provider/model`.
    #[serde(default)]
    model: Option<String>,
    /// Where the workspace comes from.
    #[serde(default)]
    workspace: Option<WorkspaceSource>,
    /// Spend limits.
    #[serde(default)]
    budget: Option<Budget>,
    /// Pause for approval before external-effect tool calls.
    #[serde(default)]
    approve_external: bool,
    /// The sandbox's network: `deny-all`, `allow:host[:port],...` or (not on public
    /// servers) `open`.
    #[serde(default)]
    network: Option<String>,
    /// A first message, starting work at once.
    #[serde(default)]
    task: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
enum WorkspaceSource {
    /// An empty directory, optionally seeded with files.
    Empty {
        #[serde(default)]
        files: BTreeMap<String, String>,
    },
    /// The bundled demo project.
    Demo,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Budget {
    #[serde(default)]
    max_cost_usd: Option<f64>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_turns: Option<u32>,
    #[serde(default)]
    max_duration_s: Option<u64>,
}

pub(crate) async fn create<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Body(req): Body<CreateSession>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let owner = state.auth.owner(&headers)?;
    let invalid = |m: String| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_body", m);
    let agent = req.agent.unwrap_or_else(|| "native".into());
    // Checked before anything is made: an agent that cannot run here leaves nothing.
    state
        .harness
        .check_agent(&agent)
        .map_err(|e| invalid(format!("agent: {e}")))?;
    let mut asked = steadfast_log::Limits::default();
    if let Some(b) = req.budget {
        asked.max_cost_micro_usd = match b.max_cost_usd {
            Some(usd) if !usd.is_finite() || usd <= 0.0 => {
                return Err(invalid("budget.max_cost_usd: must be positive".into()))
            }
            Some(usd) => Some((usd * 1e6).round() as u64),
            None => None,
        };
        if b.max_tokens == Some(0) || b.max_turns == Some(0) || b.max_duration_s == Some(0) {
            return Err(invalid(
                "budget: max_tokens, max_turns and max_duration_s must be positive".into(),
            ));
        }
        asked.max_tokens = b.max_tokens;
        asked.max_turns = b.max_turns;
        asked.max_duration_ms = b.max_duration_s.map(|s| s.saturating_mul(1000));
    }
    let ceilings = state.ceilings();
    if let Some(refusal) = crate::bounds::refuse_over(&asked, &ceilings, "budget.") {
        return Err(refusal);
    }
    let limits = asked.or_ceilings(&ceilings);
    if let Some(policy) = &req.network {
        let parsed = steadfast_sandbox::NetworkPolicy::parse(policy)
            .map_err(|e| invalid(format!("network: {e}")))?;
        if parsed == steadfast_sandbox::NetworkPolicy::Open
            && matches!(state.auth.mode, AuthMode::Public { .. })
        {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "network: `open` is not available on this server",
            ));
        }
    }
    let named_model = state
        .harness
        .options()
        .agents
        .named_agent(&agent)
        .and_then(|a| a.model.clone());
    let model = req
        .model
        .or(named_model)
        .unwrap_or_else(|| state.default_model.clone());
    steadfast_harness::parse_model(&model).map_err(|e| invalid(format!("model: {e}")))?;
    // A native session calls its model from the harness: one it cannot call (unknown
    // provider, no key) is refused now rather than failing on every wake.
    if agent == "native" {
        state
            .harness
            .check_model(&model)
            .map_err(|e| invalid(format!("model: {e}")))?;
    }

    let files = match req.workspace.unwrap_or(WorkspaceSource::Empty {
        files: BTreeMap::new(),
    }) {
        WorkspaceSource::Demo => None,
        WorkspaceSource::Empty { files } => {
            check_file_names(&files).map_err(invalid)?;
            Some(files)
        }
    };
    let dir = state
        .workspaces
        .join(format!("ws_{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(&dir).map_err(ApiError::internal)?;
    // From here on, a refusal takes the directory with it: nothing is left behind.
    let made = MadeWorkspace(Some(dir.clone()));
    let root = dir.canonicalize().map_err(ApiError::internal)?;
    match files {
        None => steadfast_testkit::demo::write_project(&root).map_err(ApiError::internal)?,
        Some(files) => {
            for (path, content) in files {
                let target = steadfast_sandbox::confine(&root, &path)
                    .map_err(|e| invalid(format!("workspace.files: {e}")))?;
                let unwritable = |e: std::io::Error| {
                    invalid(format!("workspace.files: `{path}` cannot be written: {e}"))
                };
                if let Some(parent) = target.parent() {
                    std::fs::create_dir_all(parent).map_err(unwritable)?;
                }
                std::fs::write(&target, content).map_err(unwritable)?;
            }
        }
    }
    let mut new = NewSession::native(&model, &root);
    new.agent = agent;
    new.owner = owner;
    new.task = req.task;
    new.budget_micro_usd = limits.max_cost_micro_usd;
    new.limits = limits;
    new.approve_external = req.approve_external;
    new.network = req.network;
    let id = state.harness.start_session(new).await?;
    made.keep();
    let summary = state.harness.world().session(&id).await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"id": id, "status": summary.status, "model": model, "workspace": root})),
    ))
}

/// A workspace directory made for a session being created: removed when dropped
/// unless [`MadeWorkspace::keep`] was called (the session exists).
struct MadeWorkspace(Option<std::path::PathBuf>);

impl MadeWorkspace {
    fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for MadeWorkspace {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The longest name of one path component, and of a whole path, a seeded file may have.
const MAX_NAME: usize = 255;
const MAX_PATH: usize = 4096;

/// Refuses seeded file names that no filesystem takes (a NUL, an over-long name) and
/// sets of names where one file would have to be another's directory.
fn check_file_names(files: &BTreeMap<String, String>) -> Result<(), String> {
    for path in files.keys() {
        if path.is_empty() || path.contains('\0') {
            return Err(format!(
                "workspace.files: `{}` is not a file name",
                path.escape_debug()
            ));
        }
        if path.len() > MAX_PATH || path.split('/').any(|part| part.len() > MAX_NAME) {
            return Err(format!(
                "workspace.files: a name is longer than {MAX_NAME} bytes a component or {MAX_PATH} in all"
            ));
        }
        let mut prefix = String::new();
        for part in path.split('/').filter(|p| !p.is_empty()) {
            if !prefix.is_empty() && files.contains_key(&prefix) {
                return Err(format!(
                    "workspace.files: `{prefix}` is a file, so `{path}` cannot be inside it"
                ));
            }
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(part);
        }
    }
    Ok(())
}

pub(crate) async fn list<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let owner = state.auth.owner(&headers)?;
    if matches!(state.auth.mode, AuthMode::Public { .. }) {
        // In public mode a session id is the capability: there is no listing.
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "listing sessions is disabled in public mode",
        ));
    }
    let sessions: Vec<_> = state
        .harness
        .world()
        .list_sessions()
        .await?
        .into_iter()
        .filter(|s| s.owner == owner)
        .collect();
    Ok(Json(json!({"sessions": sessions})))
}

pub(crate) async fn show<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let owner = state.auth.owner(&headers)?;
    let summary = owned(&state, &id, &owner).await?;
    let s = state.harness.state(&id).await?;
    let status = match &s.retry {
        Some(_) => "retrying".to_string(),
        None => s.status.to_string(),
    };
    Ok(Json(json!({
        "id": id,
        "status": status,
        "retry": s.retry.as_ref().map(|r| json!({
            "attempt": r.attempt,
            "reason": r.reason,
            "next_attempt_at_ms": r.at_ms,
        })),
        "title": summary.title,
        "model": s.model.to_string(),
        "turn": s.turn,
        "last_seq": s.last_seq,
        "waiting_for": s.waiting.as_ref().map(|w| &w.name),
        "waiting_since": s.waiting.as_ref().map(|w| w.seq),
        "waiting_reason": s.waiting.as_ref().map(|w| &w.reason),
        "end_reason": s.end_reason,
        "usage": s.usage,
        "cost_usd": s.cost_micro_usd as f64 / 1e6,
        "priced": state.harness.is_priced(&s.model),
        "budget_usd": s.limits.max_cost_micro_usd.map(|b| b as f64 / 1e6),
        "limits": s.limits,
        "escalated_by": s.escalated,
        "network": s.network,
        "reply": s.last_reply(),
        "created_at_ms": summary.created_at_ms,
        "updated_at_ms": summary.updated_at_ms,
    })))
}

/// `POST /v1/sessions/{id}/interrupt`: stops the running turn, wherever its driver
/// runs: a model stream is cut, a command killed; the session goes idle.
pub(crate) async fn interrupt<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let owner = state.auth.owner(&headers)?;
    let summary = owned(&state, &id, &owner).await?;
    if !matches!(summary.status.as_str(), "running" | "waiting" | "retrying") {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_running",
            format!(
                "session {id} is {}: no turn runs, so there is nothing to interrupt",
                summary.status
            ),
        ));
    }
    let inbox_id = state.harness.interrupt(&id, &owner).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"id": inbox_id, "session": id, "by": owner})),
    ))
}

pub(crate) async fn close<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let owner = state.auth.owner(&headers)?;
    owned(&state, &id, &owner).await?;
    state.harness.close_session(&id, &owner).await?;
    Ok(Json(json!({"id": id, "status": "completed"})))
}

pub(crate) async fn delete<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let owner = state.auth.owner(&headers)?;
    owned(&state, &id, &owner).await?;
    let s = state.harness.delete_session(&id, &owner).await?;
    // The workspace goes too if the server made it; its snapshot objects are shared
    // by content and reclaimed by garbage collection.
    let ws = std::path::Path::new(&s.workspace);
    if let Ok(root) = state.workspaces.canonicalize() {
        if ws.starts_with(&root) && ws != root {
            let _ = std::fs::remove_dir_all(ws);
        }
    }
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DiffQuery {
    from: Option<u64>,
    to: Option<u64>,
}

/// `GET /v1/sessions/{id}/diff?from=N&to=M`: what the session changed in its
/// workspace between two log positions (default: since it began), with the text of
/// each change.
pub(crate) async fn diff<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    query: Result<axum::extract::Query<DiffQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let owner = state.auth.owner(&headers)?;
    owned(&state, &id, &owner).await?;
    let axum::extract::Query(q) = query.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_query",
            format!("from, to: {}", e.body_text()),
        )
    })?;
    let diff = state.harness.diff(&id, q.from, q.to).await?;
    Ok(Json(serde_json::to_value(diff).unwrap_or_default()))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AtQuery {
    at: Option<u64>,
}

type AtQueryResult =
    Result<axum::extract::Query<AtQuery>, axum::extract::rejection::QueryRejection>;

fn at_query(query: AtQueryResult) -> Result<Option<u64>, ApiError> {
    let axum::extract::Query(q) = query.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_query",
            format!("at: {}", e.body_text()),
        )
    })?;
    Ok(q.at)
}

/// `GET /v1/sessions/{id}/files?at=N`: every path of the session's workspace as it
/// was at log position N (default: now), from its snapshot.
pub(crate) async fn files<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    query: AtQueryResult,
) -> Result<Json<Value>, ApiError> {
    let owner = state.auth.owner(&headers)?;
    owned(&state, &id, &owner).await?;
    let listing = state.harness.files(&id, at_query(query)?).await?;
    Ok(Json(serde_json::to_value(listing).unwrap_or_default()))
}

/// `GET /v1/sessions/{id}/files/{path}?at=N`: one file's bytes as they were at log
/// position N (default: now).
pub(crate) async fn file<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path((id, path)): Path<(String, String)>,
    query: AtQueryResult,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let owner = state.auth.owner(&headers)?;
    owned(&state, &id, &owner).await?;
    let bytes = state.harness.file(&id, &path, at_query(query)?).await?;
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/octet-stream")],
        bytes,
    )
        .into_response())
}

/// `GET /v1/sessions/{id}/integrity`: reads the session's whole log (each record's
/// checksum is verified on the way) and every blob it refers to, and names each
/// record whose blob is missing or corrupt, by position.
pub(crate) async fn integrity<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let owner = state.auth.owner(&headers)?;
    owned(&state, &id, &owner).await?;
    let records = state.harness.world().read(&id, 1).await?;
    let damaged = state.harness.blobs().damaged(&records).await;
    Ok(Json(json!({
        "ok": damaged.is_empty(),
        "records": records.len(),
        "damaged": damaged,
    })))
}

/// `GET /v1/agents`: the agents sessions can name, and whether each can run here.
pub(crate) async fn agents<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    state.auth.owner(&headers)?;
    Ok(Json(json!({"agents": state.harness.agents()})))
}
