//! Configuration, layered: defaults, then `steadfast.toml`, then `STEADFAST_*` and
//! provider environment variables, then command-line flags.
//!
//! API keys are never read from the file: it names the environment variable that
//! holds each provider's key (`api-key-env`), so the file can be committed safely.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use steadfast_harness::{HarnessOptions, ModelResolver};
use steadfast_model::{Endpoint, ModelClient, RetryPolicy};

/// The whole configuration file.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Config {
    /// Where sessions live: `postgres://...`, `sqlite:PATH`, or unset for the embedded
    /// SQLite world under the home directory.
    pub world: Option<String>,
    /// Where big outputs go: `s3://bucket/prefix` (with the usual `AWS_*` variables)
    /// or a directory; unset for `blobs/` under the home directory.
    pub blobs: Option<String>,
    /// Where this host materializes logical workspaces (default: workspaces/ under
    /// the home directory).
    pub workspace_root: Option<PathBuf>,
    /// Default model of new sessions (`provider/model`).
    pub model: Option<String>,
    /// Per-provider endpoints.
    #[serde(default)]
    pub providers: BTreeMap<String, ProviderConfig>,
    /// Sandbox settings.
    #[serde(default)]
    pub sandbox: SandboxConfig,
    /// Harness settings.
    #[serde(default)]
    pub harness: HarnessConfig,
    /// Default bounds of new sessions.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// Wrapped CLI agents.
    #[serde(default)]
    pub agents: AgentsConfig,
    /// Model prices (USD per million tokens) overriding the built-in table, by
    /// model-name prefix: `[prices."my-model"] input = 1.0, output = 4.0`.
    #[serde(default)]
    pub prices: BTreeMap<String, PriceConfig>,
    /// API server settings.
    #[serde(default)]
    pub server: ServerConfig,
    /// The operator's approval policy, the first layer of every session's (no
    /// session can loosen it): `[approval] external = "ask"` and
    /// `[[approval.rules]] verdict = "deny", host = "*.internal.example"`.
    #[serde(default)]
    pub approval: steadfast_log::ApprovalPolicy,
    /// Apply pending migrations when opening the world (`--migrate`).
    #[serde(default)]
    pub migrate_on_open: bool,
}

/// API server settings.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct ServerConfig {
    /// Bearer tokens (hashed: `echo -n "$TOKEN" | steadfast hash-token`) and their owners.
    #[serde(default)]
    pub tokens: Vec<TokenConfig>,
    /// Refuse every request when no tokens are configured.
    #[serde(default)]
    pub production: bool,
    /// Message posts allowed per session per minute.
    pub messages_per_minute: Option<u32>,
    /// Sessions and uploads one caller may create per minute; default 300.
    pub creations_per_minute: Option<u32>,
    /// The largest workspace archive `POST /v1/uploads` takes, MiB; default 64.
    pub max_upload_mb: Option<usize>,
    /// Upload MiB one caller may store per hour; default 1024 (on a public server,
    /// 256 shared by every anonymous caller). 0: no quota.
    pub upload_mb_per_hour: Option<u64>,
    /// Seconds a connection may take to send a request's head (and may idle between
    /// requests); default 10.
    pub header_timeout_secs: Option<u64>,
    /// Seconds a request's body may go without sending anything; default 30.
    pub body_timeout_secs: Option<u64>,
    /// Seconds a request's body may take to arrive in all, however it trickles;
    /// default 300.
    pub body_deadline_secs: Option<u64>,
    /// Connections open at once; default 4096.
    pub max_connections: Option<usize>,
    /// Connections open at once from one address; default: 64 in public mode, no
    /// cap of its own otherwise (a backend may hold many event streams).
    pub max_connections_per_ip: Option<usize>,
    /// Requests one address may make per minute, health probes aside; default: 600
    /// in public mode, no rate of its own otherwise.
    pub requests_per_minute_per_ip: Option<u32>,
    /// Ceilings on every API session's bounds: sessions take them where they name
    /// none, and neither a create nor a `resume` signal can pass them.
    #[serde(default)]
    pub ceilings: LimitsConfig,
    /// Web origins whose pages may call the API from a browser (CORS), e.g.
    /// `["https://app.example.com"]`; `["*"]` for any. None by default.
    #[serde(default)]
    pub cors_origins: Vec<String>,
    /// Session changes POSTed to the operator's endpoint (`[server.webhook]`).
    #[serde(default)]
    pub webhook: WebhookConfig,
    /// OpenID Connect tokens accepted beside the static ones (`[server.oidc]`).
    pub oidc: Option<OidcSettings>,
}

/// The identity provider whose JWTs authenticate API callers.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct OidcSettings {
    /// The issuer, exactly as its tokens' `iss` says (`https://login.example.com`).
    pub issuer: String,
    /// The audience tokens must name (this API's client id at the provider).
    pub audience: String,
    /// The claim that names a session's owner; default `sub` (`email` is common).
    pub owner_claim: Option<String>,
    /// The provider's keys; default: found through the issuer's discovery document.
    pub jwks_url: Option<String>,
    /// The claim that makes a token an operator's (`admin` scope: issue tokens,
    /// read the audit log), e.g. `groups`; none by default.
    pub admin_claim: Option<String>,
    /// The values of `admin-claim` that do, e.g. `["steadfast-admins"]`.
    #[serde(default)]
    pub admin_values: Vec<String>,
}

impl OidcSettings {
    /// The server's configuration of it.
    pub fn config(&self) -> steadfast_server::oidc::OidcConfig {
        let mut config = steadfast_server::oidc::OidcConfig::new(&self.issuer, &self.audience);
        if let Some(claim) = &self.owner_claim {
            config.owner_claim = claim.clone();
        }
        config.jwks_url = self.jwks_url.clone();
        config.admins = self
            .admin_claim
            .clone()
            .map(|claim| steadfast_server::oidc::AdminClaim {
                claim,
                values: self.admin_values.clone(),
            });
        config
    }
}

/// Webhooks out: every session that waits, is escalated, finishes a turn, is
/// interrupted or ends is announced to `url`, signed with the secret the named
/// environment variable holds.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct WebhookConfig {
    /// The endpoint (`https://...`); none: no webhooks.
    pub url: Option<String>,
    /// The environment variable holding the signing secret (default
    /// `STEADFAST_WEBHOOK_SECRET`); the secret itself never goes in the file.
    pub secret_env: Option<String>,
    /// Attempts before a delivery is given up; default 12.
    pub max_attempts: Option<u32>,
    /// The delay after the first failure, milliseconds (doubling, with jitter, up to
    /// five minutes); default 2000.
    pub first_retry_ms: Option<u64>,
}

impl WebhookConfig {
    /// The deliverer's options, if webhooks are configured; an error if the secret
    /// is missing.
    pub fn options(&self) -> anyhow::Result<Option<steadfast_server::webhooks::WebhookOptions>> {
        let Some(url) = &self.url else {
            return Ok(None);
        };
        let var = self
            .secret_env
            .as_deref()
            .unwrap_or("STEADFAST_WEBHOOK_SECRET");
        let secret = std::env::var(var).unwrap_or_default();
        anyhow::ensure!(
            !secret.is_empty(),
            "[server.webhook]: the signing secret is not set: put it in ${var} (or name another variable with secret-env)"
        );
        let mut options = steadfast_server::webhooks::WebhookOptions::new(url, &secret);
        if let Some(n) = self.max_attempts {
            options.max_attempts = n;
        }
        if let Some(ms) = self.first_retry_ms {
            options.backoff.first = std::time::Duration::from_millis(ms);
        }
        Ok(Some(options))
    }
}

/// A configured token.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct TokenConfig {
    /// Who the token acts as.
    pub owner: String,
    /// BLAKE3 of the token, hex.
    pub token_hash: String,
    /// What it allows: `read`, `run`, `admin` (default `["read", "run"]`; an operator's
    /// token asks for `admin` to issue tokens and read the audit log).
    pub scopes: Option<Vec<steadfast_world::Scope>>,
}

/// How to reach one provider.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct ProviderConfig {
    /// Base URL (overridden by `<PROVIDER>_BASE_URL`).
    pub base_url: Option<String>,
    /// The environment variable holding the key (default `<PROVIDER>_API_KEY`).
    pub api_key_env: Option<String>,
}

/// Sandbox settings.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct SandboxConfig {
    /// Extra environment for commands (credential-like names are dropped).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Default `bash` timeout, seconds.
    pub default_timeout_secs: Option<u64>,
    /// Longest `bash` timeout a call may ask for, seconds.
    pub max_timeout_secs: Option<u64>,
    /// `auto` (bwrap where it works, else local with a warning), `bwrap` or `local`.
    pub backend: Option<String>,
    /// `deny-all` (default), `open`, or `allow:host[:port],*.domain,...`.
    pub network: Option<steadfast_log::NetworkPolicy>,
    /// Stop a session's sandbox after this many idle seconds (0: never).
    pub idle_stop_secs: Option<u64>,
    /// Keep a sandbox whose session runs services this many seconds without a tool
    /// call (default 1800): services count as activity up to it.
    pub service_idle_secs: Option<u64>,
    /// Address space per command process, MiB.
    pub memory_mb: Option<u64>,
    /// Processes at once per sandbox.
    pub processes: Option<u32>,
    /// CPU seconds per command process.
    pub cpu_secs: Option<u64>,
    /// Largest file a command may write, MiB.
    pub file_mb: Option<u64>,
    /// Resident memory of a whole sandbox, MiB (a cgroup, where the host has one).
    pub resident_mb: Option<u64>,
    /// Disk a session's workspace may grow to, MiB.
    pub workspace_mb: Option<u64>,
    /// Size of a sandbox's private /tmp and home, MiB.
    pub tmp_mb: Option<u64>,
    /// What one session's history (its calls' snapshots and offloaded outputs) may
    /// keep, MiB; past it, calls are answered with an error, not run. Default 51200;
    /// 0: no quota.
    pub history_mb: Option<u64>,
    /// What the histories of all of one owner's sessions may keep together, MiB;
    /// default (and 0): no quota.
    pub owner_history_mb: Option<u64>,
    /// Internal destinations (loopback, private, link-local addresses) an allow-list,
    /// and the MCP servers and git remotes sessions name, may reach, by name
    /// (`host:port`); sessions cannot add to these.
    #[serde(default)]
    pub internal_hosts: Vec<String>,
    /// Host directories shown read-only inside the sandbox (toolchains under /root...).
    #[serde(default)]
    pub read_only_paths: Vec<PathBuf>,
    /// Commands must run isolated: start only where an isolating backend works, and
    /// never fall back to `local`. Always so in production, in public mode and with
    /// tokens (`serve` sets it); `run` on a developer's machine may fall back, loudly.
    pub require_isolation: Option<bool>,
}

/// The longest `[harness] stop-grace-secs` may be: a stop that waits longer is no
/// stop at all (and a deploy's own termination grace is far shorter).
const MAX_STOP_GRACE_SECS: u64 = 3600;

/// Harness settings.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct HarnessConfig {
    /// Model calls allowed in one turn before the session escalates.
    pub max_steps_per_turn: Option<u32>,
    /// Most tokens per model reply.
    pub max_tokens: Option<u32>,
    /// Lease time to live, seconds.
    pub lease_ttl_secs: Option<u64>,
    /// How long a stopping worker (SIGTERM, Ctrl-C) lets the model reply or command in
    /// hand finish and be recorded before cutting it off, seconds (default 10). What is
    /// cut off is redone by the next worker: its model call asked, and paid for, again.
    pub stop_grace_secs: Option<u64>,
    /// The most this host's cache of a shared drive store (`blobs = "s3://..."`)
    /// holds, MiB (default 4096); least recently used snapshots' objects go first.
    pub drive_cache_mb: Option<u64>,
    /// The models' context window, tokens (default: by model, e.g. 200k for Claude).
    pub context_window: Option<u64>,
    /// Compact the native agent's conversation when a request would pass this share
    /// of the window (default 0.8).
    pub compact_at: Option<f64>,
    /// Compact at all (default true); off, a conversation that outgrows the window
    /// fails the session.
    pub compaction: Option<bool>,
    /// How long after a turn ends `steadfast gc` keeps its replies' streamed pieces
    /// (`model_delta` records, redundant with the replies' outcomes) before pruning
    /// them, seconds (default one day, so clients reconnecting late still get them).
    pub keep_deltas_secs: Option<u64>,
    /// Records appended since the last checkpoint before the next one is stored, at
    /// a turn's end or a compaction (default 256).
    pub checkpoint_every: Option<u64>,
    /// The longest a workspace snapshot around a tool call may take, seconds (default
    /// 600). A call whose snapshot before it takes longer does not run, and the agent is
    /// told so; raise it for very large workspaces on slow disks.
    pub snapshot_timeout_secs: Option<u64>,
}

impl LimitsConfig {
    /// These settings as a session's bounds.
    pub fn bounds(&self) -> steadfast_log::Limits {
        steadfast_log::Limits {
            max_cost_micro_usd: self.max_cost_usd.map(steadfast_log::money::micro_usd),
            max_tokens: self.max_tokens,
            max_turns: self.max_turns,
            max_duration_ms: self.max_duration_secs.map(|s| s.saturating_mul(1000)),
        }
    }
}

/// Default bounds of new sessions (each can be set per session too).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct LimitsConfig {
    /// Money per session, USD.
    pub max_cost_usd: Option<f64>,
    /// Tokens per session.
    pub max_tokens: Option<u64>,
    /// Turns per session.
    pub max_turns: Option<u32>,
    /// Wall-clock seconds per session.
    pub max_duration_secs: Option<u64>,
}

/// Wrapped CLI agents (Claude Code, ...).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct AgentsConfig {
    /// Where their npm packages are installed (`steadfast install-agent <name>`).
    pub install_dir: Option<PathBuf>,
    /// Restarts of a CLI that died mid-turn before the session fails.
    pub max_restarts: Option<u32>,
    /// The longest a turn may run, seconds.
    pub turn_timeout_secs: Option<u64>,
    /// Whether a worker installs, from the npm registry, a CLI version a session runs
    /// that it lacks (default false: the session waits for a host that has it).
    pub install_missing: Option<bool>,
    /// Named agents: `[[agents.named]] name = "reviewer", adapter = "claude-code"`.
    #[serde(default)]
    pub named: Vec<steadfast_harness::NamedAgent>,
}

/// A model's price, USD per million tokens.
#[derive(Debug, Clone, Copy, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct PriceConfig {
    /// Input tokens.
    pub input: f64,
    /// Output tokens.
    pub output: f64,
}

/// What the command line says over the file: its global flags, each of which also
/// reads an environment variable (`STEADFAST_WORLD`, ...). `None` leaves the file's
/// setting as it is.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--world`.
    pub world: Option<String>,
    /// `--blobs`.
    pub blobs: Option<String>,
    /// `--workspace-root`.
    pub workspace_root: Option<PathBuf>,
    /// `--migrate`: it can only ask for migrations, never turn off the file's.
    pub migrate: bool,
    /// `--sandbox`.
    pub sandbox: Option<String>,
    /// `--network`.
    pub network: Option<steadfast_log::NetworkPolicy>,
}

impl Config {
    /// The configuration in its layers, each over the one before: the defaults, the
    /// file (`path`, or `steadfast.toml` here if there is one), then the environment
    /// and the flags (`overrides`); checked as a whole.
    pub fn layered(path: Option<&Path>, overrides: Overrides) -> anyhow::Result<Self> {
        let mut config = Config::load(path)?;
        let Overrides {
            world,
            blobs,
            workspace_root,
            migrate,
            sandbox,
            network,
        } = overrides;
        config.world = world.or(config.world);
        config.blobs = blobs.or(config.blobs);
        config.workspace_root = workspace_root.or(config.workspace_root);
        config.migrate_on_open |= migrate;
        config.sandbox.backend = sandbox.or(config.sandbox.backend);
        config.sandbox.network = network.or(config.sandbox.network);
        config.check()?;
        Ok(config)
    }

    /// Loads `path`, or `steadfast.toml` in the working directory if it exists.
    fn load(path: Option<&Path>) -> anyhow::Result<Self> {
        let (path, required) = match path {
            Some(p) => (p.to_path_buf(), true),
            None => (PathBuf::from("steadfast.toml"), false),
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => toml::from_str(&text).with_context(|| format!("in {}", path.display())),
            Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => {
                Ok(Config::default())
            }
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// The endpoint of `provider`: base URL from the environment, the file or the
    /// provider's default; key from the environment variable the file names.
    pub fn endpoint(&self, provider: &str) -> Option<Endpoint> {
        let upper = provider.to_ascii_uppercase();
        let cfg = self.providers.get(provider).cloned().unwrap_or_default();
        let key_var = cfg
            .api_key_env
            .unwrap_or_else(|| format!("{upper}_API_KEY"));
        if !matches!(provider, "anthropic" | "openai") {
            return None;
        }
        let api_key = std::env::var(&key_var).ok().filter(|k| !k.is_empty())?;
        Some(Endpoint {
            base_url: self.base_url(provider),
            api_key,
        })
    }

    /// The base URL calls to `provider` go to: `<PROVIDER>_BASE_URL`, else the file's
    /// `base-url`, else the provider's own address (empty for a provider it does not
    /// know).
    fn base_url(&self, provider: &str) -> String {
        let upper = provider.to_ascii_uppercase();
        let default = match provider {
            "anthropic" => "https://api.anthropic.com",
            "openai" => "https://api.openai.com/v1",
            _ => "",
        };
        std::env::var(format!("{upper}_BASE_URL"))
            .ok()
            .filter(|u| !u.is_empty())
            .or_else(|| {
                self.providers
                    .get(provider)
                    .and_then(|p| p.base_url.clone())
            })
            .unwrap_or_else(|| default.to_string())
    }

    /// Sets every unset setting the harness options carry to the value in force.
    fn fill_defaults(&mut self, options: &HarnessOptions) {
        self.bind(&mut options.clone(), Way::Show);
    }

    /// The one mapping between the file's settings and the harness options they set
    /// (see [`Binding`]): `Apply` sets each option the file sets; `Show` fills each
    /// setting the file leaves unset with the option's value, for `config --dump`.
    fn bind(&mut self, options: &mut HarnessOptions, way: Way) {
        let secs = |s: u64| Duration::from_secs(s);
        let as_secs = |d: &Duration| d.as_secs();
        let h = &mut self.harness;
        Binding::new(way).each(
            &mut h.max_steps_per_turn,
            &mut options.max_steps_per_turn,
            std::convert::identity,
            |o| *o,
        );
        Binding::new(way).each(
            &mut h.max_tokens,
            &mut options.max_tokens,
            std::convert::identity,
            |o| *o,
        );
        Binding::new(way).each(
            &mut h.lease_ttl_secs,
            &mut options.lease_ttl,
            |s| secs(s.max(3)),
            as_secs,
        );
        Binding::new(way).each(
            &mut h.stop_grace_secs,
            &mut options.stop_grace,
            secs,
            as_secs,
        );
        Binding::new(way).each(
            &mut h.compact_at,
            &mut options.compaction.at_share,
            std::convert::identity,
            |o| *o,
        );
        Binding::new(way).each(
            &mut h.compaction,
            &mut options.compaction.off,
            |on: bool| !on,
            |off| !*off,
        );
        Binding::new(way).each(
            &mut h.checkpoint_every,
            &mut options.checkpoint_every,
            |n: u64| n.max(1),
            |o| *o,
        );
        Binding::new(way).each(
            &mut h.snapshot_timeout_secs,
            &mut options.snapshot_timeout,
            secs,
            as_secs,
        );
        Binding::new(way).each(
            &mut h.drive_cache_mb,
            &mut options.drive_cache_bytes,
            |mb: u64| mb.max(1) << 20,
            |b| *b >> 20,
        );
        let s = &mut self.sandbox;
        let sandbox = &mut options.sandbox;
        Binding::new(way).each(
            &mut s.default_timeout_secs,
            &mut sandbox.default_timeout,
            secs,
            as_secs,
        );
        Binding::new(way).each(
            &mut s.max_timeout_secs,
            &mut sandbox.max_timeout,
            secs,
            as_secs,
        );
        Binding::new(way).each(
            &mut s.require_isolation,
            &mut sandbox.require_isolation,
            std::convert::identity,
            |o| *o,
        );
        let limits = &mut sandbox.limits;
        for (set, option) in [
            (&mut s.memory_mb, &mut limits.memory_mb),
            (&mut s.cpu_secs, &mut limits.cpu_secs),
            (&mut s.file_mb, &mut limits.file_mb),
            (&mut s.resident_mb, &mut limits.resident_mb),
            (&mut s.workspace_mb, &mut limits.workspace_mb),
            (&mut s.tmp_mb, &mut limits.tmp_mb),
            (&mut s.history_mb, &mut limits.history_mb),
            (&mut s.owner_history_mb, &mut limits.owner_history_mb),
        ] {
            Binding::new(way).either(set, option);
        }
        Binding::new(way).either(&mut s.processes, &mut limits.processes);
        let a = &mut self.agents;
        let agents = &mut options.agents;
        Binding::new(way).each(
            &mut a.max_restarts,
            &mut agents.max_restarts,
            std::convert::identity,
            |o| *o,
        );
        Binding::new(way).each(
            &mut a.turn_timeout_secs,
            &mut agents.turn_timeout,
            secs,
            as_secs,
        );
        Binding::new(way).each(
            &mut a.install_missing,
            &mut agents.install_missing,
            std::convert::identity,
            |o| *o,
        );
        // The backend is named in the file and parsed into the options.
        match way {
            Way::Apply => {
                if let Some(Ok(b)) = s.backend.as_deref().map(str::parse) {
                    sandbox.backend = b;
                }
            }
            Way::Show => {
                s.backend.get_or_insert_with(|| sandbox.backend.to_string());
            }
        }
    }

    /// Why [`Config::endpoint`] has none for `provider`, in words that say what to do:
    /// a provider it does not know (whatever keys are set), or the key's variable unset.
    pub fn why_no_endpoint(&self, provider: &str) -> String {
        if !matches!(provider, "anthropic" | "openai") {
            return format!("unknown provider `{provider}`: use anthropic or openai (a model is named PROVIDER/MODEL, e.g. anthropic/claude-sonnet-4-5)");
        }
        let key_var = self
            .providers
            .get(provider)
            .and_then(|p| p.api_key_env.clone())
            .unwrap_or_else(|| format!("{}_API_KEY", provider.to_ascii_uppercase()));
        format!("no API key for provider `{provider}` (set {key_var})")
    }

    /// The model of a new session when none is named.
    pub fn default_model(&self) -> String {
        if let Some(m) = &self.model {
            return m.clone();
        }
        if self.endpoint("anthropic").is_some() {
            "anthropic/claude-sonnet-4-5".into()
        } else if self.endpoint("openai").is_some() {
            "openai/gpt-5".into()
        } else {
            "fake/steadfast-demo".into()
        }
    }

    /// Harness options with models resolved through this configuration.
    pub fn harness_options(&self) -> HarnessOptions {
        let config = self.clone();
        let models: ModelResolver = Arc::new(move |spec| {
            let endpoint = config.endpoint(&spec.provider).ok_or_else(|| {
                steadfast_model::Error::Config(config.why_no_endpoint(&spec.provider))
            })?;
            ModelClient::new(&spec.provider, endpoint, RetryPolicy::default())
        });
        self.apply(HarnessOptions::with_models(models))
    }

    /// Applies the file's harness and sandbox settings to `options`.
    pub fn apply(&self, mut options: HarnessOptions) -> HarnessOptions {
        // Whether isolation is required follows from more than its own setting.
        let mut settings = self.clone();
        settings.sandbox.require_isolation = Some(self.requires_isolation());
        settings.bind(&mut options, Way::Apply);
        let h = &self.harness;
        options.compaction.window = h.context_window;
        if h.compact_at.is_some() {
            let share = options.compaction.at_share;
            options.compaction.keep_share = options.compaction.keep_share.min(share / 2.0);
        }
        options.workspace_root = self.workspace_root.clone();
        for (model, price) in &self.prices {
            options
                .prices
                .insert(model.clone(), (price.input, price.output));
        }
        let s = &self.sandbox;
        options.sandbox.env.extend(s.env.clone());
        if let Some(n) = &s.network {
            options.sandbox.network = n.clone();
        }
        // The in-sandbox agent is this very program (`steadfast sandbox-agent`).
        if let Ok(exe) = std::env::current_exe() {
            options.sandbox.agent = vec![exe.display().to_string(), "sandbox-agent".into()];
        }
        // A key that does not parse is refused by `check`, before any command runs.
        options.vault = steadfast_world::VaultKeys::from_env()
            .ok()
            .flatten()
            .map(Arc::new);
        options.sandbox.internal_hosts = s
            .internal_hosts
            .iter()
            .filter_map(|h| steadfast_sandbox::HostRule::parse(h).ok())
            .collect();
        options
            .sandbox
            .read_only_paths
            .extend(s.read_only_paths.iter().cloned());
        if let Some(secs) = s.service_idle_secs {
            options.service_idle_stop = Duration::from_secs(secs);
        }
        if let Some(secs) = s.idle_stop_secs {
            options.sandbox_idle_stop = (secs > 0).then(|| Duration::from_secs(secs));
        }
        self.apply_agents(&mut options.agents);
        options.approval = self.approval.clone();
        options
    }

    /// Wrapped agents: install directory, named agents, and the providers their
    /// gateway calls (with the keys this configuration names).
    fn apply_agents(&self, agents: &mut steadfast_harness::AgentOptions) {
        let a = &self.agents;
        agents.install_dir = std::env::var_os("STEADFAST_AGENTS_DIR")
            .map(PathBuf::from)
            .or_else(|| a.install_dir.clone());
        agents.named = a.named.clone();
        let upstream = |p: &str| {
            self.endpoint(p).map(|e| steadfast_gateway::Upstream {
                base_url: e.base_url,
                api_key: e.api_key,
            })
        };
        agents.upstreams = steadfast_gateway::Upstreams {
            anthropic: upstream("anthropic"),
            openai: upstream("openai"),
        };
    }

    /// Whether this is a production deployment (`[server] production`, or
    /// Whether commands must run in an isolating sandbox, never falling back to
    /// `local`: in production, or when the configuration (or `serve`, for a public or
    /// token-authenticated server) says so.
    pub fn requires_isolation(&self) -> bool {
        self.is_production() || self.sandbox.require_isolation == Some(true)
    }

    /// `STEADFAST_ENV=production`): no development fallbacks.
    pub fn is_production(&self) -> bool {
        self.server.production || std::env::var("STEADFAST_ENV").is_ok_and(|v| v == "production")
    }

    /// Checks settings that can be wrong in ways the file's types cannot say.
    pub fn check(&self) -> anyhow::Result<()> {
        for origin in &self.server.cors_origins {
            let scheme = origin.starts_with("https://") || origin.starts_with("http://");
            anyhow::ensure!(
                origin == "*"
                    || (scheme
                        && origin.matches('/').count() == 2
                        && !origin.contains(char::is_whitespace)),
                "[server] cors-origins: {origin:?} is not an origin (scheme://host[:port], no path), or \"*\""
            );
        }
        if let (Some(per_hour), max) = (self.server.upload_mb_per_hour, self.server.max_upload_mb) {
            let max = max.unwrap_or(steadfast_server::DEFAULT_MAX_UPLOAD >> 20) as u64;
            anyhow::ensure!(
                per_hour == 0 || per_hour >= max,
                "[server] upload-mb-per-hour {per_hour} is under max-upload-mb {max}: no upload that large could ever be stored"
            );
        }
        if let Some(oidc) = &self.server.oidc {
            anyhow::ensure!(
                oidc.admin_claim.is_some() != oidc.admin_values.is_empty(),
                "[server.oidc] admin-claim and admin-values go together: the claim names where to look, the values what makes an operator"
            );
        }
        steadfast_world::VaultKeys::from_env()?;
        let over = self.limits.bounds().over(&self.server.ceilings.bounds());
        anyhow::ensure!(
            over.is_empty(),
            "[limits] {}: a default bound over its ceiling in [server.ceilings]",
            over.iter()
                .map(|(field, default, ceiling)| {
                    let key = match *field {
                        "max_duration_s" => "max-duration-secs".to_string(),
                        other => other.replace('_', "-"),
                    };
                    format!("{key} {default} is over {ceiling}")
                })
                .collect::<Vec<_>>()
                .join(", ")
        );
        if let Some(url) = &self.server.webhook.url {
            anyhow::ensure!(
                (url.starts_with("https://") || url.starts_with("http://"))
                    && reqwest::Url::parse(url).is_ok(),
                "[server.webhook] url: {url:?} is not an http(s) URL"
            );
        }
        anyhow::ensure!(
            self.server.webhook.max_attempts != Some(0),
            "[server.webhook] max-attempts: at least 1"
        );
        anyhow::ensure!(
            self.harness
                .compact_at
                .is_none_or(|s| (0.2..=0.95).contains(&s)),
            "[harness] compact-at: a share of the context window between 0.2 and 0.95"
        );
        anyhow::ensure!(
            self.harness
                .stop_grace_secs
                .is_none_or(|s| s <= MAX_STOP_GRACE_SECS),
            "[harness] stop-grace-secs: at most {MAX_STOP_GRACE_SECS} (an hour)"
        );
        anyhow::ensure!(
            self.harness.context_window.is_none_or(|w| w >= 4096),
            "[harness] context-window: at least 4096 tokens"
        );
        let mut seen = std::collections::BTreeSet::new();
        for agent in &self.agents.named {
            anyhow::ensure!(
                seen.insert(agent.name.as_str()),
                "[[agents.named]]: two agents are named `{}`",
                agent.name
            );
            anyhow::ensure!(
                !steadfast_log::agent::is_native(&agent.name)
                    && steadfast_wrap::Adapter::named(&agent.name).is_none(),
                "[[agents.named]]: `{}` is a built-in agent's name",
                agent.name
            );
            let adapter = steadfast_wrap::Adapter::named(&agent.adapter).with_context(|| {
                format!(
                    "[[agents.named]] {}: unknown adapter `{}` (available: {})",
                    agent.name,
                    agent.adapter,
                    steadfast_wrap::Adapter::names().join(", ")
                )
            })?;
            adapter
                .at_version(agent.version.as_deref())
                .map_err(|e| anyhow::anyhow!("[[agents.named]] {}: {e}", agent.name))?;
            steadfast_harness::remote::check_servers(&agent.mcp_servers)
                .map_err(|e| anyhow::anyhow!("[[agents.named]] {}: {e}", agent.name))?;
            if let Some(model) = &agent.model {
                steadfast_harness::parse_model(model)
                    .map_err(|e| anyhow::anyhow!("[[agents.named]] {}: model: {e}", agent.name))?;
            }
            if let Some(policy) = &agent.approval {
                policy.check().map_err(|e| {
                    anyhow::anyhow!("[[agents.named]] {}: approval.{e}", agent.name)
                })?;
            }
        }
        self.approval
            .check()
            .map_err(|e| anyhow::anyhow!("[approval] {e}"))?;
        if let Some(b) = &self.sandbox.backend {
            b.parse::<steadfast_sandbox::Backend>()
                .map_err(|e| anyhow::anyhow!("[sandbox] backend: {e}"))?;
        }
        for host in &self.sandbox.internal_hosts {
            steadfast_sandbox::HostRule::parse(host)
                .map_err(|e| anyhow::anyhow!("[sandbox] internal-hosts: {e}"))?;
        }
        Ok(())
    }

    /// The bounds of a new session: the file's defaults, overridden by `over`.
    pub fn limits(&self, over: &LimitsConfig) -> steadfast_log::Limits {
        self.limits.bounds().raised(&over.bounds())
    }

    /// The effective configuration as TOML, keys shown as set or unset, never their value.
    /// Settings left unset show the value in force (the built-in default).
    pub fn dump(&self) -> String {
        let mut effective = self.clone();
        effective.world = self.world.as_deref().map(steadfast_world::redacted);
        effective.model = Some(self.default_model());
        effective.fill_defaults(&self.harness_options());
        for provider in ["anthropic", "openai"] {
            let entry = effective.providers.entry(provider.to_string()).or_default();
            let endpoint = self.endpoint(provider);
            entry.base_url = Some(
                endpoint
                    .as_ref()
                    .map(|e| e.base_url.clone())
                    .unwrap_or_else(|| self.base_url(provider)),
            );
            entry
                .api_key_env
                .get_or_insert_with(|| format!("{}_API_KEY", provider.to_ascii_uppercase()));
        }
        let mut out = toml::to_string_pretty(&effective).unwrap_or_default();
        for provider in ["anthropic", "openai"] {
            let state = if self.endpoint(provider).is_some() {
                "set"
            } else {
                "unset"
            };
            out.push_str(&format!("# {provider} key: {state}\n"));
        }
        out
    }
}

/// Which way [`Config::bind`] goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    /// The file's settings into the options.
    Apply,
    /// The options' values into the settings the file leaves unset.
    Show,
}

/// One setting of the file and the option it sets, taken one way or the other: the
/// conversions of a pair are written once, side by side, so applying a setting and
/// showing its value in force cannot drift apart.
struct Binding(Way);

impl Binding {
    fn new(way: Way) -> Self {
        Binding(way)
    }

    /// A setting whose value `to` turns into the option's, and `from` back.
    fn each<T: Copy, O>(
        self,
        setting: &mut Option<T>,
        option: &mut O,
        to: impl Fn(T) -> O,
        from: impl Fn(&O) -> T,
    ) {
        match self.0 {
            Way::Apply => {
                if let Some(v) = *setting {
                    *option = to(v);
                }
            }
            Way::Show => {
                setting.get_or_insert_with(|| from(option));
            }
        }
    }

    /// A setting and an option that are both optional and alike: whichever is set.
    fn either<T: Copy>(self, setting: &mut Option<T>, option: &mut Option<T>) {
        match self.0 {
            Way::Apply => *option = setting.or(*option),
            Way::Show => *setting = setting.or(*option),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setting_applied_is_shown_back_as_the_value_in_force() {
        let set: Config = toml::from_str(
            r#"
            [harness]
            max-steps-per-turn = 77
            max-tokens = 1234
            lease-ttl-secs = 9
            stop-grace-secs = 42
            compact-at = 0.6
            compaction = false
            checkpoint-every = 99
            snapshot-timeout-secs = 45
            drive-cache-mb = 321
            [sandbox]
            default-timeout-secs = 11
            max-timeout-secs = 222
            backend = "bwrap"
            require-isolation = true
            memory-mb = 512
            processes = 64
            cpu-secs = 30
            file-mb = 10
            resident-mb = 256
            workspace-mb = 1000
            tmp-mb = 100
            history-mb = 300
            owner-history-mb = 900
            [agents]
            max-restarts = 5
            turn-timeout-secs = 600
            install-missing = false
            "#,
        )
        .unwrap();
        let mut shown = Config::default();
        shown.fill_defaults(&set.harness_options());
        let section = |c: &Config| {
            (
                toml::to_string(&c.harness).unwrap(),
                toml::to_string(&c.sandbox).unwrap(),
                toml::to_string(&c.agents).unwrap(),
            )
        };
        assert_eq!(section(&shown), section(&set));
    }

    #[test]
    fn a_default_bound_over_its_ceiling_is_refused_naming_both() {
        let mut cfg = Config::default();
        cfg.limits.max_cost_usd = Some(10.0);
        cfg.limits.max_duration_secs = Some(7200);
        cfg.server.ceilings.max_cost_usd = Some(20.0);
        cfg.server.ceilings.max_duration_secs = Some(3600);
        let err = cfg.check().unwrap_err().to_string();
        assert!(
            err.contains("[limits] max-duration-secs 7200 is over 3600"),
            "{err}"
        );
        assert!(!err.contains("max-cost-usd"), "{err}");
        cfg.server.ceilings.max_duration_secs = None;
        cfg.check().unwrap();
    }

    #[test]
    fn an_oidc_admin_claim_needs_its_values_and_the_values_their_claim() {
        let oidc = |claim: Option<&str>, values: &[&str]| {
            let text = format!(
                "[server.oidc]\nissuer = \"https://login.example.com\"\naudience = \"api\"\n{}admin-values = {values:?}\n",
                claim.map_or(String::new(), |c| format!("admin-claim = \"{c}\"\n"))
            );
            toml::from_str::<Config>(&text).unwrap()
        };
        for (claim, values) in [(Some("groups"), &[][..]), (None, &["admins"][..])] {
            let err = oidc(claim, values).check().unwrap_err().to_string();
            assert!(err.contains("admin-claim and admin-values"), "{err}");
        }
        oidc(Some("groups"), &["admins"]).check().unwrap();
        oidc(None, &[]).check().unwrap();
    }

    #[test]
    fn an_upload_quota_under_the_largest_upload_is_refused() {
        let server = |text: &str| toml::from_str::<Config>(&format!("[server]\n{text}")).unwrap();
        let err = server("upload-mb-per-hour = 10\nmax-upload-mb = 64\n")
            .check()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("upload-mb-per-hour 10 is under max-upload-mb 64"),
            "{err}"
        );
        let err = server("upload-mb-per-hour = 32\n")
            .check()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("under max-upload-mb 64"),
            "the default limit counts: {err}"
        );
        server("upload-mb-per-hour = 64\n").check().unwrap();
        server("upload-mb-per-hour = 0\nmax-upload-mb = 512\n")
            .check()
            .unwrap();
    }

    #[test]
    fn a_cors_origin_that_is_not_an_origin_is_refused_naming_it() {
        for bad in [
            "app.example.com",
            "https://app.example.com/",
            "https://a.com/x",
            "https://a b",
        ] {
            let mut cfg = Config::default();
            cfg.server.cors_origins = vec![bad.into()];
            let err = cfg.check().unwrap_err().to_string();
            assert!(
                err.contains("cors-origins") && err.contains(bad),
                "{bad}: {err}"
            );
        }
        for good in ["*", "https://app.example.com", "http://localhost:3000"] {
            let mut cfg = Config::default();
            cfg.server.cors_origins = vec![good.into()];
            assert!(cfg.check().is_ok(), "{good}");
        }
    }

    #[test]
    fn the_file_names_the_key_variable_and_env_overrides_the_url() {
        let cfg: Config = toml::from_str(
            r#"
            model = "openai/gpt-5-mini"
            [providers.openai]
            base-url = "http://proxy.internal/v1"
            api-key-env = "STEADFAST_TEST_OPENAI_KEY_A"
            [harness]
            max-steps-per-turn = 7
            [sandbox]
            env = { LANG = "C" }
            "#,
        )
        .unwrap();
        assert!(cfg.endpoint("openai").is_none(), "no key yet");
        std::env::set_var("STEADFAST_TEST_OPENAI_KEY_A", "sk-test");
        let e = cfg.endpoint("openai").unwrap();
        assert_eq!(
            (e.base_url.as_str(), e.api_key.as_str()),
            ("http://proxy.internal/v1", "sk-test")
        );
        assert_eq!(cfg.default_model(), "openai/gpt-5-mini");
        let options = cfg.harness_options();
        assert_eq!(options.max_steps_per_turn, 7);
        assert_eq!(options.sandbox.env["LANG"], "C");
        let dump = cfg.dump();
        assert!(
            dump.contains("# openai key: set") && !dump.contains("sk-test"),
            "{dump}"
        );
    }

    #[test]
    fn a_stop_grace_out_of_range_is_a_configuration_error_naming_it() {
        let parse = |text: &str| toml::from_str::<Config>(text).map(|c| c.check());
        assert!(parse("[harness]\nstop-grace-secs = 0\n").unwrap().is_ok());
        assert!(parse("[harness]\nstop-grace-secs = 3600\n")
            .unwrap()
            .is_ok());
        let err = parse("[harness]\nstop-grace-secs = 18446744073709551615\n")
            .unwrap()
            .unwrap_err()
            .to_string();
        assert!(err.contains("stop-grace-secs"), "{err}");
        let err = parse("[harness]\nstop-grace-secs = -1\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("stop-grace-secs"), "{err}");
    }

    #[test]
    fn the_operators_approval_policy_is_every_sessions_first_layer() {
        let text = r#"
            [approval]
            external = "ask"
            [[approval.rules]]
            verdict = "deny"
            host = "*.internal.example"
            [[approval.rules]]
            verdict = "allow"
            mcp-server = "tracker"
            [[agents.named]]
            name = "reviewer"
            adapter = "claude-code"
            approval = { rules = [{ verdict = "ask", tool = "git_push" }] }
        "#;
        let cfg: Config = toml::from_str(text).unwrap();
        cfg.check().unwrap();
        let options = cfg.harness_options();
        assert_eq!(options.approval.external, steadfast_log::Verdict::Ask);
        assert_eq!(options.approval.rules.len(), 2);
        assert_eq!(
            options.approval.rules[1].mcp_server.as_deref(),
            Some("tracker")
        );
        let agent = options.agents.approval_for("reviewer").unwrap();
        assert_eq!(agent.rules[0].tool.as_deref(), Some("git_push"));
        assert!(options.agents.approval_for("native").is_none());

        let bad = "[[approval.rules]]\nverdict = \"deny\"\nhost = \"not a host\"\n";
        let err = toml::from_str::<Config>(bad).unwrap().check().unwrap_err();
        assert!(
            err.to_string().starts_with("[approval] rules[0].host"),
            "{err}"
        );
        let unknown = "[approval]\nexternal = \"maybe\"\n";
        assert!(toml::from_str::<Config>(unknown).is_err());
    }

    #[test]
    fn flags_lie_over_the_file_and_the_file_over_the_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("steadfast.toml");
        std::fs::write(
            &path,
            "world = \"sqlite:/from/file.db\"\nmigrate-on-open = true\n\
             [sandbox]\nbackend = \"local\"\nnetwork = \"open\"\n",
        )
        .unwrap();
        let file_only = Config::layered(Some(&path), Overrides::default()).unwrap();
        assert_eq!(file_only.world.as_deref(), Some("sqlite:/from/file.db"));
        assert!(
            file_only.migrate_on_open,
            "the file's migrate-on-open stands"
        );
        assert_eq!(file_only.sandbox.backend.as_deref(), Some("local"));
        assert!(file_only.blobs.is_none(), "the default where neither says");

        let network = steadfast_log::NetworkPolicy::parse("allow:example.com").unwrap();
        let flags = Overrides {
            world: Some("sqlite:/from/flag.db".into()),
            network: Some(network.clone()),
            migrate: false,
            ..Overrides::default()
        };
        let both = Config::layered(Some(&path), flags).unwrap();
        assert_eq!(both.world.as_deref(), Some("sqlite:/from/flag.db"));
        assert_eq!(both.sandbox.network, Some(network));
        assert_eq!(both.sandbox.backend.as_deref(), Some("local"));
        assert!(
            both.migrate_on_open,
            "no flag turns the file's migrations off"
        );

        let bad = Overrides {
            sandbox: Some("chroot".into()),
            ..Overrides::default()
        };
        let err = Config::layered(Some(&path), bad).unwrap_err().to_string();
        assert!(
            err.contains("[sandbox] backend"),
            "the layers are checked: {err}"
        );
    }

    #[test]
    fn two_agents_with_one_name_are_a_configuration_error() {
        let parse = |text: &str| toml::from_str::<Config>(text).unwrap().check();
        let one = "[[agents.named]]\nname = \"reviewer\"\nadapter = \"claude-code\"\n";
        assert!(parse(one).is_ok());
        let twice = format!("{one}[[agents.named]]\nname = \"reviewer\"\nadapter = \"codex\"\n");
        let err = parse(&twice).unwrap_err().to_string();
        assert!(err.contains("two agents are named `reviewer`"), "{err}");
        let shadow = "[[agents.named]]\nname = \"codex\"\nadapter = \"pi\"\n";
        assert!(parse(shadow).is_err(), "a built-in agent's name");
        let unknown = "[[agents.named]]\nname = \"x\"\nadapter = \"aider\"\n";
        assert!(parse(unknown)
            .unwrap_err()
            .to_string()
            .contains("unknown adapter"));
        let with_mcp = format!(
            "{one}mcp-servers = [{{name = \"tracker\", url = \"https://mcp.example.com/mcp\", credential = \"tracker\", classes = {{close_issue = \"external\"}}}}]\n"
        );
        let cfg = toml::from_str::<Config>(&with_mcp).unwrap();
        cfg.check().unwrap();
        let agents = cfg.harness_options().agents;
        let servers = agents.mcp_servers_for("reviewer", Vec::new());
        assert_eq!(servers.len(), 1);
        assert_eq!(servers[0].credential.as_deref(), Some("tracker"));
        assert!(agents.mcp_servers_for("native", Vec::new()).is_empty());
        let bad_mcp = format!("{one}mcp-servers = [{{name = \"a b\", url = \"https://x/mcp\"}}]\n");
        assert!(parse(&bad_mcp)
            .unwrap_err()
            .to_string()
            .contains("server name"));
        let bad_network = "[sandbox]\nnetwork = \"everywhere\"\n";
        let err = toml::from_str::<Config>(bad_network)
            .unwrap_err()
            .to_string();
        assert!(err.contains("network policy `everywhere`"), "{err}");
    }

    #[test]
    fn an_identity_provider_is_read_with_its_owner_claim() {
        let cfg: Config = toml::from_str(
            "[server.oidc]\nissuer = \"https://login.example.com\"\naudience = \"steadfast\"\nowner-claim = \"email\"\n",
        )
        .unwrap();
        let oidc = cfg.server.oidc.unwrap().config();
        assert_eq!(oidc.issuer, "https://login.example.com");
        assert_eq!(oidc.audience, "steadfast");
        assert_eq!(oidc.owner_claim, "email");
        assert_eq!(oidc.jwks_url, None, "found by discovery");
        assert!(
            toml::from_str::<Config>("[server.oidc]\nissuer = \"https://x\"\n").is_err(),
            "an audience is required"
        );
    }

    #[test]
    fn a_webhook_needs_an_http_url_a_secret_in_the_environment_and_an_attempt() {
        let parse = |text: &str| {
            let cfg: Config = toml::from_str(text)?;
            cfg.check()?;
            anyhow::Ok(cfg)
        };
        assert!(parse("[server.webhook]\nurl = \"ftp://hooks.example.com\"").is_err());
        assert!(parse("[server.webhook]\nurl = \"https://\"").is_err());
        assert!(parse("[server.webhook]\nurl = \"https://h.example\"\nmax-attempts = 0").is_err());
        assert!(
            parse("[server.webhook]\nsecret = \"inline\"").is_err(),
            "no secrets in the file"
        );
        let cfg = parse(
            "[server.webhook]\nurl = \"https://hooks.example.com/x\"\nsecret-env = \"SF_TEST_HOOK_SECRET_UNSET\"",
        )
        .unwrap();
        let err = cfg.server.webhook.options().err().unwrap().to_string();
        assert!(err.contains("SF_TEST_HOOK_SECRET_UNSET"), "{err}");
        assert!(Config::default()
            .server
            .webhook
            .options()
            .unwrap()
            .is_none());
    }

    #[test]
    fn unknown_keys_and_keys_in_the_file_are_refused() {
        assert!(toml::from_str::<Config>("[providers.openai]\napi-key = \"sk-oops\"").is_err());
        assert!(toml::from_str::<Config>("modle = \"x\"").is_err());
    }
}
