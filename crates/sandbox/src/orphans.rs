//! Commands left running by a harness that died.
//!
//! Commands run in their own process group, so a signal to the harness does not reach
//! them, and a harness killed with SIGKILL cannot kill them either. Left alone, such a
//! command would keep changing the workspace after the next harness restored it. So
//! each running command's process group is recorded in a file outside the workspace,
//! with the process that ran it, and a new sandbox over the same workspace first kills
//! every process still in a recorded group whose recorder is gone and whose working
//! directory is inside the workspace. (A live harness's commands are never touched: a
//! wrapped CLI and its tools run in two sandboxes over one workspace at once.)

use std::path::{Path, PathBuf};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// The directory where running commands of the workspace `root` are recorded.
pub(crate) fn registry(root: &Path) -> PathBuf {
    let key = blake3::hash(root.to_string_lossy().as_bytes()).to_hex();
    std::env::temp_dir()
        .join("steadfast-running")
        .join(&key[..24])
}

/// A running command's record: forgotten when dropped, however the command's run
/// ends (its future cancelled too, when the lease is lost or the call interrupted).
#[derive(Debug)]
pub(crate) struct Record(PathBuf);

impl Drop for Record {
    fn drop(&mut self) {
        forget(&self.0);
    }
}

/// Records a running command's process group, with the session and lease epoch it
/// runs under.
pub(crate) fn record(registry: &Path, pgid: u32, lease: Option<&(String, u64)>) -> Option<Record> {
    let file = registry.join(format!("{pgid}.pgid"));
    let record = match lease {
        Some((session, epoch)) => format!("{pgid} {} {session} {epoch}", std::process::id()),
        None => format!("{pgid} {}", std::process::id()),
    };
    // A directory emptied by another command's [`forget`] between the two steps is
    // made again.
    for _ in 0..3 {
        std::fs::create_dir_all(registry).ok()?;
        match std::fs::write(&file, &record) {
            Ok(()) => return Some(Record(file)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(_) => return None,
        }
    }
    None
}

/// Removes a finished command's record, and the registry's directories once they are
/// empty, so a host's temporary directory holds nothing once no command runs.
pub(crate) fn forget(file: &Path) {
    let _ = std::fs::remove_file(file);
    let registry = file.parent();
    // Fails, leaving them, while another command is recorded.
    for dir in [registry, registry.and_then(Path::parent)]
        .into_iter()
        .flatten()
    {
        if std::fs::remove_dir(dir).is_err() {
            break;
        }
    }
}

/// Kills what is left of every recorded command of the workspace `root` whose
/// harness is gone. Returns how many processes were killed.
pub(crate) fn reap(registry: &Path, root: &Path) -> usize {
    kill_recorded(registry, root, |owner, _| {
        // Still running under a live harness (this one, or another on this host).
        !owner
            .is_some_and(|o| o == std::process::id() as i32 || kill(Pid::from_raw(o), None).is_ok())
    })
}

/// Kills every recorded command of the workspace `root` run for `session` under a
/// lease epoch before `epoch`, by whichever process, alive or not: its holder lost the
/// lease (see [`crate::take_over`]). Returns how many processes were killed.
pub(crate) fn take_over(root: &Path, session: &str, epoch: u64) -> usize {
    kill_recorded(&registry(root), root, |_, lease| {
        lease.is_some_and(|(of, under)| of == session && under < epoch)
    })
}

/// Kills the processes of every recorded command of `root` that `doomed(owner,
/// (session, epoch))` picks, and waits until they are gone.
fn kill_recorded(
    registry: &Path,
    root: &Path,
    doomed: impl Fn(Option<i32>, Option<(&str, u64)>) -> bool,
) -> usize {
    let Ok(entries) = std::fs::read_dir(registry) else {
        return 0;
    };
    let groups: Vec<i32> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let text = std::fs::read_to_string(e.path()).ok()?;
            let mut words = text.split_whitespace();
            let pgid: i32 = words.next()?.parse().ok()?;
            let owner: Option<i32> = words.next().and_then(|w| w.parse().ok());
            let lease = words.next().zip(words.next().and_then(|e| e.parse().ok()));
            if !doomed(owner, lease) {
                return None;
            }
            forget(&e.path());
            Some(pgid)
        })
        .collect();
    if groups.is_empty() {
        return 0;
    }
    let mut killed = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return 0;
    };
    for entry in procs.filter_map(Result::ok) {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Some(pgrp) = process_group(pid) else {
            continue;
        };
        if !groups.contains(&pgrp) {
            continue;
        }
        // Only processes working inside this workspace: a recycled group id belongs
        // to someone else.
        let inside = std::fs::read_link(format!("/proc/{pid}/cwd"))
            .map(|cwd| cwd.starts_with(root))
            .unwrap_or(false);
        if inside && kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok() {
            killed.push(pid);
        }
    }
    if !killed.is_empty() {
        tracing::warn!(workspace = %root.display(), killed = killed.len(), "killed commands left running by a harness that is gone or lost its lease");
    }
    // Gone before the caller restores the workspace: a write a process was in the
    // middle of when the signal came still lands, so "killed" is not yet "done".
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while killed.iter().any(|&pid| is_running(pid)) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    killed.len()
}

/// Whether `pid` exists and has not exited (a zombie has: it writes nothing more).
fn is_running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat[stat.rfind(')').map_or(0, |i| i + 1)..]
            .split_whitespace()
            .next()
            .unwrap_or("");
        state != "Z" && state != "X"
    })
}

/// The process group of `pid`, from `/proc/<pid>/stat` (field 5, after the
/// parenthesised command name, which may itself contain spaces).
fn process_group(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(2)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_is_removed_once_its_last_command_is_forgotten() {
        let tmp = tempfile::tempdir().unwrap();
        let registry = tmp.path().join("steadfast-running").join("key");
        let a = record(&registry, 1, None).unwrap();
        let b = record(&registry, 2, Some(&("s".to_string(), 1))).unwrap();
        drop(a);
        assert!(b.0.exists(), "another command's record stays");
        drop(b);
        assert!(!registry.exists() && !tmp.path().join("steadfast-running").exists());
        // Recorded again after that, the directories are made again.
        let c = record(&registry, 3, None).unwrap();
        assert!(c.0.exists());
    }
}
