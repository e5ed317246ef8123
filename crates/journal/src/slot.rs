//! A session's sandbox over time: provisioned when first needed (in the background
//! while the model thinks), stopped when idle, provisioned again (hydrated from the
//! drive) on demand, replaced when it dies.

use std::path::PathBuf;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use steadfast_drive::Drive;
use steadfast_sandbox::Sandbox;
use tokio::sync::Mutex;

use crate::Result;

/// Makes the sandbox tools run in, for a session's workspace. Called on a blocking
/// thread, when a call first needs one (and again after an idle stop or a death).
pub type MakeSandbox<S> = Arc<dyn Fn() -> steadfast_sandbox::Result<S> + Send + Sync>;

/// The running sandbox, if any, and when it was last used.
struct Live<S> {
    sandbox: Arc<S>,
    last_used: Instant,
}

/// Whether the session runs services, and how long a sandbox running them is kept
/// without a tool call (ms; 0: no longer than any other).
#[derive(Default)]
struct ServiceKeep {
    running: std::sync::atomic::AtomicBool,
    keep_ms: std::sync::atomic::AtomicU64,
}

impl ServiceKeep {
    /// How long a sandbox may idle before it is stopped, given `idle`, the stop for
    /// one running no service.
    fn idle_limit(&self, idle: Duration) -> Duration {
        use std::sync::atomic::Ordering::Relaxed;
        match self.running.load(Relaxed) {
            true => idle.max(Duration::from_millis(self.keep_ms.load(Relaxed))),
            false => idle,
        }
    }
}

/// Holds at most one sandbox for a session's driver: the native loop's and a wrapped
/// CLI's tools share this one holder.
pub struct SandboxSlot<S> {
    workspace: PathBuf,
    make: MakeSandbox<S>,
    drive: Drive,
    live: Arc<Mutex<Option<Live<S>>>>,
    /// The snapshot a new sandbox is hydrated to (the log's last recorded one).
    hydrate_to: Arc<StdMutex<Option<String>>>,
    /// Set when a sandbox was started anew (not adopted): the session's services are
    /// to be started again in it (see [`Self::take_fresh`]).
    fresh: Arc<std::sync::atomic::AtomicBool>,
    /// How the idle stop treats services (see [`Self::keeping_services`]).
    services: Arc<ServiceKeep>,
    reaper: Option<tokio::task::JoinHandle<()>>,
}

impl<S> Drop for SandboxSlot<S> {
    fn drop(&mut self) {
        if let Some(r) = &self.reaper {
            r.abort();
        }
    }
}

impl<S: Sandbox> SandboxSlot<S> {
    /// A slot for `workspace` whose sandboxes `make` makes; one idle for `idle_stop`
    /// is stopped (made again, hydrated from `drive`, when next needed).
    pub fn new(
        workspace: PathBuf,
        make: MakeSandbox<S>,
        drive: Drive,
        idle_stop: Option<Duration>,
    ) -> Self {
        let live: Arc<Mutex<Option<Live<S>>>> = Arc::new(Mutex::new(None));
        let services = Arc::new(ServiceKeep::default());
        let reaper = idle_stop.map(|idle| {
            let live = live.clone();
            let services = services.clone();
            tokio::spawn(async move {
                let tick = (idle / 4).max(Duration::from_millis(10));
                loop {
                    tokio::time::sleep(tick).await;
                    // A slot busy provisioning or running a call is not idle.
                    let Ok(mut guard) = live.try_lock() else {
                        continue;
                    };
                    // Services running count as activity, up to their own limit.
                    let limit = services.idle_limit(idle);
                    let stale = guard.as_ref().is_some_and(|l| {
                        l.last_used.elapsed() >= limit && Arc::strong_count(&l.sandbox) == 1
                    });
                    if stale {
                        tracing::info!("sandbox idle for {limit:?}: stopping it");
                        guard.take();
                    }
                }
            })
        });
        SandboxSlot {
            workspace,
            make,
            drive,
            live,
            hydrate_to: Arc::new(StdMutex::new(None)),
            fresh: Arc::default(),
            services,
            reaper,
        }
    }

    /// The workspace directory the slot's sandboxes mount.
    pub fn workspace(&self) -> &std::path::Path {
        &self.workspace
    }

    /// Sets the snapshot the next sandbox is hydrated to.
    pub fn hydrate_to(&self, snapshot: Option<String>) {
        *self.hydrate_to.lock().unwrap_or_else(|e| e.into_inner()) = snapshot;
    }

    /// Starts provisioning in the background if no sandbox is running, so a tool call
    /// later finds one ready; the caller goes on at once.
    pub fn prewarm(&self) {
        let Ok(guard) = self.live.try_lock() else {
            return; // already provisioning or in use
        };
        if guard.is_some() {
            return;
        }
        drop(guard);
        let this = self.handle();
        tokio::spawn(tracing::Instrument::in_current_span(async move {
            if let Err(e) = this.get().await {
                tracing::warn!(error = %e, "sandbox prewarm failed; the next tool call retries");
            }
        }));
    }

    /// The running sandbox, provisioning (and hydrating) one if there is none.
    pub async fn get(&self) -> Result<Arc<S>> {
        let mut guard = self.live.lock().await;
        if let Some(live) = guard.as_mut() {
            live.last_used = Instant::now();
            return Ok(live.sandbox.clone());
        }
        let started = Instant::now();
        let snapshot = self
            .hydrate_to
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let make = self.make.clone();
        // On the blocking pool, inside the caller's span: provisioning belongs to the
        // turn's trace, not to one of its own.
        let parent = tracing::Span::current();
        let sandbox = tokio::task::spawn_blocking(move || parent.in_scope(|| make())).await??;
        // Hydrated once the new sandbox has reaped what an earlier one left running
        // (a killed driver's orphan may write until then), and before any call runs
        // in it: this also undoes what such a process wrote after the wake's restore.
        // One adopted from the last holder is left as it is: it still works in the
        // workspace, and what it does is recorded when its kept calls end.
        let adopted = sandbox.adopted();
        if let (Some(snapshot), false) = (snapshot, adopted) {
            self.drive.restore_async(&self.workspace, &snapshot).await?;
        }
        self.fresh
            .store(!adopted, std::sync::atomic::Ordering::SeqCst);
        tracing::info!(
            ms = started.elapsed().as_millis() as u64,
            "sandbox provisioned"
        );
        let sandbox = Arc::new(sandbox);
        *guard = Some(Live {
            sandbox: sandbox.clone(),
            last_used: Instant::now(),
        });
        Ok(sandbox)
    }

    /// Keeps a sandbox whose session runs services for up to `limit` without a tool
    /// call (its services count as activity until then), where the idle stop would
    /// stop it sooner: a dev server the agent started is not stopped, and started
    /// again, each time the model thinks for a while.
    pub fn keeping_services(self, limit: Duration) -> Self {
        self.services.keep_ms.store(
            limit.as_millis() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        self
    }

    /// Says whether the session runs services now (the log's word).
    pub fn runs_services(&self, running: bool) {
        self.services
            .running
            .store(running, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether a sandbox was started anew (not adopted) since this was last asked:
    /// then the session's services are to be started again in it.
    pub fn take_fresh(&self) -> bool {
        self.fresh.swap(false, std::sync::atomic::Ordering::SeqCst)
    }

    /// Marks the running sandbox used now (after a call, so idleness counts from its end).
    pub async fn touch(&self) {
        if let Some(live) = self.live.lock().await.as_mut() {
            live.last_used = Instant::now();
        }
    }

    /// Forgets `dead`, a sandbox that died, if it is still the one in use (a sibling
    /// call may have made the next already); the next call provisions a new one.
    pub async fn discard_if(&self, dead: &Arc<S>) {
        let mut live = self.live.lock().await;
        if live.as_ref().is_some_and(|l| Arc::ptr_eq(&l.sandbox, dead)) {
            live.take();
        }
    }

    /// The running sandbox, if there is one (none is made).
    pub async fn running(&self) -> Option<Arc<S>> {
        self.live.lock().await.as_ref().map(|l| l.sandbox.clone())
    }

    /// How long the running sandbox has gone unused (nothing while a call, or a
    /// visitor's connection, holds it); `None` if no sandbox runs.
    pub async fn unused_for(&self) -> Option<Duration> {
        let live = self.live.lock().await;
        live.as_ref().map(|l| match Arc::strong_count(&l.sandbox) {
            1 => l.last_used.elapsed(),
            _ => Duration::ZERO,
        })
    }

    /// Forgets a sandbox that died; the next call provisions a new one.
    pub async fn discard(&self) {
        self.live.lock().await.take();
    }

    /// Whether a sandbox is running now.
    pub async fn is_running(&self) -> bool {
        self.live.lock().await.is_some()
    }

    /// Whether a sandbox is running and free this instant (never waits: a slot busy
    /// provisioning or running a call is not ready).
    pub fn ready(&self) -> bool {
        self.live.try_lock().is_ok_and(|live| live.is_some())
    }

    /// A second handle on the same slot, for background provisioning and for calls
    /// that run while the driver goes on.
    pub fn handle(&self) -> Self {
        SandboxSlot {
            workspace: self.workspace.clone(),
            make: self.make.clone(),
            drive: self.drive.clone(),
            live: self.live.clone(),
            hydrate_to: self.hydrate_to.clone(),
            fresh: self.fresh.clone(),
            services: self.services.clone(),
            reaper: None,
        }
    }
}
