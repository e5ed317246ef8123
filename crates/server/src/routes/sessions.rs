//! Creating, listing, showing, closing and deleting sessions.

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use serde::Deserialize;
use steadfast_harness::NewSession;
use steadfast_world::{InboundKind, World};
use utoipa::{IntoParams, ToSchema};

use super::{owned, Shared};
use crate::auth::AuthMode;
use crate::error::ApiError;
use crate::extract::Body;
use crate::wire;

/// A session to start (`POST /v1/sessions`).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"agent": "claude-code", "model": "anthropic/claude-sonnet-4-5", "workspace": {"kind": "empty", "files": {"README.md": "# hello\n"}}, "budget": {"max_cost_usd": 2.5}, "network": "deny-all", "task": "add a test for the parser"}))]
pub(crate) struct CreateSession {
    /// The agent: `native` (the default), a wrapped CLI (`claude-code`, `codex`, `pi`,
    /// `opencode`) or a name from the server's `[[agents.named]]`; `GET /v1/agents`
    /// lists what this server can run. An agent whose CLI is not installed here is
    /// refused with 422.
    #[serde(default)]
    #[schema(example = "claude-code")]
    agent: Option<String>,
    /// `provider/model`, e.g. `anthropic/claude-sonnet-4-5`.
    #[serde(default)]
    model: Option<String>,
    /// Where the workspace comes from (default: empty).
    #[serde(default)]
    workspace: Option<WorkspaceSource>,
    /// Hard bounds; hitting one escalates the session until a `resume` signal (whose
    /// payload may raise the same fields) arrives.
    #[serde(default)]
    budget: Option<Budget>,
    /// Pause for the `approval` signal before every external-effect tool call (the
    /// shorthand for `"approval": {"external": "ask"}`).
    #[serde(default)]
    approve_external: bool,
    /// The session's approval policy: `external` (what an external effect no rule
    /// names gets: `allow`, `ask` or `deny`) and `rules`, each a `verdict` for the
    /// calls matching every condition it names (`tool`, with `*`; `mcp_server`;
    /// `host`, judged at the egress proxy for each connection; `class`). The strictest
    /// matching rule stands. It is added beneath the operator's and the named agent's
    /// policies and can only make them stricter.
    #[serde(default)]
    #[schema(example = json!({"external": "ask", "rules": [{"verdict": "allow", "host": "*.pypi.org"}, {"verdict": "deny", "mcp_server": "billing"}]}))]
    approval: Option<steadfast_log::ApprovalPolicy>,
    /// The sandbox's network policy: `deny-all` (default), `allow:host[:port],*.domain,...`
    /// (through an egress proxy), or `open` (refused with 403 on public servers).
    #[serde(default)]
    #[schema(example = "allow:pypi.org,files.pythonhosted.org")]
    network: Option<String>,
    /// A first message, starting work at once.
    #[serde(default)]
    task: Option<String>,
    /// Tools the client runs (native agent only), as in the Anthropic and OpenAI APIs:
    /// when the model calls one, the session waits, holding no worker or sandbox,
    /// until `POST /v1/sessions/{id}/tool_results` answers the call.
    #[serde(default)]
    tools: Vec<steadfast_log::ClientTool>,
    /// Credentials from the caller's vault that the egress proxy adds, as a header, to
    /// the sandbox's plain-HTTP requests to a destination of the allow-list (`network`);
    /// the sandbox never holds them. TLS (`CONNECT`) tunnels get nothing added.
    #[serde(default)]
    egress_credentials: Vec<steadfast_log::EgressCredential>,
    /// The caller's own MCP servers (streamable HTTP): the harness connects with the
    /// named vault credential and offers their tools to the agent (native or wrapped)
    /// as `<name>__<tool>`, each call journaled and classed by the tool's annotations
    /// (`readOnlyHint` read, `idempotentHint` idempotent, otherwise external) unless
    /// `classes` overrides them. The sandbox never holds the credential.
    #[serde(default)]
    mcp_servers: Vec<steadfast_log::McpServer>,
    /// How many explorers one call of the `explore` tool may fork (at most 8;
    /// default 0: the tool is not offered; a wrapped CLI gets it from its journaled
    /// MCP server). With it, the agent can fork itself into explorers from the point
    /// it is at, one per task, each a session of the caller's own, and wait for their
    /// answers.
    #[serde(default)]
    #[schema(example = 3)]
    explorers: u32,
    /// A title to list it by (default: its first message, shortened), at most 200
    /// characters; `PATCH /v1/sessions/{id}` changes it.
    #[serde(default)]
    #[schema(example = "Nightly flake hunt")]
    title: Option<String>,
    /// Labels to find it by (`GET /v1/sessions?label=team=infra`): at most 32, keys of
    /// letters, digits and `._/-`, values of letters, digits and `._-`, each at most 63.
    #[serde(default)]
    #[schema(example = json!({"team": "infra", "env": "prod"}))]
    labels: BTreeMap<String, String>,
    /// The caller's own notes, returned as given and never filtered on: at most 50,
    /// keys up to 64 bytes, values up to 512.
    #[serde(default)]
    #[schema(example = json!({"ticket": "https://tracker.example.com/PROJ-12"}))]
    metadata: BTreeMap<String, String>,
}

/// Where a new session's workspace comes from.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
enum WorkspaceSource {
    /// An empty directory, optionally seeded with files (path to content: text, or
    /// any bytes as `{"base64": ...}`), within the body limit.
    Empty {
        /// Files to write, by path relative to the workspace.
        #[serde(default)]
        files: SeedFiles,
    },
    /// The bundled demo project.
    Demo,
    /// A git repository, cloned by the server outside any sandbox with a credential
    /// from the caller's vault (which the sandbox never holds; `.git/config` names the
    /// plain URL). The agent (native or wrapped) gets a `git_push` tool, run by the
    /// harness with the same credential. Only `https://` URLs on public servers; `http://` elsewhere.
    Git(steadfast_log::GitSource),
    /// A tar archive uploaded with `POST /v1/uploads` (binary-safe, larger than a
    /// request body may be), unpacked into the workspace.
    Upload {
        /// The upload's id.
        #[schema(example = "upl_af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262")]
        upload: String,
    },
}

/// Files a new workspace is seeded with: path to content.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(transparent)]
struct SeedFiles(BTreeMap<String, FileContent>);

/// A seeded file's content.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(untagged)]
enum FileContent {
    /// UTF-8 text, written as is.
    Text(String),
    /// Any bytes, base64-encoded (standard alphabet, padded).
    Bytes(Base64Content),
}

/// Bytes as base64.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct Base64Content {
    /// The bytes, base64-encoded.
    #[schema(example = "iVBORw0KGgo=")]
    base64: String,
}

impl FileContent {
    fn into_bytes(self, path: &str) -> Result<Vec<u8>, String> {
        use base64::Engine as _;
        match self {
            FileContent::Text(text) => Ok(text.into_bytes()),
            FileContent::Bytes(b) => base64::engine::general_purpose::STANDARD
                .decode(b.base64.as_bytes())
                .map_err(|e| format!("workspace.files: `{path}`: not base64: {e}")),
        }
    }
}

/// A session's bounds, as asked at creation (or for a fork).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Budget {
    /// Money for model calls, US dollars.
    #[serde(default)]
    #[schema(exclusive_minimum = 0.0)]
    max_cost_usd: Option<f64>,
    /// Tokens of model calls (input, output and cache, added up).
    #[serde(default)]
    #[schema(minimum = 1)]
    max_tokens: Option<u64>,
    /// Turns (user messages that open work).
    #[serde(default)]
    #[schema(minimum = 1)]
    max_turns: Option<u32>,
    /// Wall-clock time since the session began, seconds.
    #[serde(default)]
    #[schema(minimum = 1)]
    max_duration_s: Option<u64>,
}

impl Budget {
    /// The bounds asked, checked (each positive) but not yet against any ceiling;
    /// the error names the field.
    pub(crate) fn limits(&self) -> Result<steadfast_log::Limits, String> {
        let max_cost_micro_usd = match self.max_cost_usd {
            Some(usd) if !usd.is_finite() || usd <= 0.0 => {
                return Err("budget.max_cost_usd: must be positive".into())
            }
            Some(usd) => Some(steadfast_log::money::micro_usd(usd)),
            None => None,
        };
        if self.max_tokens == Some(0) || self.max_turns == Some(0) || self.max_duration_s == Some(0)
        {
            return Err("budget: max_tokens, max_turns and max_duration_s must be positive".into());
        }
        Ok(steadfast_log::Limits {
            max_cost_micro_usd,
            max_tokens: self.max_tokens,
            max_turns: self.max_turns,
            max_duration_ms: self.max_duration_s.map(|s| s.saturating_mul(1000)),
        })
    }
}

/// Start a session
///
/// A budget over the operator's ceilings (`[server.ceilings]`, and in public mode the
/// spend cap) is refused with 403 `over_ceiling` naming the field; a bound a session
/// does not name is the operator's default (`[limits]`, kept within its ceiling), or
/// else the ceiling. A seeded file that cannot be written (a NUL or
/// over-long name, a file inside a file) is 422 and leaves nothing behind.
#[utoipa::path(
    post,
    path = "/v1/sessions",
    request_body = CreateSession,
    responses(
        (status = 201, description = "Created", body = wire::Created),
        (status = 400, description = "The body is not JSON", body = wire::Error),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 403, description = "Over a ceiling the operator set (`over_ceiling`), or a network policy this server does not allow", body = wire::Error),
        (status = 413, description = "The body is larger than the limit", body = wire::Error),
        (status = 415, description = "The body is not `application/json`", body = wire::Error),
        (status = 422, description = "A field's value is refused (the message names it)", body = wire::Error),
        (status = 429, description = "More sessions and uploads a minute from this caller than the server takes (`rate_limited`)", body = wire::Error),
    )
)]
pub(crate) async fn create<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Body(req): Body<CreateSession>,
) -> Result<(StatusCode, Json<wire::Created>), ApiError> {
    let owner = state.owner(&headers, steadfast_world::Scope::Run).await?;
    state.creation_allowed(&owner).await?;
    let invalid = |m: String| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_body", m);
    let described = steadfast_world::SessionPatch {
        title: req.title,
        labels: req.labels.into_iter().map(|(k, v)| (k, Some(v))).collect(),
        metadata: req
            .metadata
            .into_iter()
            .map(|(k, v)| (k, Some(v)))
            .collect(),
    };
    described.check().map_err(invalid)?;
    let agent = req.agent.unwrap_or_else(|| "native".into());
    // Checked before anything is made: an agent that cannot run here leaves nothing.
    state
        .harness
        .check_agent(&agent)
        .map_err(|e| invalid(format!("agent: {e}")))?;
    let asked = match &req.budget {
        Some(b) => b.limits().map_err(invalid)?,
        None => steadfast_log::Limits::default(),
    };
    let ceilings = state.ceilings();
    if let Some(refusal) = crate::bounds::refuse_over(&asked, &ceilings, "budget.") {
        return Err(refusal);
    }
    let limits = crate::bounds::for_new_session(&asked, &state.defaults, &ceilings);
    if let Some(policy) = &req.approval {
        policy
            .check()
            .map_err(|e| invalid(format!("approval.{e}")))?;
    }
    let network = req
        .network
        .as_deref()
        .map(steadfast_log::NetworkPolicy::parse)
        .transpose()
        .map_err(|e| invalid(format!("network: {e}")))?;
    if network == Some(steadfast_log::NetworkPolicy::Open)
        && matches!(state.auth.mode, AuthMode::Public { .. })
    {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "network: `open` is not available on this server",
        ));
    }
    steadfast_harness::client_tools::check(&agent, &req.tools).map_err(invalid)?;
    check_egress_credentials(&state, &owner, network.as_ref(), &req.egress_credentials).await?;
    let mcp_servers = state
        .harness
        .options()
        .agents
        .mcp_servers_for(&agent, req.mcp_servers);
    steadfast_harness::remote::check_servers(&mcp_servers).map_err(invalid)?;
    for server in &mcp_servers {
        if let Some(name) = &server.credential {
            open_credential(&state, &owner, name, "mcp_servers.credential").await?;
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
    // A model the agent cannot call from here (unknown provider, no key, an API its
    // CLI does not speak) is refused now rather than failing on every wake.
    state
        .harness
        .check_agent_model(&agent, &model)
        .map_err(|e| invalid(format!("model: {e}")))?;

    let source = req.workspace.unwrap_or(WorkspaceSource::Empty {
        files: SeedFiles::default(),
    });
    let mut git_secret = None;
    match &source {
        WorkspaceSource::Demo => {}
        WorkspaceSource::Empty { files } => check_file_names(&files.0).map_err(invalid)?,
        WorkspaceSource::Upload { upload } => {
            let valid = upload
                .strip_prefix(super::uploads::UPLOAD_PREFIX)
                .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()));
            if !valid {
                return Err(invalid(format!(
                    "workspace.upload: `{}` is not an upload id",
                    upload.escape_debug()
                )));
            }
        }
        WorkspaceSource::Git(git) => {
            let public = matches!(state.auth.mode, AuthMode::Public { .. });
            steadfast_harness::git::check_source(git, public).map_err(invalid)?;
            if let Some(name) = &git.credential {
                git_secret =
                    Some(open_credential(&state, &owner, name, "workspace.credential").await?);
            }
        }
    }
    let workspace_id = steadfast_harness::new_workspace_id();
    let dir = state.workspaces.join(&workspace_id);
    std::fs::create_dir_all(&dir).map_err(ApiError::internal)?;
    // From here on, a refusal takes the directory with it: nothing is left behind.
    let made = MadeWorkspace(Some(dir.clone()));
    let root = dir.canonicalize().map_err(ApiError::internal)?;
    let mut git = None;
    match source {
        WorkspaceSource::Demo => {
            steadfast_testkit::demo::write_project(&root).map_err(ApiError::internal)?
        }
        WorkspaceSource::Git(source) => {
            let credential = git_secret.map(|secret| {
                steadfast_harness::git::GitCredential::basic(&source.username, &secret)
            });
            let open = &state.harness.options().sandbox.internal_hosts;
            let public = matches!(state.auth.mode, AuthMode::Public { .. });
            steadfast_harness::git::clone(&source, credential.as_ref(), &root, open)
                .await
                .map_err(|e| {
                    // An anonymous caller is told no more than that it failed: git's
                    // words would tell a closed port from a service that answered.
                    if public {
                        tracing::info!(error = %e, "a public caller's clone failed");
                        invalid("workspace.url: the repository could not be cloned (check the URL and the ref; only public https remotes can be reached)".to_string())
                    } else {
                        invalid(format!("workspace: {e}"))
                    }
                })?;
            git = Some(source);
        }
        WorkspaceSource::Upload { upload } => {
            let hash = &upload[super::uploads::UPLOAD_PREFIX.len()..];
            let archive = match state.harness.blobs().get(hash).await {
                Ok(bytes) => bytes,
                Err(steadfast_world::Error::NotFound(_)) => {
                    return Err(invalid(format!("workspace.upload: no upload `{upload}`")))
                }
                Err(e) => return Err(e.into()),
            };
            let limit = (state.max_upload as u64).saturating_mul(crate::UNPACK_FACTOR);
            let target = root.clone();
            tokio::task::spawn_blocking(move || {
                steadfast_drive::unpack_tar(&archive, &target, limit)
            })
            .await
            .map_err(ApiError::internal)?
            .map_err(|e| invalid(format!("workspace.upload: {e}")))?;
        }
        WorkspaceSource::Empty { files } => {
            for (path, content) in files.0 {
                let target = steadfast_sandbox::confine(&root, &path)
                    .map_err(|e| invalid(format!("workspace.files: {e}")))?;
                let unwritable = |e: std::io::Error| {
                    invalid(format!("workspace.files: `{path}` cannot be written: {e}"))
                };
                if let Some(parent) = target.parent() {
                    std::fs::create_dir_all(parent).map_err(unwritable)?;
                }
                let bytes = content.into_bytes(&path).map_err(invalid)?;
                std::fs::write(&target, bytes).map_err(unwritable)?;
            }
        }
    }
    let mut new = NewSession::native(&model, &root);
    new.workspace_id = Some(workspace_id.clone());
    new.agent = agent.into();
    new.owner = owner.clone();
    new.task = req.task;
    new.limits = limits;
    new.approve_external = req.approve_external;
    new.approval = req.approval;
    new.network = network;
    new.client_tools = req.tools;
    new.egress_credentials = req.egress_credentials;
    new.git = git;
    new.mcp_servers = mcp_servers;
    new.explorers = req.explorers;
    new.described = described;
    let audited = serde_json::json!({
        "agent": new.agent,
        "model": model,
        "labels": new.described.labels,
        "limits": new.limits,
    });
    let id = state.harness.start_session(new).await?;
    state.audit(&owner, "session.created", &id, audited).await;
    made.keep();
    let summary = state.harness.world().session(&id).await?;
    Ok((
        StatusCode::CREATED,
        Json(wire::Created {
            id,
            status: summary.status,
            model,
            workspace: workspace_id,
        }),
    ))
}

/// Refuses egress credentials a session could not use: each must name a destination its
/// allow-list allows, a header, and a credential in the caller's vault (which this
/// server must be able to open).
async fn check_egress_credentials<W: World + Clone>(
    state: &super::Shared<W>,
    owner: &str,
    network: Option<&steadfast_log::NetworkPolicy>,
    bindings: &[steadfast_log::EgressCredential],
) -> Result<(), ApiError> {
    if bindings.is_empty() {
        return Ok(());
    }
    let invalid = |m: String| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_body", m);
    let allow = match network {
        Some(steadfast_log::NetworkPolicy::AllowList(rules)) => rules,
        _ => {
            return Err(invalid(
                "egress_credentials: need a `network` allow-list (`allow:host[:port],...`) naming their hosts".into(),
            ))
        }
    };
    for binding in bindings {
        let rule = steadfast_sandbox::HostRule::parse(&binding.host)
            .map_err(|e| invalid(format!("egress_credentials: {e}")))?;
        let port = rule.port.unwrap_or(80);
        if !allow.iter().any(|a| a.allows(&rule.host, port)) {
            return Err(invalid(format!(
                "egress_credentials: `{}` is not in the session's allow-list",
                binding.host
            )));
        }
        let value =
            open_credential(state, owner, &binding.credential, "egress_credentials").await?;
        steadfast_sandbox::Injection::new(&binding.host, &binding.header, &binding.prefix, &value)
            .map_err(|e| invalid(format!("egress_credentials: `{}`: {e}", binding.credential)))?;
    }
    Ok(())
}

/// Opens credential `name` of `owner` from the vault, for checking a session's request
/// (and cloning its repository); a refusal is a 422 naming `field`.
async fn open_credential<W: World + Clone>(
    state: &super::Shared<W>,
    owner: &str,
    name: &str,
    field: &str,
) -> Result<String, ApiError> {
    let invalid = |m: String| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_body", m);
    let keys = state.vault.as_ref().ok_or_else(|| {
        invalid(format!(
            "{field}: this server has no vault key, so it keeps no credentials"
        ))
    })?;
    let entry = state
        .harness
        .world()
        .vault_get(owner, name)
        .await?
        .ok_or_else(|| invalid(format!("{field}: no credential `{name}` in your vault")))?;
    let value = keys
        .open(owner, name, &entry.sealed)
        .map_err(|e| invalid(format!("{field}: `{name}`: {e}")))?;
    String::from_utf8(value).map_err(|_| invalid(format!("{field}: `{name}` is not text")))
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
fn check_file_names<V>(files: &BTreeMap<String, V>) -> Result<(), String> {
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

/// Which of the caller's sessions to list (`GET /v1/sessions`).
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListQuery {
    /// Only these statuses, comma-separated (`idle,waiting`).
    #[param(example = "idle,waiting")]
    status: Option<String>,
    /// Only sessions of this agent.
    #[param(example = "claude-code")]
    agent: Option<String>,
    /// Only sessions with every one of these labels, `key=value` comma-separated.
    #[param(example = "team=infra,env=prod")]
    label: Option<String>,
    /// Created at or after, ms since the Unix epoch.
    created_after: Option<u64>,
    /// Created before, ms since the Unix epoch.
    created_before: Option<u64>,
    /// Last changed at or after, ms since the Unix epoch.
    updated_after: Option<u64>,
    /// Last changed before, ms since the Unix epoch.
    updated_before: Option<u64>,
    /// Only titles containing this text, ignoring case.
    #[param(example = "flake")]
    title: Option<String>,
    /// The previous page's `next_cursor`.
    cursor: Option<String>,
    /// Sessions per page: 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<usize>,
}

/// The sessions a page holds unless the caller says otherwise.
const DEFAULT_PAGE: usize = 100;

impl ListQuery {
    /// The world's query for `owner`, or which parameter is wrong.
    fn for_owner(self, owner: String) -> Result<steadfast_world::SessionQuery, String> {
        use steadfast_world::listing;
        let mut statuses = Vec::new();
        for status in self.status.iter().flat_map(|s| s.split(',')) {
            let Some(status) = steadfast_log::Status::parse(status) else {
                let all: Vec<_> = steadfast_log::STATUSES.map(|s| s.as_str()).into();
                return Err(format!(
                    "status: `{}` is not one of {}",
                    status.escape_debug(),
                    all.join(", ")
                ));
            };
            statuses.push(status);
        }
        let limit = self.limit.unwrap_or(DEFAULT_PAGE);
        if !(1..=listing::MAX_PAGE).contains(&limit) {
            return Err(format!("limit: 1 to {} a page", listing::MAX_PAGE));
        }
        if self.title.as_ref().is_some_and(|t| t.len() > 200) {
            return Err("title: at most 200 bytes".into());
        }
        Ok(steadfast_world::SessionQuery {
            owner: Some(owner),
            statuses,
            agent: self.agent,
            labels: match &self.label {
                Some(text) => listing::parse_label_filter("label", text)?,
                None => Default::default(),
            },
            created_after: self.created_after,
            created_before: self.created_before,
            updated_after: self.updated_after,
            updated_before: self.updated_before,
            title: self.title.filter(|t| !t.is_empty()),
            after: match &self.cursor {
                Some(c) => Some(c.parse().map_err(|e| format!("cursor: {e}"))?),
                None => None,
            },
            limit: Some(limit),
        })
    }
}

/// List the caller's sessions
///
/// A page at a time, newest first, filtered by status, agent, labels, time and title;
/// follow `next_cursor` for the next page (it stays right while sessions are created
/// and deleted). Not available in public mode, where a session's id is the capability
/// (403).
#[utoipa::path(
    get,
    path = "/v1/sessions",
    params(ListQuery),
    responses(
        (status = 200, description = "The caller's sessions", body = wire::SessionList),
        (status = 400, description = "A query parameter that does not parse (the message names it)", body = wire::Error),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 403, description = "Listing is disabled in public mode", body = wire::Error),
    )
)]
pub(crate) async fn list<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    query: Result<axum::extract::Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<wire::SessionList>, ApiError> {
    let owner = state.owner(&headers, steadfast_world::Scope::Read).await?;
    if matches!(state.auth.mode, AuthMode::Public { .. }) {
        // In public mode a session id is the capability: there is no listing.
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "listing sessions is disabled in public mode",
        ));
    }
    let bad = |m: String| ApiError::new(StatusCode::BAD_REQUEST, "invalid_query", m);
    let axum::extract::Query(query) = query.map_err(|e| bad(e.body_text()))?;
    let query = query.for_owner(owner).map_err(bad)?;
    let page = state.harness.world().list_sessions(&query).await?;
    Ok(Json(wire::SessionList {
        sessions: page
            .sessions
            .into_iter()
            .map(wire::SessionSummary::from)
            .collect(),
        next_cursor: page.next.map(|c| c.to_string()),
    }))
}

/// A change to a session's title, labels or metadata (`PATCH /v1/sessions/{id}`).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"title": "Nightly flake hunt", "labels": {"env": "prod", "ticket": null}}))]
pub(crate) struct UpdateSession {
    /// A new title (kept from now on over the first message's).
    #[serde(default)]
    title: Option<String>,
    /// Labels to set; `null` removes one. Labels not named stay.
    #[serde(default)]
    labels: BTreeMap<String, Option<String>>,
    /// Metadata to set; `null` removes an entry. Entries not named stay.
    #[serde(default)]
    metadata: BTreeMap<String, Option<String>>,
}

/// Rename, label or annotate a session
///
/// Labels and metadata merge key by key (`null` removes one); any session of the
/// caller's, running or ended. Answers the session as it now is.
#[utoipa::path(
    patch,
    path = "/v1/sessions/{id}",
    params(("id" = String, Path, description = "The session's id")),
    request_body = UpdateSession,
    responses(
        (status = 200, description = "The session, changed", body = wire::Session),
        (status = 400, description = "The body is not JSON", body = wire::Error),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 404, description = "No such session, or not the caller's", body = wire::Error),
        (status = 415, description = "The body is not `application/json`", body = wire::Error),
        (status = 422, description = "A value is refused, or too many labels or entries would result (the message names the field)", body = wire::Error),
    )
)]
pub(crate) async fn update<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Body(req): Body<UpdateSession>,
) -> Result<Json<wire::Session>, ApiError> {
    let owner = state.owner(&headers, steadfast_world::Scope::Run).await?;
    owned(&state, &id, &owner).await?;
    let patch = steadfast_world::SessionPatch {
        title: req.title,
        labels: req.labels,
        metadata: req.metadata,
    };
    patch
        .check()
        .map_err(|m| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_body", m))?;
    state.harness.world().update_session(&id, &patch).await?;
    state
        .audit(
            &owner,
            "session.changed",
            &id,
            serde_json::json!({"title": patch.title, "labels": patch.labels, "metadata": patch.metadata.keys().collect::<Vec<_>>()}),
        )
        .await;
    show(State(state), headers, Path(id)).await
}

/// A session's state
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}",
    params(("id" = String, Path, description = "The session's id")),
    responses(
        (status = 200, description = "The session", body = wire::Session),
        (status = 400, description = "The path does not parse", body = wire::Error),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 404, description = "No such session, or not the caller's", body = wire::Error),
    )
)]
pub(crate) async fn show<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<wire::Session>, ApiError> {
    use steadfast_log::Status;
    let owner = state.owner(&headers, steadfast_world::Scope::Read).await?;
    let summary = owned(&state, &id, &owner).await?;
    let s = state.harness.state(&id).await?;
    let children = state.harness.world().forks(&id).await?;
    // A message posted to an idle session is a turn about to open: until a worker takes
    // it, the session is not idle, or a client polling for `idle` after posting would
    // stop before the turn it asked for has run.
    let queued = s.is_idle()
        && s.retry.is_none()
        && state
            .harness
            .world()
            .inbox(&id)
            .await?
            .iter()
            .any(|i| matches!(i.kind, InboundKind::Message | InboundKind::Steer));
    let status = if queued { Status::Running } else { s.status() };
    Ok(Json(wire::Session {
        id,
        status,
        retry: s.retry.as_ref().map(|r| wire::Retry {
            attempt: r.attempt,
            reason: r.reason.clone(),
            next_attempt_at_ms: r.at_ms,
        }),
        title: summary.title,
        model: s.model.to_string(),
        turn: s.turn,
        last_seq: s.last_seq,
        waiting_for: s.waiting().map(|w| w.name.clone()),
        waiting_since: s.waiting().map(|w| w.seq),
        waiting_reason: s.waiting().map(|w| w.reason.clone()),
        waiting_call: s
            .waiting()
            .as_ref()
            .and_then(|w| w.call_id.as_ref())
            .and_then(|id| s.pending_tool(id))
            .map(|p| wire::WaitingCall {
                call_id: p.call_id.clone(),
                tool: p.tool.clone(),
                input: p.input.clone(),
            }),
        end_reason: s.end_reason().map(str::to_string),
        usage: s.usage,
        cost_usd: steadfast_log::money::usd(s.cost_micro_usd),
        history_bytes: s.kept_bytes,
        priced: state.harness.is_priced(&s.model),
        budget_usd: s.limits.max_cost_micro_usd.map(steadfast_log::money::usd),
        limits: s.limits,
        escalated_by: s.escalated_by(),
        network: s.network.as_ref().map(ToString::to_string),
        reply: s.last_reply(),
        created_at_ms: summary.created_at_ms,
        updated_at_ms: summary.updated_at_ms,
        agent: summary.agent,
        labels: summary.labels,
        metadata: summary.metadata,
        parent: summary.parent,
        forked_at: summary.forked_at,
        children,
    }))
}

/// Stop the running turn now
///
/// From any API process, whichever worker drives the session: a model stream is cut
/// (recorded as `turn_interrupted` by the caller, no restart), a command is killed and
/// its outcome recorded with the snapshot after it, a wait for a human is abandoned.
/// The session goes idle; the model is told on its next turn.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/interrupt",
    params(("id" = String, Path, description = "The session's id")),
    responses(
        (status = 202, description = "The interrupt is on its way", body = wire::Interrupting),
        (status = 400, description = "The path does not parse", body = wire::Error),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 404, description = "No such session, or not the caller's", body = wire::Error),
        (status = 409, description = "No turn runs (`not_running`)", body = wire::Error),
    )
)]
pub(crate) async fn interrupt<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<wire::Interrupting>), ApiError> {
    let owner = state.owner(&headers, steadfast_world::Scope::Run).await?;
    let summary = owned(&state, &id, &owner).await?;
    if !summary.status.is_interruptible() {
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
        Json(wire::Interrupting {
            id: inbox_id,
            session: id,
            by: owner,
        }),
    ))
}

/// End a session for good
///
/// A running turn is interrupted first.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/close",
    params(("id" = String, Path, description = "The session's id")),
    responses(
        (status = 200, description = "Closed", body = wire::Closed),
        (status = 400, description = "The path does not parse", body = wire::Error),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 404, description = "No such session, or not the caller's", body = wire::Error),
        (status = 409, description = "The session has ended, or is busy", body = wire::Error),
    )
)]
pub(crate) async fn close<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<wire::Closed>, ApiError> {
    let owner = state.owner(&headers, steadfast_world::Scope::Run).await?;
    owned(&state, &id, &owner).await?;
    let ended = state.harness.close_session(&id, &owner).await?;
    state
        .audit(
            &owner,
            "session.closed",
            &id,
            serde_json::json!({"status": ended}),
        )
        .await;
    Ok(Json(wire::Closed { id, status: ended }))
}

/// Delete a session
///
/// Its log, inbox and managed workspace go, after a running turn is interrupted. Its
/// big outputs and snapshots are shared by content with any session that produced
/// the same bytes, so `steadfast gc` reclaims those no remaining log refers to.
#[utoipa::path(
    delete,
    path = "/v1/sessions/{id}",
    params(("id" = String, Path, description = "The session's id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, description = "The path does not parse", body = wire::Error),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 404, description = "No such session, or not the caller's", body = wire::Error),
        (status = 409, description = "The session is busy", body = wire::Error),
    )
)]
pub(crate) async fn delete<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let owner = state.owner(&headers, steadfast_world::Scope::Run).await?;
    owned(&state, &id, &owner).await?;
    let s = state.harness.delete_session(&id, &owner).await?;
    state
        .audit(&owner, "session.deleted", &id, serde_json::json!({}))
        .await;
    // This host's copy of a logical workspace goes too (other hosts' copies go with
    // their next `steadfast gc`); its snapshot objects are shared by content and
    // reclaimed by garbage collection. A user's own directory is never removed.
    if steadfast_log::is_workspace_id(&s.workspace) {
        let _ = std::fs::remove_dir_all(state.workspaces.join(&s.workspace));
    }
    Ok(StatusCode::NO_CONTENT)
}

/// The two log positions a diff spans.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct DiffQuery {
    /// From this log position (default 0: as the session began).
    from: Option<u64>,
    /// To this log position (default: now).
    to: Option<u64>,
}

/// What the session changed in its workspace
///
/// Between two log positions (default: since it began), with unified diffs of text
/// files; binary, huge and special files are named with a note instead.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/diff",
    params(("id" = String, Path, description = "The session's id"), DiffQuery),
    responses(
        (status = 200, description = "The changes", body = steadfast_harness::WorkspaceDiff),
        (status = 400, description = "A query that does not parse", body = wire::Error),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 404, description = "No such session, or not the caller's", body = wire::Error),
        (status = 422, description = "A position past the log's end", body = wire::Error),
    )
)]
pub(crate) async fn diff<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    query: Result<axum::extract::Query<DiffQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<steadfast_harness::WorkspaceDiff>, ApiError> {
    let owner = state.owner(&headers, steadfast_world::Scope::Read).await?;
    owned(&state, &id, &owner).await?;
    let axum::extract::Query(q) = query.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_query",
            format!("from, to: {}", e.body_text()),
        )
    })?;
    Ok(Json(state.harness.diff(&id, q.from, q.to).await?))
}

/// The log position to read the workspace at.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct AtQuery {
    /// The log position (default: now; 0: as the session began).
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

/// Every path of the session's workspace at a log position
///
/// Read from the snapshot in force there, never from the live workspace.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/files",
    params(("id" = String, Path, description = "The session's id"), AtQuery),
    responses(
        (status = 200, description = "The listing", body = steadfast_harness::WorkspaceListing),
        (status = 400, description = "A query that does not parse", body = wire::Error),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 404, description = "No such session, or not the caller's", body = wire::Error),
        (status = 422, description = "A position past the log's end", body = wire::Error),
    )
)]
pub(crate) async fn files<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    query: AtQueryResult,
) -> Result<Json<steadfast_harness::WorkspaceListing>, ApiError> {
    let owner = state.owner(&headers, steadfast_world::Scope::Read).await?;
    owned(&state, &id, &owner).await?;
    Ok(Json(state.harness.files(&id, at_query(query)?).await?))
}

/// One file's bytes as they were at a log position (binary-safe)
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/files/{path}",
    params(
        ("id" = String, Path, description = "The session's id"),
        ("path" = String, Path, description = "Relative to the workspace; may contain `/`"),
        AtQuery,
    ),
    responses(
        (status = 200, description = "The bytes", body = Vec<u8>, content_type = "application/octet-stream"),
        (status = 400, description = "A query that does not parse", body = wire::Error),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 404, description = "No such session or file (`no_file`)", body = wire::Error),
        (status = 500, description = "The file's stored content is lost or damaged (`data_lost`)", body = wire::Error),
        (status = 422, description = "A position past the log's end", body = wire::Error),
    )
)]
pub(crate) async fn file<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path((id, path)): Path<(String, String)>,
    query: AtQueryResult,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let owner = state.owner(&headers, steadfast_world::Scope::Read).await?;
    owned(&state, &id, &owner).await?;
    let bytes = state.harness.file(&id, &path, at_query(query)?).await?;
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/octet-stream")],
        bytes,
    )
        .into_response())
}

/// A tool call's whole output
///
/// The output of the `tool_call_outcome` at log position `seq`, every byte of it: an
/// event carries at most 4 KiB of an output (its `output.excerpt`), and a big one
/// lives in the blob store (`output.blob`). Served as `text/plain`, never rendered.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/outputs/{seq}",
    operation_id = "tool_output",
    params(
        ("id" = String, Path, description = "The session's id"),
        ("seq" = u64, Path, description = "The log position of a `tool_call_outcome`"),
    ),
    responses(
        (status = 200, description = "The output", body = String, content_type = "text/plain; charset=utf-8"),
        (status = 400, description = "The path does not parse", body = wire::Error),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 404, description = "No such session, or no tool call's outcome at `seq` (`no_output`)", body = wire::Error),
        (status = 500, description = "The output's blob is lost or damaged (`data_lost`)", body = wire::Error),
    )
)]
pub(crate) async fn output<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path((id, seq)): Path<(String, u64)>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let owner = state.owner(&headers, steadfast_world::Scope::Read).await?;
    let summary = owned(&state, &id, &owner).await?;
    let none = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "no_output",
            format!("seq: no tool call's outcome at position {seq} of session {id}"),
        )
    };
    if seq == 0 || seq > summary.last_seq {
        return Err(none());
    }
    let records = state.harness.world().read(&id, seq).await?;
    let output = match records.into_iter().find(|r| r.seq == seq).map(|r| r.event) {
        Some(steadfast_log::Event::ToolCallOutcome { output, .. }) => output,
        _ => return Err(none()),
    };
    let bytes = match output {
        steadfast_log::Output::Inline { text } => text.into_bytes(),
        steadfast_log::Output::Blob(blob) => state.harness.blobs().get(&blob.hash).await?,
    };
    Ok((
        [
            (
                axum::http::header::CONTENT_TYPE,
                "text/plain; charset=utf-8",
            ),
            (axum::http::header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        bytes,
    )
        .into_response())
}

/// The whole workspace as a tar archive, as it was at a log position
///
/// Streamed from the snapshot in force there (never the live workspace): directories,
/// files with their executable bit, symbolic links and FIFOs under their workspace
/// paths, `.git` included; the same snapshot gives the same bytes. Each file is checked
/// against its hash on the way out: a damaged object ends the archive short (no tar
/// end marker), never with wrong bytes.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/archive",
    params(("id" = String, Path, description = "The session's id"), AtQuery),
    responses(
        (status = 200, description = "The tar archive", body = Vec<u8>, content_type = "application/x-tar"),
        (status = 400, description = "A query that does not parse", body = wire::Error),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 404, description = "No such session, or no snapshot there", body = wire::Error),
        (status = 500, description = "An object of the snapshot is lost (`data_lost`), found before the first byte", body = wire::Error),
        (status = 422, description = "A position past the log's end", body = wire::Error),
    )
)]
pub(crate) async fn archive<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    query: AtQueryResult,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let owner = state.owner(&headers, steadfast_world::Scope::Read).await?;
    owned(&state, &id, &owner).await?;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let at = state.harness.archive(&id, at_query(query)?, tx).await?;
    let chunks = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|chunk| (chunk, rx))
    });
    let disposition = format!("attachment; filename=\"{id}-{at}.tar\"");
    Ok((
        [
            (
                axum::http::header::CONTENT_TYPE,
                "application/x-tar".to_string(),
            ),
            (axum::http::header::CONTENT_DISPOSITION, disposition),
        ],
        axum::body::Body::from_stream(chunks),
    )
        .into_response())
}

/// List a session's services
///
/// The long-lived processes the session's agent started with the `service` tool and
/// has not stopped (a dev server, a database, a watcher), as its log says. They run in
/// the session's sandbox; when a new sandbox is started for the session (after an idle
/// stop, a move to another host or a crash of its machine) they are started again, and
/// `restarts` counts it.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/services",
    params(("id" = String, Path, description = "The session's id")),
    responses(
        (status = 200, description = "The session's services", body = wire::Services),
        (status = 400, description = "The path does not parse", body = wire::Error),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 404, description = "No such session, or not the caller's", body = wire::Error),
    )
)]
pub(crate) async fn services<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<wire::Services>, ApiError> {
    let owner = state.owner(&headers, steadfast_world::Scope::Read).await?;
    owned(&state, &id, &owner).await?;
    let session = state.harness.state(&id).await?;
    Ok(Json(wire::Services {
        services: session
            .services
            .into_iter()
            .map(|s| wire::Service {
                name: s.name,
                command: s.command,
                port: s.port,
                restarts: s.restarts,
            })
            .collect(),
    }))
}

/// Check a session's stored data
///
/// Reads the whole log (each record's checksum is verified; a failing one answers 500
/// `data_corrupt` naming the session and position), every blob it refers to, naming
/// each record whose blob is missing or corrupt by log position, and every object of
/// every workspace snapshot it names, naming each one lost.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/integrity",
    params(("id" = String, Path, description = "The session's id")),
    responses(
        (status = 200, description = "The check ran", body = wire::Integrity),
        (status = 400, description = "The path does not parse", body = wire::Error),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
        (status = 404, description = "No such session, or not the caller's", body = wire::Error),
        (status = 500, description = "A record fails its checksum (`data_corrupt`)", body = wire::Error),
    )
)]
pub(crate) async fn integrity<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<wire::Integrity>, ApiError> {
    let owner = state.owner(&headers, steadfast_world::Scope::Read).await?;
    owned(&state, &id, &owner).await?;
    let records = state.harness.world().read(&id, 1).await?;
    let damaged = state.harness.blobs().damaged(&records).await;
    let lost_objects = state.harness.lost_objects(&records, true).await?;
    let mut snapshots: Vec<&str> = records.iter().flat_map(|r| r.event.snapshots()).collect();
    snapshots.sort_unstable();
    snapshots.dedup();
    Ok(Json(wire::Integrity {
        ok: damaged.is_empty() && lost_objects.is_empty(),
        records: records.len() as u64,
        damaged,
        snapshots: snapshots.len() as u64,
        lost_objects,
    }))
}

/// The agents sessions can run
///
/// The native loop, every wrapped CLI adapter and every named agent, with the CLI
/// version each runs, the range its adapter is tested with, and whether it is
/// installed on this server.
#[utoipa::path(
    get,
    path = "/v1/agents",
    responses(
        (status = 200, description = "The agents", body = wire::AgentList),
        (status = 401, description = "No valid bearer token (when the server has tokens configured)", body = wire::Error),
    )
)]
pub(crate) async fn agents<W: World + Clone>(
    State(state): State<Shared<W>>,
    headers: HeaderMap,
) -> Result<Json<wire::AgentList>, ApiError> {
    state.owner(&headers, steadfast_world::Scope::Read).await?;
    Ok(Json(wire::AgentList {
        agents: state.harness.agents(),
    }))
}
