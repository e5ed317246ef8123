//! The HTTP API: sessions, messages and steers, resumable event streams, signals.
//!
//! Build the router with [`app`]; `steadfast serve` runs it beside N workers that
//! take turns from the world's queue, and `steadfast worker` runs workers alone. The
//! API process never drives a turn itself: it writes to the world (sessions, inbox)
//! and streams the log, so any API instance can serve any session.
//!
//! Event streams are server-sent events whose ids are log positions: reconnecting
//! with `?cursor=N` or `Last-Event-ID: N` continues after position N with nothing
//! lost or repeated, on any instance.

mod auth;
mod bounds;
mod console;
mod error;
mod extract;
mod hook_check;
mod limits;
mod listen;
mod metrics;
pub mod oidc;
pub mod openapi;
mod public;
mod routes;
mod stream;
pub mod webhooks;
mod wire;

use std::path::PathBuf;
use std::sync::Arc;

use axum::Router;
use steadfast_harness::Harness;
use steadfast_sandbox::AnySandbox;
use steadfast_world::World;

pub use auth::{hash_token, Auth, AuthMode, Caller, TokenEntry, DEFAULT_SCOPES};
pub use error::ApiError;
pub use listen::{serve, ServeOptions};
pub use metrics::metrics_router;

/// The largest request body accepted (uploads aside).
pub const MAX_BODY: usize = 256 * 1024;
/// The largest workspace archive taken unless the operator says otherwise.
pub const DEFAULT_MAX_UPLOAD: usize = 64 << 20;
/// Upload bytes one caller may store per hour unless the operator says otherwise.
pub const DEFAULT_UPLOAD_BYTES_PER_HOUR: u64 = 1 << 30;
/// How many times its own size an uploaded archive may unpack to.
pub const UNPACK_FACTOR: u64 = 8;

/// What the API needs.
pub struct ServerState<W> {
    /// Creates sessions (snapshots their workspace) and reads their logs.
    pub harness: Arc<Harness<W, AnySandbox>>,
    /// Who may call, and as whom.
    pub auth: Auth,
    /// Where managed workspaces are created.
    pub workspaces: PathBuf,
    /// The model of sessions that name none.
    pub default_model: String,
    /// Message posts allowed per session per minute.
    pub messages_per_minute: u32,
    /// Sessions and uploads one caller may create per minute (they make workspaces,
    /// snapshots and stored blobs).
    pub creations_per_minute: u32,
    /// The operator's ceilings on every session's bounds: a session is created within
    /// them (taking them where it names none) and no signal raises a bound past them.
    pub ceilings: steadfast_log::Limits,
    /// The operator's default bounds of a session that names none (`[limits]`); each
    /// is kept within its ceiling.
    pub defaults: steadfast_log::Limits,
    /// Web origins whose pages may call the API (CORS); `*` for any. Empty: no
    /// cross-origin access.
    pub cors_origins: Vec<String>,
    /// The operator's vault keys; `None`: this server keeps no credentials.
    pub vault: Option<Arc<steadfast_world::VaultKeys>>,
    /// The largest workspace archive `POST /v1/uploads` takes, bytes; it may unpack to
    /// [`UNPACK_FACTOR`] times that.
    pub max_upload: usize,
    /// Upload bytes one caller may store per hour (uploads no session used stay
    /// until `gc`'s grace has passed, so this bounds what they can hold); `None`:
    /// no quota.
    pub upload_bytes_per_hour: Option<u64>,
    /// Whether this process runs sessions' commands (it has workers), so its
    /// readiness includes their sandbox backend.
    pub runs_commands: bool,
}

impl<W: World + Clone> ServerState<W> {
    /// Takes `amount` from the rate bucket `key` (`capacity` a `window_secs`), counted in
    /// the world so every API process of a deployment draws on the same bucket.
    pub(crate) async fn draw(
        &self,
        key: String,
        amount: f64,
        capacity: f64,
        window_secs: u64,
    ) -> Result<bool, ApiError> {
        let draw = steadfast_world::rate::Draw {
            key,
            amount,
            capacity,
            window_ms: window_secs * 1000,
        };
        Ok(self.harness.world().take_tokens(&draw).await?)
    }

    /// Takes one of `owner`'s creations this minute (a session, a fork, an upload, a
    /// credential stored), or says to slow down (429).
    pub(crate) async fn creation_allowed(&self, owner: &str) -> Result<(), ApiError> {
        let per_minute = f64::from(self.creations_per_minute.max(1));
        if self
            .draw(format!("create/{owner}"), 1.0, per_minute, 60)
            .await?
        {
            return Ok(());
        }
        Err(error::ApiError::rate_limited(format!(
            "more than {} sessions, forks, uploads and stored credentials a minute from one \
             caller; slow down",
            self.creations_per_minute
        )))
    }

    /// Takes `bytes` of `owner`'s upload quota this hour, or refuses (429): the store
    /// keeps an upload no session used for `gc`'s grace, so a caller's uploads are
    /// bounded by what it may store in that time, not only by how many it makes.
    pub(crate) async fn upload_allowed(&self, owner: &str, bytes: u64) -> Result<(), ApiError> {
        let Some(per_hour) = self.upload_bytes_per_hour else {
            return Ok(());
        };
        if self
            .draw(
                format!("upload/{owner}"),
                bytes as f64,
                per_hour as f64,
                3600,
            )
            .await?
        {
            return Ok(());
        }
        Err(error::ApiError::rate_limited(format!(
            "this upload would take this caller past {} MiB of uploads an hour; \
             start sessions from the uploads already made, or wait",
            per_hour >> 20
        )))
    }

    /// Takes one of the messages (or, `kind` `signals`, signals) session `id` may be
    /// sent this minute, or says to slow down (429).
    pub(crate) async fn inbox_allowed(&self, kind: &str, id: &str) -> Result<(), ApiError> {
        let per_minute = f64::from(self.messages_per_minute.max(1));
        if self
            .draw(format!("{kind}/{id}"), 1.0, per_minute, 60)
            .await?
        {
            return Ok(());
        }
        Err(ApiError::rate_limited(format!(
            "more than {} {kind} a minute to this session; slow down",
            self.messages_per_minute
        )))
    }

    /// The owner a request acts as, if its token allows `scope` (`run` includes
    /// `read`): 401 without a valid token, 403 without the scope.
    pub(crate) async fn owner(
        &self,
        headers: &axum::http::HeaderMap,
        scope: steadfast_world::Scope,
    ) -> Result<String, ApiError> {
        use steadfast_world::Scope;
        let caller = self.auth.caller(headers, self.harness.world()).await?;
        let allowed = caller.scopes.contains(&scope)
            || (scope == Scope::Read && caller.scopes.contains(&Scope::Run));
        if !allowed {
            return Err(ApiError::new(
                axum::http::StatusCode::FORBIDDEN,
                "forbidden",
                format!("this token does not have the `{}` scope", scope.as_str()),
            ));
        }
        Ok(caller.owner)
    }

    /// Records what `actor` did in the audit log; a failure to record is logged, not
    /// answered (the change itself is made and durable).
    pub(crate) async fn audit(
        &self,
        actor: &str,
        action: &str,
        target: &str,
        detail: serde_json::Value,
    ) {
        if let Err(e) = self
            .harness
            .world()
            .audit(actor, action, target, &detail)
            .await
        {
            tracing::error!(error = %e, action, target, "could not record an audit entry");
        }
    }
}

impl<W> ServerState<W> {
    /// State with the given parts and default limits.
    pub fn new(
        harness: Arc<Harness<W, AnySandbox>>,
        auth: Auth,
        workspaces: PathBuf,
        default_model: String,
    ) -> Self {
        ServerState {
            harness,
            auth,
            workspaces,
            default_model,
            messages_per_minute: 60,
            creations_per_minute: 300,
            ceilings: steadfast_log::Limits::default(),
            defaults: steadfast_log::Limits::default(),
            cors_origins: Vec::new(),
            vault: None,
            max_upload: DEFAULT_MAX_UPLOAD,
            upload_bytes_per_hour: Some(DEFAULT_UPLOAD_BYTES_PER_HOUR),
            runs_commands: true,
        }
    }
}

impl<W> ServerState<W> {
    /// The ceilings in force: the configured ones, and in public mode the spend cap.
    pub(crate) fn ceilings(&self) -> steadfast_log::Limits {
        let mut ceilings = self.ceilings;
        if let AuthMode::Public {
            session_cap_micro_usd,
        } = self.auth.mode
        {
            ceilings.max_cost_micro_usd = Some(
                ceilings
                    .max_cost_micro_usd
                    .map_or(session_cap_micro_usd, |c| c.min(session_cap_micro_usd)),
            );
        }
        ceilings
    }
}

/// The API's router, with the web console at `/ui`.
pub fn app<W: World + Clone>(state: ServerState<W>) -> Router {
    let state = Arc::new(state);
    let cors = routes::cors(&state.cors_origins);
    // The console's pages beside the API; a browser's credentials (its login cookie, a
    // read-only link) are turned into, or held to, what the API checks before either.
    let app = routes::router(state.clone())
        .merge(console::router(state.clone()))
        .layer(axum::middleware::from_fn_with_state(
            state,
            console::credentials::credentials::<W>,
        ));
    match cors {
        Some(cors) => app.layer(cors),
        None => app,
    }
}
