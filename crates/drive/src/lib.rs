//! The drive: content-addressed, incremental snapshots of a workspace.
//!
//! A session's files must never drift from its log (DESIGN.md invariant 5). Every
//! mutating tool call records the snapshot before and after it; after a crash the
//! workspace is restored to a recorded snapshot instead of re-running commands.
//!
//! Snapshots cover everything in the workspace, `.git` included, except a top-level
//! `.steadfast` directory (the runtime's own state, should it live inside the
//! workspace). File contents are stored once per distinct content ([`store::ObjectStore`]);
//! a snapshot is a manifest of paths, itself content-addressed, so its id is a
//! pointer and forking a drive is copying that id. A stat cache keeps unchanged files
//! from being hashed again.

mod archive;
mod manifest;
mod statcache;
mod store;

use std::path::{Path, PathBuf};

pub use archive::{unpack_tar, Unpacked};
pub use manifest::{Change, ChangeKind, Entry, Manifest, SpecialKind};
use statcache::StatCache;
use store::ObjectStore;

/// The name of the workspace directory snapshots leave out.
pub const EXCLUDED_DIR: &str = ".steadfast";

/// Everything that can go wrong with a drive.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A filesystem operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// On what.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// No snapshot or object with this id is stored.
    #[error("snapshot or object {0} not found in the drive")]
    NotFound(String),
    /// A stored object does not hash to its name.
    #[error("drive object {0} is corrupt")]
    Corrupt(String),
    /// An archive given to unpack is not one, or holds what a workspace may not.
    #[error("{0}")]
    Archive(String),
}

/// The drive's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io { op, path, source }
}

/// A snapshot store on local disk, shared by all the workspaces that use it.
#[derive(Debug, Clone)]
pub struct Drive {
    objects: ObjectStore,
    cache_dir: PathBuf,
}

impl Drive {
    /// Opens (creating if needed) a drive stored under `dir`.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let cache_dir = dir.join("statcache");
        std::fs::create_dir_all(&cache_dir).map_err(io("create", &cache_dir))?;
        Ok(Drive {
            objects: ObjectStore::open(dir.join("objects"))?,
            cache_dir,
        })
    }

    /// Takes a snapshot of `workspace` and returns its id.
    ///
    /// Durable when this returns: every object and the manifest are synced. A crash
    /// part way through leaves only unreferenced objects behind.
    pub fn snapshot(&self, workspace: &Path) -> Result<String> {
        let mut cache = StatCache::load(&self.cache_dir, workspace);
        let manifest = manifest::scan(workspace, &mut cache, &self.objects)?;
        steadfast_fault::point(steadfast_fault::points::MID_SNAPSHOT);
        let id = self.objects.put(&manifest.to_bytes())?;
        cache.save()?;
        Ok(id)
    }

    /// Makes `workspace` equal to snapshot `id`: extra entries removed, changed and
    /// missing ones written. Idempotent, so a crash during a restore is repaired by
    /// restoring again.
    pub fn restore(&self, workspace: &Path, id: &str) -> Result<()> {
        let manifest = self.manifest(id)?;
        let mut cache = StatCache::load(&self.cache_dir, workspace);
        manifest::apply(&manifest, workspace, &mut cache, &self.objects)?;
        cache.save()
    }

    /// The manifest of snapshot `id`.
    pub fn manifest(&self, id: &str) -> Result<Manifest> {
        Manifest::from_bytes(id, &self.objects.get(id)?)
    }

    /// What changed from snapshot `a` to snapshot `b`, by path.
    pub fn diff(&self, a: &str, b: &str) -> Result<Vec<Change>> {
        Ok(self.manifest(a)?.diff(&self.manifest(b)?))
    }

    /// Removes stored objects that none of `keep` (snapshot ids) references, once they
    /// are older than `min_age` (a snapshot being taken right now has written objects
    /// that no log references yet; the grace period keeps them). Returns the number of
    /// objects removed.
    pub fn gc(&self, keep: &[String], min_age: std::time::Duration) -> Result<usize> {
        let mut referenced = std::collections::HashSet::new();
        for id in keep {
            let manifest = match self.manifest(id) {
                Ok(m) => m,
                Err(Error::NotFound(_)) => continue,
                Err(e) => return Err(e),
            };
            referenced.insert(id.clone());
            for entry in manifest.entries.values() {
                if let Entry::File { hash, .. } = entry {
                    referenced.insert(hash.clone());
                }
            }
        }
        self.objects.sweep(&referenced, min_age)
    }

    /// Where the content objects are kept (for tests that damage one).
    #[cfg(test)]
    pub(crate) fn objects_dir(&self) -> PathBuf {
        self.objects.dir().to_path_buf()
    }

    /// The bytes of a file in a snapshot.
    pub fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>> {
        match self.manifest(id)?.entries.get(path) {
            Some(Entry::File { hash, .. }) => self.objects.get(hash),
            _ => Err(Error::NotFound(format!("{id}:{path}"))),
        }
    }
}

#[cfg(test)]
mod tests;
