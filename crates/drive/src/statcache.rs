//! The stat cache: a file whose size, times and inode are unchanged is not hashed again.
//!
//! Timestamps have coarse resolution, so a file changed twice within one tick keeps its
//! mtime. Like git's "racily clean" rule, an entry is trusted only if the file was
//! already older than [`SETTLE`] when it was cached; younger files are always re-hashed.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::{io, Result};

const SETTLE_NS: i128 = 2_000_000_000;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Stamp {
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    ino: u64,
    mode: u32,
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Self {
        Stamp {
            size: meta.size(),
            mtime_ns: meta.mtime() as i128 * 1_000_000_000 + meta.mtime_nsec() as i128,
            ctime_ns: meta.ctime() as i128 * 1_000_000_000 + meta.ctime_nsec() as i128,
            ino: meta.ino(),
            mode: meta.mode(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Cached {
    stamp: Stamp,
    hash: String,
}

/// Cached hashes of one workspace's files.
pub(crate) struct StatCache {
    file: PathBuf,
    old: HashMap<String, Cached>,
    new: HashMap<String, Cached>,
    now_ns: i128,
}

impl StatCache {
    /// Loads the cache for `workspace`; a missing or unreadable cache is empty.
    pub(crate) fn load(dir: &Path, workspace: &Path) -> Self {
        let key = blake3::hash(workspace.to_string_lossy().as_bytes()).to_hex();
        let file = dir.join(format!("{}.json", &key[..32]));
        let old = std::fs::read(&file)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let now_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as i128)
            .unwrap_or(0);
        StatCache {
            file,
            old,
            new: HashMap::new(),
            now_ns,
        }
    }

    /// The cached hash of `path`, if its metadata is unchanged since it was cached.
    pub(crate) fn lookup(&mut self, path: &str, meta: &std::fs::Metadata) -> Option<String> {
        let cached = self.old.get(path)?;
        if cached.stamp != Stamp::of(meta) {
            return None;
        }
        let hash = cached.hash.clone();
        self.new.insert(path.to_string(), cached.clone());
        Some(hash)
    }

    /// Remembers the hash of `path` (stored in the drive) if the file has settled.
    pub(crate) fn record(&mut self, path: &str, meta: &std::fs::Metadata, hash: &str) {
        let stamp = Stamp::of(meta);
        if self.now_ns - stamp.mtime_ns.max(stamp.ctime_ns) < SETTLE_NS {
            return;
        }
        self.new.insert(
            path.to_string(),
            Cached {
                stamp,
                hash: hash.to_string(),
            },
        );
    }

    /// Writes back the entries seen in this pass (entries of vanished files drop out).
    pub(crate) fn save(self) -> Result<()> {
        let tmp = self
            .file
            .with_extension(format!("tmp{}", std::process::id()));
        let bytes = serde_json::to_vec(&self.new).expect("cache serializes");
        std::fs::write(&tmp, bytes).map_err(io("write", &tmp))?;
        std::fs::rename(&tmp, &self.file).map_err(io("rename", &self.file))
    }
}
