//! The drive: content-addressed, incremental snapshots of a workspace.
//!
//! A session's files must never drift from its log (docs/ARCHITECTURE.md rule 5). Every
//! mutating tool call records the snapshot before and after it; after a crash the
//! workspace is restored to a recorded snapshot instead of re-running commands.
//!
//! Snapshots cover everything in the workspace, `.git` included, except a top-level
//! `.steadfast` directory (the runtime's own state, should it live inside the
//! workspace). File contents are stored once per distinct content ([`store::ObjectStore`]);
//! each directory is a tree object naming its entries by content ([`tree`]), so a
//! snapshot's id is a pointer (forking a drive is copying it) and a snapshot stores
//! only the files and directories that changed. The index ([`index`]) keeps unchanged
//! files from being hashed and unchanged directories from being written: a snapshot
//! costs a stat per entry plus the work of what changed.

mod archive;
mod cache;
mod index;
mod manifest;
mod remote;
mod restore;
mod scan;
mod store;
mod tree;
mod watch;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub use archive::{unpack_tar, Unpacked};
pub use cache::KNOWN_FOR;
use index::Index;
pub use manifest::{Change, ChangeKind, Entry, Manifest, SpecialKind};
use scan::{Mode, Scanner};
use store::ObjectStore;
use tree::Stored;
use watch::Changes;

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
    /// The shared store failed (unreachable, refused, or answered nonsense).
    #[error("drive store: {0}")]
    Store(String),
    /// A restore's blocking task did not finish (it panicked, or its runtime shut
    /// down).
    #[error("drive task: {0}")]
    Task(String),
}

impl Error {
    /// Whether this is a snapshot abandoned at its deadline (see
    /// [`Drive::snapshot_within`]): nothing is wrong with the workspace, it is only too
    /// big (or its disk too slow) to read in the time allowed.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::TimedOut)
    }
}

/// An object a snapshot reaches that the store no longer holds as written.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct LostObject {
    /// A snapshot that reaches it.
    pub snapshot: String,
    /// The object (a file's content or a directory's tree).
    pub object: String,
    /// `missing`, `corrupt`, or what reading it said.
    pub problem: String,
}

/// The drive's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A name part no other writer uses at the same time (this process's id and a counter),
/// for a temporary file renamed into place: two processes, or two threads of one, that
/// write the same file never share a temporary.
pub(crate) fn unique_temp_suffix() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "tmp{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

pub(crate) fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io { op, path, source }
}

/// A snapshot just taken: its id, and the bytes of new objects it stored (0 when the
/// store held everything already): what it added to the drive, counted against a
/// session's history quota.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    /// The snapshot's id.
    pub id: String,
    /// Bytes of objects this snapshot wrote that the store did not hold.
    pub stored_bytes: u64,
}

/// A snapshot store, shared by all the workspaces that use it: on local disk, or in
/// an object store every host shares with a bounded cache on this one.
#[derive(Debug, Clone)]
pub struct Drive {
    objects: ObjectStore,
    cache_dir: PathBuf,
    /// The indexes of workspaces snapshotted lately, by path. Each is also the
    /// workspace's writer lock: a snapshot or a restore holds it for its whole pass.
    indexes: Arc<Mutex<HashMap<PathBuf, Arc<Mutex<Index>>>>>,
    /// Files read (hashed) by snapshots and restores so far.
    files_read: Arc<AtomicU64>,
    /// With a shared store: every object of the recorded snapshot each workspace was
    /// brought to from elsewhere (a new host, or another host's changes), by path.
    /// The store keeps them while the session lives (its log refers to the
    /// snapshot), so the first snapshot after such a restore, which re-reads files
    /// the index has not seen, uploads none of them again.
    restored: Arc<Mutex<HashMap<PathBuf, Arc<std::collections::HashSet<String>>>>>,
}

/// How many objects a restore from elsewhere fetches before it makes room for more
/// in the cache.
const PREFETCH_CHUNK: usize = 1024;

/// How many workspaces' indexes a drive keeps in memory (the rest are read back
/// from their files when next used).
const INDEXES_IN_MEMORY: usize = 64;

impl Drive {
    /// Opens (creating if needed) a drive stored under `dir`.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        Self::open_at(dir, dir.join("objects"))
    }

    /// Opens a drive whose objects are in the directory `objects` (which may be
    /// shared by several hosts) and whose per-host state is under `dir`.
    pub fn open_at(dir: impl AsRef<Path>, objects: impl Into<PathBuf>) -> Result<Self> {
        Self::with_objects(dir.as_ref(), ObjectStore::open(objects.into())?)
    }

    /// Opens a drive whose objects live in `store`, shared by every host, with a
    /// cache of at most `cache_bytes` and the per-host state under `dir`. A snapshot
    /// is durable when `store` holds it; any host can restore it.
    pub fn open_shared(
        dir: impl AsRef<Path>,
        store: Arc<dyn object_store::ObjectStore>,
        cache_bytes: u64,
    ) -> Result<Self> {
        let dir = dir.as_ref();
        let remote = remote::Remote::new(store);
        let objects = ObjectStore::cached(dir.join("objects"), remote, cache_bytes)?;
        Self::with_objects(dir, objects)
    }

    fn with_objects(dir: &Path, objects: ObjectStore) -> Result<Self> {
        let cache_dir = dir.join("statcache");
        std::fs::create_dir_all(&cache_dir).map_err(io("create", &cache_dir))?;
        Ok(Drive {
            objects,
            cache_dir,
            indexes: Arc::default(),
            files_read: Arc::default(),
            restored: Arc::default(),
        })
    }

    /// Runs `f` with the index of `workspace`, holding it for the whole pass.
    ///
    /// **One pass at a time per workspace.** Snapshots and restores of one workspace
    /// through this drive (and its clones) never overlap: a snapshot taken while a
    /// restore runs would record a workspace half one thing and half another, and two
    /// restores to different snapshots at once would leave a mixture of both. So a
    /// snapshot always records a workspace some restore left whole (or that commands
    /// changed), and concurrent callers (tool calls of one reply run in parallel) are
    /// served in turn, each with the index the one before it left.
    fn with_index<T>(&self, workspace: &Path, f: impl FnOnce(&mut Index) -> T) -> T {
        let slot = {
            let mut indexes = self.indexes.lock().expect("index lock");
            if !indexes.contains_key(workspace) && indexes.len() >= INDEXES_IN_MEMORY {
                // Forget one no pass is using (its files stay, read back when needed).
                let idle = indexes
                    .iter()
                    .find(|(_, slot)| Arc::strong_count(slot) == 1)
                    .map(|(path, _)| path.clone());
                if let Some(path) = idle {
                    indexes.remove(&path);
                }
            }
            indexes
                .entry(workspace.to_path_buf())
                .or_insert_with(|| Arc::new(Mutex::new(Index::new(&self.cache_dir, workspace))))
                .clone()
        };
        let mut index = match slot.lock() {
            Ok(index) => index,
            Err(poisoned) => {
                // A pass panicked half way: its index is only a hint, so start over.
                let mut index = poisoned.into_inner();
                index.clear();
                slot.clear_poison();
                index
            }
        };
        f(&mut index)
    }

    /// Takes a snapshot of `workspace` and returns its id.
    ///
    /// Durable when this returns: every new object is synced. A crash part way
    /// through leaves only unreferenced objects behind.
    pub fn snapshot(&self, workspace: &Path) -> Result<String> {
        self.take(workspace).map(|taken| taken.id)
    }

    /// [`Drive::snapshot`], saying also what it stored.
    pub fn take(&self, workspace: &Path) -> Result<Taken> {
        self.with_index(workspace, |index| {
            let (id, stored_bytes) = self.store_pass(workspace, index)?;
            if self.objects.contains(&id)? {
                return Ok(Taken { id, stored_bytes });
            }
            // The index named a tree the store no longer holds (swept while no log
            // referenced it): start over from the files themselves.
            index.clear();
            let (id, more) = self.store_pass(workspace, index)?;
            Ok(Taken {
                id,
                stored_bytes: stored_bytes + more,
            })
        })
    }

    fn store_pass(&self, workspace: &Path, index: &mut Index) -> Result<(String, u64)> {
        let touched = match index.changes() {
            Changes::Only(touched) => {
                if touched.is_empty() && index.trusts("") {
                    if let Some(root) = index.tree_of("") {
                        // Nothing was reported anywhere since the last pass.
                        steadfast_fault::point(steadfast_fault::points::MID_SNAPSHOT);
                        return Ok((root.to_string(), 0));
                    }
                }
                Some(touched)
            }
            Changes::Everything => None,
        };
        let mut scanner = Scanner::new(&self.objects, index, Mode::Store);
        scanner.touched = touched;
        scanner.batch.vouched = self
            .restored
            .lock()
            .expect("restored lock")
            .get(workspace)
            .cloned();
        let root = scanner.root(workspace)?;
        self.files_read
            .fetch_add(scanner.files_read, Ordering::Relaxed);
        steadfast_fault::point(steadfast_fault::points::MID_SNAPSHOT);
        self.objects.finish(&mut scanner.batch)?;
        Ok((root, scanner.batch.committed))
    }

    /// [`Drive::snapshot`] for async callers, on a blocking thread, abandoned after
    /// `limit`: a snapshot that takes longer (a workspace on a dead network mount, a
    /// runaway tree) fails with a timed-out [`Error::Io`] instead of holding its caller
    /// (and the session's lease) for ever. The abandoned pass still runs to its end,
    /// holding the workspace's turn ([`Drive::with_index`]) until then.
    pub async fn snapshot_within(
        &self,
        workspace: &Path,
        limit: std::time::Duration,
    ) -> Result<Taken> {
        let (drive, ws) = (self.clone(), workspace.to_path_buf());
        let started = std::time::Instant::now();
        let timed_out = || Error::Io {
            op: "snapshot",
            path: workspace.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("took longer than {} s and was abandoned", limit.as_secs()),
            ),
        };
        match tokio::time::timeout(limit, tokio::task::spawn_blocking(move || drive.take(&ws)))
            .await
        {
            Ok(done) => {
                let snapshot = done.map_err(|e| Error::Task(e.to_string()))??;
                // Finished past the deadline (the timer had not fired yet on a busy
                // machine): late all the same, whatever the scheduler did.
                if started.elapsed() > limit {
                    return Err(timed_out());
                }
                Ok(snapshot)
            }
            Err(_) => Err(timed_out()),
        }
    }

    /// [`Drive::restore`] for async callers, on a blocking thread: restoring a big
    /// tree must not stall the runtime the session's other work runs on.
    pub async fn restore_async(&self, workspace: &Path, id: &str) -> Result<()> {
        let (drive, workspace, id) = (self.clone(), workspace.to_path_buf(), id.to_string());
        tokio::task::spawn_blocking(move || drive.restore(&workspace, &id))
            .await
            .map_err(|e| Error::Task(e.to_string()))?
    }

    /// Makes `workspace` equal to snapshot `id`: extra entries removed, changed and
    /// missing ones written, directories that already match left alone. Idempotent,
    /// so a crash during a restore is repaired by restoring again.
    pub fn restore(&self, workspace: &Path, id: &str) -> Result<()> {
        let root = tree::root_of(&self.objects, id)?;
        std::fs::create_dir_all(workspace).map_err(io("create", workspace))?;
        self.with_index(workspace, |index| {
            if self.objects.is_shared() && index.tree_of("") != Some(root.as_str()) {
                self.bring_over(workspace, &root)?;
            }
            let touched = index.probe_changes();
            // On any failure here (a real one comes back from the full pass too):
            if touched.is_some() && self.restore_pass(workspace, index, &root, touched).is_ok() {
                return Ok(());
            }
            // Without the watcher, or if what it vouched for did not hold up: every
            // directory is listed (restoring is idempotent, so starting over is safe).
            self.restore_pass(workspace, index, &root, None)
        })
    }

    /// Before `workspace` is brought to tree `root` from elsewhere (a shared store,
    /// and this host's copy is not at it): every object of the snapshot this cache
    /// lacks is fetched at once, many in flight (a restore would otherwise ask
    /// directory by directory), and, for a logical workspace, remembered as kept by
    /// the shared store (see [`Drive::restored`]). Only a logical workspace belongs to
    /// one session for good; a directory may be another session's next, after the
    /// first was deleted and its objects collected.
    fn bring_over(&self, workspace: &Path, root: &str) -> Result<()> {
        let mut objects = std::collections::HashSet::new();
        tree::mark(&self.objects, root, &mut objects)?;
        let all: Vec<&str> = objects.iter().map(String::as_str).collect();
        for some in all.chunks(PREFETCH_CHUNK) {
            self.objects.prefetch(some)?;
        }
        if !is_logical(workspace) {
            return Ok(());
        }
        let mut restored = self.restored.lock().expect("restored lock");
        if restored.len() >= INDEXES_IN_MEMORY {
            restored.clear();
        }
        restored.insert(workspace.to_path_buf(), Arc::new(objects));
        Ok(())
    }

    /// Probes `workspace` (only `touched` directories, when given) and makes it
    /// equal to tree `root`, leaving the index knowing what it made (see
    /// [`restore::Seeds`]).
    fn restore_pass(
        &self,
        workspace: &Path,
        index: &mut Index,
        root: &str,
        touched: Option<std::collections::HashSet<String>>,
    ) -> Result<()> {
        let mut scanner = Scanner::new(&self.objects, index, Mode::Probe);
        let unchanged = touched.as_ref().is_some_and(|t| t.is_empty());
        scanner.touched = touched;
        if !(unchanged && scanner.trusts_root()) {
            scanner.root(workspace)?;
        }
        self.files_read
            .fetch_add(scanner.files_read, Ordering::Relaxed);
        let found = std::mem::take(&mut scanner.found);
        drop(scanner);
        let current = restore::Current {
            found: &found,
            index,
        };
        let mut seeds = Vec::new();
        restore::apply(
            &self.objects,
            &current,
            workspace,
            "",
            root,
            false,
            &mut seeds,
        )?;
        // What the restore made is known without reading it again, except in a user's
        // directory over a shared store: its first snapshot reads (and uploads) every
        // file again, since the directory may be another session's next, and what the
        // first one's snapshots named may be collected once it is deleted.
        if !self.objects.is_shared() || is_logical(workspace) {
            for (rel, record) in seeds {
                index.put(&rel, record)?;
            }
        }
        Ok(())
    }

    /// The manifest of snapshot `id`: every path in it.
    pub fn manifest(&self, id: &str) -> Result<Manifest> {
        match tree::load(&self.objects, id)? {
            Stored::Flat(manifest) => Ok(manifest),
            Stored::Tree { .. } => {
                let mut manifest = Manifest::default();
                tree::flatten(&self.objects, id, "", &mut manifest.entries)?;
                Ok(manifest)
            }
        }
    }

    /// What changed from snapshot `a` to snapshot `b`, by path. Directories both
    /// share are skipped without being read.
    pub fn diff(&self, a: &str, b: &str) -> Result<Vec<Change>> {
        let both_trees = matches!(tree::load(&self.objects, a)?, Stored::Tree { .. })
            && matches!(tree::load(&self.objects, b)?, Stored::Tree { .. });
        if !both_trees {
            return Ok(self.manifest(a)?.diff(&self.manifest(b)?));
        }
        let mut changes = Vec::new();
        tree::diff(&self.objects, a, b, "", &mut changes)?;
        changes.sort_by(|x, y| x.path.cmp(&y.path));
        Ok(changes)
    }

    /// What changed from snapshot `a` to snapshot `b`, one line per path (`added
    /// src/x.rs`): the change list a log record carries (an escalation, a session's
    /// end, an edit found between turns). A diff that cannot be made is one line
    /// saying why: the record it goes in is worth more than the list.
    pub fn change_lines(&self, a: &str, b: &str) -> Vec<String> {
        match self.diff(a, b) {
            Ok(changes) => changes
                .into_iter()
                .map(|c| format!("{} {}", format!("{:?}", c.kind).to_lowercase(), c.path))
                .collect(),
            Err(e) => vec![format!("(diff unavailable: {e})")],
        }
    }

    /// Removes stored objects that none of `keep` (snapshot ids) reaches, once they
    /// are older than `min_age` (a snapshot being taken right now has written objects
    /// that no log references yet; the grace period keeps them). Returns the number of
    /// objects removed.
    pub fn gc(&self, keep: &[String], min_age: std::time::Duration) -> Result<usize> {
        let mut referenced = std::collections::HashSet::new();
        for id in keep {
            tree::mark(&self.objects, id, &mut referenced)?;
        }
        self.objects.sweep(&referenced, min_age)
    }

    /// Bytes of new objects this drive (and its clones) has stored since it was
    /// opened: what snapshots cost in storage.
    pub fn stored_bytes(&self) -> u64 {
        self.objects.written()
    }

    /// Files snapshots and restores through this drive (and its clones) have read
    /// whole so far: those whose stat said they might have changed.
    pub fn files_read(&self) -> u64 {
        self.files_read.load(Ordering::Relaxed)
    }

    /// Where the content objects are kept (for tests that damage one).
    #[cfg(test)]
    pub(crate) fn objects_dir(&self) -> PathBuf {
        self.objects.dir().to_path_buf()
    }

    /// Every object the snapshots `ids` reach that is missing from the store, or with
    /// `read` does not hash to its name (reading every file: a full check), each
    /// named once with the first snapshot found to reach it.
    pub fn damage(&self, ids: &[String], read: bool) -> Vec<LostObject> {
        let mut seen = std::collections::HashSet::new();
        let mut lost = Vec::new();
        for id in ids {
            let mut found = Vec::new();
            tree::damage(&self.objects, id, read, &mut seen, &mut found);
            lost.extend(found.into_iter().map(|(object, problem)| LostObject {
                snapshot: id.clone(),
                object,
                problem,
            }));
        }
        lost
    }

    /// The bytes of a file in a snapshot; `None` if the snapshot has no file there.
    /// An object the snapshot names but the store lost is [`Error::NotFound`] (or
    /// [`Error::Corrupt`]): lost data, never taken for an absent file.
    pub fn read_file(&self, id: &str, path: &str) -> Result<Option<Vec<u8>>> {
        let hash = match tree::load(&self.objects, id)? {
            Stored::Flat(manifest) => match manifest.entries.get(path) {
                Some(Entry::File { hash, .. }) => Some(hash.clone()),
                _ => None,
            },
            Stored::Tree { .. } => match tree::lookup(&self.objects, id, path)? {
                Some(tree::Node::File { hash, .. }) => Some(hash),
                _ => None,
            },
        };
        hash.map(|hash| self.objects.get(&hash)).transpose()
    }
}

/// Whether `workspace` is a logical one (Steadfast's own copy, named by its id), which
/// belongs to one session for good.
fn is_logical(workspace: &Path) -> bool {
    workspace
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(steadfast_log::is_workspace_id)
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_shared;
