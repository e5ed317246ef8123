//! Change tracking: an inotify watch on every directory of a workspace a process has
//! snapshotted, so the next snapshot looks only at the directories something changed
//! in (and their parents), and a snapshot with nothing changed does no work at all.
//!
//! A watch is added before its directory is listed, so any change after the listing
//! is reported. Whatever the watcher cannot vouch for falls back to a full pass (the
//! index still saves reading unchanged files): the first snapshot of a workspace in a
//! process, a queue overflow, a watch that could not be added (limits), and any error.
//! Not seen by inotify, and so not by this: writes through a shared memory mapping
//! (`mmap`), and writes to a workspace file through a hard link from outside it.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};

/// Watchers alive in this process (each holds an inotify instance, of which a user
/// has few: 128 by default).
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// Most watchers one process keeps; more workspaces are snapshotted by full passes.
const MAX_LIVE: usize = 16;

/// One workspace's watches.
#[derive(Debug)]
pub(crate) struct Watcher {
    inotify: Inotify,
    /// Each watch's directory, by workspace path.
    dirs: HashMap<WatchDescriptor, String>,
    /// The watch on each workspace path, while the directory watched there has not
    /// moved or gone since it was listed.
    paths: HashMap<String, WatchDescriptor>,
}

/// What changed since the last pass.
pub(crate) enum Changes {
    /// These directories and every one above them; nothing else.
    Only(HashSet<String>),
    /// Unknown: look at everything.
    Everything,
}

impl Watcher {
    /// A new watcher, if the process may have another.
    pub(crate) fn new() -> Option<Self> {
        if LIVE.fetch_add(1, Ordering::Relaxed) >= MAX_LIVE {
            LIVE.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        match Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC) {
            Ok(inotify) => Some(Watcher {
                inotify,
                dirs: HashMap::new(),
                paths: HashMap::new(),
            }),
            Err(_) => {
                LIVE.fetch_sub(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Watches directory `abs` (workspace path `rel`); false if it could not be.
    pub(crate) fn watch(&mut self, abs: &Path, rel: &str) -> bool {
        let mask = AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_MODIFY
            | AddWatchFlags::IN_ATTRIB
            | AddWatchFlags::IN_CLOSE_WRITE
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_DELETE_SELF
            | AddWatchFlags::IN_MOVE_SELF
            | AddWatchFlags::IN_DONT_FOLLOW
            | AddWatchFlags::IN_ONLYDIR;
        match self.inotify.add_watch(abs, mask) {
            Ok(wd) => {
                // The same directory moved keeps its descriptor: it now has this path.
                self.forget(wd);
                self.dirs.insert(wd, rel.to_string());
                self.paths.insert(rel.to_string(), wd);
                true
            }
            Err(_) => false,
        }
    }

    /// Whether the directory at `rel` has been watched, without moving or going,
    /// since it was listed: only then does its silence mean it is unchanged.
    pub(crate) fn trusts(&self, rel: &str) -> bool {
        self.paths
            .get(rel)
            .is_some_and(|wd| self.dirs.get(wd).is_some_and(|r| r == rel))
    }

    /// Drops what watch `wd` stood for.
    fn forget(&mut self, wd: WatchDescriptor) {
        if let Some(rel) = self.dirs.remove(&wd) {
            if self.paths.get(&rel) == Some(&wd) {
                self.paths.remove(&rel);
            }
        }
    }

    /// Everything reported since the last call.
    pub(crate) fn changes(&mut self) -> Changes {
        let mut dirty = HashSet::new();
        loop {
            let events = match self.inotify.read_events() {
                Ok(events) => events,
                Err(nix::Error::EAGAIN) => break,
                Err(_) => return Changes::Everything,
            };
            for event in events {
                if event.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    return Changes::Everything;
                }
                if let Some(rel) = self.dirs.get(&event.wd) {
                    dirty.insert(rel.clone());
                }
                let gone = AddWatchFlags::IN_IGNORED
                    | AddWatchFlags::IN_MOVE_SELF
                    | AddWatchFlags::IN_DELETE_SELF;
                if event.mask.intersects(gone) {
                    // The directory moved or went (its parent reported that too):
                    // whatever is at its path now is listed afresh.
                    self.forget(event.wd);
                    if event.mask.contains(AddWatchFlags::IN_MOVE_SELF) {
                        let _ = self.inotify.rm_watch(event.wd);
                    }
                }
            }
        }
        let mut touched = HashSet::new();
        for rel in dirty {
            with_parents(&mut touched, &rel);
        }
        Changes::Only(touched)
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        LIVE.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Adds directory `rel` and every directory above it to `set`.
pub(crate) fn with_parents(set: &mut HashSet<String>, rel: &str) {
    let mut at = rel;
    while set.insert(at.to_string()) && !at.is_empty() {
        at = crate::tree::split(at).0;
    }
}
