//! Inbound hooks: the owner makes a URL for one session and name, a third party posts
//! to it, and the delivery answers the session's wait or starts a turn — without the
//! owner's token ever leaving the owner.
//!
//! A delivery is checked ([`crate::hook_check`]) before anything of it is used, taken
//! once (the world refuses a replayed delivery id on every API host), and lands in the
//! session's log as the signal or message it became; the audit log and `/metrics`
//! count it.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use steadfast_world::{Hook, HookCheck, HookSecret, HookThen, InboundKind, World};
use utoipa::{IntoParams, ToSchema};

use super::{owned, Shared};
use crate::auth::AuthMode;
use crate::error::ApiError;
use crate::extract::Body;
use crate::hook_check::{self, Key, Refused};
use crate::wire;

/// The largest delivery a hook takes: GitHub's larger events fit, a flood does not.
pub(crate) const MAX_DELIVERY: usize = 1024 * 1024;

/// The most hooks one session has.
const MAX_HOOKS: usize = 32;

/// How long a delivery's id is remembered: longer than any sender redelivers (GitHub
/// offers redelivery for three days) and far past a signed time's [`hook_check::SKEW`].
const REMEMBERED_MS: u64 = 7 * 24 * 3600 * 1000;

/// The longest text a `message` hook makes (a message's own limit).
const MAX_MESSAGE: usize = 64 * 1024;

/// A hook to make.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "ci", "check": "github", "then": "signal"}))]
pub(crate) struct CreateHook {
    /// Its name: the signal a delivery sends, the last segment of its URL (letters,
    /// digits, `- _ .`, at most 128).
    name: String,
    /// How a delivery is checked (default `token`: a secret in the URL; the signing
    /// checks need the server's vault key, which seals their key).
    #[serde(default = "default_check")]
    check: HookCheck,
    /// What a delivery does (default `signal`: it answers the session's wait for the
    /// signal of the hook's name; `message` starts or queues a turn with it).
    #[serde(default = "default_then")]
    then: HookThen,
    /// The signing key, for a sender that chooses its own (Slack's signing secret);
    /// one is made when none is given. Not for `token`.
    #[serde(default)]
    secret: Option<String>,
}

fn default_check() -> HookCheck {
    HookCheck::Token
}

fn default_then() -> HookThen {
    HookThen::Signal
}

/// Make an inbound hook
///
/// A URL a third party (CI, GitHub, Slack, a pager) posts to: a checked delivery
/// answers the session's wait for the signal named as the hook (`then: signal`) or
/// starts a turn with the delivery as the message (`then: message`). The secret —
/// the URL's token, or the key the sender signs with — is answered here only.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/hooks",
    operation_id = "create_hook",
    params(("id" = String, Path, description = "The session's id")),
    request_body = CreateHook,
    responses(
        (status = 201, description = "Made; its secret is shown this once", body = wire::HookCreated),
        (status = 400, description = "The body is not JSON", body = wire::Error),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 403, description = "Public mode has no hooks", body = wire::Error),
        (status = 404, description = "No such session, or not the caller's", body = wire::Error),
        (status = 409, description = "The session has a hook of that name (`hook_exists`): delete it first", body = wire::Error),
        (status = 413, description = "The body is larger than the limit", body = wire::Error),
        (status = 415, description = "The body is not `application/json`", body = wire::Error),
        (status = 422, description = "A field's value is refused (the message names it), or a signing check on a server with no vault key (`vault_unavailable`)", body = wire::Error),
        (status = 429, description = "More sessions, uploads, credentials and hooks a minute from this caller than the server takes (`rate_limited`)", body = wire::Error),
    )
)]
pub(crate) async fn create<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Body(req): Body<CreateHook>,
) -> Result<(StatusCode, Json<wire::HookCreated>), ApiError> {
    let owner = state.owner(&headers, steadfast_world::Scope::Run).await?;
    if matches!(state.auth.mode, AuthMode::Public { .. }) {
        // Anonymous callers share one owner: a hook would let anyone reach any session.
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "hooks are not available in public mode",
        ));
    }
    owned(&state, &id, &owner).await?;
    check_name(&req.name, req.then)?;
    state.creation_allowed(&owner).await?;
    let world = state.harness.world();
    if world.hooks(Some(&id)).await?.len() >= MAX_HOOKS {
        return Err(invalid(format!(
            "name: this session has {MAX_HOOKS} hooks, the most there may be; delete one first"
        )));
    }
    let made = format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    let (secret, stored) = match req.check {
        HookCheck::Token => {
            if req.secret.is_some() {
                return Err(invalid(
                    "secret: a `token` hook's secret is made by the server; give one only for a signing check",
                ));
            }
            let token = format!("hk_{made}");
            let hash = crate::hash_token(&token);
            (token, HookSecret::TokenHash(hash))
        }
        _ => {
            let keys = state.vault.clone().ok_or_else(|| {
                ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "vault_unavailable",
                    format!(
                        "check: a signing check's key is sealed by the vault, and this server has no vault key \
                         (the operator sets {}); `token` needs none",
                        steadfast_world::vault::KEY_ENV
                    ),
                )
            })?;
            let secret = match req.secret {
                Some(s) if s.len() < 16 || s.len() > 256 => {
                    return Err(invalid("secret: between 16 and 256 bytes"));
                }
                Some(s) => s,
                None => format!("whsec_{made}"),
            };
            let sealed = keys.seal(&id, &Hook::sealed_name(&req.name), secret.as_bytes());
            (secret, HookSecret::Sealed(sealed))
        }
    };
    let hook = Hook {
        session: id.clone(),
        name: req.name,
        check: req.check,
        then: req.then,
        secret: stored,
        created_at_ms: steadfast_world::now_ms(),
        created_by: owner.clone(),
    };
    if !world.hook_create(&hook).await? {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "hook_exists",
            format!(
                "name: session {id} has a hook {:?}; delete it first (which revokes its secret)",
                hook.name
            ),
        ));
    }
    state
        .audit(
            &owner,
            "hook.created",
            &id,
            json!({"hook": hook.name, "check": hook.check, "then": hook.then}),
        )
        .await;
    let mut shown = info(&headers, &hook);
    if hook.check == HookCheck::Token {
        shown.url.push_str(&format!("?token={secret}"));
    }
    Ok((
        StatusCode::CREATED,
        Json(wire::HookCreated {
            hook: shown,
            secret,
        }),
    ))
}

/// A session's hooks (never their secrets)
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/hooks",
    operation_id = "list_hooks",
    params(("id" = String, Path, description = "The session's id")),
    responses(
        (status = 200, description = "The session's hooks, by name", body = wire::HookList),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 404, description = "No such session, or not the caller's", body = wire::Error),
    )
)]
pub(crate) async fn list<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<wire::HookList>, ApiError> {
    let owner = state.owner(&headers, steadfast_world::Scope::Read).await?;
    owned(&state, &id, &owner).await?;
    let hooks = state.harness.world().hooks(Some(&id)).await?;
    Ok(Json(wire::HookList {
        hooks: hooks.iter().map(|h| info(&headers, h)).collect(),
    }))
}

/// Revoke a hook
///
/// Its URL and secret stop working at once, on every API host.
#[utoipa::path(
    delete,
    path = "/v1/sessions/{id}/hooks/{name}",
    operation_id = "delete_hook",
    params(
        ("id" = String, Path, description = "The session's id"),
        ("name" = String, Path, description = "The hook's name"),
    ),
    responses(
        (status = 204, description = "Revoked"),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 404, description = "No such session or hook, or not the caller's", body = wire::Error),
    )
)]
pub(crate) async fn delete<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path((id, name)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let owner = state.owner(&headers, steadfast_world::Scope::Run).await?;
    owned(&state, &id, &owner).await?;
    if !state.harness.world().hook_delete(&id, &name).await? {
        return Err(no_hook(&id, &name));
    }
    state
        .audit(&owner, "hook.deleted", &id, json!({"hook": name}))
        .await;
    Ok(StatusCode::NO_CONTENT)
}

/// Where a token travels.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct DeliveryQuery {
    /// A `token` hook's secret, as its URL carries it.
    #[serde(default)]
    token: Option<String>,
}

/// Deliver to an inbound hook (no bearer token: the hook's check is the proof)
///
/// Checked by the hook's `check` (see `POST /v1/sessions/{id}/hooks`), then taken once:
/// a delivery id seen before is a 409 `replayed`. A `signal` hook answers the
/// session's wait for the signal of its name (409 `not_waiting` when it waits for none;
/// the sender may retry); a `message` hook starts or queues a turn. GitHub's `ping`
/// and Slack's `url_verification` are answered (200) and deliver nothing. The body is
/// the signal's payload: its JSON, or its text as a JSON string.
#[utoipa::path(
    post,
    path = "/v1/hooks/{session}/{name}",
    operation_id = "deliver_hook",
    security(()),
    params(
        ("session" = String, Path, description = "The session's id"),
        ("name" = String, Path, description = "The hook's name"),
        DeliveryQuery,
    ),
    request_body(content = Option<Value>, content_type = "application/json", description = "Any JSON, or text", example = json!({"action": "completed", "conclusion": "success"})),
    responses(
        (status = 200, description = "A sender's check that delivers nothing (GitHub `ping`, Slack `url_verification`)", body = Value),
        (status = 202, description = "Delivered", body = wire::HookDelivered),
        (status = 400, description = "A header the check needs is missing (the message names it)", body = wire::Error),
        (status = 401, description = "No token (`missing_token`), a token or signature that does not match (`bad_signature`), or a signed time too far from ours (`stale_signature`)", body = wire::Error),
        (status = 404, description = "No such hook", body = wire::Error),
        (status = 409, description = "A delivery already taken (`replayed`), a session that waits for no such signal (`not_waiting`), or one that has ended", body = wire::Error),
        (status = 413, description = "A body over 1 MiB", body = wire::Error),
        (status = 415, description = "A body that is neither JSON nor text", body = wire::Error),
        (status = 429, description = "More deliveries a minute to this session than the server takes", body = wire::Error),
        (status = 503, description = "A signed hook this server cannot check: it lacks the vault key that sealed its key (`vault_unavailable`)", body = wire::Error),
    )
)]
pub(crate) async fn deliver<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path((id, name)): Path<(String, String)>,
    query: Result<Query<DeliveryQuery>, axum::extract::rejection::QueryRejection>,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let world = state.harness.world();
    let hook = world
        .hooks(Some(&id))
        .await?
        .into_iter()
        .find(|h| h.name == name)
        .ok_or_else(|| no_hook(&id, &name))?;
    // Read only for a hook that exists, and bounded: a signature covers the whole body.
    let body = crate::extract::bounded(&headers, body, MAX_DELIVERY, "a hook takes").await?;
    let check = hook.check.as_str();
    let token = query.ok().and_then(|Query(q)| q.token);
    let now = steadfast_world::now_ms();
    let proven = prove(&state, &hook, token.as_deref(), &headers, &body, now)?;
    let payload = payload(&headers, &body)?;
    // A sender's own check of the URL: answered, and nothing delivered.
    if let Some(answer) = handshake(hook.check, proven.event.as_deref(), &payload) {
        steadfast_metrics::metrics().hook_delivery(check, "ping");
        return Ok((StatusCode::OK, Json(answer)).into_response());
    }
    let kind = match hook.then {
        HookThen::Signal => "signals",
        HookThen::Message => "messages",
    };
    // A replay is refused before it can spend the session's budget of signals and
    // messages (anyone who saw one delivery could otherwise starve the others).
    if let Some(delivery) = &proven.delivery {
        if !world
            .hook_take_delivery(&id, &name, delivery, now, now.saturating_sub(REMEMBERED_MS))
            .await?
        {
            steadfast_metrics::metrics().hook_delivery(check, "replayed");
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "replayed",
                format!("delivery {delivery:?} was taken already; a replay changes nothing"),
            ));
        }
    }
    let delivered = match state.inbox_allowed(kind, &id).await {
        Ok(()) => act(&state, &hook, proven.event.as_deref(), &payload).await,
        Err(e) => Err(e),
    };
    let (inbox_id, answers) = match delivered {
        Ok(done) => done,
        Err(e) => {
            // Not taken by the session: the sender's retry is a delivery, not a replay.
            if let Some(delivery) = &proven.delivery {
                world.hook_untake_delivery(&id, &name, delivery).await?;
            }
            if e.code == "not_waiting" {
                steadfast_metrics::metrics().hook_delivery(check, "not_waiting");
            }
            return Err(e);
        }
    };
    steadfast_metrics::metrics().hook_delivery(check, "delivered");
    state
        .audit(
            &format!("hook:{name}"),
            "hook.delivered",
            &id,
            json!({
                "hook": name,
                "check": hook.check,
                "then": hook.then,
                "delivery": proven.delivery,
                "event": proven.event,
                "inbox_id": inbox_id,
            }),
        )
        .await;
    Ok((
        StatusCode::ACCEPTED,
        Json(wire::HookDelivered {
            id: inbox_id,
            hook: name,
            delivery: proven.delivery,
            answers,
        }),
    )
        .into_response())
}

/// What a delivery proves, checked by its hook's check against its secret (a token's
/// hash, or a key the vault opens); refusals are counted and answered.
fn prove<W>(
    state: &crate::ServerState<W>,
    hook: &Hook,
    token: Option<&str>,
    headers: &HeaderMap,
    body: &[u8],
    now: u64,
) -> Result<hook_check::Proven, ApiError> {
    let (id, name, check) = (&hook.session, &hook.name, hook.check.as_str());
    let opened;
    let key = match &hook.secret {
        HookSecret::TokenHash(hash) => Key::Token { hash, given: token },
        HookSecret::Sealed(sealed) => {
            // The operator's to fix, and the sender's to retry once it is: a 503.
            let unopened = |why: String| {
                tracing::error!(session = %id, hook = %name, "{why}");
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "vault_unavailable", why)
            };
            let keys = state.vault.clone().ok_or_else(|| {
                unopened(format!(
                    "this server has no vault key to check a `{check}` hook's signature (the operator sets {})",
                    steadfast_world::vault::KEY_ENV
                ))
            })?;
            opened = keys
                .open(id, &Hook::sealed_name(name), sealed)
                .map_err(|e| {
                    unopened(format!(
                        "this hook's key does not open with this server's vault keys ({e}); \
                         the operator keeps retired keys in {} until `rekey-vault` has run",
                        steadfast_world::vault::OLD_KEYS_ENV
                    ))
                })?;
            Key::Signing(&opened)
        }
    };
    hook_check::verify(hook.check, key, headers, body, now).map_err(|refused| {
        steadfast_metrics::metrics().hook_delivery(check, refused.metric());
        match refused {
            Refused::Missing("token") => ApiError::new(
                StatusCode::UNAUTHORIZED,
                "missing_token",
                "token: a `token` hook's URL carries it as `?token=`; this request has none",
            ),
            Refused::Missing(what) => ApiError::new(
                StatusCode::BAD_REQUEST,
                "missing_header",
                format!("{what}: a `{check}` hook's delivery must carry it"),
            ),
            Refused::BadSignature => ApiError::new(
                StatusCode::UNAUTHORIZED,
                "bad_signature",
                format!("the delivery's {} does not match this hook's", proof(hook.check)),
            ),
            Refused::Stale(seconds) => ApiError::new(
                StatusCode::UNAUTHORIZED,
                "stale_signature",
                format!(
                    "the signed time is {seconds} s from this server's clock; at most {} s is taken",
                    hook_check::SKEW.as_secs()
                ),
            ),
        }
    })
}

/// What the delivery does: the signal it sends, or the message it queues.
async fn act<W: World + Clone>(
    state: &crate::ServerState<W>,
    hook: &Hook,
    event: Option<&str>,
    payload: &Value,
) -> Result<(u64, Option<u64>), ApiError> {
    match hook.then {
        HookThen::Signal => {
            let target = steadfast_harness::SignalTarget {
                queue: false,
                wait: None,
            };
            Ok(state
                .harness
                .signal(&hook.session, &hook.name, payload, target)
                .await?)
        }
        HookThen::Message => {
            let shown = match payload {
                Value::String(text) => text.clone(),
                other => serde_json::to_string_pretty(other).unwrap_or_default(),
            };
            let about = event.map_or(String::new(), |e| format!(" (event `{e}`)"));
            let text = format!("The `{}` hook was delivered{about}:\n\n{shown}", hook.name);
            if text.len() > MAX_MESSAGE {
                return Err(ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "body_too_large",
                    format!("body: a `message` hook's delivery becomes a message of at most {MAX_MESSAGE} bytes"),
                ));
            }
            let world = state.harness.world();
            // An ended session's store refuses the message (409 `session_ended`).
            let id = world
                .post(
                    &hook.session,
                    InboundKind::Message,
                    "",
                    &Value::String(text),
                )
                .await?;
            Ok((id, None))
        }
    }
}

/// The delivery's body as a payload: its JSON, its text, or nothing.
fn payload(headers: &HeaderMap, body: &[u8]) -> Result<Value, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    let json_typed = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.contains("json"));
    match serde_json::from_slice(body) {
        Ok(value) => Ok(value),
        Err(e) if json_typed => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "malformed_json",
            format!("the body is typed JSON and does not parse: {e}"),
        )),
        Err(_) => match std::str::from_utf8(body) {
            Ok(text) => Ok(Value::String(text.to_string())),
            Err(_) => Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_body",
                "body: neither JSON nor UTF-8 text",
            )),
        },
    }
}

/// The answer to a sender checking the URL works, when this delivery is one.
fn handshake(check: HookCheck, event: Option<&str>, payload: &Value) -> Option<Value> {
    match check {
        HookCheck::Github if event == Some("ping") => Some(json!({"ok": true, "ping": "pong"})),
        HookCheck::Slack if payload["type"] == "url_verification" => {
            Some(json!({"challenge": payload["challenge"]}))
        }
        _ => None,
    }
}

/// What a check compares, for an error message.
fn proof(check: HookCheck) -> &'static str {
    match check {
        HookCheck::Token => "token",
        HookCheck::Github => "X-Hub-Signature-256",
        HookCheck::Slack => "X-Slack-Signature",
        HookCheck::Hmac => "Steadfast-Signature",
    }
}

/// A hook's name is a signal's name, and not one a third party may send.
fn check_name(name: &str, then: HookThen) -> Result<(), ApiError> {
    if name.is_empty()
        || name.len() > 128
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(invalid("name: letters, digits, - _ . only, at most 128"));
    }
    if name.chars().all(|c| c == '.') {
        // `.` and `..` are path steps to every client that builds the URL.
        return Err(invalid(
            "name: not only dots (it is the last step of the hook's URL)",
        ));
    }
    if then == HookThen::Signal {
        // An interrupt stops work and a resume raises bounds: the owner's to send, not a
        // third party's; a client tool's result answers one call through its own route.
        if [
            steadfast_log::INTERRUPT_SIGNAL,
            steadfast_log::RESUME_SIGNAL,
        ]
        .contains(&name)
            || name.starts_with(steadfast_log::TOOL_RESULT_SIGNAL)
        {
            return Err(invalid(format!(
                "name: `{name}` is a signal only the session's owner sends"
            )));
        }
    }
    Ok(())
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_body", message)
}

fn no_hook(id: &str, name: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "hook_not_found",
        format!("no hook {name:?} on session {id}"),
    )
}

/// A hook as listed.
fn info(headers: &HeaderMap, hook: &Hook) -> wire::HookInfo {
    wire::HookInfo {
        name: hook.name.clone(),
        check: hook.check,
        then: hook.then,
        url: hook_url(headers, &hook.session, &hook.name),
        created_at_ms: hook.created_at_ms,
        created_by: hook.created_by.clone(),
    }
}

/// A hook's URL as this request reached the server (`Host`, and
/// `X-Forwarded-Proto` from a proxy in front), without its token.
fn hook_url(headers: &HeaderMap, session: &str, name: &str) -> String {
    let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    let path = format!("/v1/hooks/{}/{}", segment(session), segment(name));
    match header("host") {
        Some(host) => {
            let scheme = match header("x-forwarded-proto") {
                Some("https") => "https",
                _ => "http",
            };
            format!("{scheme}://{host}{path}")
        }
        None => path,
    }
}

/// `text` as one URL path segment: bytes outside RFC 3986's unreserved set escaped.
fn segment(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
