//! Control groups for bwrap sandboxes: the kernel's own bound on a sandbox's resident
//! memory and its number of processes, which rlimits cannot give (`RLIMIT_AS` bounds
//! what one process reserves, not what a sandbox uses; `RLIMIT_NPROC` counts per user).
//!
//! Each sandbox gets a group of its own, nested under the harness's own group (so it
//! stays inside whatever bounds the harness itself runs under), named like its run
//! directory so an abandoned one can be found and removed. Both hierarchies are
//! supported: v2 (one unified tree, where the parent must delegate the controllers),
//! and v1 (separate `memory` and `pids` trees). Where neither can be used (not root,
//! no delegation), [`Cgroup::create`] says why and the sandbox runs with rlimits only.

use std::path::{Path, PathBuf};

use crate::ResourceLimits;

const ROOT: &str = "/sys/fs/cgroup";

/// Processes a sandbox needs besides its commands' (bubblewrap, its init, the agent).
const OWN_PROCESSES: u32 = 16;

/// One sandbox's control groups; removed when dropped (after its processes are gone).
#[derive(Debug)]
pub(crate) struct Cgroup {
    dirs: Vec<PathBuf>,
    /// Where the memory controller counts OOM kills (`memory.events` or
    /// `memory.oom_control`).
    oom_counter: Option<PathBuf>,
}

/// The harness's own group in the hierarchy whose `/proc/self/cgroup` line matches.
fn own_path(matches: impl Fn(&str, &str) -> bool) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        matches(id, controllers).then(|| path.to_string())
    })
}

fn write(path: &Path, value: &str) -> Result<(), String> {
    std::fs::write(path, value).map_err(|e| format!("{}: {e}", path.display()))
}

impl Cgroup {
    /// Creates groups named `name` bounding `limits.resident_mb` and
    /// `limits.processes`. `Ok(None)` when no bound is asked for.
    pub(crate) fn create(name: &str, limits: &ResourceLimits) -> Result<Option<Self>, String> {
        if limits.resident_mb.is_none() && limits.processes.is_none() {
            return Ok(None);
        }
        let memory = limits.resident_mb.map(|mb| (mb * 1024 * 1024).to_string());
        let pids = limits
            .processes
            .map(|n| (n.saturating_add(OWN_PROCESSES)).to_string());
        if Path::new(ROOT).join("cgroup.controllers").exists() {
            return Self::create_v2(name, memory, pids).map(Some);
        }
        Self::create_v1(name, memory, pids).map(Some)
    }

    fn create_v2(name: &str, memory: Option<String>, pids: Option<String>) -> Result<Self, String> {
        let own = own_path(|id, _| id == "0").ok_or("no cgroup v2 membership")?;
        let parent = Path::new(ROOT).join(own.trim_start_matches('/'));
        // The parent must hand the controllers down; a group that holds processes
        // itself (other than the root) cannot, which is the usual reason this fails.
        let wanted: Vec<&str> = [
            memory.as_ref().map(|_| "+memory"),
            pids.as_ref().map(|_| "+pids"),
        ]
        .into_iter()
        .flatten()
        .collect();
        write(&parent.join("cgroup.subtree_control"), &wanted.join(" "))?;
        let dir = parent.join(name);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let group = Cgroup {
            oom_counter: memory.as_ref().map(|_| dir.join("memory.events")),
            dirs: vec![dir.clone()],
        };
        if let Some(bytes) = &memory {
            write(&dir.join("memory.max"), bytes)?;
            let _ = write(&dir.join("memory.swap.max"), "0");
        }
        if let Some(n) = &pids {
            write(&dir.join("pids.max"), n)?;
        }
        Ok(group)
    }

    fn create_v1(name: &str, memory: Option<String>, pids: Option<String>) -> Result<Self, String> {
        let mut group = Cgroup {
            dirs: Vec::new(),
            oom_counter: None,
        };
        for (controller, setting) in [("memory", &memory), ("pids", &pids)] {
            let Some(value) = setting else { continue };
            let own = own_path(|_, c| c.split(',').any(|c| c == controller))
                .ok_or_else(|| format!("no cgroup v1 {controller} controller"))?;
            let dir = Path::new(ROOT)
                .join(controller)
                .join(own.trim_start_matches('/'))
                .join(name);
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            group.dirs.push(dir.clone());
            if controller == "memory" {
                write(&dir.join("memory.limit_in_bytes"), value)?;
                // Without swap accounting this file is absent; the bound then is RAM.
                let _ = write(&dir.join("memory.memsw.limit_in_bytes"), value);
                group.oom_counter = Some(dir.join("memory.oom_control"));
            } else {
                write(&dir.join("pids.max"), value)?;
            }
        }
        Ok(group)
    }

    /// The groups' directories (for whoever removes them when the sandbox ends).
    pub(crate) fn dirs(&self) -> Vec<String> {
        self.dirs.iter().map(|d| d.display().to_string()).collect()
    }

    /// Arguments for `sh` that make the shell join the groups and then run the
    /// program and arguments that follow, in its place: what a process starts after
    /// joining stays in the groups, so nothing of the sandbox runs outside them.
    pub(crate) fn joining_shell(&self) -> Vec<String> {
        let mut args = vec![
            "-c".to_string(),
            r#"n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 126; shift; n=$((n-1)); done; exec "$@""#
                .to_string(),
            "steadfast-cgroup".to_string(),
            self.dirs.len().to_string(),
        ];
        args.extend(
            self.dirs
                .iter()
                .map(|d| d.join("cgroup.procs").display().to_string()),
        );
        args
    }

    /// How many times the memory bound has killed a process in this sandbox.
    pub(crate) fn oom_kills(&self) -> u64 {
        let Some(counter) = &self.oom_counter else {
            return 0;
        };
        std::fs::read_to_string(counter)
            .ok()
            .and_then(|text| {
                text.lines().find_map(|l| {
                    l.strip_prefix("oom_kill ")
                        .and_then(|n| n.trim().parse().ok())
                })
            })
            .unwrap_or(0)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for dir in &self.dirs {
            // The sandbox's processes are gone or going; give the kernel a moment.
            for _ in 0..50 {
                if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
    }
}

/// Removes the groups of sandboxes whose harness died (`alive` says whether a run
/// directory name's owner still runs).
pub(crate) fn reap(alive: impl Fn(&str) -> bool) {
    let mut parents = Vec::new();
    if let Some(own) = own_path(|id, _| id == "0") {
        parents.push(Path::new(ROOT).join(own.trim_start_matches('/')));
    }
    for controller in ["memory", "pids"] {
        if let Some(own) = own_path(|_, c| c.split(',').any(|c| c == controller)) {
            parents.push(
                Path::new(ROOT)
                    .join(controller)
                    .join(own.trim_start_matches('/')),
            );
        }
    }
    for parent in parents {
        let Ok(entries) = std::fs::read_dir(&parent) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("steadfast-sbx-") && !alive(&name) {
                let _ = std::fs::remove_dir(entry.path());
            }
        }
    }
}
