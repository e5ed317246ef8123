//! `steadfast gc`: reclaim drive objects and blobs no session's log references.
//! Both are shared by content between sessions (and owners), so deleting a session
//! leaves them to this sweep over what every remaining log still refers to.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use steadfast_log::Event;
use steadfast_world::World;

use crate::config::Config;

/// Arguments of `steadfast gc`.
#[derive(Debug, Args)]
pub struct GcArgs {
    /// Leave objects younger than this alone (a snapshot in progress has written
    /// objects no log references yet).
    #[arg(long, default_value_t = 3600)]
    min_age_secs: u64,
    /// Prune the streamed pieces of replies (`model_delta` records) of turns that
    /// ended longer ago than this (default: `[harness] keep-deltas-secs`, else a day).
    #[arg(long)]
    keep_deltas_secs: Option<u64>,
    /// Also drop this host's copies of the logical workspaces of sessions that have
    /// not changed for this long and are not running (whichever host drives one next
    /// materializes it again from the drive).
    #[arg(long)]
    idle_workspaces_secs: Option<u64>,
}

/// How long streamed pieces of replies are kept after their turn ends, by default.
const KEEP_DELTAS: Duration = Duration::from_secs(24 * 3600);

/// The position past the last turn that ended at or before `cutoff_ms`: every
/// streamed piece before it belongs to a finished turn (0 when none has).
fn ended_turns_end(records: &[steadfast_log::Record], cutoff_ms: u64) -> u64 {
    records
        .iter()
        .filter(|r| r.at_ms <= cutoff_ms)
        .filter(|r| {
            matches!(
                r.event,
                Event::TurnEnded { .. }
                    | Event::TurnInterrupted { .. }
                    | Event::SessionEnded { .. }
            )
        })
        .map(|r| r.seq)
        .max()
        .unwrap_or(0)
}

/// How long webhook outbox entries are kept (the deliverer's retention too).
const OUTBOX_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

pub async fn run(home: &Path, config: &Config, args: GcArgs) -> anyhow::Result<ExitCode> {
    if args.min_age_secs < steadfast_drive::KNOWN_FOR.as_secs() {
        eprintln!(
            "steadfast: warning: --min-age-secs {} is shorter than a snapshot being taken on some host may rely on ({}s): only use it while no session runs",
            args.min_age_secs,
            steadfast_drive::KNOWN_FOR.as_secs()
        );
    }
    let world = crate::setup::world(home, config, false).await?;
    let mut keep = BTreeSet::new();
    let mut keep_blobs = std::collections::HashSet::new();
    let sessions = world.list_sessions(&Default::default()).await?.sessions;
    let keep_deltas = args
        .keep_deltas_secs
        .or(config.harness.keep_deltas_secs)
        .map_or(KEEP_DELTAS, Duration::from_secs);
    let cutoff_ms = steadfast_world::now_ms().saturating_sub(keep_deltas.as_millis() as u64);
    let mut pruned = 0;
    let mut workspaces = std::collections::HashSet::new();
    let idle_since = args
        .idle_workspaces_secs
        .map(|secs| steadfast_world::now_ms().saturating_sub(secs.saturating_mul(1000)));
    for s in &sessions {
        let records = world.read(&s.id, 1).await?;
        // A fork works in a workspace of its own, named where it begins.
        let workspace = records.iter().rev().find_map(|r| match &r.event {
            Event::Forked { workspace, .. } | Event::SessionStarted { workspace, .. } => {
                Some(workspace)
            }
            _ => None,
        });
        if let Some(workspace) = workspace {
            let idle = idle_since.is_some_and(|t| s.updated_at_ms < t)
                && s.status != steadfast_log::Status::Running;
            if !idle {
                workspaces.insert(workspace.clone());
            }
        }
        let before = ended_turns_end(&records, cutoff_ms);
        if before > 0 {
            pruned += world.prune_deltas(&s.id, before).await?;
        }
        keep_blobs.extend(
            records
                .iter()
                .flat_map(|r| r.event.blob_hashes())
                .map(str::to_string),
        );
        keep_blobs.extend(world.spilled(&s.id).await?);
        keep.extend(
            records
                .iter()
                .flat_map(|r| r.event.snapshots())
                .map(str::to_string),
        );
    }
    let blobs = crate::setup::blobs(home, config)?;
    let blobs_removed = blobs
        .sweep(&keep_blobs, Duration::from_secs(args.min_age_secs))
        .await?;
    let options = config.harness_options();
    let drive = steadfast_harness::open_drive(home, &blobs, options.drive_cache_bytes)?;
    let keep: Vec<String> = keep.into_iter().collect();
    let removed = tokio::task::spawn_blocking(move || {
        drive.gc(&keep, Duration::from_secs(args.min_age_secs))
    })
    .await??;
    // The webhook outbox keeps each announced change as the record of its deliveries
    // for a while; without a deliverer (no webhook configured) its entries only age.
    let before = steadfast_world::now_ms().saturating_sub(OUTBOX_RETENTION.as_millis() as u64);
    let announced = world.outbox_prune(before).await?;
    let root = steadfast_harness::workspace_root(home, options.workspace_root.as_deref());
    let dropped = drop_workspaces(&root, &workspaces, Duration::from_secs(args.min_age_secs));
    eprintln!(
        "steadfast: {} sessions scanned; {pruned} streamed reply pieces of turns ended over {}s ago pruned; {removed} drive objects and {blobs_removed} blobs no log references, older than {}s, removed; {dropped} workspaces of sessions that are gone{} dropped from this host; {announced} webhook outbox entries older than {} days forgotten",
        sessions.len(),
        keep_deltas.as_secs(),
        args.min_age_secs,
        match args.idle_workspaces_secs {
            Some(secs) => format!(" or idle over {secs}s"),
            None => String::new(),
        },
        OUTBOX_RETENTION.as_secs() / 86_400
    );
    Ok(ExitCode::SUCCESS)
}

/// Removes this host's copies of logical workspaces not in `named` (their session was
/// deleted on another host, or has been idle past the asked-for time), once older
/// than `min_age` (a session being created has made its directory before its log
/// names it). Returns how many went.
fn drop_workspaces(
    root: &Path,
    named: &std::collections::HashSet<String>,
    min_age: Duration,
) -> usize {
    let Ok(entries) = std::fs::read_dir(root) else {
        return 0;
    };
    let mut dropped = 0;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let old_enough = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= min_age);
        if steadfast_log::is_workspace_id(&name)
            && !named.contains(&name)
            && old_enough
            && std::fs::remove_dir_all(entry.path()).is_ok()
        {
            dropped += 1;
        }
    }
    dropped
}
