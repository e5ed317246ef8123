//! Content-addressed object files: `objects/<first 2 hex>/<rest>`, named by BLAKE3:
//! of their bytes, or for a tree, of the tree it stands for (see the `tree` module);
//! every read checks an object against its name.
//!
//! Objects written for one snapshot go into a [`Batch`]: each is written to a
//! temporary file, and the batch syncs them together (several at once, so the
//! filesystem's journal commits them in one go) before renaming each into place. An
//! object is therefore either whole or absent, and a snapshot with ten new objects
//! pays for about one sync, not ten.
//!
//! With a shared store behind it ([`Remote`]), this directory is a bounded cache: a
//! batch's objects are uploaded before it is finished (a snapshot is durable when the
//! shared store holds it, so the cache is not synced), objects missing here are
//! fetched (and checked by whoever reads them), and the least recently used are evicted.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::cache::Cache;
use crate::remote::Remote;
use crate::{io, Error, Result};

#[derive(Debug, Clone)]
pub(crate) struct ObjectStore {
    dir: PathBuf,
    /// Bytes of new objects committed through this handle (and its clones).
    written: Arc<AtomicU64>,
    /// The shared store this directory caches, if any.
    remote: Option<Remote>,
    /// The bounded cache this directory is (with a remote only).
    cache: Option<Arc<Cache>>,
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// New objects written but not yet synced and renamed into place.
#[derive(Default)]
pub(crate) struct Batch {
    pending: Vec<(PathBuf, std::fs::File, String)>,
    /// Objects a pass wrote that this directory already held: a shared store is
    /// given them again (it may have collected them since this host cached them).
    reused: Vec<String>,
    /// Objects the shared store keeps for as long as the session does: those of the
    /// recorded snapshot this workspace was last restored to. A pass that writes one
    /// again need not upload it.
    pub(crate) vouched: Option<Arc<std::collections::HashSet<String>>>,
    bytes: u64,
    /// Bytes of the objects this batch has put in place so far (a batch commits
    /// every [`BATCH_LIMIT`] objects, and at its end).
    pub(crate) committed: u64,
}

/// How many written objects a batch holds (open) before it commits them.
const BATCH_LIMIT: usize = 512;

/// Up to this many new objects are synced file by file; more, with one `syncfs`.
const SYNC_ONE_BY_ONE: usize = 32;

impl ObjectStore {
    pub(crate) fn open(dir: PathBuf) -> Result<Self> {
        let tmp = dir.join("tmp");
        std::fs::create_dir_all(&tmp).map_err(io("create", &tmp))?;
        Ok(ObjectStore {
            dir,
            written: Arc::default(),
            remote: None,
            cache: None,
        })
    }

    /// A cache in `dir` of at most `limit` bytes in front of `remote`.
    pub(crate) fn cached(dir: PathBuf, remote: Remote, limit: u64) -> Result<Self> {
        let mut store = Self::open(dir.clone())?;
        store.remote = Some(remote);
        store.cache = Some(Arc::new(Cache::open(dir, limit)?));
        Ok(store)
    }

    /// Counts `bytes` more in the cache, if this directory is one (see
    /// [`Cache::added`]).
    fn cached_more(&self, bytes: u64, keep: Option<&Path>) -> Result<()> {
        match &self.cache {
            Some(cache) => cache.added(bytes, keep),
            None => Ok(()),
        }
    }

    /// The path of object `hash` here, fetched from the shared store if this
    /// directory does not hold it (and marked as just used if it does).
    pub(crate) fn local(&self, hash: &str) -> Result<PathBuf> {
        let path = self.checked_path(hash)?;
        let Some(remote) = &self.remote else {
            return Ok(path);
        };
        if let Ok(file) = std::fs::File::options().write(true).open(&path) {
            let _ = file.set_modified(std::time::SystemTime::now());
            return Ok(path);
        }
        let (tmp, file) = self.temporary()?;
        drop(file);
        if let Err(e) = remote.download(hash, &tmp) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        let len = std::fs::metadata(&tmp).map_err(io("read", &tmp))?.len();
        let parent = path.parent().expect("object paths have a parent");
        std::fs::create_dir_all(parent).map_err(io("create", parent))?;
        std::fs::rename(&tmp, &path).map_err(io("rename", &path))?;
        self.cached_more(len, Some(&path))?;
        Ok(path)
    }

    /// A pass wrote an object already stored: it is made fresh where gc looks, so
    /// that a gc running now (which takes only objects older than its grace period)
    /// cannot take it before the snapshot's log record refers to it. In a directory,
    /// its time is set to now; with a shared store, it is uploaded again with the
    /// batch, unless this process uploaded it less than [`crate::KNOWN_FOR`] ago or the
    /// batch's workspace was restored to a snapshot holding it.
    pub(crate) fn reuse(&self, batch: &mut Batch, hash: &str) {
        let vouched = batch.vouched.as_ref().is_some_and(|v| v.contains(hash));
        match &self.cache {
            Some(cache) if !vouched && !cache.knows(hash) => batch.reused.push(hash.to_string()),
            Some(_) => {}
            None => {
                if let Ok(file) = std::fs::File::options().write(true).open(self.path(hash)) {
                    let _ = file.set_modified(std::time::SystemTime::now());
                }
            }
        }
    }

    /// Fetches those of `hashes` this directory lacks from the shared store, several
    /// at once (a restore about to write them asks first, rather than one by one).
    pub(crate) fn prefetch(&self, hashes: &[&str]) -> Result<()> {
        let Some(remote) = &self.remote else {
            return Ok(());
        };
        let mut missing: Vec<&str> = hashes
            .iter()
            .copied()
            .filter(|h| self.checked_path(h).is_ok_and(|p| !p.exists()))
            .collect();
        missing.sort_unstable();
        missing.dedup();
        if missing.len() < 2 {
            return Ok(());
        }
        let mut items = Vec::with_capacity(missing.len());
        for hash in missing {
            let (tmp, file) = self.temporary()?;
            drop(file);
            items.push((hash.to_string(), tmp));
        }
        let fetched = remote.download_all(items.clone());
        let mut bytes = 0;
        for (hash, tmp) in items {
            if fetched.is_err() {
                let _ = std::fs::remove_file(&tmp);
                continue;
            }
            let path = self.path(&hash);
            bytes += std::fs::metadata(&tmp).map_err(io("read", &tmp))?.len();
            let parent = path.parent().expect("object paths have a parent");
            std::fs::create_dir_all(parent).map_err(io("create", parent))?;
            std::fs::rename(&tmp, &path).map_err(io("rename", &path))?;
        }
        fetched?;
        self.cached_more(bytes, None)
    }

    /// Whether a read that failed with `error` is worth one more try: with a shared
    /// store, a cached copy found corrupt (dropped here, so the next read fetches it
    /// again) or evicted between being fetched and opened. Without one, the local
    /// copy is the only one.
    fn refetchable(&self, hash: &str, error: &Error) -> bool {
        if self.remote.is_none() {
            return false;
        }
        match error {
            Error::Corrupt(_) => {
                if let Ok(path) = self.checked_path(hash) {
                    let _ = std::fs::remove_file(path);
                }
                true
            }
            Error::NotFound(_) => true,
            _ => false,
        }
    }

    /// Bytes of new objects committed through this store so far.
    pub(crate) fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    /// Whether the objects live in a store other hosts share.
    pub(crate) fn is_shared(&self) -> bool {
        self.remote.is_some()
    }

    /// Whether this directory holds object `hash` (a shared store is not asked).
    pub(crate) fn holds(&self, hash: &str) -> bool {
        self.checked_path(hash).is_ok_and(|p| p.exists())
    }

    /// Whether object `hash` is stored.
    pub(crate) fn contains(&self, hash: &str) -> Result<bool> {
        if self.checked_path(hash).is_ok_and(|p| p.exists()) {
            return Ok(true);
        }
        match &self.remote {
            Some(remote) if self.checked_path(hash).is_ok() => remote.contains(hash),
            _ => Ok(false),
        }
    }

    /// Syncs every object of `batch` (a few threads at once) and renames each into
    /// place. Durable when this returns.
    pub(crate) fn finish(&self, batch: &mut Batch) -> Result<()> {
        let pending = std::mem::take(&mut batch.pending);
        let reused = std::mem::take(&mut batch.reused);
        if let Some(remote) = &self.remote {
            let mut uploads: Vec<(String, PathBuf)> = pending
                .iter()
                .map(|(tmp, _, hash)| (hash.clone(), tmp.clone()))
                .collect();
            uploads.extend(reused.into_iter().map(|h| {
                let path = self.path(&h);
                (h, path)
            }));
            remote.upload(uploads.clone())?;
            if let Some(cache) = &self.cache {
                cache.uploaded(uploads.iter().map(|(h, _)| h.as_str()));
            }
            let bytes = batch.bytes;
            self.rename_all(batch, pending)?;
            return self.cached_more(bytes, None);
        }
        if pending.is_empty() {
            return Ok(());
        }
        if pending.len() > SYNC_ONE_BY_ONE {
            // Many new objects (a first snapshot, a big checkout): one sync of the
            // whole filesystem costs less than thousands of file syncs.
            let dir = std::fs::File::open(&self.dir).map_err(io("open", &self.dir))?;
            nix::unistd::syncfs(&dir).map_err(|e| io("sync", &self.dir)(e.into()))?;
            return self.rename_all(batch, pending);
        }
        let threads = pending.len().min(8);
        let chunk = pending.len().div_ceil(threads);
        let synced: Vec<Result<()>> = std::thread::scope(|scope| {
            let handles: Vec<_> = pending
                .chunks(chunk)
                .map(|part| {
                    scope.spawn(move || {
                        for (tmp, file, _) in part {
                            file.sync_all().map_err(io("sync", tmp))?;
                        }
                        Ok(())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(io("sync", &self.dir)(std::io::Error::other(
                            "sync thread panicked",
                        )))
                    })
                })
                .collect()
        });
        synced.into_iter().collect::<Result<()>>()?;
        self.rename_all(batch, pending)
    }

    /// Renames synced objects into place.
    fn rename_all(
        &self,
        batch: &mut Batch,
        pending: Vec<(PathBuf, std::fs::File, String)>,
    ) -> Result<()> {
        for (tmp, file, hash) in pending {
            drop(file);
            let path = self.path(&hash);
            let parent = path.parent().expect("object paths have a parent");
            std::fs::create_dir_all(parent).map_err(io("create", parent))?;
            std::fs::rename(&tmp, &path).map_err(io("rename", &path))?;
        }
        let bytes = std::mem::take(&mut batch.bytes);
        batch.committed += bytes;
        self.written.fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }

    /// Adds a written temporary file to `batch`, committing the batch when full.
    fn defer(
        &self,
        batch: &mut Batch,
        tmp: PathBuf,
        file: std::fs::File,
        hash: String,
        len: u64,
    ) -> Result<()> {
        batch.pending.push((tmp, file, hash));
        batch.bytes += len;
        if batch.pending.len() >= BATCH_LIMIT {
            self.finish(batch)?;
        }
        Ok(())
    }

    #[cfg(test)]
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, hash: &str) -> PathBuf {
        self.dir.join(&hash[..2]).join(&hash[2..])
    }

    /// Stores `bytes` under their hash (a no-op if already there) and returns it.
    #[cfg(test)]
    pub(crate) fn put(&self, batch: &mut Batch, bytes: &[u8]) -> Result<String> {
        let hash = blake3::hash(bytes).to_hex().to_string();
        self.put_hashed(batch, &hash, bytes)?;
        Ok(hash)
    }

    /// Stores `bytes` already known to hash to `hash`.
    pub(crate) fn put_hashed(&self, batch: &mut Batch, hash: &str, bytes: &[u8]) -> Result<()> {
        if self.path(hash).exists() {
            self.reuse(batch, hash);
            return Ok(());
        }
        let (tmp, mut file) = self.temporary()?;
        file.write_all(bytes).map_err(io("write", &tmp))?;
        self.defer(batch, tmp, file, hash.to_string(), bytes.len() as u64)
    }

    /// Stores what `reader` (the open file at `path`) yields, a chunk at a time:
    /// hashing and copying together, so memory stays bounded whatever the size.
    /// Returns the hash and the byte count.
    pub(crate) fn put_reader(
        &self,
        batch: &mut Batch,
        path: &Path,
        reader: &mut impl Read,
    ) -> Result<(String, u64)> {
        // Small files (most of a repository) are read whole and written only if new.
        let mut head = Vec::new();
        reader
            .take(SMALL as u64 + 1)
            .read_to_end(&mut head)
            .map_err(io("read", path))?;
        if head.len() <= SMALL {
            let hash = blake3::hash(&head).to_hex().to_string();
            self.put_hashed(batch, &hash, &head)?;
            return Ok((hash, head.len() as u64));
        }
        let (tmp, mut file) = self.temporary()?;
        let mut hasher = blake3::Hasher::new();
        hasher.update(&head);
        write_sparse(&mut file, &head).map_err(io("write", &tmp))?;
        let mut total = head.len() as u64;
        drop(head);
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let _ = std::fs::remove_file(&tmp);
                    return Err(io("read", path)(e));
                }
            };
            hasher.update(&buf[..n]);
            write_sparse(&mut file, &buf[..n]).map_err(io("write", &tmp))?;
            total += n as u64;
        }
        file.set_len(total).map_err(io("write", &tmp))?;
        let hash = hasher.finalize().to_hex().to_string();
        if self.path(&hash).exists() {
            let _ = std::fs::remove_file(&tmp);
            self.reuse(batch, &hash);
        } else {
            self.defer(batch, tmp, file, hash.clone(), total)?;
        }
        Ok((hash, total))
    }

    fn temporary(&self) -> Result<(PathBuf, std::fs::File)> {
        let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp =
            self.dir
                .join("tmp")
                .join(format!("{}-{:x}-{n}", std::process::id(), process_nonce()));
        let file = std::fs::File::create(&tmp).map_err(io("create", &tmp))?;
        Ok((tmp, file))
    }

    /// Writes object `hash` to a new file `dest`, a chunk at a time, checking that
    /// it still hashes to its name (a corrupt object leaves no `dest` behind).
    pub(crate) fn copy_to(&self, hash: &str, dest: &Path) -> Result<()> {
        match self.copy_once(hash, dest) {
            Err(e) if self.refetchable(hash, &e) => self.copy_once(hash, dest),
            done => done,
        }
    }

    fn copy_once(&self, hash: &str, dest: &Path) -> Result<()> {
        let path = self.local(hash)?;
        let mut source = std::fs::File::open(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::NotFound(hash.to_string()),
            _ => io("read", &path)(e),
        })?;
        let mut out = std::fs::File::create(dest).map_err(io("create", dest))?;
        let mut hasher = blake3::Hasher::new();
        let mut buf = vec![0u8; CHUNK];
        let mut written = 0u64;
        loop {
            let n = source.read(&mut buf).map_err(io("read", &path))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            write_sparse(&mut out, &buf[..n]).map_err(io("write", dest))?;
            written += n as u64;
        }
        out.set_len(written).map_err(io("write", dest))?;
        if hasher.finalize().to_hex().as_str() != hash {
            let _ = std::fs::remove_file(dest);
            return Err(Error::Corrupt(hash.to_string()));
        }
        Ok(())
    }

    pub(crate) fn checked_path(&self, hash: &str) -> Result<PathBuf> {
        if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::NotFound(hash.to_string()));
        }
        Ok(self.path(hash))
    }

    /// Removes objects (and leftover temporary files) not in `keep` and older than
    /// `min_age`. Returns how many were removed.
    pub(crate) fn sweep(
        &self,
        keep: &std::collections::HashSet<String>,
        min_age: std::time::Duration,
    ) -> Result<usize> {
        let Some(remote) = &self.remote else {
            return self.sweep_dir(keep, min_age);
        };
        // The shared store first: what it no longer holds, no cache may vouch for.
        let doomed: Vec<String> = remote
            .list()?
            .into_iter()
            .filter(|o| !keep.contains(&o.hash) && o.age >= min_age)
            .map(|o| o.hash)
            .collect();
        let removed = doomed.len();
        remote.delete(doomed)?;
        self.sweep_dir(keep, min_age)?;
        if let Some(cache) = &self.cache {
            cache.recount()?;
        }
        Ok(removed)
    }

    /// [`Self::sweep`] of this directory alone.
    fn sweep_dir(
        &self,
        keep: &std::collections::HashSet<String>,
        min_age: std::time::Duration,
    ) -> Result<usize> {
        let old_enough = |path: &Path| {
            std::fs::metadata(path)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age >= min_age)
        };
        let mut removed = 0;
        for dir in std::fs::read_dir(&self.dir).map_err(io("read", &self.dir))? {
            let dir = dir.map_err(io("read", &self.dir))?.path();
            let Some(prefix) = dir.file_name().and_then(|n| n.to_str()).map(str::to_string) else {
                continue;
            };
            if !dir.is_dir() {
                continue;
            }
            for file in std::fs::read_dir(&dir).map_err(io("read", &dir))? {
                let path = file.map_err(io("read", &dir))?.path();
                let name = path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or_default();
                let unreferenced = prefix == "tmp" || !keep.contains(&format!("{prefix}{name}"));
                if unreferenced && old_enough(&path) {
                    std::fs::remove_file(&path).map_err(io("remove", &path))?;
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }

    /// Reads an object and checks it still hashes to its name.
    pub(crate) fn get(&self, hash: &str) -> Result<Vec<u8>> {
        self.get_checked(hash, |bytes| {
            if blake3::hash(bytes).to_hex().as_str() != hash {
                return Err(Error::Corrupt(hash.to_string()));
            }
            Ok(bytes.to_vec())
        })
    }

    /// Reads object `hash` and makes what `check` makes of its bytes; `check` fails
    /// with [`Error::Corrupt`] when they are not what the name promises (a tree
    /// stored as a delta is named by what it stands for, not by its bytes). A copy
    /// cached from a shared store that fails is fetched again, once.
    pub(crate) fn get_checked<T>(
        &self,
        hash: &str,
        check: impl Fn(&[u8]) -> Result<T>,
    ) -> Result<T> {
        match self.read(hash).and_then(|b| check(&b)) {
            Err(e) if self.refetchable(hash, &e) => check(&self.read(hash)?),
            done => done,
        }
    }

    fn read(&self, hash: &str) -> Result<Vec<u8>> {
        let path = self.local(hash)?;
        std::fs::read(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::NotFound(hash.to_string()),
            _ => io("read", &path)(e),
        })
    }
}

/// A number telling this process's temporary files from those of processes on
/// other hosts with the same pid (when the object directory is shared).
fn process_nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static NONCE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *NONCE.get_or_init(|| {
        std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
    })
}

/// How much of a file is read at a time.
const CHUNK: usize = 256 * 1024;

/// The unit of a hole: a run of zeros this long (aligned in the file) is skipped, not
/// written, so a sparse file stays sparse in the store and back in the workspace.
const HOLE: usize = 4096;

/// Writes `chunk` at `file`'s position, leaving each all-zero block of [`HOLE`] bytes
/// as a hole (the caller sets the file's length at the end, so a trailing hole counts).
fn write_sparse(file: &mut std::fs::File, chunk: &[u8]) -> std::io::Result<()> {
    use std::io::{Seek, SeekFrom};
    let mut rest = chunk;
    while !rest.is_empty() {
        let block = &rest[..rest.len().min(HOLE)];
        if block.len() == HOLE && block.iter().all(|b| *b == 0) {
            file.seek(SeekFrom::Current(HOLE as i64))?;
        } else {
            file.write_all(block)?;
        }
        rest = &rest[block.len()..];
    }
    Ok(())
}

/// Files up to this size are read whole; bigger ones are streamed.
const SMALL: usize = 1024 * 1024;
