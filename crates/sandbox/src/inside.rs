//! What holds only inside a sandbox, in its agent's process: where the run directory
//! is, and clearing out what a command left running (sparing the session's services).

use std::sync::{Mutex, OnceLock};

/// Where the sandbox's run directory (shared with the host) is, inside it.
pub(crate) const INSIDE_RUN_DIR: &str = "/run/steadfast";

static IN_SANDBOX: OnceLock<()> = OnceLock::new();

/// The process groups [`kill_strays`] leaves alone: the session's services.
static SPARED: Mutex<Vec<i32>> = Mutex::new(Vec::new());

/// Marks this process as a sandbox's agent.
pub(crate) fn enter() {
    let _ = IN_SANDBOX.set(());
}

/// Whether this process is a sandbox's agent.
pub(crate) fn in_sandbox() -> bool {
    IN_SANDBOX.get().is_some()
}

/// Leaves process group `group` (a service's) alone from now on, or (with `spared`
/// false) no longer.
pub(crate) fn spare(group: i32, spared: bool) {
    let mut groups = SPARED.lock().unwrap_or_else(|e| e.into_inner());
    groups.retain(|g| *g != group);
    if spared {
        groups.push(group);
    }
}

/// Kills every process of the sandbox but the agent, the namespace's init and the
/// services' groups, so a command cannot leave anything running (even in a new
/// session or process group). Does nothing outside the agent.
pub(crate) fn kill_strays() {
    if !in_sandbox() {
        return;
    }
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return;
    };
    let spared = SPARED.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for entry in dir.filter_map(Result::ok) {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let group = nix::unistd::getpgid(Some(nix::unistd::Pid::from_raw(pid as i32)))
            .map_or(0, |g| g.as_raw());
        if pid != 1 && pid != me && !spared.contains(&group) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}
