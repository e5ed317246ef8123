//! Wrapped agents under the one [`Harness::wake`]: a session whose agent is a CLI
//! (Claude Code, Codex, Pi, ...) is driven by a [`WrappedDriver`], which runs the CLI
//! through the gateway and the journaled tools ([`steadfast_wrap`]), exactly as a
//! native session is driven by the native loop. Workers, the server, `run` and
//! `resume` all come here through `wake`, so whichever process picks a session up
//! drives it with the agent it was started with, and never with another.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use steadfast_gateway::Upstreams;
use steadfast_log::{EndState, Event, SessionState, Status};
use steadfast_sandbox::Sandbox;
use steadfast_world::interrupt;
use steadfast_world::{InboundKind, Lease, LiveSession, World};
use steadfast_wrap::{drive_turn, Adapter, TurnReport, WrappedOptions};

use crate::driver::{body_text, Stop};
use crate::harness::Harness;
use crate::{Error, Result};

/// How many tool calls a wrapped turn may make per model call it is allowed: the
/// runaway guard's ceiling (a reply may ask for several tools at once).
const TOOL_CALLS_PER_STEP: usize = 4;

/// How wrapped agents are found, installed and run.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// Where their npm packages are installed (`None`: `agents/` under the home).
    pub install_dir: Option<PathBuf>,
    /// Agents configured by name (`[[agents.named]]`).
    pub named: Vec<NamedAgent>,
    /// The providers the gateway calls, with the harness's own keys.
    pub upstreams: Upstreams,
    /// Restarts of a CLI that died mid-turn before the session fails.
    pub max_restarts: u32,
    /// The longest a turn may run.
    pub turn_timeout: Duration,
    /// Whether a worker that lacks the CLI version a session runs installs it (from
    /// the npm registry, in the background) rather than only leaving the session to
    /// hosts that have it. Off by default: nothing is fetched while sessions run
    /// unless the operator says so (`[agents] install-missing = true`).
    pub install_missing: bool,
}

impl Default for AgentOptions {
    fn default() -> Self {
        AgentOptions {
            install_dir: None,
            named: Vec::new(),
            upstreams: Upstreams::default(),
            max_restarts: 5,
            turn_timeout: Duration::from_secs(3600),
            install_missing: false,
        }
    }
}

/// An agent configured by name: one of the adapters, at a version, with a default
/// model. Read as is from the configuration file (`[[agents.named]]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct NamedAgent {
    /// The name sessions use (`"agent": "reviewer"`, `--agent reviewer`).
    pub name: String,
    /// The adapter (`claude-code`, `codex`, `pi`, `opencode`).
    pub adapter: String,
    /// The model of its sessions when none is given (`provider/model`).
    #[serde(default)]
    pub model: Option<String>,
    /// The CLI version (`None`: the adapter's pinned one); install it with
    /// `steadfast install-agent <name>`.
    #[serde(default)]
    pub version: Option<String>,
    /// MCP servers every session of this agent gets: `mcp-servers = [{name = "tracker",
    /// url = "https://...", credential = "tracker"}]` (their credentials are looked up
    /// in the session owner's vault).
    #[serde(default)]
    pub mcp_servers: Vec<steadfast_log::McpServer>,
    /// The approval policy every session of this agent gets, beneath the operator's:
    /// `approval = { external = "ask", rules = [{ verdict = "allow", host = "pypi.org" }] }`.
    /// A session's own policy can only be stricter.
    #[serde(default)]
    pub approval: Option<steadfast_log::ApprovalPolicy>,
    /// Instructions its CLI is given on top of its own system prompt (`instructions =
    /// "Answer in French."`). A session keeps the ones it started with; `steadfast
    /// replay --agent <name>` tries a change of them on recorded sessions first.
    #[serde(default)]
    pub instructions: Option<String>,
}

/// An agent a session can run, as `GET /v1/agents` lists it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct AgentInfo {
    /// The name sessions use.
    pub name: String,
    /// `native`, or the adapter of a wrapped CLI.
    pub adapter: String,
    /// The CLI's npm package (wrapped agents).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub package: Option<String>,
    /// The version sessions run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The versions the adapter is tested with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tested: Option<String>,
    /// The model of its sessions when none is given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Whether sessions can run it on this host now (its CLI is installed).
    pub installed: bool,
}

impl AgentOptions {
    /// Where wrapped CLIs are installed for a harness whose home is `home`.
    pub fn install_dir_under(&self, home: Option<&Path>) -> PathBuf {
        self.install_dir.clone().unwrap_or_else(|| {
            home.map_or_else(|| PathBuf::from(".steadfast"), Path::to_path_buf)
                .join("agents")
        })
    }

    /// The named agent called `agent`, if the configuration has one.
    pub fn named_agent(&self, agent: &str) -> Option<&NamedAgent> {
        self.named.iter().find(|a| a.name == agent)
    }

    /// The MCP servers a session of `agent` gets: the named agent's, then the ones the
    /// session asks for (a name used twice is refused by the session's checks).
    pub fn mcp_servers_for(
        &self,
        agent: &str,
        requested: Vec<steadfast_log::McpServer>,
    ) -> Vec<steadfast_log::McpServer> {
        let mut servers = self
            .named_agent(agent)
            .map(|a| a.mcp_servers.clone())
            .unwrap_or_default();
        servers.extend(requested);
        servers
    }

    /// The approval policy of a named agent's sessions, if it has one.
    pub fn approval_for(&self, agent: &str) -> Option<steadfast_log::ApprovalPolicy> {
        self.named_agent(agent).and_then(|a| a.approval.clone())
    }

    /// The instructions a named agent's CLI is given, if it has any.
    pub fn instructions_for(&self, agent: &str) -> Option<String> {
        self.named_agent(agent)
            .and_then(|a| a.instructions.clone())
            .filter(|i| !i.trim().is_empty())
    }

    /// The adapter a session's agent stands for (a configured agent's, or a built-in
    /// adapter's), at the version it runs. `native` has none.
    pub fn adapter(&self, agent: &str) -> Result<Adapter> {
        let named = self.named_agent(agent);
        let adapter_name = named.map_or(agent, |a| a.adapter.as_str());
        let mut adapter = Adapter::named(adapter_name).ok_or_else(|| {
            let mut known = vec![steadfast_log::agent::NATIVE.to_string()];
            known.extend(Adapter::names().iter().map(|n| n.to_string()));
            known.extend(self.named.iter().map(|a| a.name.clone()));
            Error::Invalid(format!(
                "unknown agent `{agent}` (available: {})",
                known.join(", ")
            ))
        })?;
        adapter = adapter
            .at_version(named.and_then(|a| a.version.as_deref()))
            .map_err(Error::Invalid)?;
        adapter.name = agent.to_string();
        Ok(adapter)
    }

    /// Every agent sessions can name (the native loop, the built-in adapters and the
    /// configured agents), as installed under `dir`.
    pub fn list(&self, dir: &Path) -> Vec<AgentInfo> {
        let mut out = vec![AgentInfo {
            name: steadfast_log::agent::NATIVE.into(),
            adapter: steadfast_log::agent::NATIVE.into(),
            package: None,
            version: None,
            tested: None,
            model: None,
            installed: true,
        }];
        let names = Adapter::names()
            .into_iter()
            .map(|n| n.to_string())
            .chain(self.named.iter().map(|a| a.name.clone()));
        for name in names {
            let Ok(adapter) = self.adapter(&name) else {
                continue;
            };
            let named = self.named_agent(&name);
            out.push(AgentInfo {
                installed: adapter.is_installed(dir),
                adapter: named.map_or(name.clone(), |a| a.adapter.clone()),
                name,
                package: Some(adapter.package.to_string()),
                version: Some(adapter.version.clone()),
                tested: Some(adapter.tested.to_string()),
                model: named.and_then(|a| a.model.clone()),
            });
        }
        out
    }
}

impl<W: World + Clone, S: Sandbox> Harness<W, S> {
    /// Where wrapped CLIs are installed.
    pub fn install_dir(&self) -> PathBuf {
        self.options.agents.install_dir_under(self.home.as_deref())
    }

    /// The adapter a session's agent stands for; see [`AgentOptions::adapter`].
    pub fn adapter(&self, agent: &str) -> Result<Adapter> {
        self.options.agents.adapter(agent)
    }

    /// Checks that sessions of `agent` can run here: `native`, or a known wrapped
    /// agent (optionally `@version`) whose CLI is installed. The error says what to do.
    pub fn check_agent(&self, agent: &str) -> Result<()> {
        let (name, version) = match agent.split_once('@') {
            Some((name, version)) => (name, Some(version)),
            None => (agent, None),
        };
        if steadfast_log::agent::is_native(name) {
            return Ok(());
        }
        let adapter = self
            .adapter(name)?
            .at_version(version)
            .map_err(Error::Invalid)?;
        // A worker installs what it lacks when the operator allows it.
        if self.options.agents.install_missing {
            return Ok(());
        }
        self.installed(adapter, "needs").map(drop)
    }

    /// The adapter a wrapped session runs: its agent's, at the CLI version the session
    /// began with. A host without that version installed leaves the session to one
    /// that has it ([`Error::NotHere`]): another version would re-pay the turn's model
    /// calls and diverge from the record.
    pub fn session_adapter(&self, state: &SessionState) -> Result<Adapter> {
        let configured = self.adapter(&state.agent)?;
        // The version the session began with, if the agent still stands for the same
        // CLI (an operator who points a named agent at another CLI gets that one).
        let began = state.agent_cli.as_deref().and_then(|cli| {
            cli.strip_prefix(configured.package)
                .and_then(|rest| rest.strip_prefix('@'))
        });
        let adapter = configured.at_version(began).map_err(Error::Invalid)?;
        self.installed(adapter, "runs, for this session,")
    }

    /// `adapter`, if its CLI is installed here at its version; else why not and what to
    /// run ([`Error::NotHere`]: another host may have it). `wants` says who wants it.
    pub(crate) fn installed(&self, adapter: Adapter, wants: &str) -> Result<Adapter> {
        let dir = self.install_dir();
        if adapter.is_installed(&dir) {
            return Ok(adapter);
        }
        if self.options.agents.install_missing {
            self.install_in_background(&adapter, &dir);
            return Err(Error::NotHere(format!(
                "agent `{}` {wants} {}@{}, which this host is installing ([agents] install-missing); the session goes on once it is installed",
                adapter.name, adapter.package, adapter.version
            )));
        }
        let found = adapter
            .installed_version(&dir)
            .map_or_else(|| "is not installed".to_string(), |v| format!("is at {v}"));
        Err(Error::NotHere(format!(
            "agent `{}` {wants} {}@{}, which {found} in {}; run: steadfast install-agent {}@{}",
            adapter.name,
            adapter.package,
            adapter.version,
            dir.display(),
            adapter.name,
            adapter.version
        )))
    }

    /// Starts installing `adapter`'s CLI under `dir` on a thread of its own, unless this
    /// harness is installing it already. A failed install is logged; the next session
    /// that needs the CLI tries again.
    fn install_in_background(&self, adapter: &Adapter, dir: &Path) {
        let key = format!("{}@{}", adapter.package, adapter.version);
        let mut installing = self.installing.lock().unwrap_or_else(|e| e.into_inner());
        if !installing.insert(key.clone()) {
            return;
        }
        drop(installing);
        tracing::info!(cli = %key, dir = %dir.display(), "installing a CLI version a session runs");
        let (adapter, dir, set) = (adapter.clone(), dir.to_path_buf(), self.installing.clone());
        std::thread::spawn(move || {
            match adapter.install(&dir) {
                Ok(()) => tracing::info!(cli = %key, "installed"),
                Err(e) => tracing::warn!(cli = %key, error = %e, "installing the CLI failed"),
            }
            set.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
        });
    }

    /// Every agent sessions can name: the native loop, the built-in adapters and the
    /// configured agents.
    pub fn agents(&self) -> Vec<AgentInfo> {
        self.options.agents.list(&self.install_dir())
    }

    /// The driver of a wrapped session under `lease`.
    pub(crate) async fn wrapped_driver(
        &self,
        lease: Lease,
        state: SessionState,
        heartbeat: steadfast_world::Heartbeat,
        adopted: bool,
    ) -> Result<WrappedDriver<'_, W, S>> {
        let adapter = self.session_adapter(&state)?;
        let sandbox = self.sandbox_options(&lease, &state, &heartbeat).await?;
        let state = self.adopt_outside_edits(&lease, state).await?;
        let workspace = self.workspace_at_wake(&state, adopted).await?;
        let agents = &self.options.agents;
        let options = WrappedOptions {
            adapter,
            install_dir: self.install_dir(),
            workspace,
            sandbox,
            upstreams: agents.upstreams.clone(),
            max_restarts: agents.max_restarts,
            turn_timeout: agents.turn_timeout,
            max_exchanges_per_turn: self.options.max_steps_per_turn as usize,
            prices: self.options.prices.clone(),
            max_tool_calls_per_turn: (self.options.max_steps_per_turn as usize)
                .saturating_mul(TOOL_CALLS_PER_STEP),
            snapshot_timeout: self.options.snapshot_timeout,
            reconcilers: self.options.reconcilers.clone(),
            http: self.http.clone(),
            hosted: self.hosted_tools(&lease.session, &state).await?,
            mismatch: steadfast_journal::exchange::Mismatch::Diverge,
            adopted,
        };
        let live = std::sync::Arc::new(LiveSession::with_state(
            self.world.clone(),
            lease.clone(),
            state,
        ));
        live.fence(heartbeat.watch());
        Ok(WrappedDriver {
            harness: self,
            live,
            lease,
            options,
            report: TurnReport::default(),
            _heartbeat: heartbeat,
        })
    }
}

/// Drives one wrapped session under its lease: takes its messages and signals from
/// the inbox and runs each turn's CLI to the turn's end. Dropping it (or the process
/// dying) loses nothing: the next wake replays the turn from the log.
pub struct WrappedDriver<'h, W, S> {
    harness: &'h Harness<W, S>,
    lease: Lease,
    /// The session's log and state: the driver's appends, the gateway's and the
    /// journal's all go through it, and the fold keeps the state.
    live: std::sync::Arc<LiveSession<W>>,
    options: WrappedOptions,
    report: TurnReport,
    /// Keeps the lease while the driver lives (and fences `live` when it is lost).
    _heartbeat: steadfast_world::Heartbeat,
}

impl<W: World + Clone, S: Sandbox> WrappedDriver<'_, W, S> {
    /// The session's state as of its last record (held until the guard is dropped;
    /// never across an await).
    pub fn state(&self) -> std::sync::MutexGuard<'_, SessionState> {
        self.live.lock()
    }

    /// The session id.
    pub fn session(&self) -> &str {
        &self.lease.session
    }

    /// What the turns driven so far did (replayed and live calls, restarts).
    pub fn report(&self) -> &TurnReport {
        &self.report
    }

    async fn append(&mut self, events: &[Event]) -> Result<()> {
        self.live.append(events).await?;
        Ok(())
    }

    /// Works until the turn is done (and no message is queued), the session waits
    /// for a signal, or it ends.
    pub async fn run(&mut self) -> Result<Stop> {
        let (_never, stopping) = tokio::sync::watch::channel(false);
        loop {
            if let Some(stop) = self.run_until(stopping.clone()).await? {
                return Ok(stop);
            }
        }
    }

    /// Works as [`Self::run`] does, but once `stopping` turns true the CLI is stopped
    /// at once (it has no steps to stop between), the model reply and the tool call it
    /// was waiting on are still recorded, and it returns `Ok(None)`: the turn goes on
    /// from the log with the session's next driver, which replays what was recorded.
    pub async fn run_until(
        &mut self,
        stopping: tokio::sync::watch::Receiver<bool>,
    ) -> Result<Option<Stop>> {
        loop {
            if *stopping.borrow() {
                return Ok(None);
            }
            let (ended, status, turn, waiting) = self
                .live
                .with(|s| (s.is_ended(), s.phase.status(), s.turn, s.waiting().cloned()));
            if ended {
                return Ok(Some(Stop::Ended(end_state(status))));
            }
            let inbox = self.harness.world.inbox(&self.lease.session).await?;
            // An interrupt with no turn running (it came after the turn ended, or
            // while escalated) stops nothing: it is recorded, and so taken, rather
            // than left to stop a later turn; one for a waiting turn abandons the wait.
            if status != Status::Running {
                if let Some(item) = inbox.iter().find(|i| interrupt::is_interrupt(i)) {
                    self.append(&[Event::TurnInterrupted {
                        turn,
                        by: interrupt::sender(item),
                        inbox_id: item.id,
                        call_id: None,
                        stopped: status == Status::Waiting,
                        not_begun: Vec::new(),
                    }])
                    .await?;
                    continue;
                }
            }
            if let Some(wait) = waiting {
                let Some(signal) = inbox
                    .into_iter()
                    .find(|i| i.kind == InboundKind::Signal && i.name == wait.name)
                else {
                    return Ok(Some(Stop::Waiting(wait.name)));
                };
                self.append(&[Event::SignalReceived {
                    name: signal.name,
                    payload: signal.body,
                    inbox_id: signal.id,
                }])
                .await?;
                continue;
            }
            match status {
                Status::Running => {
                    let turn = drive_turn(
                        &self.live,
                        &self.harness.blobs,
                        &self.harness.drive,
                        &self.options,
                        stopping.clone(),
                    )
                    .await;
                    match turn {
                        Ok(report) if report.stopped => {
                            self.add(report);
                            return Ok(None);
                        }
                        Ok(report) => {
                            self.add(report);
                            // The turn is over: a checkpoint, when one is due, lets the
                            // next wake skip what came before.
                            let due = self
                                .live
                                .with(|s| self.harness.checkpoint_due(s).then(|| s.clone()));
                            if let Some(state) = due {
                                if let Some(checkpoint) =
                                    self.harness.checkpoint_if_due(&state).await?
                                {
                                    self.append(&[checkpoint]).await?;
                                }
                            }
                        }
                        Err(e) => {
                            // A CLI that failed past its restarts has ended the session.
                            let (ended, status) =
                                self.live.with(|s| (s.is_ended(), s.phase.status()));
                            if ended {
                                return Ok(Some(Stop::Ended(end_state(status))));
                            }
                            return Err(e.into());
                        }
                    }
                }
                _ => {
                    let Some(item) = inbox.into_iter().find(|i| i.kind != InboundKind::Signal)
                    else {
                        return Ok(Some(Stop::Idle));
                    };
                    let turn = turn + 1;
                    self.append(&[Event::UserMessage {
                        turn,
                        text: body_text(&item.body),
                        inbox_id: Some(item.id),
                    }])
                    .await?;
                }
            }
        }
    }

    fn add(&mut self, turn: TurnReport) {
        let r = &mut self.report;
        r.reply = turn.reply;
        r.restarts += turn.restarts;
        r.exchanges.replayed += turn.exchanges.replayed;
        r.exchanges.live += turn.exchanges.live;
        r.exchanges.diverged += turn.exchanges.diverged;
        r.tools.0 += turn.tools.0;
        r.tools.1 += turn.tools.1;
    }

    /// Drives the open turn once (no restart after a divergence), its model requests
    /// the record does not have treated as `mismatch` says: a replay against another
    /// CLI, whose report says where it diverged.
    pub(crate) async fn replay_turn(
        &mut self,
        mismatch: steadfast_journal::exchange::Mismatch,
    ) -> Result<TurnReport> {
        let (_never, stopping) = tokio::sync::watch::channel(false);
        let options = WrappedOptions {
            mismatch,
            ..self.options.clone()
        };
        Ok(drive_turn(
            &self.live,
            &self.harness.blobs,
            &self.harness.drive,
            &options,
            stopping,
        )
        .await?)
    }

    /// Sends a user message, opening a turn.
    pub async fn send(&mut self, text: &str) -> Result<()> {
        let (status, ended, turn) = self
            .live
            .with(|s| (s.phase.status(), s.is_ended(), s.turn + 1));
        if status != Status::Idle || ended {
            return Err(Error::Invalid(format!(
                "session {} is {status}; a message can only start a turn when it is idle",
                self.lease.session
            )));
        }
        self.append(&[Event::UserMessage {
            turn,
            text: text.to_string(),
            inbox_id: None,
        }])
        .await
    }

    /// Ends the session.
    pub async fn end(&mut self, state: EndState, reason: &str) -> Result<()> {
        let diff = self.live.with(|s| self.harness.changes_since_start(s));
        self.append(&[Event::SessionEnded {
            state,
            reason: reason.to_string(),
            diff,
        }])
        .await
    }

    /// Gives the lease back so another harness need not wait for it to lapse.
    pub async fn release(self) -> Result<()> {
        self.harness.world.release_lease(&self.lease).await?;
        Ok(())
    }
}

fn end_state(status: Status) -> EndState {
    match status {
        Status::Failed => EndState::Failed,
        Status::Escalated => EndState::Escalated,
        Status::Closed => EndState::Closed,
        _ => EndState::Completed,
    }
}
