//! `steadfast bench drive`: snapshots of a generated 20,000-file workspace with 0, 10
//! and 1,000 files changed, against `git add -A && git write-tree` on the same tree
//! (its own repository outside the tree), alternated round by round; with the bytes
//! each snapshot stored against the bytes that changed, and a restore of one change.
//!
//! With a shared blob store (`--blobs s3://...`) the drive keeps its objects there,
//! as a fleet's hosts do, and hydrating the tree is measured on a cold host (an empty
//! cache: everything comes from the store) and a warm one (its cache holds it),
//! against `git clone` of the same tree from a local bare repository.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use steadfast_drive::Drive;

use super::bench::Rounds;

/// Directories of the generated tree: `TOP` packages of `SUB` modules each.
const TOP: usize = 20;
const SUB: usize = 10;
/// Files per module directory.
const FILES: usize = 100;

fn file_path(root: &Path, i: usize) -> std::path::PathBuf {
    let (dir, file) = (i / FILES, i % FILES);
    root.join(format!("pkg{}/mod{}/file{file}.rs", dir / SUB, dir % SUB))
}

fn content(i: usize, version: usize) -> String {
    format!("// file {i}, version {version}\npub fn f{i}() -> usize {{ {version} }}\n").repeat(12)
}

/// Writes the tree: `TOP * SUB * FILES` files of about 700 bytes.
pub(super) fn generate(root: &Path) -> anyhow::Result<usize> {
    let total = TOP * SUB * FILES;
    for i in 0..total {
        let path = file_path(root, i);
        if i % FILES == 0 {
            std::fs::create_dir_all(path.parent().expect("has a parent"))?;
        }
        std::fs::write(path, content(i, 0))?;
    }
    Ok(total)
}

fn git(git_dir: &Path, tree: &Path, script: &str) -> anyhow::Result<()> {
    let status = Command::new("sh")
        .arg("-c")
        .arg(script)
        .env("GIT_DIR", git_dir)
        .env("GIT_WORK_TREE", tree)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", git_dir)
        .stdout(std::process::Stdio::null())
        .status()?;
    anyhow::ensure!(status.success(), "`{script}` failed");
    Ok(())
}

pub async fn run(rounds: usize, blobs: Option<String>) -> anyhow::Result<()> {
    let store = match blobs {
        Some(url) => Some((url.clone(), steadfast_world::Blobs::open(&url)?)),
        None => None,
    };
    tokio::task::spawn_blocking(move || measure(rounds.max(5), store)).await?
}

/// A blob store and its URL.
type Shared = (String, steadfast_world::Blobs);

/// A drive as a host of the fleet opens it, with `dir` as its home: the objects in
/// the blob store when there is one.
fn host_drive(dir: &Path, store: Option<&Shared>) -> anyhow::Result<Drive> {
    Ok(match store {
        Some((_, blobs)) => steadfast_harness::open_drive(dir, blobs, HOST_CACHE)?,
        None => Drive::open(dir.join("drive"))?,
    })
}

/// The cache bound of the benchmark's hosts: room for the whole tree.
const HOST_CACHE: u64 = 1 << 30;

fn measure(rounds: usize, store: Option<Shared>) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("steadfast-bench-drive")
        .tempdir_in(std::env::temp_dir())?;
    let tree = dir.path().join("tree");
    let git_dir = dir.path().join("repo.git");
    let total = generate(&tree)?;
    git(
        &git_dir,
        &tree,
        "git init -q && git add -A && git write-tree",
    )?;
    let drive = host_drive(dir.path(), store.as_ref())?;
    let first = Instant::now();
    drive.snapshot(&tree)?;
    let first = first.elapsed();
    // Let every file settle, so both sides may trust their stat caches.
    std::thread::sleep(Duration::from_millis(2100));
    git(&git_dir, &tree, "git add -A && git write-tree")?;
    drive.snapshot(&tree)?;

    println!(
        "drive{}: snapshots of a {total}-file workspace (first one {:.0} ms), against `git add -A && git write-tree`, {rounds} alternating rounds",
        store.as_ref().map(|(url, _)| format!(" in {url}")).unwrap_or_default(),
        first.as_secs_f64() * 1e3
    );
    let mut version = 0;
    let mut next = 0;
    for changed in [0usize, 10, 1000] {
        let mut timed = Rounds::default();
        let mut stored = Vec::new();
        let mut changed_bytes = 0;
        for _ in 0..rounds {
            version += 1;
            changed_bytes = 0;
            for _ in 0..changed {
                // Spread over the tree: every 7th file onwards, wrapping.
                let i = (next * 7919) % total;
                next += 1;
                let text = content(i, version);
                changed_bytes += text.len();
                std::fs::write(file_path(&tree, i), text)?;
            }
            let start = Instant::now();
            git(&git_dir, &tree, "git add -A && git write-tree")?;
            let git_time = start.elapsed();
            let before = drive.stored_bytes();
            let start = Instant::now();
            drive.snapshot(&tree)?;
            timed.push(git_time, start.elapsed());
            stored.push(drive.stored_bytes() - before);
        }
        stored.sort_unstable();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "  {changed:>4} changed: git {:>7.2} ms, steadfast {:>7.2} ms (median), ratio {:.3}x; stored {} bytes per snapshot for {changed_bytes} changed",
            ms(timed.base()),
            ms(timed.ours()),
            timed.ratio(),
            stored[stored.len() / 2],
        );
    }
    println!(
        "  targets: ≤ 0.5x git at 10 changed; ≤ 20 ms with nothing changed; stored ≈ changed bytes"
    );

    // Restore: one file changed back, and a fresh directory hydrated.
    let id = drive.snapshot(&tree)?;
    let mut restore_one = Vec::new();
    for round in 0..rounds {
        std::fs::write(file_path(&tree, round), "scribbled over")?;
        let start = Instant::now();
        drive.restore(&tree, &id)?;
        restore_one.push(start.elapsed());
    }
    let fresh = dir.path().join("fresh");
    let start = Instant::now();
    drive.restore(&fresh, &id)?;
    let hydrate = start.elapsed();
    println!(
        "  restore of one changed file: {:.1} ms (median); hydrating an empty directory: {:.0} ms",
        super::bench::median(restore_one).as_secs_f64() * 1e3,
        hydrate.as_secs_f64() * 1e3
    );
    taken_over(dir.path(), &tree, &drive, &id, store.as_ref(), rounds)?;
    if let Some(store) = &store {
        hydrate_hosts(dir.path(), &tree, &git_dir, &id, store, rounds)?;
    }
    Ok(())
}

/// What a session taken over by another host pays before its first call: the
/// workspace (a logical one) hydrated there, then its first snapshot, against a
/// snapshot with nothing changed on the host that has worked in it all along.
fn taken_over(
    dir: &Path,
    tree: &Path,
    drive: &Drive,
    id: &str,
    store: Option<&Shared>,
    rounds: usize,
) -> anyhow::Result<()> {
    let mut timed = Rounds::default();
    for round in 0..rounds {
        let start = Instant::now();
        drive.snapshot(tree)?;
        let warm = start.elapsed();
        let host = dir.join(format!("host-next-{round}"));
        let next = match store {
            Some(_) => host_drive(&host, store)?,
            None => Drive::open_at(host.join("drive"), dir.join("drive").join("objects"))?,
        };
        let workspace = host.join("ws_takenover");
        next.restore(&workspace, id)?;
        let start = Instant::now();
        next.snapshot(&workspace)?;
        timed.push(warm, start.elapsed());
        std::fs::remove_dir_all(&host)?;
    }
    println!(
        "  first snapshot after hydrating on another host: {:.1} ms (median), against {:.1} ms on the host that had it, ratio {:.2}x",
        timed.ours().as_secs_f64() * 1e3,
        timed.base().as_secs_f64() * 1e3,
        timed.ratio()
    );
    Ok(())
}

/// Hydrating snapshot `id` into an empty directory on a cold host (a new host
/// identity: its own empty cache) and on a warm one (one that hydrated it before),
/// against `git clone` of the same tree from a local bare repository, alternated.
fn hydrate_hosts(
    dir: &Path,
    tree: &Path,
    git_dir: &Path,
    id: &str,
    store: &Shared,
    rounds: usize,
) -> anyhow::Result<()> {
    git(
        git_dir,
        tree,
        "git add -A && git -c user.name=bench -c user.email=bench@localhost commit -q -m tree",
    )?;
    let warm = host_drive(&dir.join("host-warm"), Some(store))?;
    warm.restore(&dir.join("warm-first"), id)?;
    let (mut cold_vs_git, mut warm_vs_git) = (Rounds::default(), Rounds::default());
    for round in 0..rounds {
        let clone_to = dir.join(format!("clone-{round}"));
        let start = Instant::now();
        let status = Command::new("git")
            .args(["clone", "-q"])
            .arg(git_dir)
            .arg(&clone_to)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", git_dir)
            .status()?;
        anyhow::ensure!(status.success(), "git clone failed");
        let git_time = start.elapsed();
        let cold = host_drive(&dir.join(format!("host-cold-{round}")), Some(store))?;
        let start = Instant::now();
        cold.restore(&dir.join(format!("cold-{round}")), id)?;
        cold_vs_git.push(git_time, start.elapsed());
        let start = Instant::now();
        warm.restore(&dir.join(format!("warm-{round}")), id)?;
        warm_vs_git.push(git_time, start.elapsed());
        for gone in [
            &clone_to,
            &dir.join(format!("cold-{round}")),
            &dir.join(format!("warm-{round}")),
        ] {
            std::fs::remove_dir_all(gone)?;
        }
        std::fs::remove_dir_all(dir.join(format!("host-cold-{round}")))?;
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "  hydrating on another host from {}: git clone {:.0} ms; cold host (empty cache) {:.0} ms, ratio {:.2}x; warm host (cached) {:.0} ms, ratio {:.2}x (medians of {rounds})",
        store.0,
        ms(cold_vs_git.base()),
        ms(cold_vs_git.ours()),
        cold_vs_git.ratio(),
        ms(warm_vs_git.ours()),
        warm_vs_git.ratio(),
    );
    Ok(())
}
