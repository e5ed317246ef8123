//! A host's cache of a shared store's objects: bounded, least recently used first
//! out, and remembering which objects this process uploaded lately.
//!
//! Every cached object is in the shared store too, so any can be evicted; a read marks
//! an object as just used (its file's time, which also survives a restart).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use crate::{io, Result};

/// How long an upload vouches for an object (`steadfast gc` takes only objects older
/// than its grace period, an hour by default, which must exceed this).
pub const KNOWN_FOR: Duration = Duration::from_secs(600);

/// How many objects a cache remembers as uploaded (past it, it forgets them all and
/// starts over: a few more uploads, never a wrong answer).
const KNOWN_LIMIT: usize = 1 << 20;

/// The bound on a cache directory and what it holds now.
#[derive(Debug)]
pub(crate) struct Cache {
    dir: PathBuf,
    limit: u64,
    used: AtomicU64,
    /// Objects this process uploaded lately, and when. A pass that writes one of
    /// these again need not upload it: the store has held it for less than
    /// [`KNOWN_FOR`], shorter than any gc grace period, so no gc can have taken it.
    /// Any other cached object is uploaded again (gc may have collected it since).
    known: Mutex<HashMap<String, Instant>>,
}

/// An object file of a cache directory.
struct CachedObject {
    path: PathBuf,
    len: u64,
    used: SystemTime,
}

impl Cache {
    /// The cache in `dir` (objects in its two-hex-digit shards), of at most `limit`
    /// bytes.
    pub(crate) fn open(dir: PathBuf, limit: u64) -> Result<Self> {
        let cache = Cache {
            dir,
            limit,
            used: AtomicU64::new(0),
            known: Mutex::default(),
        };
        cache.recount()?;
        Ok(cache)
    }

    /// Whether this process uploaded `hash` less than [`KNOWN_FOR`] ago.
    pub(crate) fn knows(&self, hash: &str) -> bool {
        let known = self.known.lock().expect("known lock");
        known.get(hash).is_some_and(|at| at.elapsed() < KNOWN_FOR)
    }

    /// Remembers that `hashes` were just uploaded.
    pub(crate) fn uploaded<'a>(&self, hashes: impl IntoIterator<Item = &'a str>) {
        let now = Instant::now();
        let mut known = self.known.lock().expect("known lock");
        for hash in hashes {
            if known.len() >= KNOWN_LIMIT {
                known.clear();
            }
            known.insert(hash.to_string(), now);
        }
    }

    /// Counts the cache's bytes again from its files (after a sweep removed some).
    pub(crate) fn recount(&self) -> Result<()> {
        let used = self.objects()?.iter().map(|o| o.len).sum();
        self.used.store(used, Ordering::Relaxed);
        Ok(())
    }

    /// Counts `bytes` more and, past the bound, evicts the least recently used
    /// objects down to three quarters of it, but never `keep` (about to be read).
    pub(crate) fn added(&self, bytes: u64, keep: Option<&Path>) -> Result<()> {
        let used = self.used.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if used <= self.limit {
            return Ok(());
        }
        let mut objects = self.objects()?;
        objects.sort_by_key(|o| o.used);
        let mut used: u64 = objects.iter().map(|o| o.len).sum();
        let target = self.limit / 4 * 3;
        for object in objects {
            if used <= target {
                break;
            }
            if Some(object.path.as_path()) == keep {
                continue;
            }
            if std::fs::remove_file(&object.path).is_ok() {
                used -= object.len;
            }
        }
        self.used.store(used, Ordering::Relaxed);
        Ok(())
    }

    /// Every object file, with its size and last use.
    fn objects(&self) -> Result<Vec<CachedObject>> {
        let mut found = Vec::new();
        for shard in std::fs::read_dir(&self.dir).map_err(io("read", &self.dir))? {
            let shard = shard.map_err(io("read", &self.dir))?.path();
            let is_shard = shard
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.len() == 2 && n != "tmp");
            if !is_shard || !shard.is_dir() {
                continue;
            }
            for file in std::fs::read_dir(&shard).map_err(io("read", &shard))? {
                let path = file.map_err(io("read", &shard))?.path();
                if let Ok(meta) = std::fs::metadata(&path) {
                    let used = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                    found.push(CachedObject {
                        path,
                        len: meta.len(),
                        used,
                    });
                }
            }
        }
        Ok(found)
    }
}
