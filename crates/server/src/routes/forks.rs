//! Forking a session (new sessions whose history is the parent's up to a position
//! and whose workspace is the snapshot recorded there) and rewinding one in place.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use serde::Deserialize;
use steadfast_harness::{ForkRequest, MAX_FORKS};
use steadfast_world::World;
use utoipa::ToSchema;

use super::{owned, Shared};
use crate::error::ApiError;
use crate::extract::Body;
use crate::wire;

/// How to fork a session (`POST /v1/sessions/{id}/fork`); every field is optional.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"at": 42, "count": 3, "title": "try another way"}))]
pub(crate) struct ForkSession {
    /// The parent's last log position the forks share, from 1 (`session_started`);
    /// default: its latest committed one. A position inside a turn is welcome: the
    /// fork carries the turn on from there.
    #[serde(default)]
    at: Option<u64>,
    /// How many forks to make, 1 to 32 (default 1).
    #[serde(default)]
    count: Option<u32>,
    /// The forks' title (default: the parent's).
    #[serde(default)]
    title: Option<String>,
    /// The model the forks speak to, `provider/model` (default: the parent's).
    #[serde(default)]
    model: Option<String>,
    /// Bounds for the forks: each field given replaces the parent's, within the
    /// operator's ceilings (over one: 403 `over_ceiling`); the rest are the parent's.
    /// Spend and turns so far are the parent's history, and count.
    #[serde(default)]
    budget: Option<super::sessions::Budget>,
}

/// Fork a session at any position
///
/// Makes new sessions of the caller's whose history is this one's up to `at` (shared,
/// not copied: a fork costs the same at any length of history and any size of
/// workspace) and whose workspace is the snapshot recorded at `at` — uncommitted
/// and untracked files, `.git`, symlinks, all of it — materialized by whichever worker
/// drives the fork. The parent is not disturbed, even while it runs. A fork of an
/// ended session is idle and takes messages; a fork inside a turn is running and a
/// worker carries the turn on, resolving calls cut off at the fork point as after a
/// crash. Deleting the parent never breaks a fork.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/fork",
    params(("id" = String, Path, description = "The session to fork")),
    request_body = ForkSession,
    responses(
        (status = 201, description = "The forks, made", body = wire::Forks),
        (status = 400, description = "The body is not JSON", body = wire::Error),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 403, description = "A bound in `budget` is over the operator's ceiling (`over_ceiling`, naming it)", body = wire::Error),
        (status = 404, description = "No such session, or not the caller's", body = wire::Error),
        (status = 415, description = "The body is not `application/json`", body = wire::Error),
        (status = 422, description = "`at` outside the log, `count` out of range, a title, model or bound refused (the message names the field)", body = wire::Error),
        (status = 429, description = "Too many sessions made a minute by this caller", body = wire::Error),
    )
)]
pub(crate) async fn fork<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Body(req): Body<ForkSession>,
) -> Result<(StatusCode, Json<wire::Forks>), ApiError> {
    let owner = state.owner(&headers, steadfast_world::Scope::Run).await?;
    owned(&state, &id, &owner).await?;
    let invalid = |m: String| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_body", m);
    let count = req.count.unwrap_or(1);
    if !(1..=MAX_FORKS).contains(&count) {
        return Err(invalid(format!(
            "count: between 1 and {MAX_FORKS} forks at once, not {count}"
        )));
    }
    steadfast_world::SessionPatch {
        title: req.title.clone(),
        ..Default::default()
    }
    .check()
    .map_err(invalid)?;
    let limits = match &req.budget {
        Some(budget) => {
            let asked = budget.limits().map_err(invalid)?;
            if let Some(refusal) = crate::bounds::refuse_over(&asked, &state.ceilings(), "budget.")
            {
                return Err(refusal);
            }
            Some(asked)
        }
        None => None,
    };
    for _ in 0..count {
        state.creation_allowed(&owner).await?;
    }
    let request = ForkRequest {
        parent: id.clone(),
        at: req.at,
        count,
        owner: owner.clone(),
        title: req.title,
        model: req.model,
        limits,
        agent: None,
        instructions: None,
        held: false,
        explorer: None,
    };
    let made = state.harness.fork(&request).await?;
    state
        .audit(
            &owner,
            "session.forked",
            &id,
            serde_json::json!({"at": made.first().and_then(|s| s.forked_at), "forks": made.iter().map(|s| &s.id).collect::<Vec<_>>()}),
        )
        .await;
    Ok((
        StatusCode::CREATED,
        Json(wire::Forks {
            sessions: made.into_iter().map(Into::into).collect(),
        }),
    ))
}

/// Where to rewind a session to (`POST /v1/sessions/{id}/rewind`).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"to": 42}))]
pub(crate) struct RewindSession {
    /// The last log position the session keeps: a turn's end (a `turn_ended` or
    /// `turn_interrupted` event) or 1, its start.
    to: u64,
}

/// Rewind a session to an earlier turn's end
///
/// The session carries on from `to`: its workspace is put back to the snapshot
/// recorded there and the model's next context is the history up to there. Nothing is
/// deleted: the events after `to` are set aside, readable whole as `branch` (a fork
/// taken at the session's last event, like any other); the event stream goes on with a
/// `rewound` event (positions only move forward, so a reader's cursor stays valid).
/// External effects among the events set aside (a push, a request out) cannot be
/// undone: they are listed as `facts`, and the model is told of them with the next
/// message. A running turn is interrupted first.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/rewind",
    params(("id" = String, Path, description = "The session to rewind")),
    request_body = RewindSession,
    responses(
        (status = 200, description = "Rewound", body = wire::Rewound),
        (status = 400, description = "The body is not JSON", body = wire::Error),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 404, description = "No such session, or not the caller's", body = wire::Error),
        (status = 409, description = "The session is busy and could not be stopped", body = wire::Error),
        (status = 415, description = "The body is not `application/json`", body = wire::Error),
        (status = 422, description = "`to` outside the log or inside a turn", body = wire::Error),
        (status = 429, description = "Too many sessions made a minute by this caller (a rewind makes one: the branch)", body = wire::Error),
    )
)]
pub(crate) async fn rewind<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Body(req): Body<RewindSession>,
) -> Result<Json<wire::Rewound>, ApiError> {
    let owner = state.owner(&headers, steadfast_world::Scope::Run).await?;
    owned(&state, &id, &owner).await?;
    state.creation_allowed(&owner).await?;
    let report = state.harness.rewind(&id, req.to, &owner).await?;
    state
        .audit(
            &owner,
            "session.rewound",
            &id,
            serde_json::json!({"to": report.to, "branch": report.branch, "facts": report.facts.len()}),
        )
        .await;
    Ok(Json(wire::Rewound {
        id,
        to: report.to,
        branch: report.branch,
        facts: report.facts,
        status: report.status,
    }))
}

/// Which agent a wrapped session runs from its next turn (`POST /v1/sessions/{id}/agent`).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ChangeAgent {
    /// An adapter at a version (`claude-code@2.1.332`), or a named agent.
    agent: String,
}

/// Move a wrapped session to another CLI version or named agent
///
/// Between turns only: its next turn runs that CLI, on a worker that has it installed
/// (one without it leaves the session to another). Recorded in its log as an
/// `agent_changed` event. Try the change on the session's recorded turns first with
/// `steadfast replay --agent`.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/agent",
    params(("id" = String, Path, description = "The wrapped session")),
    request_body = ChangeAgent,
    responses(
        (status = 200, description = "Changed (or already so)", body = wire::AgentChanged),
        (status = 400, description = "The body is not JSON", body = wire::Error),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 404, description = "No such session, or not the caller's", body = wire::Error),
        (status = 415, description = "The body is not `application/json`", body = wire::Error),
        (status = 422, description = "`agent` unknown, not a version, not installed on this server, unable to speak the session's model; a native session; a turn in progress", body = wire::Error),
    )
)]
pub(crate) async fn change_agent<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Body(req): Body<ChangeAgent>,
) -> Result<Json<wire::AgentChanged>, ApiError> {
    let owner = state.owner(&headers, steadfast_world::Scope::Run).await?;
    owned(&state, &id, &owner).await?;
    // As at creation: an agent this server cannot run is refused before anything.
    state.harness.check_agent(&req.agent).map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_body",
            format!("agent: {e}"),
        )
    })?;
    let (agent, cli) = state.harness.change_agent(&id, &req.agent).await?;
    state
        .audit(
            &owner,
            "session.agent_changed",
            &id,
            serde_json::json!({"agent": agent, "cli": cli}),
        )
        .await;
    Ok(Json(wire::AgentChanged { id, agent, cli }))
}
