//! What a sandbox may reach and use: its network policy and resource limits.

use serde::{Deserialize, Serialize};

/// Where a sandbox's commands may connect (kept in the log; see
/// [`steadfast_log::NetworkPolicy`]), and one allowed destination.
pub use steadfast_log::{HostRule, NetworkPolicy};

/// Resource limits of a sandbox's commands. A command that hits one is killed (or
/// fails) and the tool result says which limit it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceLimits {
    /// Address space per process, MiB (`RLIMIT_AS`: what a process may reserve, which
    /// bounds what it can use; runtimes that reserve much more than they use, such as
    /// V8 with WebAssembly, need it generous).
    pub memory_mb: Option<u64>,
    /// Processes alive at once (beyond the sandbox's own).
    pub processes: Option<u32>,
    /// CPU time per process, seconds.
    pub cpu_secs: Option<u64>,
    /// Largest file a command may write, MiB.
    pub file_mb: Option<u64>,
    /// Resident memory of the whole sandbox, MiB, enforced by a cgroup where the host
    /// offers one (v2, or v1's memory controller); see [`crate::cgroup`].
    #[serde(default)]
    pub resident_mb: Option<u64>,
    /// Disk the workspace may grow to, MiB: a command that grows it past this is
    /// killed (checked while it runs, so it can overshoot by what it writes between
    /// two checks; `file_mb` bounds each file exactly).
    #[serde(default)]
    pub workspace_mb: Option<u64>,
    /// Size of the sandbox's private `/tmp` (and home), MiB, each a RAM-backed tmpfs.
    #[serde(default)]
    pub tmp_mb: Option<u64>,
    /// What a session's history may keep beyond its log, MiB: the new objects its
    /// calls' snapshots stored and the outputs they offloaded. Past it, the session's
    /// tool calls are answered with an error instead of run (a call that starts under
    /// it can pass it by what the workspace quota lets one call write).
    #[serde(default)]
    pub history_mb: Option<u64>,
    /// What the histories of all of one owner's sessions may keep together, MiB, as
    /// [`ResourceLimits::history_mb`]; deleting sessions frees it.
    #[serde(default)]
    pub owner_history_mb: Option<u64>,
}

impl Default for ResourceLimits {
    fn default() -> Self {
        ResourceLimits {
            // An address-space bound, not resident memory: Node's WebAssembly alone
            // reserves about 10 GiB, so a tight default would break ordinary tools.
            memory_mb: Some(32768),
            processes: Some(512),
            cpu_secs: Some(600),
            file_mb: Some(1024),
            resident_mb: Some(8192),
            workspace_mb: Some(10240),
            tmp_mb: Some(1024),
            history_mb: Some(51200),
            owner_history_mb: None,
        }
    }
}
