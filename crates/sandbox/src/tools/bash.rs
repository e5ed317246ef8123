//! `bash`: run a command in its own process group, with a timeout, an output cap and
//! (inside an isolating sandbox) resource limits.

use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::resource::{getrusage, UsageWho};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde_json::Value;

use super::{opt_u64, str_arg, Context};
use crate::{ResourceLimits, ToolOutput};

/// Kills the whole process group when dropped: on timeout, on cancellation (the
/// future dropped) and after the command exits, so no background job outlives its call.
struct GroupGuard(Option<Pid>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            let _ = killpg(pid, Signal::SIGKILL);
        }
    }
}

/// How often the process count is checked against the limit.
const PROCESS_POLL: Duration = Duration::from_millis(20);

/// How often, at most, the workspace's size is checked against its quota.
const QUOTA_POLL: Duration = Duration::from_millis(200);

/// The shell that applies the limits and then runs the command (`$1`). `ulimit`
/// without `-S`/`-H` sets both, so the command cannot raise them again.
///
/// The CPU limit is the one exception: its soft limit is the configured seconds and its
/// hard limit one second more. At the soft limit the kernel sends `SIGXCPU`, which ends
/// the command with that signal, so the report names the CPU limit from the exit status
/// alone, whatever the machine's load did to the timing. (With both limits equal the
/// kernel sends a bare `SIGKILL`, indistinguishable from any other kill.) A command that
/// catches `SIGXCPU` gets its `SIGKILL` a second later. No core file is written into the
/// workspace (`-c 0`).
pub(super) fn limited(limits: &ResourceLimits, command: &str, cmd: &mut std::process::Command) {
    let mut steps = vec!["ulimit -c 0".to_string()];
    if let Some(s) = limits.cpu_secs {
        // Soft first: a hard limit below the current soft one is refused.
        steps.push(format!("ulimit -S -t {s}"));
        steps.push(format!("ulimit -H -t {}", s + 1));
    }
    if let Some(mb) = limits.memory_mb {
        steps.push(format!("ulimit -v {}", mb * 1024));
    }
    if let Some(mb) = limits.file_mb {
        steps.push(format!("ulimit -f {}", mb * 1024)); // bash counts 1024-byte blocks
    }
    let script = format!("{} || exit 125; exec bash -c \"$1\"", steps.join(" && "));
    cmd.arg("-c").arg(script).arg("steadfast").arg(command);
}

/// Bytes the files under `root` take, by their length (a sparse file counts whole:
/// a snapshot stores what reading it gives).
fn tree_bytes(root: &std::path::Path) -> u64 {
    walkdir::WalkDir::new(root)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum()
}

/// Kills the command's group once the workspace holds more than `quota` bytes and more
/// than when the command began (so a workspace already over its quota can still be
/// cleaned up). Checks at once, then at an interval that grows with what a check costs (at least
/// [`QUOTA_POLL`], at most a fifth of the time spent checking), so a big workspace is
/// not walked continuously.
async fn watch_quota(root: std::path::PathBuf, quota: u64, pgid: Pid, flag: Arc<AtomicBool>) {
    let mut ceiling = None;
    loop {
        let started = std::time::Instant::now();
        let root2 = root.clone();
        let Ok(used) = tokio::task::spawn_blocking(move || tree_bytes(&root2)).await else {
            return;
        };
        let ceiling = *ceiling.get_or_insert(quota.max(used));
        if used > ceiling {
            flag.store(true, Ordering::SeqCst);
            let _ = killpg(pgid, Signal::SIGKILL);
            crate::inside::kill_strays();
            return;
        }
        tokio::time::sleep(QUOTA_POLL.max(started.elapsed() * 5)).await;
    }
}

/// Processes visible in this PID namespace.
fn process_count() -> usize {
    std::fs::read_dir("/proc").map_or(0, |d| {
        d.filter_map(Result::ok)
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .bytes()
                    .all(|b| b.is_ascii_digit())
            })
            .count()
    })
}

fn children_cpu() -> Duration {
    getrusage(UsageWho::RUSAGE_CHILDREN).map_or(Duration::ZERO, |u| {
        let (user, sys) = (u.user_time(), u.system_time());
        Duration::from_micros(
            (user.tv_sec() * 1_000_000 + user.tv_usec() + sys.tv_sec() * 1_000_000 + sys.tv_usec())
                as u64,
        )
    })
}

pub(crate) async fn run(ctx: &Context<'_>, input: &Value) -> ToolOutput {
    let command = match str_arg(input, &["command"]) {
        Ok(c) => c.to_string(),
        Err(e) => return ToolOutput::error(e),
    };
    let timeout = opt_u64(input, "timeout")
        .map(Duration::from_millis)
        .unwrap_or(ctx.options.default_timeout)
        .min(ctx.options.max_timeout);

    let (mut reader, writer) = match std::io::pipe() {
        Ok(p) => p,
        Err(e) => return ToolOutput::error(format!("bash: cannot create pipe: {e}")),
    };
    let writer2 = match writer.try_clone() {
        Ok(w) => w,
        Err(e) => return ToolOutput::error(format!("bash: cannot create pipe: {e}")),
    };
    let mut cmd = std::process::Command::new("bash");
    match ctx.limits {
        Some(limits) => limited(limits, &command, &mut cmd),
        None => {
            cmd.arg("-c").arg(&command);
        }
    }
    cmd.current_dir(ctx.root)
        .env_clear()
        .envs(ctx.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(writer2)
        .process_group(0);
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.kill_on_drop(true);
    let cpu_before = children_cpu();
    let baseline = process_count();
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return ToolOutput::error(format!("bash: cannot start: {e}")),
    };
    drop(cmd); // closes our copies of the pipe's write end
    let pgid = child.id().map(|p| Pid::from_raw(p as i32));
    let guard = GroupGuard(pgid);
    let recorded = child
        .id()
        .zip(ctx.registry)
        .and_then(|(p, registry)| crate::orphans::record(registry, p, ctx.options.lease.as_ref()));

    // The process limit: counted in the sandbox's own PID namespace, where every
    // process is the command's (RLIMIT_NPROC does not bind a root-owned sandbox).
    let too_many = Arc::new(AtomicBool::new(false));
    let watchdog = ctx
        .limits
        .and_then(|l| l.processes)
        .zip(pgid)
        .map(|(max, pgid)| {
            let flag = too_many.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(PROCESS_POLL).await;
                    if process_count().saturating_sub(baseline) > max as usize {
                        flag.store(true, Ordering::SeqCst);
                        let _ = killpg(pgid, Signal::SIGKILL);
                        crate::inside::kill_strays();
                        return;
                    }
                }
            })
        });

    let over_quota = Arc::new(AtomicBool::new(false));
    let quota = ctx
        .limits
        .and_then(|l| l.workspace_mb)
        .zip(pgid)
        .map(|(mb, pgid)| {
            let flag = over_quota.clone();
            let root = ctx.root.to_path_buf();
            tokio::spawn(watch_quota(root, mb * 1024 * 1024, pgid, flag))
        });

    let cap = ctx.options.max_output_bytes;
    let collector = tokio::task::spawn_blocking(move || {
        let mut kept = Vec::new();
        let mut total = 0usize;
        let mut buf = [0u8; 64 * 1024];
        loop {
            match reader.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    total += n;
                    let room = cap.saturating_sub(kept.len());
                    kept.extend_from_slice(&buf[..n.min(room)]);
                }
            }
        }
        (kept, total)
    });

    let status = tokio::time::timeout(timeout, child.wait()).await;
    for w in [watchdog, quota].into_iter().flatten() {
        w.abort();
    }
    drop(guard); // the group goes, so the pipe closes even if a background job held it
                 // Inside a sandbox, so does everything else a command started (even in a session
                 // of its own, which the group kill misses and which would hold the pipe open).
    crate::inside::kill_strays();
    drop(recorded);
    let (kept, total) = collector.await.unwrap_or_default();
    let mut text = String::from_utf8_lossy(&kept).into_owned();
    if total > kept.len() {
        text.push_str(&format!(
            "\n[steadfast] output truncated: {total} bytes written, first {} kept (limit {} bytes)",
            kept.len(),
            cap
        ));
    }
    let status = match status {
        Err(_) => {
            text.push_str(&format!(
                "\n[steadfast] command timed out after {} ms; its process group was killed",
                timeout.as_millis()
            ));
            return ToolOutput {
                text,
                is_error: true,
                exit_code: None,
            };
        }
        Ok(Err(e)) => {
            return ToolOutput::error(format!("bash: waiting for the command failed: {e}"))
        }
        Ok(Ok(status)) => status,
    };
    let code = status.code();
    // A signal that killed the command, whether we saw it directly or bash reported it.
    let signal = status
        .signal()
        .or(code.filter(|c| *c > 128 && *c < 160).map(|c| c - 128));
    let limit_hit = ctx.limits.and_then(|limits| {
        limit_message(
            limits,
            signal,
            children_cpu().saturating_sub(cpu_before),
            too_many.load(Ordering::SeqCst),
            over_quota.load(Ordering::SeqCst),
            &text,
            code,
        )
    });
    if let Some(c) = code.filter(|c| *c != 0) {
        text.push_str(&format!("\nExit code {c}"));
    } else if code.is_none() {
        text.push_str("\n[steadfast] command was killed by a signal");
    }
    if let Some(message) = &limit_hit {
        text.push_str(&format!("\n[steadfast] {message}"));
    }
    ToolOutput {
        text,
        is_error: code != Some(0) || limit_hit.is_some(),
        exit_code: code,
    }
}

/// Which resource limit (if any) ended a command, in words the model can act on.
fn limit_message(
    limits: &ResourceLimits,
    signal: Option<i32>,
    cpu: Duration,
    too_many_processes: bool,
    over_quota: bool,
    output: &str,
    code: Option<i32>,
) -> Option<String> {
    const SIGKILL: i32 = 9;
    const SIGXCPU: i32 = 24;
    const SIGXFSZ: i32 = 25;
    if too_many_processes {
        return Some(format!(
            "the command exceeded the sandbox's process limit ({} processes) and was killed",
            limits.processes.unwrap_or_default()
        ));
    }
    if over_quota {
        return Some(format!(
            "the workspace grew past its disk quota ({} MiB) and the command was killed; \
             remove files to make room",
            limits.workspace_mb.unwrap_or_default()
        ));
    }
    if let Some(secs) = limits.cpu_secs {
        // `SIGXCPU` is the soft limit's own signal; a `SIGKILL` counts as the hard limit
        // only when the command's measured CPU time passed the soft one (the hard limit
        // is a whole second beyond it, so the margin is the kernel's, not a guess).
        let spent = cpu >= Duration::from_secs(secs);
        if signal == Some(SIGXCPU) || (signal == Some(SIGKILL) && spent) {
            return Some(format!(
                "the command exceeded the sandbox's CPU time limit ({secs} s) and was killed"
            ));
        }
    }
    if let Some(mb) = limits.file_mb {
        if signal == Some(SIGXFSZ) {
            return Some(format!(
                "the command tried to write a file over the sandbox's file size limit ({mb} MiB)"
            ));
        }
    }
    if let Some(mb) = limits.memory_mb {
        let lower = output.to_ascii_lowercase();
        let oom = [
            "memoryerror",
            "cannot allocate memory",
            "out of memory",
            "bad_alloc",
            "memory allocation failed",
            "memory allocation of",
        ]
        .iter()
        .any(|m| lower.contains(m));
        if code != Some(0) && oom {
            return Some(format!(
                "the command ran out of memory: the sandbox's memory limit is {mb} MiB"
            ));
        }
    }
    None
}
