//! The harness: opens sessions and wakes them. Holds no session state.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use steadfast_drive::Drive;
use steadfast_log::{Event, ModelSpec, Record, SessionState};
use steadfast_model::{Endpoint, ModelClient, RetryPolicy};
use steadfast_sandbox::egress::EgressDesk;
use steadfast_sandbox::{AnySandbox, Sandbox, SandboxOptions};
use steadfast_world::{now_ms, Blobs, Holder, LiveSession, SqliteWorld, World};

use crate::driver::{Driver, Stop};
use crate::wrapped::WrappedDriver;
use crate::{prompt, Error, Result};
use steadfast_journal::{Journal, MakeSandbox, SandboxSlot};
use steadfast_world::Heartbeat;

/// Turns a session's model spec into a client (this is where credentials live).
pub type ModelResolver =
    Arc<dyn Fn(&ModelSpec) -> steadfast_model::Result<ModelClient> + Send + Sync>;

/// Makes the sandbox for a workspace. Called on a blocking thread, when a session
/// first needs one (and again after an idle stop or a death).
pub type Provisioner<S> =
    Arc<dyn Fn(&Path, &SandboxOptions) -> steadfast_sandbox::Result<S> + Send + Sync>;

/// How a harness behaves.
#[derive(Clone)]
pub struct HarnessOptions {
    /// Resolves model clients.
    pub models: ModelResolver,
    /// Sandbox settings.
    pub sandbox: SandboxOptions,
    /// How long a lease lasts without renewal.
    pub lease_ttl: Duration,
    /// Model calls allowed in one turn before the session is escalated.
    pub max_steps_per_turn: u32,
    /// The most tokens a reply may have.
    pub max_tokens: u32,
    /// When the native agent compacts its conversation (context windows, shares).
    pub compaction: crate::compaction::CompactionPolicy,
    /// Records appended since the last checkpoint before a turn's end or a
    /// compaction stores another (waking reads the latest and what follows it).
    pub checkpoint_every: u64,
    /// Model prices that override the built-in table (for the cost breaker).
    pub prices: steadfast_model::pricing::PriceTable,
    /// Stop a session's sandbox after this long without a tool call (`None`: keep it
    /// while the driver lives).
    pub sandbox_idle_stop: Option<Duration>,
    /// How long a sandbox whose session runs services is kept without a tool call:
    /// its services count as activity up to this (see
    /// [`steadfast_journal::SandboxSlot::keeping_services`]).
    pub service_idle_stop: Duration,
    /// The longest a workspace snapshot may take. One that takes longer fails the call
    /// it belongs to (resolved by invariant 4 on the next wake) instead of holding the
    /// session's lease for ever.
    pub snapshot_timeout: Duration,
    /// Start provisioning a sandbox in the background when a model call begins, so the
    /// first tool call finds one ready (model calls never wait for it either way).
    pub prewarm_sandbox: bool,
    /// Probes that decide, after a crash, whether an external effect took place.
    pub reconcilers: Vec<Arc<dyn steadfast_sandbox::reconcile::Reconciler>>,
    /// Wrapped agents: where their CLIs are, and the providers their gateway calls.
    pub agents: crate::wrapped::AgentOptions,
    /// How long workers leave a session alone after a failure retrying may fix.
    pub retry_backoff: crate::Backoff,
    /// The operator's vault keys, to open the credentials sessions bind to egress
    /// destinations; `None`: no credential can be opened here.
    pub vault: Option<Arc<steadfast_world::VaultKeys>>,
    /// This host's identity (`STEADFAST_HOST_ID`, else the hostname): what the log
    /// records for a workspace given as a directory, which only this host drives.
    pub host: String,
    /// Where logical workspaces are materialized on this host (`None`:
    /// `workspaces/` under the home).
    pub workspace_root: Option<PathBuf>,
    /// The most the local cache of a shared drive store may hold, bytes.
    pub drive_cache_bytes: u64,
    /// How long a stopping worker lets what is in hand finish and be recorded (the
    /// native agent's step: a model reply streaming in, a command running; a wrapped
    /// CLI's reply and tool call in flight) before it cuts it off and hands the
    /// session back. What is cut off is redone by the next holder: its model call paid
    /// for twice, its command rolled back and run again.
    pub stop_grace: Duration,
    /// The operator's approval policy: the first layer of every session's, which no
    /// session's own can loosen (see [`steadfast_log::approval`]).
    pub approval: steadfast_log::ApprovalPolicy,
}

/// The default [`HarnessOptions::stop_grace`]: most model replies finish within it,
/// and it leaves a deploy's usual 30 s termination grace room for the rest.
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// The default bound on a host's cache of a shared drive store.
pub const DRIVE_CACHE_BYTES: u64 = 4 << 30;

impl std::fmt::Debug for HarnessOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HarnessOptions")
            .field("sandbox", &self.sandbox)
            .field("lease_ttl", &self.lease_ttl)
            .field("max_steps_per_turn", &self.max_steps_per_turn)
            .field("max_tokens", &self.max_tokens)
            .field("sandbox_idle_stop", &self.sandbox_idle_stop)
            .field("prewarm_sandbox", &self.prewarm_sandbox)
            .finish_non_exhaustive()
    }
}

impl HarnessOptions {
    /// Options whose models come from the environment (`*_API_KEY`, `*_BASE_URL`).
    pub fn from_env() -> Self {
        Self::with_models(Arc::new(ModelClient::from_env))
    }

    /// Options that send every model call to a fake provider at `base_url`, in the
    /// Anthropic wire format (the session's model name is passed through).
    pub fn fake_provider(base_url: &str) -> Self {
        let base_url = base_url.to_string();
        Self::with_models(Arc::new(move |_spec: &ModelSpec| {
            let endpoint = Endpoint {
                base_url: base_url.clone(),
                api_key: "fake-provider-key".into(),
            };
            ModelClient::new("anthropic", endpoint, RetryPolicy::default())
        }))
    }

    /// Options with the given model resolver and defaults for the rest.
    pub fn with_models(models: ModelResolver) -> Self {
        HarnessOptions {
            models,
            sandbox: SandboxOptions::default(),
            lease_ttl: Duration::from_secs(30),
            max_steps_per_turn: 200,
            max_tokens: 8192,
            compaction: Default::default(),
            checkpoint_every: CHECKPOINT_EVERY,
            prices: Default::default(),
            sandbox_idle_stop: Some(Duration::from_secs(300)),
            service_idle_stop: Duration::from_secs(1800),
            snapshot_timeout: Duration::from_secs(600),
            prewarm_sandbox: true,
            reconcilers: vec![Arc::new(steadfast_sandbox::reconcile::GitPush)],
            agents: Default::default(),
            retry_backoff: Default::default(),
            vault: None,
            host: steadfast_world::host_id(),
            workspace_root: None,
            drive_cache_bytes: DRIVE_CACHE_BYTES,
            stop_grace: STOP_GRACE,
            approval: Default::default(),
        }
    }
}

/// What a new session is.
#[derive(Debug, Clone)]
pub struct NewSession {
    /// The agent.
    pub agent: steadfast_log::Agent,
    /// `provider/model`.
    pub model: String,
    /// The workspace directory (created if missing).
    pub workspace: PathBuf,
    /// The logical workspace this is (`workspace` is then its directory under this
    /// host's workspace root): the log records the id, and any host can drive the
    /// session. `None`: a directory on this host, which the log binds to it.
    pub workspace_id: Option<String>,
    /// Who owns the session.
    pub owner: String,
    /// The first user message, if the session should start working at once. It is
    /// appended together with the session's first record, so no crash can leave a
    /// session that exists but has lost its task.
    pub task: Option<String>,
    /// Pause for a human's approval before every external-effect tool call (the
    /// shorthand for an `approval` of `{"external": "ask"}`).
    pub approve_external: bool,
    /// The session's own approval policy: per tool, MCP server, destination host
    /// and effect class. It can only be stricter than the operator's and the named
    /// agent's (see [`steadfast_log::approval`]).
    pub approval: Option<steadfast_log::ApprovalPolicy>,
    /// Bounds on tokens, turns and wall-clock time.
    pub limits: steadfast_log::Limits,
    /// The sandbox's network policy for this session; `None` for the harness's
    /// default.
    pub network: Option<steadfast_log::NetworkPolicy>,
    /// Tools the session's client runs (native agent only): calling one waits for
    /// the client's result.
    pub client_tools: Vec<steadfast_log::ClientTool>,
    /// Credentials the egress proxy adds to the sandbox's requests (by vault name).
    pub egress_credentials: Vec<steadfast_log::EgressCredential>,
    /// The repository the workspace was cloned from (see [`crate::git`]), which the
    /// `git_push` tool pushes to.
    pub git: Option<steadfast_log::GitSource>,
    /// The user's MCP servers whose tools the agent is offered.
    pub mcp_servers: Vec<steadfast_log::McpServer>,
    /// How many explorers one call of the native agent's `explore` tool may fork (0:
    /// the tool is not offered); at most [`crate::explore::MAX_EXPLORERS`].
    pub explorers: u32,
    /// A title, labels and metadata to list and find it by (the first message titles
    /// a session given none).
    pub described: steadfast_world::SessionPatch,
}

impl NewSession {
    /// A session of the native agent with model `provider/model` in `workspace`.
    pub fn native(model: &str, workspace: &Path) -> Self {
        NewSession {
            agent: steadfast_log::Agent::native(),
            model: model.into(),
            workspace: workspace.to_path_buf(),
            workspace_id: None,
            owner: "local".into(),
            task: None,
            approve_external: false,
            approval: None,
            limits: Default::default(),
            network: None,
            client_tools: Vec::new(),
            egress_credentials: Vec::new(),
            git: None,
            mcp_servers: Vec::new(),
            explorers: 0,
            described: Default::default(),
        }
    }

    /// The same session, opening its first turn with `task`.
    pub fn with_task(mut self, task: &str) -> Self {
        self.task = Some(task.to_string());
        self
    }
}

/// Parses `provider/model`.
pub fn parse_model(spec: &str) -> Result<ModelSpec> {
    match spec.split_once('/') {
        Some((provider, model)) if !provider.is_empty() && !model.is_empty() => Ok(ModelSpec {
            provider: provider.to_string(),
            model: model.to_string(),
        }),
        _ => Err(Error::Invalid(format!(
            "model `{spec}` is not of the form provider/model (e.g. anthropic/claude-sonnet-4-5)"
        ))),
    }
}

/// Opens the drive beside `blobs`: its objects where the blobs are (so hosts sharing
/// the blobs share snapshots), directly when that is a directory, through a cache of
/// at most `cache_bytes` under `home` when it is an object store; its per-host state
/// (which files were seen unchanged) under `home`.
pub fn open_drive(home: &Path, blobs: &Blobs, cache_bytes: u64) -> Result<Drive> {
    let state = home.join("drive");
    Ok(match blobs.drive_objects() {
        steadfast_world::DriveObjects::Dir(objects) => {
            adopt_objects(&state.join("objects"), &objects);
            Drive::open_at(&state, objects)?
        }
        steadfast_world::DriveObjects::Store(store) => {
            Drive::open_shared(&state, store, cache_bytes)?
        }
    })
}

/// Moves a home's drive objects from where they were kept before they went beside
/// the blobs, once (a failure leaves them; snapshots they hold are then missing and
/// reported so).
fn adopt_objects(old: &Path, new: &Path) {
    if old.is_dir() && !new.exists() {
        if let Some(parent) = new.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        if let Err(e) = std::fs::rename(old, new) {
            tracing::warn!(
                "could not move drive objects {} to {}: {e}",
                old.display(),
                new.display()
            );
        }
    }
}

/// Starts and wakes sessions. Stateless: any harness can wake any session.
pub struct Harness<W = SqliteWorld, S = AnySandbox> {
    pub(crate) world: W,
    pub(crate) blobs: Blobs,
    pub(crate) drive: Drive,
    pub(crate) holder: Holder,
    pub(crate) home: Option<PathBuf>,
    pub(crate) options: HarnessOptions,
    provision: Provisioner<S>,
    /// One client, one connection pool, for every provider call this harness makes or
    /// relays, whichever wake or CLI run makes it.
    pub(crate) http: reqwest::Client,
    /// The CLI versions (`package@version`) this harness is installing now.
    pub(crate) installing: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
    /// Held while this process starts a visitors' hold (see [`crate::visit`]).
    pub(crate) holds: tokio::sync::Mutex<()>,
}

impl Harness<SqliteWorld, AnySandbox> {
    /// The embedded default under `home`: `world.db` (SQLite), `blobs/`, `drive/`, and
    /// the sandbox backend the options name.
    pub fn open_local(home: &Path, options: HarnessOptions) -> Result<Self> {
        let blobs = Blobs::local(&home.join("blobs"))?;
        let world = SqliteWorld::open(home.join("world.db"))?.with_spill(blobs.clone());
        Harness::with_world_and_blobs(home, world, blobs, options)
    }
}

impl<W: World + Clone> Harness<W, AnySandbox> {
    /// A harness over `world`, with blobs and drive under `home` and the sandbox
    /// backend the options name.
    pub fn with_world(home: &Path, world: W, options: HarnessOptions) -> Result<Self> {
        let blobs = Blobs::local(&home.join("blobs"))?;
        Self::with_world_and_blobs(home, world, blobs, options)
    }

    /// A harness over `world` and `blobs`, with the drive under `home` and the
    /// sandbox backend the options name.
    pub fn with_world_and_blobs(
        home: &Path,
        world: W,
        blobs: Blobs,
        options: HarnessOptions,
    ) -> Result<Self> {
        let drive = open_drive(home, &blobs, options.drive_cache_bytes)?;
        let provision: Provisioner<AnySandbox> = Arc::new(AnySandbox::provision);
        let mut harness = Harness::new(world, blobs, drive, options, provision);
        harness.home = Some(home.to_path_buf());
        Ok(harness)
    }
}

impl<W: World + Clone, S: Sandbox> Harness<W, S> {
    /// A harness over the given parts.
    pub fn new(
        world: W,
        blobs: Blobs,
        drive: Drive,
        options: HarnessOptions,
        provision: Provisioner<S>,
    ) -> Self {
        Harness {
            world,
            blobs,
            drive,
            home: None,
            holder: Holder::new(format!("harness-{}", uuid::Uuid::now_v7().simple())),
            options,
            provision,
            http: steadfast_model::provider_http(),
            installing: Arc::default(),
            holds: tokio::sync::Mutex::new(()),
        }
    }

    /// How long its stopping workers let what is in hand finish (see
    /// [`HarnessOptions::stop_grace`]), so whoever stops them knows how long to wait.
    pub fn stop_grace(&self) -> Duration {
        self.options.stop_grace
    }

    /// The world sessions live in.
    pub fn world(&self) -> &W {
        &self.world
    }

    /// The drive snapshots live in.
    pub fn drive(&self) -> &Drive {
        &self.drive
    }

    /// The blob store.
    pub fn blobs(&self) -> &Blobs {
        &self.blobs
    }

    /// The options this harness runs with.
    pub fn options(&self) -> &HarnessOptions {
        &self.options
    }

    /// The state directory (blobs, drive, managed workspaces), if local.
    pub fn home(&self) -> Option<&Path> {
        self.home.as_deref()
    }

    /// Checks that sessions of `agent` with `model` (`provider/model`) can call it from
    /// here: a native session's provider is known and has a key; a wrapped CLI speaks
    /// the provider's API and the gateway has an upstream for it. The error says what
    /// is missing.
    pub fn check_agent_model(&self, agent: &str, model: &str) -> Result<()> {
        if steadfast_log::agent::is_native(agent) {
            return self.check_model(model);
        }
        let spec = parse_model(model)?;
        let api = self
            .adapter(agent)?
            .api_for(&spec.provider)
            .map_err(Error::Invalid)?;
        let upstreams = &self.options.agents.upstreams;
        let upstream = match api {
            "anthropic" => upstreams.anthropic.is_some(),
            _ => upstreams.openai.is_some(),
        };
        if !upstream {
            return Err(Error::Invalid(format!(
                "model {model}: this server has no key for `{api}`, so {agent} could not call it"
            )));
        }
        Ok(())
    }

    /// Checks that sessions of `model` (`provider/model`) can call it from here: the
    /// provider is known and has a key. The error says what is missing.
    pub fn check_model(&self, model: &str) -> Result<()> {
        let spec = parse_model(model)?;
        (self.options.models)(&spec)
            .map(|_| ())
            .map_err(|e| Error::Invalid(format!("model {model}: {e}")))
    }

    /// Whether calls to `model` have a price here (the configured table or the
    /// built-in one): an unpriced model's spend is unknown, not zero.
    pub fn is_priced(&self, model: &steadfast_log::ModelSpec) -> bool {
        steadfast_model::pricing::is_priced(&self.options.prices, &model.provider, &model.model)
    }

    /// Creates a session: its log begins with the agent, model, workspace and the
    /// workspace's initial snapshot. Returns its id.
    pub async fn start_session(&self, new: NewSession) -> Result<String> {
        let model = parse_model(&new.model)?;
        let money_bound = new.limits.max_cost_micro_usd;
        if money_bound.is_some() && !self.is_priced(&model) {
            return Err(Error::Invalid(format!(
                "budget: the model {} has no price here, so a money bound could never \
                 trip; configure one ([prices.\"{}\"] input = ..., output = ...) or bound \
                 the session by tokens instead",
                new.model, model.model
            )));
        }
        // A wrapped agent's CLI version is the session's from now on.
        let agent_cli = match new.agent.as_str() {
            _ if new.agent.is_native() => None,
            agent => {
                let adapter = self.adapter(agent)?;
                adapter.api_for(&model.provider).map_err(Error::Invalid)?;
                Some(format!("{}@{}", adapter.package, adapter.version))
            }
        };
        // The operator's layer, the named agent's, the session's own: each is judged,
        // and the strictest verdict stands.
        let approval: Vec<steadfast_log::ApprovalPolicy> =
            std::iter::once(self.options.approval.clone())
                .chain(self.options.agents.approval_for(&new.agent))
                .chain(new.approval)
                .filter(|layer| !layer.is_open())
                .collect();
        for layer in &approval {
            layer
                .check()
                .map_err(|e| Error::Invalid(format!("approval: {e}")))?;
        }
        crate::client_tools::check(&new.agent, &new.client_tools).map_err(Error::Invalid)?;
        crate::explore::check(new.explorers).map_err(Error::Invalid)?;
        crate::remote::check_servers(&new.mcp_servers).map_err(Error::Invalid)?;
        new.described.check().map_err(Error::Invalid)?;
        std::fs::create_dir_all(&new.workspace)
            .map_err(|e| Error::Invalid(format!("workspace {}: {e}", new.workspace.display())))?;
        let workspace = new
            .workspace
            .canonicalize()
            .map_err(|e| Error::Invalid(format!("workspace {}: {e}", new.workspace.display())))?;
        self.keep_home_out(&workspace)?;
        let (recorded, host) = match &new.workspace_id {
            Some(id) => {
                let expected = self.workspace_dir_of(id)?;
                if expected.canonicalize().ok().as_ref() != Some(&workspace) {
                    return Err(Error::Invalid(format!(
                        "workspace {id} is not under this host's workspace root {}",
                        expected.display()
                    )));
                }
                (id.clone(), None)
            }
            None => (
                workspace.display().to_string(),
                Some(self.options.host.clone()),
            ),
        };
        // The snapshot comes first: a crash while taking it leaves no session behind.
        let snapshot = self.snapshot(&workspace).await?;
        let id = format!("ses_{}", uuid::Uuid::now_v7().simple());
        self.world.create_session(&id, &new.owner).await?;
        if !new.described.is_empty() {
            self.world.update_session(&id, &new.described).await?;
        }
        let lease = self
            .world
            .acquire_lease(&id, &self.holder, self.options.lease_ttl)
            .await?;
        let instructions = agent_cli
            .is_some()
            .then(|| self.options.agents.instructions_for(&new.agent))
            .flatten();
        let mut events = vec![Event::SessionStarted {
            agent: new.agent,
            agent_cli,
            model,
            system: prompt::system(host.is_some().then_some(recorded.as_str())),
            instructions,
            workspace: recorded,
            host,
            initial_snapshot: Some(snapshot),
            created_at_ms: now_ms(),
            // A session's money bound is `limits.max_cost_micro_usd`; this field is
            // only read from logs written before there were limits.
            budget_micro_usd: None,
            approve_external: new.approve_external,
            approval,
            limits: new.limits,
            network: new.network,
            client_tools: new.client_tools,
            egress_credentials: new.egress_credentials,
            git: new.git.map(Box::new),
            mcp_servers: new.mcp_servers,
            explorers: new.explorers,
        }];
        if let Some(text) = new.task {
            events.push(Event::UserMessage {
                turn: 1,
                text,
                inbox_id: None,
            });
        }
        self.world.append(&lease, &events).await?;
        self.world.release_lease(&lease).await?;
        Ok(id)
    }

    /// Reads and folds a session's log without driving it.
    pub async fn state(&self, session: &str) -> Result<SessionState> {
        Ok(self.load(session).await?.0)
    }

    /// A session's state, from its latest checkpoint and the records after it when
    /// there is a usable one (this format, its blob intact), else from the whole log;
    /// with the records read (from the checkpoint's own on, or all).
    pub async fn load(&self, session: &str) -> Result<(SessionState, Vec<Record>)> {
        Ok(steadfast_world::load_state(&self.world, &self.blobs, session).await?)
    }

    /// Stores `state` (the session's, after its last record) as a checkpoint when
    /// enough has been appended since the last one, so waking reads only what
    /// follows it.
    pub(crate) async fn checkpoint_if_due(
        &self,
        state: &SessionState,
    ) -> Result<Option<steadfast_log::Event>> {
        if !self.checkpoint_due(state) {
            return Ok(None);
        }
        let checkpoint = steadfast_log::fold::Checkpoint {
            version: steadfast_log::fold::CHECKPOINT_VERSION,
            state: state.clone(),
        };
        let bytes = serde_json::to_vec(&checkpoint)
            .map_err(|e| Error::Invalid(format!("checkpoint: {e}")))?;
        let blob = self.blobs.put(&bytes).await?;
        Ok(Some(steadfast_log::Event::Checkpoint {
            blob,
            version: steadfast_log::fold::CHECKPOINT_VERSION,
        }))
    }

    /// Whether enough has been appended since `state`'s last checkpoint for another.
    pub(crate) fn checkpoint_due(&self, state: &SessionState) -> bool {
        state.last_seq >= state.last_checkpoint + self.options.checkpoint_every.max(1)
    }

    /// Takes over a session and returns the driver its agent needs: the native loop,
    /// or its wrapped CLI with the gateway and the journaled tools. The single entry
    /// point for every agent (workers, the server, `run` and `resume`).
    pub async fn wake(&self, session: &str) -> Result<Awake<'_, W, S>> {
        let lease = self
            .world
            .acquire_lease(session, &self.holder, self.options.lease_ttl)
            .await?;
        match self.wake_leased(lease.clone()).await {
            Ok(awake) => Ok(awake),
            Err(e) => {
                // Nothing was driven: the session is free for a process that can
                // (workers, which claim through the queue, hold it back instead).
                let _ = self.world.release_lease(&lease).await;
                Err(e)
            }
        }
    }

    /// [`Harness::wake`] for a lease already taken (by [`World::claim`]).
    #[tracing::instrument(level = "debug", skip_all, fields(session = %lease.session, epoch = lease.epoch))]
    pub async fn wake_leased(&self, lease: steadfast_world::Lease) -> Result<Awake<'_, W, S>> {
        // From the moment the lease is taken: a wake that takes longer than the lease
        // (a cold host hydrating a big workspace) keeps it, or knows it lost it.
        let heartbeat = Heartbeat::start(self.world.clone(), lease.clone(), self.options.lease_ttl);
        let (state, records) = self.load(&lease.session).await?;
        let adopted = self.take_over_workspace(&lease, &state).await;
        // A turn an earlier driver left in flight (it died, or its lease lapsed): not
        // one just opened by its user message, nor one held back to retry a failure.
        let fresh_or_retrying = records.last().is_some_and(|r| {
            matches!(
                r.event,
                steadfast_log::Event::UserMessage { .. } | steadfast_log::Event::DriveFailed { .. }
            )
        });
        if state.phase.status() == steadfast_log::Status::Running {
            // The turn is timed and traced whole, though it began elsewhere.
            let began = records.iter().rev().find_map(|r| match r.event {
                steadfast_log::Event::UserMessage { turn, .. } => Some((turn, r.at_ms)),
                _ => None,
            });
            if let Some((turn, at)) = began {
                steadfast_metrics::metrics().turn_resumed(&lease.session, turn, at);
            }
        }
        if state.phase.status() == steadfast_log::Status::Running && !fresh_or_retrying {
            let last = records.last().map_or(0, |r| r.at_ms);
            let behind = steadfast_world::now_ms().saturating_sub(last);
            steadfast_metrics::metrics().takeover(std::time::Duration::from_millis(behind));
        }
        if state.is_wrapped() {
            Ok(Awake::Wrapped(Box::new(
                self.wrapped_driver(lease, state, heartbeat, adopted)
                    .await?,
            )))
        } else {
            Ok(Awake::Native(Box::new(
                self.native_driver(lease, state, heartbeat, adopted).await?,
            )))
        }
    }

    /// Takes over a native session for the native loop: lease, fold, workspace
    /// restored to the last recorded snapshot (hydrating an empty one). The sandbox is
    /// provisioned later, when the session first needs one. The driver carries on at
    /// the frontier of uncommitted work. A wrapped session is refused: the native loop
    /// never drives one.
    pub async fn wake_native(&self, session: &str) -> Result<Driver<'_, W, S>> {
        match self.wake(session).await? {
            Awake::Native(driver) => Ok(*driver),
            Awake::Wrapped(driver) => {
                let agent = driver.state().agent.clone();
                let _ = driver.release().await;
                Err(Error::Invalid(format!(
                    "session {session} runs the `{agent}` agent, not the native loop"
                )))
            }
        }
    }

    async fn native_driver(
        &self,
        lease: steadfast_world::Lease,
        state: SessionState,
        heartbeat: Heartbeat,
        adopted: bool,
    ) -> Result<Driver<'_, W, S>> {
        let sandbox_options = self.sandbox_options(&lease, &state, &heartbeat).await?;
        let state = self.adopt_outside_edits(&lease, state).await?;
        let workspace = self.workspace_at_wake(&state, adopted).await?;
        let model = (self.options.models)(&state.model)?.with_http(self.http.clone());
        let hosted = self.hosted_tools(&lease.session, &state).await?;
        let live = Arc::new(LiveSession::with_state(
            self.world.clone(),
            lease.clone(),
            state,
        ));
        live.fence(heartbeat.watch());
        let journal = self
            .tools_journal(
                live,
                workspace,
                sandbox_options,
                self.options.sandbox_idle_stop,
            )
            .for_native_loop(crate::driver::STAGE_WITHIN)
            .with_hosted(hosted);
        Ok(Driver::new(self, journal, model, heartbeat).adopting(adopted))
    }

    /// The journal a session's tools run through, over `live`, its sandboxes made in
    /// `workspace` with `sandbox_options`, one idle for `idle_stop` stopped (services
    /// keep it longer): what the sandbox opens through its egress proxy is recorded
    /// against the call running, in the live log.
    pub(crate) fn tools_journal(
        &self,
        live: Arc<LiveSession<W>>,
        workspace: PathBuf,
        mut sandbox_options: SandboxOptions,
        idle_stop: Option<Duration>,
    ) -> Journal<W, S> {
        let last_snapshot = Arc::new(std::sync::Mutex::new(
            live.with(|s| s.last_snapshot.clone()),
        ));
        let desk = EgressDesk::new();
        let held_back: steadfast_journal::HeldBack = Arc::default();
        let record = Journal::<W, S>::egress_recorder(
            Arc::new(std::sync::OnceLock::from(live.clone())),
            Arc::clone(&held_back),
        );
        sandbox_options.egress_watch = Some(desk.watch(record));
        let history = steadfast_journal::history::HistoryQuota::of(&sandbox_options.limits);
        let make: MakeSandbox<S> = {
            let (provision, ws) = (self.provision.clone(), workspace.clone());
            Arc::new(move || provision(&ws, &sandbox_options))
        };
        let sandbox = SandboxSlot::new(workspace, make, self.drive.clone(), idle_stop)
            .keeping_services(self.options.service_idle_stop);
        Journal::new(
            live,
            self.drive.clone(),
            self.blobs.clone(),
            sandbox,
            last_snapshot,
        )
        .with_snapshot_timeout(self.options.snapshot_timeout)
        .with_held_back(held_back)
        .with_egress(desk)
        .with_history_quota(history)
    }

    /// The sandbox settings of a session: the harness's, with the network policy the
    /// session's log records (kept across resumes, whatever the resuming process was
    /// told), for every agent alike.
    pub(crate) async fn sandbox_options(
        &self,
        lease: &steadfast_world::Lease,
        state: &SessionState,
        heartbeat: &Heartbeat,
    ) -> Result<SandboxOptions> {
        let session = lease.session.as_str();
        self.keep_home_out(&self.workspace_dir(state)?)?;
        let mut options = self.options.sandbox.clone();
        // A logical workspace is somewhere else on each host; inside the sandbox it is
        // always at one path, so what the agent saw there stays true wherever it goes.
        if steadfast_log::is_workspace_id(&state.workspace) {
            options.mount_at = Some(steadfast_sandbox::WORKSPACE_MOUNT.into());
        }
        if let Some(policy) = &state.network {
            options.network = policy.clone();
        }
        options.inject = self.egress_credentials(session, state).await?;
        options.lease = Some((session.to_string(), lease.epoch));
        // Its sandbox outlives this process for as long as the lease is surely held,
        // for the next holder on this machine to adopt with what it runs.
        let watch = heartbeat.watch();
        options.hold = Some(steadfast_sandbox::Hold::new(move || watch.held_for()));
        Ok(options)
    }

    /// The headers the egress proxy adds for `session`: each bound credential, opened
    /// from its owner's vault here, outside any sandbox.
    async fn egress_credentials(
        &self,
        session: &str,
        state: &SessionState,
    ) -> Result<Vec<steadfast_sandbox::Injection>> {
        if state.egress_credentials.is_empty() {
            return Ok(Vec::new());
        }
        let mut injections = Vec::new();
        for binding in &state.egress_credentials {
            let name = &binding.credential;
            let value = self.open_credential(session, name).await?;
            let injection = steadfast_sandbox::Injection::new(
                &binding.host,
                &binding.header,
                &binding.prefix,
                &value,
            )
            .map_err(|e| Error::Invalid(format!("egress credential `{name}`: {e}")))?;
            injections.push(injection);
        }
        Ok(injections)
    }

    /// The tools the harness runs for a session outside its sandbox, set up with the
    /// credentials they need (opened here): its MCP servers' and `git_push`.
    pub(crate) async fn hosted_tools(
        &self,
        session: &str,
        state: &SessionState,
    ) -> Result<steadfast_journal::Hosted> {
        let git = match &state.git {
            None => None,
            Some(source) => {
                let credential = match &source.credential {
                    Some(name) => {
                        let secret = self.open_credential(session, name).await?;
                        Some(crate::git::GitCredential::basic(&source.username, &secret))
                    }
                    None => None,
                };
                Some(Arc::new(crate::git::GitPusher::new(
                    source.clone(),
                    credential,
                    self.workspace_dir(state)?,
                    self.options.sandbox.internal_hosts.clone(),
                )))
            }
        };
        // A wrapped agent's `explore` calls come through the journal, which has this
        // hook fork the session (the native loop forks in its driver).
        let explore = match state.explorers > 0 && state.is_wrapped() {
            true => {
                let (world, blobs) = (self.world.clone(), self.blobs.clone());
                let parent = session.to_string();
                let owner = self.world.session(session).await?.owner;
                let make: steadfast_journal::explore::MakeExplorers =
                    Arc::new(move |call_id, tasks, at| {
                        let (world, blobs) = (world.clone(), blobs.clone());
                        let (parent, owner) = (parent.clone(), owner.clone());
                        Box::pin(async move {
                            crate::fork::fork_explorers(
                                &world, &blobs, &parent, &owner, &call_id, tasks, at,
                            )
                            .await
                            .map_err(|e| e.to_string())
                        })
                    });
                Some(steadfast_journal::explore::Explorers(make))
            }
            false => None,
        };
        Ok(steadfast_journal::Hosted {
            remote: self.remote_tools(session, state).await?,
            git,
            explore,
        })
    }

    /// The session's MCP servers, connected with their credentials (opened here,
    /// outside any sandbox); none when it has none. A server that cannot be reached
    /// is left out with a warning (its tools are not offered this time).
    async fn remote_tools(
        &self,
        session: &str,
        state: &SessionState,
    ) -> Result<Option<Arc<crate::remote::RemoteTools>>> {
        if state.mcp_servers.is_empty() {
            return Ok(None);
        }
        let mut secrets = std::collections::HashMap::new();
        for server in &state.mcp_servers {
            if let Some(name) = &server.credential {
                let secret = self.open_credential(session, name).await?;
                secrets.insert(server.name.clone(), secret);
            }
        }
        let (remote, failures) = crate::remote::RemoteTools::connect(
            &state.mcp_servers,
            &secrets,
            &self.options.sandbox.internal_hosts,
        )
        .await;
        for failure in failures {
            tracing::warn!(%session, %failure, "MCP server left out");
        }
        Ok(Some(Arc::new(remote)))
    }

    /// Opens credential `name` of `session`'s owner from the vault, here, outside any
    /// sandbox, for the harness to use on the session's behalf.
    pub(crate) async fn open_credential(&self, session: &str, name: &str) -> Result<String> {
        let keys = self.options.vault.as_ref().ok_or_else(|| {
            Error::Invalid(format!(
                "the session uses vault credential `{name}`, and this host has no vault key ({})",
                steadfast_world::vault::KEY_ENV
            ))
        })?;
        let owner = self.world.session(session).await?.owner;
        let entry =
            self.world.vault_get(&owner, name).await?.ok_or_else(|| {
                Error::Invalid(format!("credential `{name}` is not in the vault"))
            })?;
        let value = keys
            .open(&owner, name, &entry.sealed)
            .map_err(|e| Error::Invalid(format!("credential `{name}`: {e}")))?;
        String::from_utf8(value)
            .map_err(|_| Error::Invalid(format!("credential `{name}` is not text")))
    }

    /// Refuses a workspace (or a read-only path shown to sandboxes) that is or holds
    /// this harness's home: the world's database, blobs and snapshots must never be
    /// visible to, let alone writable by, the code a model runs.
    pub(crate) fn keep_home_out(&self, workspace: &Path) -> Result<()> {
        let Some(home) = self.home.as_deref() else {
            return Ok(());
        };
        let Ok(home) = home.canonicalize() else {
            return Ok(());
        };
        let exposes = |dir: &Path| dir.canonicalize().is_ok_and(|d| home.starts_with(&d));
        if exposes(workspace) {
            return Err(Error::Invalid(format!(
                "the workspace {} holds Steadfast's home {} (the world's database and \
                 snapshots), which its sandbox would see: choose another workspace, or put \
                 the home elsewhere (--home or STEADFAST_HOME)",
                workspace.display(),
                home.display()
            )));
        }
        if let Some(dir) = self
            .options
            .sandbox
            .read_only_paths
            .iter()
            .find(|d| exposes(d))
        {
            return Err(Error::Invalid(format!(
                "[sandbox] read-only-paths: {} holds Steadfast's home {}, which sandboxes \
                 must never see",
                dir.display(),
                home.display()
            )));
        }
        Ok(())
    }

    pub(crate) async fn snapshot(&self, workspace: &Path) -> Result<String> {
        use tracing::Instrument;
        self.snapshot_timed(workspace)
            .instrument(steadfast_metrics::trace::snapshot_span())
            .await
    }

    async fn snapshot_timed(&self, workspace: &Path) -> Result<String> {
        Ok(self
            .drive
            .snapshot_within(workspace, self.options.snapshot_timeout)
            .await?
            .id)
    }
}

/// A woken session: the driver its agent needs.
pub enum Awake<'h, W, S> {
    /// The native agent loop.
    Native(Box<Driver<'h, W, S>>),
    /// A wrapped CLI through the gateway and the journaled tools.
    Wrapped(Box<WrappedDriver<'h, W, S>>),
}

impl<W: World + Clone, S: Sandbox> Awake<'_, W, S> {
    /// Works until the turn is done, the session waits for a signal, or it ends.
    pub async fn run(&mut self) -> Result<Stop> {
        match self {
            Awake::Native(d) => d.run().await,
            Awake::Wrapped(d) => d.run().await,
        }
    }

    /// Works as [`Self::run`] does, but once `stopping` turns true it stops as soon
    /// as it can without losing what is being paid for, and returns `Ok(None)`: the
    /// native loop at the end of the step in hand, a wrapped CLI at once (it has no
    /// steps to stop between), once the reply and the tool call it was waiting on
    /// are recorded.
    pub async fn run_until(
        &mut self,
        stopping: tokio::sync::watch::Receiver<bool>,
    ) -> Result<Option<Stop>> {
        match self {
            Awake::Native(d) => d.run_until(|| *stopping.borrow()).await,
            Awake::Wrapped(d) => d.run_until(stopping).await,
        }
    }

    /// Sends a user message, opening a turn.
    pub async fn send(&mut self, text: &str) -> Result<()> {
        match self {
            Awake::Native(d) => d.send(text).await,
            Awake::Wrapped(d) => d.send(text).await,
        }
    }

    /// Ends the session.
    pub async fn end(&mut self, state: steadfast_log::EndState, reason: &str) -> Result<()> {
        match self {
            Awake::Native(d) => d.end(state, reason).await,
            Awake::Wrapped(d) => d.end(state, reason).await,
        }
    }

    /// The session's state as of the driver's last look at its log.
    pub fn state(&self) -> std::sync::MutexGuard<'_, SessionState> {
        match self {
            Awake::Native(d) => d.state(),
            Awake::Wrapped(d) => d.state(),
        }
    }

    /// The session id.
    pub fn session(&self) -> &str {
        match self {
            Awake::Native(d) => d.session(),
            Awake::Wrapped(d) => d.session(),
        }
    }

    /// Commits what the native loop holds for its next commit (see
    /// [`Driver::commit_staged`]), for a graceful stop after `run` was dropped.
    pub async fn commit_staged(&mut self) -> Result<()> {
        match self {
            Awake::Native(d) => d.commit_staged().await,
            Awake::Wrapped(_) => Ok(()),
        }
    }

    /// Gives the lease back.
    pub async fn release(self) -> Result<()> {
        match self {
            Awake::Native(d) => d.release().await,
            Awake::Wrapped(d) => d.release().await,
        }
    }
}

/// Records appended between checkpoints (at the end of a turn or a compaction).
const CHECKPOINT_EVERY: u64 = 256;
