//! `steadfast serve` (the API plus workers) and `steadfast worker` (workers alone).

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use steadfast_server::{app, Auth, ServerState, TokenEntry};

use crate::config::Config;
use crate::setup;

/// Arguments of `steadfast serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8700", env = "STEADFAST_LISTEN")]
    listen: String,
    /// Workers to run in this process (0: API only).
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Production mode: with no tokens configured, refuse every request.
    #[arg(long)]
    production: bool,
    /// Serve anyone, without authentication. Must be asked for by name, and needs
    /// --session-spend-cap-usd.
    #[arg(long, requires = "session_spend_cap_usd")]
    public: bool,
    /// The most any session may spend on models in public mode, in US dollars.
    #[arg(long)]
    session_spend_cap_usd: Option<f64>,
    #[command(flatten)]
    metrics: MetricsArgs,
}

/// Where Prometheus scrapes a process.
#[derive(Debug, Args)]
pub struct MetricsArgs {
    /// Serve Prometheus metrics at /metrics on this address, a listener of the
    /// operator's own (metrics span every owner's sessions, so outside development
    /// they are not on the API's listener).
    #[arg(long, env = "STEADFAST_METRICS_LISTEN")]
    metrics_listen: Option<String>,
}

impl MetricsArgs {
    /// Starts the metrics listener, if one was asked for.
    async fn start(
        &self,
        world: steadfast_world::AnyWorld,
        blobs: steadfast_world::Blobs,
        sandbox: Option<steadfast_sandbox::SandboxOptions>,
    ) -> anyhow::Result<Option<tokio::task::JoinHandle<()>>> {
        let Some(addr) = &self.metrics_listen else {
            return Ok(None);
        };
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("listening for metrics on {addr}"))?;
        eprintln!(
            "steadfast: metrics at http://{}/metrics",
            listener.local_addr()?
        );
        let router = steadfast_server::metrics_router(world, blobs, sandbox);
        Ok(Some(tokio::spawn(async move {
            let options = steadfast_server::ServeOptions::default();
            if let Err(e) =
                steadfast_server::serve(listener, router, options, std::future::pending()).await
            {
                tracing::error!(error = %e, "the metrics listener failed");
            }
        })))
    }
}

/// How long a stopping server waits for open connections.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Arguments of `steadfast worker`.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// Workers to run in this process.
    #[arg(long, default_value_t = 1)]
    workers: usize,
    #[command(flatten)]
    metrics: MetricsArgs,
}

/// Connections one address may hold open on a public server unless configured.
const PUBLIC_CONNECTIONS_PER_IP: usize = 64;
/// Upload MiB every anonymous caller of a public server may store an hour, together.
const PUBLIC_UPLOAD_MB_PER_HOUR: u64 = 256;
/// Requests one address may make per minute on a public server unless configured.
const PUBLIC_REQUESTS_PER_MINUTE_PER_IP: u32 = 600;

/// Where commands must run isolated (production, a public server, a server with
/// tokens, or `[sandbox] require-isolation`), a host where no isolating sandbox backend
/// works is a startup error, never a silent fallback: other people's commands never
/// run as plain processes of this machine.
fn check_isolation(config: &Config, mode: &str) -> anyhow::Result<()> {
    if config.requires_isolation() {
        steadfast_sandbox::isolation(&config.harness_options().sandbox).map_err(|why| {
            anyhow::anyhow!(
                "{mode} refuses to start without an isolating sandbox: {why} \
                 (install bubblewrap, or use a host where it can create namespaces)"
            )
        })?;
    }
    Ok(())
}

/// What a server that must isolate commands is, in words (for [`check_isolation`]).
fn isolation_mode(config: &Config, public: bool) -> &'static str {
    if config.is_production() {
        "production mode"
    } else if public {
        "public mode"
    } else if !config.server.tokens.is_empty() {
        "a server with tokens"
    } else {
        "a configuration that requires isolation"
    }
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
    }
}

pub async fn serve(home: &Path, config: &Config, args: ServeArgs) -> anyhow::Result<ExitCode> {
    let mut config = config.clone();
    config.server.production |= args.production;
    // Anyone who can reach a public server, or holds a token, runs commands here:
    // never as plain processes of this machine.
    if args.public || !config.server.tokens.is_empty() || config.server.oidc.is_some() {
        config.sandbox.require_isolation = Some(true);
    }
    let config = &config;
    // An API-only server (`--workers 0`) runs no session's commands: its workers,
    // elsewhere, are checked where they start.
    if args.workers > 0 {
        check_isolation(config, isolation_mode(config, args.public))?;
    }
    let tokens: Vec<TokenEntry> = config
        .server
        .tokens
        .iter()
        .map(|t| TokenEntry {
            owner: t.owner.clone(),
            token_hash: t.token_hash.clone(),
            scopes: t.scopes.clone(),
        })
        .collect();
    let public_cap = if args.public {
        args.session_spend_cap_usd
    } else {
        None
    };
    let oidc = match &config.server.oidc {
        Some(settings) if !args.public => {
            Some(steadfast_server::oidc::Oidc::start(settings.config()).await?)
        }
        _ => None,
    };
    let auth = Auth::with_oidc(&tokens, oidc, config.is_production(), public_cap)
        .map_err(anyhow::Error::msg)?;
    let world = setup::world(home, config, false).await?;
    setup::check_stores(home, config, &world).await?;
    let (harness, fake) = setup::shared_harness(home, config, world).await?;
    let sandbox = (args.workers > 0).then(|| harness.options().sandbox.clone());
    let metrics = args
        .metrics
        .start(harness.world().clone(), harness.blobs().clone(), sandbox)
        .await?;
    let webhook = config.server.webhook.options()?;
    let workspaces = harness.workspace_root()?;
    std::fs::create_dir_all(&workspaces)?;
    let mut state = ServerState::new(
        harness.clone(),
        auth.clone(),
        workspaces,
        config.default_model(),
    );
    state.ceilings = config.server.ceilings.bounds();
    state.defaults = config.limits.bounds();
    use steadfast_world::World as _;
    // Ceilings change only with the configuration: each server records those it
    // enforces as it starts, so the audit log says which were in force when.
    harness
        .world()
        .audit(
            "operator",
            "ceilings.set",
            &steadfast_world::host_id(),
            &serde_json::json!({"ceilings": state.ceilings, "defaults": state.defaults}),
        )
        .await?;
    state.cors_origins = config.server.cors_origins.clone();
    state.vault = harness.options().vault.clone();
    if let Some(n) = config.server.messages_per_minute {
        state.messages_per_minute = n;
    }
    if let Some(n) = config.server.creations_per_minute {
        state.creations_per_minute = n;
    }
    state.upload_bytes_per_hour = match config.server.upload_mb_per_hour {
        Some(0) => None,
        Some(mb) => Some(mb.saturating_mul(1 << 20)),
        None if args.public => Some(PUBLIC_UPLOAD_MB_PER_HOUR << 20),
        None => Some(steadfast_server::DEFAULT_UPLOAD_BYTES_PER_HOUR),
    };
    state.runs_commands = args.workers > 0;
    if let Some(mb) = config.server.max_upload_mb {
        state.max_upload = mb.saturating_mul(1 << 20);
    }
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    let addr = listener.local_addr()?;
    eprintln!(
        "steadfast: serving on http://{addr} ({}; {}); API described at /openapi.json",
        auth.mode_name(),
        crate::render::count(args.workers as u64, "worker")
    );
    println!("http://{addr}");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    if let Some(options) = webhook {
        let world = harness.world().clone();
        let stop = stop_rx.clone();
        tokio::spawn(steadfast_server::webhooks::deliver(world, options, stop));
    }
    let grace = harness.stop_grace();
    let mut workers = spawn_workers(harness, args.workers, stop_rx);
    // On SIGTERM or Ctrl-C: stop accepting, let requests finish, but never wait on
    // open event streams (they do not end by themselves) longer than the grace; the
    // workers are told at once, so their steps in hand finish meanwhile.
    let stopping = Arc::new(tokio::sync::Notify::new());
    let notify = stopping.clone();
    let stop_tx = Arc::new(stop_tx);
    let stop = stop_tx.clone();
    let steps_until = Arc::new(std::sync::OnceLock::new());
    let stopped_at = steps_until.clone();
    let mut edges = steadfast_server::ServeOptions::default();
    let server = &config.server;
    if let Some(secs) = server.header_timeout_secs {
        edges.header_timeout = std::time::Duration::from_secs(secs);
    }
    if let Some(secs) = server.body_timeout_secs {
        edges.body_timeout = std::time::Duration::from_secs(secs);
    }
    if let Some(secs) = server.body_deadline_secs {
        edges.body_deadline = std::time::Duration::from_secs(secs);
    }
    if let Some(n) = server.max_connections {
        edges.max_connections = n;
    }
    edges.max_connections_per_ip = server
        .max_connections_per_ip
        .or(args.public.then_some(PUBLIC_CONNECTIONS_PER_IP));
    edges.requests_per_minute_per_ip = server
        .requests_per_minute_per_ip
        .or(args.public.then_some(PUBLIC_REQUESTS_PER_MINUTE_PER_IP));
    let graceful = steadfast_server::serve(listener, app(state), edges, async move {
        shutdown_signal().await;
        let _ = stopped_at.set(steps_deadline(grace));
        let _ = stop.send(true);
        notify.notify_one();
    });
    tokio::select! {
        served = graceful => served?,
        _ = async { stopping.notified().await; tokio::time::sleep(SHUTDOWN_GRACE).await } => {
            eprintln!("steadfast: connections still open after {} s; stopping", SHUTDOWN_GRACE.as_secs());
        }
    }
    let steps_until = steps_until
        .get()
        .copied()
        .unwrap_or_else(|| steps_deadline(grace));
    stop_workers(&stop_tx, &mut workers, steps_until).await;
    metrics.inspect(|m| m.abort());
    drop(fake);
    Ok(ExitCode::SUCCESS)
}

/// How long stopping workers get to hand their sessions back (committing what they
/// hold for the next commit and giving up their leases), beyond the time they have to
/// finish the step in hand, before they are aborted.
const WORKER_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// When the steps in hand must be done if the workers are told to stop now (far in
/// the future, not a panic, for a grace no clock can add).
fn steps_deadline(grace: std::time::Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(grace)
        .unwrap_or_else(|| now + std::time::Duration::from_secs(86_400 * 365))
}

/// Tells the workers to stop, gives them until `steps_until` to finish the steps in
/// hand (their own grace ends then too) and [`WORKER_GRACE`] more to hand their
/// sessions back, then aborts what is left. A second SIGTERM or Ctrl-C cuts the wait
/// short.
async fn stop_workers(
    stop: &tokio::sync::watch::Sender<bool>,
    workers: &mut tokio::task::JoinSet<()>,
    steps_until: tokio::time::Instant,
) {
    let _ = stop.send(true);
    let left = steps_until.saturating_duration_since(tokio::time::Instant::now());
    if !workers.is_empty() && !left.is_zero() {
        eprintln!(
            "steadfast: letting the steps in hand finish (up to {} s more; stop again to cut them off)",
            left.as_secs()
        );
    }
    tokio::select! {
        _ = tokio::time::timeout_at(steps_until.checked_add(WORKER_GRACE).unwrap_or(steps_until), async {
            while workers.join_next().await.is_some() {}
        }) => {}
        () = shutdown_signal() => {}
    }
    workers.abort_all();
}

pub async fn worker(home: &Path, config: &Config, args: WorkerArgs) -> anyhow::Result<ExitCode> {
    check_isolation(config, isolation_mode(config, false))?;
    let world = setup::world(home, config, false).await?;
    setup::check_stores(home, config, &world).await?;
    let (harness, fake) = setup::shared_harness(home, config, world).await?;
    let metrics = args
        .metrics
        .start(
            harness.world().clone(),
            harness.blobs().clone(),
            Some(harness.options().sandbox.clone()),
        )
        .await?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let grace = harness.stop_grace();
    let mut workers = spawn_workers(harness, args.workers.max(1), stop_rx);
    eprintln!(
        "steadfast: {} taking turns (pid {})",
        crate::render::count(args.workers.max(1) as u64, "worker"),
        std::process::id()
    );
    tokio::select! {
        _ = shutdown_signal() => {}
        _ = workers.join_next() => {}
    }
    stop_workers(&stop_tx, &mut workers, steps_deadline(grace)).await;
    metrics.inspect(|m| m.abort());
    drop(fake);
    Ok(ExitCode::SUCCESS)
}

fn spawn_workers(
    harness: Arc<
        steadfast_harness::Harness<steadfast_world::AnyWorld, steadfast_sandbox::AnySandbox>,
    >,
    n: usize,
    stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinSet<()> {
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..n {
        let (harness, stop) = (harness.clone(), stop.clone());
        set.spawn(async move { harness.work(stop).await });
    }
    set
}
