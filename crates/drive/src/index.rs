//! The workspace index: for each directory, what it held when last stored (its tree
//! id and names) and the stat stamps of its settled files. A file whose stamp is
//! unchanged is not hashed again; a directory whose names all came out as before keeps
//! its tree id without being serialized or stored again. So a snapshot with nothing
//! changed stats every entry and writes nothing.
//!
//! The index lives in memory in the [`crate::Drive`] and, per directory, in a small
//! file under the drive's `statcache/`, rewritten only when that directory changes
//! (updated in place, never the whole index), and read lazily after a restart. It is
//! only ever a hint checked against the filesystem: a lost or torn file costs hashing
//! again, never a wrong snapshot.
//!
//! Timestamps have coarse resolution, so a file changed twice within one tick keeps
//! its mtime. Like git's "racily clean" rule, a stamp is kept only for a file that was
//! already older than [`SETTLE_NS`] when it was read; younger files are always hashed.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::tree::Node;
use crate::watch::{Changes, Watcher};
use crate::{io, Result};

pub(crate) const SETTLE_NS: i128 = 2_000_000_000;

/// What identifies a file's version without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Stamp {
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    ino: u64,
    mode: u32,
}

impl Stamp {
    /// The stamp of what `fstatat` returned.
    pub(crate) fn of(stat: &nix::sys::stat::FileStat) -> Self {
        Stamp {
            size: stat.st_size as u64,
            mtime_ns: stat.st_mtime as i128 * 1_000_000_000 + stat.st_mtime_nsec as i128,
            ctime_ns: stat.st_ctime as i128 * 1_000_000_000 + stat.st_ctime_nsec as i128,
            ino: stat.st_ino,
            mode: stat.st_mode,
        }
    }

    /// Whether the file had settled by `now_ns`, so its stamp can be trusted later.
    pub(crate) fn settled(&self, now_ns: i128) -> bool {
        now_ns - self.mtime_ns.max(self.ctime_ns) >= SETTLE_NS
    }
}

/// One directory as last stored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct DirRecord {
    /// The id of its stored tree.
    pub(crate) tree: String,
    /// Its names, as in that tree.
    pub(crate) nodes: BTreeMap<String, Node>,
    /// Stamps of its files that had settled, by name.
    pub(crate) stamps: BTreeMap<String, Stamp>,
}

/// One workspace's index.
#[derive(Debug)]
pub(crate) struct Index {
    dir: PathBuf,
    records: HashMap<String, Option<DirRecord>>,
    /// Now, in ns since the epoch, read once per pass.
    pub(crate) now_ns: i128,
    /// The workspace's directories watched for changes, once a full pass has run.
    watcher: Option<Watcher>,
    /// Directories holding files too young to trust their stamps: looked at again
    /// by the next pass, so their stamps are kept (for a process that starts over
    /// from the files) once they settle.
    pub(crate) unsettled: std::collections::HashSet<String>,
    /// Changes a restore's probe took from the watcher, still owed to the next pass.
    pending: Option<std::collections::HashSet<String>>,
}

impl Index {
    /// The index of `workspace`, kept under `cache_dir`.
    pub(crate) fn new(cache_dir: &Path, workspace: &Path) -> Self {
        let key = blake3::hash(workspace.to_string_lossy().as_bytes()).to_hex();
        Index {
            dir: cache_dir.join(&key[..32]),
            records: HashMap::new(),
            now_ns: 0,
            watcher: None,
            unsettled: Default::default(),
            pending: Some(Default::default()),
        }
    }

    /// Starts a pass: reads the clock once.
    pub(crate) fn begin(&mut self) {
        self.now_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as i128)
            .unwrap_or(0);
    }

    fn file(&self, rel: &str) -> PathBuf {
        let key = blake3::hash(rel.as_bytes()).to_hex();
        self.dir.join(format!("{}.json", &key[..32]))
    }

    /// Takes the record of directory `rel` out of memory for a pass to use (read from
    /// disk the first time); [`Index::keep`] or [`Index::put`] gives it back.
    pub(crate) fn take(&mut self, rel: &str) -> Option<DirRecord> {
        match self.records.remove(rel) {
            Some(record) => record,
            None => std::fs::read(self.file(rel))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok()),
        }
    }

    /// Gives back, unchanged, a record taken for a pass.
    pub(crate) fn keep(&mut self, rel: &str, record: DirRecord) {
        self.records.insert(rel.to_string(), Some(record));
    }

    /// Replaces the record of directory `rel`, in memory and in its file.
    pub(crate) fn put(&mut self, rel: &str, record: DirRecord) -> Result<()> {
        std::fs::create_dir_all(&self.dir).map_err(io("create", &self.dir))?;
        let file = self.file(rel);
        let tmp = file.with_extension(crate::unique_temp_suffix());
        let bytes = serde_json::to_vec(&record).expect("records serialize");
        std::fs::write(&tmp, bytes).map_err(io("write", &tmp))?;
        std::fs::rename(&tmp, &file).map_err(io("rename", &file))?;
        self.records.insert(rel.to_string(), Some(record));
        Ok(())
    }

    /// The tree id of directory `rel` as last stored, if it is in memory.
    pub(crate) fn tree_of(&self, rel: &str) -> Option<&str> {
        self.records
            .get(rel)
            .and_then(Option::as_ref)
            .map(|r| r.tree.as_str())
    }

    /// What changed since the last pass, as far as the watcher can vouch. Without a
    /// watcher (the first pass in this process, or after a failure) one is started,
    /// and the coming pass, which must look at everything, adds its watches.
    pub(crate) fn changes(&mut self) -> Changes {
        let owed = self.pending.replace(Default::default());
        let mut touched = match &mut self.watcher {
            Some(watcher) => match watcher.changes() {
                Changes::Only(touched) => touched,
                Changes::Everything => {
                    self.unsettled.clear();
                    return Changes::Everything;
                }
            },
            None => {
                self.watcher = Watcher::new();
                self.unsettled.clear();
                return Changes::Everything;
            }
        };
        let Some(owed) = owed else {
            self.unsettled.clear();
            return Changes::Everything;
        };
        touched.extend(owed);
        // Taken: the pass adds back each one it finds still unsettled.
        for rel in std::mem::take(&mut self.unsettled) {
            crate::watch::with_parents(&mut touched, &rel);
        }
        Changes::Only(touched)
    }

    /// What changed since the last store pass, for a restore's probe: the index
    /// still describes what that pass saw, so the probe must look again at every
    /// directory changed since then — by commands, and by earlier restores whose own
    /// probes already took their changes from the watcher — not only at those changed
    /// since the last probe. The changes stay owed to the next store pass. `None` when
    /// the watcher cannot vouch for anything.
    pub(crate) fn probe_changes(&mut self) -> Option<std::collections::HashSet<String>> {
        let watcher = self.watcher.as_mut()?;
        match watcher.changes() {
            Changes::Only(touched) => {
                let owed = self.pending.as_mut()?;
                owed.extend(touched);
                Some(owed.clone())
            }
            Changes::Everything => {
                self.pending = None;
                None
            }
        }
    }

    /// Directory `rel` as last stored, if it is in memory.
    pub(crate) fn record(&self, rel: &str) -> Option<&DirRecord> {
        self.records.get(rel).and_then(Option::as_ref)
    }

    /// Whether the watcher vouches that directory `rel` is the one last listed there.
    pub(crate) fn trusts(&self, rel: &str) -> bool {
        self.watcher.as_ref().is_some_and(|w| w.trusts(rel))
    }

    /// Watches directory `abs` (workspace path `rel`) before it is listed. A watch
    /// that cannot be added ends watching: the next pass looks at everything.
    pub(crate) fn watch(&mut self, abs: &Path, rel: &str) {
        if let Some(watcher) = &mut self.watcher {
            if !watcher.watch(abs, rel) {
                self.watcher = None;
            }
        }
    }

    /// Forgets everything (memory and files), as when a record named an object the
    /// store no longer holds.
    pub(crate) fn clear(&mut self) {
        self.records.clear();
        self.watcher = None;
        self.unsettled.clear();
        self.pending = Some(Default::default());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
