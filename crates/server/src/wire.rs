//! What the API answers, as types: every handler returns one of these (never an
//! ad-hoc JSON value), and the OpenAPI document ([`crate::openapi`]) is generated from
//! the same types, so the document cannot drift from the replies.

use std::collections::BTreeMap;

use serde::Serialize;
use steadfast_log::{Breaker, Limits, Status, Usage};
use utoipa::ToSchema;

/// Every error: a stable machine-readable code and a message for humans.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"error": {"code": "session_not_found", "message": "no session s_0192"}}))]
pub struct Error {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// The code and message of an [`Error`].
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// A stable code (`session_not_found`, `invalid_body`, `over_ceiling`, ...).
    pub code: String,
    /// What went wrong, naming the field where one is at fault.
    pub message: String,
}

/// A workspace archive just uploaded.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"id": "upl_af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262", "bytes": 1048576}))]
pub struct Upload {
    /// What a session names as its workspace (`{"kind": "upload", "upload": id}`).
    pub id: String,
    /// Its size.
    pub bytes: u64,
}

/// A session just created.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"id": "s_01931f7c", "status": "idle", "model": "anthropic/claude-sonnet-4-5", "workspace": "ws_01931f7c9e3a7b2c8d4e5f6a7b8c9d0e"}))]
pub struct Created {
    /// The session's id.
    pub id: String,
    /// Where it stands.
    pub status: Status,
    /// `provider/model`.
    pub model: String,
    /// The session's workspace: a logical id, which whichever host drives the
    /// session materializes from the drive (no host's path).
    pub workspace: String,
}

/// A session as `GET /v1/sessions/{id}` shows it.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({
    "id": "ses_01931f7c", "status": "waiting", "retry": null, "title": "fix the failing test",
    "model": "anthropic/claude-sonnet-4-5", "turn": 2, "last_seq": 41,
    "waiting_for": "approval", "waiting_since": 41, "waiting_reason": "may I push to main?",
    "waiting_call": {"call_id": "toolu_01A", "tool": "request_approval", "input": {"reason": "may I push to main?"}},
    "end_reason": null,
    "usage": {"input_tokens": 18250, "output_tokens": 1930, "cache_read_tokens": 12000, "cache_write_tokens": 0},
    "cost_usd": 0.084, "history_bytes": 5242880, "priced": true, "budget_usd": 5.0, "limits": {"max_cost_micro_usd": 5000000},
    "escalated_by": null, "network": "deny-all", "reply": null,
    "created_at_ms": 1764640000000_u64, "updated_at_ms": 1764640093000_u64,
    "agent": "native", "labels": {"team": "infra"}, "metadata": {"ticket": "PROJ-12"},
    "parent": null, "forked_at": null, "children": ["ses_01931f80"]
}))]
pub struct Session {
    /// The session's id.
    pub id: String,
    /// Where it stands.
    pub status: Status,
    /// After a failure retrying may fix: the attempt, why, and when the next begins.
    #[schema(required = true)]
    pub retry: Option<Retry>,
    /// The title its owner gave it, or else the first user message, shortened.
    pub title: String,
    /// `provider/model`.
    #[schema(example = "anthropic/claude-sonnet-4-5")]
    pub model: String,
    /// The current (or last) turn, from 1.
    pub turn: u32,
    /// The last log position.
    pub last_seq: u64,
    /// The signal a waiting session awaits.
    #[schema(required = true)]
    pub waiting_for: Option<String>,
    /// The log position of the wait in progress (answer it with `?wait=N`).
    #[schema(required = true)]
    pub waiting_since: Option<u64>,
    /// Why it waits.
    #[schema(required = true)]
    pub waiting_reason: Option<String>,
    /// The tool call the wait is for (a client tool to run, or an approval asked for).
    #[schema(required = true)]
    pub waiting_call: Option<WaitingCall>,
    /// Why it ended, if it did.
    #[schema(required = true)]
    pub end_reason: Option<String>,
    /// Tokens of recorded model calls.
    pub usage: Usage,
    /// Money spent on recorded model calls.
    pub cost_usd: f64,
    /// Bytes the session's history keeps beyond its log: the new workspace objects
    /// its calls' snapshots stored and the outputs they offloaded, counted against
    /// the operator's history quota (`[sandbox] history-mb`).
    pub history_bytes: u64,
    /// Whether the model has a price (built-in or configured), so money bounds hold.
    pub priced: bool,
    /// The money bound, if any.
    #[schema(required = true)]
    pub budget_usd: Option<f64>,
    /// The session's bounds (absent: unbounded).
    pub limits: Limits,
    /// The bound that stopped the session, while it is escalated.
    #[schema(required = true)]
    pub escalated_by: Option<Breaker>,
    /// The session's own network policy, if it has one.
    #[schema(required = true)]
    pub network: Option<String>,
    /// The last turn's final answer.
    #[schema(required = true)]
    pub reply: Option<String>,
    /// Created, ms since the Unix epoch.
    pub created_at_ms: u64,
    /// Last appended to, ms since the Unix epoch.
    pub updated_at_ms: u64,
    /// The agent it runs.
    pub agent: String,
    /// Labels, which `GET /v1/sessions?label=` filters on.
    pub labels: BTreeMap<String, String>,
    /// The owner's own notes on it.
    pub metadata: BTreeMap<String, String>,
    /// The session this one was forked from (`POST /v1/sessions/{id}/fork`).
    #[schema(required = true)]
    pub parent: Option<String>,
    /// The parent's last log position this session shares; its own events follow.
    #[schema(required = true)]
    pub forked_at: Option<u64>,
    /// The sessions forked from this one, oldest first.
    pub children: Vec<String>,
}

/// A tool call a session waits on.
#[derive(Debug, Serialize, ToSchema)]
pub struct WaitingCall {
    /// The call (what `POST .../tool_results` answers).
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// Its input, as the model gave it.
    pub input: serde_json::Value,
}

/// A retry scheduled after a failure.
#[derive(Debug, Serialize, ToSchema)]
pub struct Retry {
    /// Failures in a row.
    pub attempt: u32,
    /// The last failure, in words.
    pub reason: String,
    /// When a worker may try again, ms since the Unix epoch.
    pub next_attempt_at_ms: u64,
}

/// A row of `GET /v1/sessions`.
#[derive(Debug, Serialize, ToSchema)]
pub struct SessionSummary {
    /// The session's id.
    pub id: String,
    /// Who owns it.
    pub owner: String,
    /// Where it stands.
    pub status: Status,
    /// The title its owner gave it, or else the first user message, shortened.
    pub title: String,
    /// The last log position.
    pub last_seq: u64,
    /// Created, ms since the Unix epoch.
    pub created_at_ms: u64,
    /// Last appended to, ms since the Unix epoch.
    pub updated_at_ms: u64,
    /// The agent it runs (`native`, `claude-code`, a named agent, ...).
    pub agent: String,
    /// Labels, which `GET /v1/sessions?label=` filters on.
    #[schema(example = json!({"team": "infra"}))]
    pub labels: BTreeMap<String, String>,
    /// The owner's own notes on it.
    #[schema(example = json!({"ticket": "https://tracker.example.com/PROJ-12"}))]
    pub metadata: BTreeMap<String, String>,
    /// The session this one was forked from, if it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// The parent's last log position this session shares, if it is a fork.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forked_at: Option<u64>,
}

impl From<steadfast_world::SessionSummary> for SessionSummary {
    fn from(s: steadfast_world::SessionSummary) -> Self {
        SessionSummary {
            id: s.id,
            owner: s.owner,
            status: s.status,
            title: s.title,
            last_seq: s.last_seq,
            created_at_ms: s.created_at_ms,
            updated_at_ms: s.updated_at_ms,
            agent: s.agent,
            labels: s.labels,
            metadata: s.metadata,
            parent: s.parent,
            forked_at: s.forked_at,
        }
    }
}

/// A session just rewound.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"id": "ses_01931f7c", "to": 42, "branch": "ses_01931f90", "facts": ["`bash` ran `git push origin main`: it completed"], "status": "idle"}))]
pub struct Rewound {
    /// The session.
    pub id: String,
    /// The last position it kept.
    pub to: u64,
    /// The fork holding the events set aside.
    pub branch: String,
    /// The external effects those events recorded, which still stand.
    pub facts: Vec<String>,
    /// Where it stands now.
    pub status: Status,
}

/// A wrapped session's agent, as changed.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"id": "ses_01931f7c", "agent": "claude-code", "cli": "@anthropic-ai/claude-code@2.1.332"}))]
pub struct AgentChanged {
    /// The session.
    pub id: String,
    /// The agent its next turn runs.
    pub agent: String,
    /// The CLI that agent stands for, `package@version`.
    pub cli: String,
}

/// Sessions just forked.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"sessions": [{"id": "ses_01931f80", "owner": "alice", "status": "idle", "title": "try another way", "last_seq": 43, "created_at_ms": 1764640200000_u64, "updated_at_ms": 1764640200000_u64, "agent": "claude-code", "labels": {}, "metadata": {}, "parent": "ses_01931f7c", "forked_at": 42}]}))]
pub struct Forks {
    /// One per fork, in the order made.
    pub sessions: Vec<SessionSummary>,
}

/// The caller's sessions.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"sessions": [{"id": "ses_01931f7c", "owner": "alice", "status": "idle", "title": "fix the failing test", "last_seq": 57, "created_at_ms": 1764640000000_u64, "updated_at_ms": 1764640123000_u64, "agent": "claude-code", "labels": {"team": "infra"}, "metadata": {}}], "next_cursor": "1764640000000.ses_01931f7c"}))]
pub struct SessionList {
    /// Newest first.
    pub sessions: Vec<SessionSummary>,
    /// Pass as `cursor` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// An interrupt on its way to whichever worker drives the session.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"id": 31, "session": "ses_01931f7c", "by": "alice"}))]
pub struct Interrupting {
    /// The inbox entry that carries it.
    pub id: u64,
    /// The session.
    pub session: String,
    /// Who interrupted.
    pub by: String,
}

/// A session ended for good.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"id": "ses_01931f7c", "status": "closed"}))]
pub struct Closed {
    /// The session.
    pub id: String,
    /// How it ended: `closed`, or how it had ended already (`completed`, `failed`,
    /// `escalated`).
    pub status: Status,
}

/// A signal accepted.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"id": 12, "signal": "approval", "answers": 41}))]
pub struct SignalAccepted {
    /// The inbox entry that carries it.
    pub id: u64,
    /// Its name.
    pub signal: String,
    /// The log position of the wait it answers (none when queued for a later wait).
    #[schema(required = true)]
    pub answers: Option<u64>,
}

/// A session's services: long-lived processes its agent started with the `service`
/// tool, as the log says they run.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"services": [{"name": "web", "command": "python3 -m http.server 8000", "port": 8000, "restarts": 1}]}))]
pub struct Services {
    /// Each service started and not stopped since, in the order they were started.
    pub services: Vec<Service>,
}

/// One service of a session.
#[derive(Debug, Serialize, ToSchema)]
pub struct Service {
    /// Its name.
    pub name: String,
    /// The command that starts it.
    pub command: String,
    /// The port it listens on, if it was started with one.
    #[schema(required = true)]
    pub port: Option<u16>,
    /// Times it was started again with a new sandbox (after an idle stop, a move to
    /// another host, or a sandbox that died).
    pub restarts: u32,
}

/// What listens in a session's sandbox, each with its preview URL.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"ports": [{"port": 8000, "url": "/v1/sessions/ses_0190a/ports/8000/", "service": "web"}]}))]
pub struct Ports {
    /// Each TCP port a program in the sandbox listens on, lowest first.
    pub ports: Vec<Port>,
}

/// One port a program in a session's sandbox listens on.
#[derive(Debug, Serialize, ToSchema)]
pub struct Port {
    /// The port, on the sandbox's own loopback.
    pub port: u16,
    /// Its preview URL, a path on this server: HTTP and WebSocket requests under it
    /// are forwarded to the port.
    pub url: String,
    /// The service that said it listens there, if one did.
    #[schema(required = true)]
    pub service: Option<String>,
}

/// A share link, as listed (never its secret).
#[derive(Debug, Serialize, ToSchema)]
pub struct PreviewLink {
    /// Its id (`pl_...`), which revocation names.
    pub id: String,
    /// `port` (a preview of one port) or `view` (the session's read-only page).
    pub opens: &'static str,
    /// The port in the session's sandbox it opens; `null` for a view link.
    #[schema(required = true)]
    pub port: Option<u16>,
    /// Made, ms since the Unix epoch.
    pub created_at_ms: u64,
    /// When it stops working, ms since the Unix epoch.
    pub expires_at_ms: u64,
    /// When it was revoked, if it was.
    #[schema(required = true)]
    pub revoked_at_ms: Option<u64>,
}

impl PreviewLink {
    /// The listing of `link`, a token that opens `port` (`None`: the session's view).
    pub(crate) fn of(link: &steadfast_world::ServiceToken, port: Option<u16>) -> Self {
        PreviewLink {
            id: link.id.clone(),
            opens: match port {
                Some(_) => "port",
                None => "view",
            },
            port,
            created_at_ms: link.created_at_ms,
            expires_at_ms: link.expires_at_ms.unwrap_or(u64::MAX),
            revoked_at_ms: link.revoked_at_ms,
        }
    }
}

/// A share link just made: its URL, shown this once.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"url": "/v1/previews/sfl_3c5e0f0a9b7d4e6f8a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c1d2e3f/", "link": {"id": "pl_0190a1", "opens": "port", "port": 8000, "created_at_ms": 1733443200000_u64, "expires_at_ms": 1733446800000_u64, "revoked_at_ms": null}}))]
pub struct PreviewLinkCreated {
    /// The link, a path on this server; anyone who has it can read the port.
    pub url: String,
    /// What was made.
    pub link: PreviewLink,
}

/// A session's share links.
#[derive(Debug, Serialize, ToSchema)]
pub struct PreviewLinks {
    /// Every link made for the session's ports, oldest first.
    pub links: Vec<PreviewLink>,
}

/// The result of checking a session's stored data.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"ok": false, "records": 212, "damaged": [{"seq": 88, "blob": "9f2c41d0", "problem": "missing"}], "snapshots": 14, "lost_objects": [{"snapshot": "5be1c0a2", "object": "77d0e3f9", "problem": "missing"}]}))]
pub struct Integrity {
    /// Whether every record, blob and workspace snapshot read back as written.
    pub ok: bool,
    /// Records read (each one's checksum verified).
    pub records: u64,
    /// Each record whose blob is missing or corrupt.
    pub damaged: Vec<steadfast_world::BlobDamage>,
    /// Snapshots checked: every workspace snapshot the log names, each object of it
    /// read back.
    pub snapshots: u64,
    /// Each object a snapshot reaches that is missing or corrupt, with a snapshot
    /// that reaches it (restoring or reading the workspace there would fail).
    pub lost_objects: Vec<steadfast_drive::LostObject>,
}

/// The agents sessions can run here.
#[derive(Debug, Serialize, ToSchema)]
pub struct AgentList {
    /// The native loop, every wrapped CLI adapter, every named agent.
    pub agents: Vec<steadfast_harness::AgentInfo>,
}

/// One page of a session's events, as JSON.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"schema": 1, "after": 4, "next_after": 6, "has_more": true, "events": [
    {"type": "tool_call_intent", "seq": 5, "at_ms": 1764640001000_u64, "call_id": "toolu_01A", "tool": "bash", "input": {"command": "pytest -q"}, "class": "read"},
    {"type": "tool_call_outcome", "seq": 6, "at_ms": 1764640003500_u64, "call_id": "toolu_01A", "is_error": false, "exit_code": 0, "output": {"excerpt": "12 passed in 0.41s\n", "truncated": false, "bytes": 19}, "stored_bytes": 2048}
]}))]
pub struct EventPage {
    /// The public event schema's version.
    pub schema: u32,
    /// The events after `after`, in log order.
    pub events: Vec<crate::public::PublicEvent>,
    /// The cursor this page starts after.
    pub after: u64,
    /// The cursor of the next page (the last event's position).
    pub next_after: u64,
    /// Whether more events follow.
    pub has_more: bool,
}

/// One server-sent event of a session's stream, as a client's SSE parser gives it.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"id": "7", "data": "{\"type\":\"model_delta\",\"seq\":7,\"at_ms\":1764640000500,\"call_id\":\"mc_1\",\"text\":\"Looking at the test\",\"restart\":false}"}))]
pub struct StreamFrame {
    /// The log position (absent on the closing `end` frame).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `message` (the default, omitted on the wire), or `end` for the close.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// A [`crate::public::PublicEvent`] as JSON; `{}` on `end`.
    pub data: String,
}

/// A stored credential, as listed: its name, never its value.
#[derive(Debug, Serialize, ToSchema)]
pub struct Credential {
    /// Its name, as sessions refer to it.
    pub name: String,
    /// When it was last written, ms since the Unix epoch.
    pub updated_at_ms: u64,
}

/// The caller's credentials.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"credentials": [{"name": "github", "updated_at_ms": 1764640000000_u64}]}))]
pub struct CredentialList {
    /// By name.
    pub credentials: Vec<Credential>,
}

/// A token issued through the API, as listed: never the token itself.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"id": "tok_01931f7c", "name": "ci pipeline", "owner": "ci-bot", "scopes": ["read", "run"], "created_at_ms": 1764640000000_u64, "created_by": "admin", "expires_at_ms": null, "revoked_at_ms": null}))]
pub struct TokenInfo {
    /// Its id, which revocation names.
    pub id: String,
    /// What it is for.
    pub name: String,
    /// Who it acts as.
    pub owner: String,
    /// What it allows: `read`, `run`, `admin`.
    pub scopes: Vec<String>,
    /// Issued, ms since the Unix epoch.
    pub created_at_ms: u64,
    /// Who issued it.
    pub created_by: String,
    /// When it stops working, if it does.
    #[schema(required = true)]
    pub expires_at_ms: Option<u64>,
    /// When it was revoked, if it was.
    #[schema(required = true)]
    pub revoked_at_ms: Option<u64>,
}

impl From<steadfast_world::ServiceToken> for TokenInfo {
    fn from(t: steadfast_world::ServiceToken) -> Self {
        TokenInfo {
            id: t.id,
            name: t.name,
            owner: t.owner,
            scopes: t.scopes.iter().map(|s| s.as_str().to_string()).collect(),
            created_at_ms: t.created_at_ms,
            created_by: t.created_by,
            expires_at_ms: t.expires_at_ms,
            revoked_at_ms: t.revoked_at_ms,
        }
    }
}

/// A token just issued: the token, shown this once, and what it is.
#[derive(Debug, Serialize, ToSchema)]
pub struct IssuedToken {
    /// The bearer token (`sft_...`); the server keeps only its hash.
    pub token: String,
    /// What was issued.
    pub issued: TokenInfo,
}

/// Every issued token.
#[derive(Debug, Serialize, ToSchema)]
pub struct TokenList {
    /// Newest first.
    pub tokens: Vec<TokenInfo>,
}

/// One entry of the audit log.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"id": 7, "at_ms": 1764640000000_u64, "actor": "admin", "action": "token.issued", "target": "tok_01931f7c", "detail": {"owner": "ci-bot", "scopes": ["read", "run"]}}))]
pub struct AuditEntry {
    /// Increasing.
    pub id: u64,
    /// When, ms since the Unix epoch.
    pub at_ms: u64,
    /// Who: the owner the caller's token acts as (`operator`: the configuration).
    pub actor: String,
    /// What: `token.issued`, `token.revoked`, `vault.put`, `vault.deleted`,
    /// `ceilings.set`, `session.created`, `session.changed`, `session.closed`,
    /// `session.deleted`.
    pub action: String,
    /// On what: a token's id, a credential's name, a session's id.
    pub target: String,
    /// Details of the change.
    #[schema(value_type = Object)]
    pub detail: serde_json::Value,
}

impl From<steadfast_world::AuditEntry> for AuditEntry {
    fn from(e: steadfast_world::AuditEntry) -> Self {
        AuditEntry {
            id: e.id,
            at_ms: e.at_ms,
            actor: e.actor,
            action: e.action,
            target: e.target,
            detail: e.detail,
        }
    }
}

/// A page of the audit log.
#[derive(Debug, Serialize, ToSchema)]
pub struct AuditPage {
    /// Oldest first.
    pub entries: Vec<AuditEntry>,
    /// Pass as `after` for the next page.
    pub next_after: u64,
}

/// A message queued for a session (`POST .../messages` with `Accept: application/json`).
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"id": 12, "session": "ses_01931f7c", "after": 57}))]
pub struct MessageQueued {
    /// The inbox entry that carries it.
    pub id: u64,
    /// The session.
    pub session: String,
    /// The log position it was queued at: its turn's events follow it
    /// (`GET .../events?after=N`).
    pub after: u64,
}

/// An inbound hook, as listed (never its secret).
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"name": "ci", "check": "github", "then": "signal", "url": "https://steadfast.example.com/v1/hooks/ses_01931f7c/ci", "created_at_ms": 1767225600000_u64, "created_by": "alice"}))]
pub struct HookInfo {
    /// Its name: the signal it sends.
    pub name: String,
    /// How a delivery is checked.
    pub check: steadfast_world::HookCheck,
    /// What a delivery does.
    pub then: steadfast_world::HookThen,
    /// Where to deliver, as this request reached the server (a `token` hook's URL
    /// also needs its `?token=`, shown when it was made).
    pub url: String,
    /// When it was made, ms since the Unix epoch.
    pub created_at_ms: u64,
    /// Who made it.
    pub created_by: String,
}

/// An inbound hook just made, with its secret (shown this once).
#[derive(Debug, Serialize, ToSchema)]
pub struct HookCreated {
    /// The hook; its `url` is the one to give the sender (with `?token=` for a
    /// `token` hook).
    #[serde(flatten)]
    pub hook: HookInfo,
    /// The token (`token`) or the key the sender signs with (GitHub's "secret",
    /// Slack's signing secret, `hmac`).
    pub secret: String,
}

/// A session's inbound hooks.
#[derive(Debug, Serialize, ToSchema)]
pub struct HookList {
    /// By name.
    pub hooks: Vec<HookInfo>,
}

/// A delivery taken by an inbound hook.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"id": 14, "hook": "ci", "delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958", "answers": 41}))]
pub struct HookDelivered {
    /// The inbox entry that carries it.
    pub id: u64,
    /// The hook.
    pub hook: String,
    /// The sender's delivery id, when it gave one (a replay of it is refused).
    #[schema(required = true)]
    pub delivery: Option<String>,
    /// The log position of the wait it answers (none for a message).
    #[schema(required = true)]
    pub answers: Option<u64>,
}
