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

/// The sessions [`kill_strays`] leaves alone: people's shells (see [`crate::shell`]).
static SPARED_SESSIONS: Mutex<Vec<i32>> = Mutex::new(Vec::new());

/// Leaves every process of session `sid` (a person's shell and what it started) alone
/// from now on, or (with `spared` false) no longer.
pub(crate) fn spare_session(sid: i32, spared: bool) {
    let mut sessions = SPARED_SESSIONS.lock().unwrap_or_else(|e| e.into_inner());
    sessions.retain(|s| *s != sid);
    if spared {
        sessions.push(sid);
    }
}

/// Kills every process of session `sid` (a shell that ended, and what it left).
pub(crate) fn kill_session(sid: i32) {
    if sid <= 0 {
        return;
    }
    for pid in processes() {
        if nix::unistd::getsid(Some(nix::unistd::Pid::from_raw(pid)))
            .is_ok_and(|s| s.as_raw() == sid)
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// The ids of the processes this process can see.
fn processes() -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_string_lossy().parse::<i32>().ok())
        .collect()
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
    let me = std::process::id() as i32;
    let spared = SPARED.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let shells = SPARED_SESSIONS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    for pid in processes() {
        let of = Some(nix::unistd::Pid::from_raw(pid));
        let group = nix::unistd::getpgid(of).map_or(0, |g| g.as_raw());
        let session = nix::unistd::getsid(of).map_or(0, |s| s.as_raw());
        if pid != 1 && pid != me && !spared.contains(&group) && !shells.contains(&session) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}
