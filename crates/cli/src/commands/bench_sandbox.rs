//! `steadfast bench sandbox`: what a bwrap sandbox costs, against the local backend
//! measured in the same run.
//!
//! Provisioning is timed from nothing to a first command answered, including hydration
//! of a 1,000-file workspace from the drive: *cold* (an empty workspace directory, as
//! on a new machine) and *after an idle stop* (the workspace still there, so hydration
//! only checks it). Per-command overhead is the median round trip of `true`.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;
use steadfast_drive::Drive;
use steadfast_sandbox::{bwrap_available, BwrapSandbox, LocalSandbox, Sandbox, SandboxOptions};

use super::bench::median;

/// Files in the benchmark's workspace.
const FILES: usize = 1000;

fn write_workspace(dir: &Path) -> anyhow::Result<()> {
    for i in 0..FILES {
        let sub = dir.join(format!("src/mod{}", i % 20));
        std::fs::create_dir_all(&sub)?;
        std::fs::write(
            sub.join(format!("file{i}.rs")),
            format!("// file {i}\npub fn f{i}() -> usize {{ {i} }}\n").repeat(20),
        )?;
    }
    Ok(())
}

/// Hydrates `ws` to `snapshot`, provisions with `provision`, and runs a first command.
async fn provision_once<S: Sandbox>(
    drive: &Drive,
    ws: &Path,
    snapshot: &str,
    provision: impl Fn(&Path) -> steadfast_sandbox::Result<S>,
) -> anyhow::Result<(Duration, S)> {
    let start = Instant::now();
    drive.restore(ws, snapshot)?;
    let sandbox = provision(ws)?;
    let out = sandbox
        .execute("bash", &json!({"command": "ls src | wc -l"}))
        .await?;
    anyhow::ensure!(
        out.text.trim() == "20",
        "hydration incomplete: {}",
        out.text
    );
    Ok((start.elapsed(), sandbox))
}

async fn per_command<S: Sandbox>(sandbox: &S, n: usize) -> anyhow::Result<Duration> {
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        sandbox.execute("bash", &json!({"command": "true"})).await?;
        times.push(start.elapsed());
    }
    Ok(median(times))
}

pub(crate) async fn run(rounds: usize) -> anyhow::Result<()> {
    bwrap_available().map_err(|e| anyhow::anyhow!("the sandbox benchmark needs bwrap: {e}"))?;
    let dir = tempfile::tempdir()?;
    let drive = Drive::open(dir.path().join("drive"))?;
    let source = dir.path().join("source");
    write_workspace(&source)?;
    let snapshot = drive.snapshot(&source)?;
    let options = SandboxOptions {
        agent: vec![
            std::env::current_exe()?.display().to_string(),
            "sandbox-agent".into(),
        ],
        ..SandboxOptions::default()
    };
    let bwrap = |ws: &Path| BwrapSandbox::new(ws, &options);
    let local = |ws: &Path| LocalSandbox::new(ws, SandboxOptions::default());

    let (mut cold_b, mut cold_l, mut warm_b, mut warm_l) = (vec![], vec![], vec![], vec![]);
    for round in 0..rounds {
        // Cold: an empty workspace. Then the sandbox is stopped (dropped), the
        // workspace stays, and it is provisioned again.
        let ws = dir.path().join(format!("ws-bwrap-{round}"));
        cold_b.push(provision_once(&drive, &ws, &snapshot, bwrap).await?.0);
        warm_b.push(provision_once(&drive, &ws, &snapshot, bwrap).await?.0);
        let ws = dir.path().join(format!("ws-local-{round}"));
        cold_l.push(provision_once(&drive, &ws, &snapshot, local).await?.0);
        warm_l.push(provision_once(&drive, &ws, &snapshot, local).await?.0);
    }
    let ws = dir.path().join("ws-commands");
    let (_, b) = provision_once(&drive, &ws, &snapshot, bwrap).await?;
    let (_, l) = provision_once(&drive, &ws, &snapshot, local).await?;
    let n = 50;
    let (cmd_b, cmd_l) = (per_command(&b, n).await?, per_command(&l, n).await?);

    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let (cb, cl, wb, wl) = (
        median(cold_b),
        median(cold_l),
        median(warm_b),
        median(warm_l),
    );
    println!("sandbox: provision to first command, {FILES}-file workspace hydrated from the drive (median of {rounds})");
    println!(
        "  cold (empty workspace):   bwrap {:>7.1} ms   local {:>7.1} ms   ratio {:.2}x",
        ms(cb),
        ms(cl),
        ms(cb) / ms(cl)
    );
    println!(
        "  after an idle stop:       bwrap {:>7.1} ms   local {:>7.1} ms   ratio {:.2}x",
        ms(wb),
        ms(wl),
        ms(wb) / ms(wl)
    );
    println!("sandbox: per-command round trip of `true` (median of {n})");
    println!(
        "  bwrap {:.2} ms   local {:.2} ms   ratio {:.2}x   (overhead {:+.2} ms)",
        ms(cmd_b),
        ms(cmd_l),
        ms(cmd_b) / ms(cmd_l),
        ms(cmd_b) - ms(cmd_l)
    );
    Ok(())
}
