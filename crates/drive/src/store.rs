//! Content-addressed object files: `objects/<first 2 hex>/<rest>`, named by BLAKE3.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{io, Error, Result};

#[derive(Debug, Clone)]
pub(crate) struct ObjectStore {
    dir: PathBuf,
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

impl ObjectStore {
    pub(crate) fn open(dir: PathBuf) -> Result<Self> {
        let tmp = dir.join("tmp");
        std::fs::create_dir_all(&tmp).map_err(io("create", &tmp))?;
        Ok(ObjectStore { dir })
    }

    fn path(&self, hash: &str) -> PathBuf {
        self.dir.join(&hash[..2]).join(&hash[2..])
    }

    pub(crate) fn contains(&self, hash: &str) -> bool {
        hash.len() > 2 && self.path(hash).exists()
    }

    /// Stores `bytes` under their hash (a no-op if already there) and returns it.
    pub(crate) fn put(&self, bytes: &[u8]) -> Result<String> {
        let hash = blake3::hash(bytes).to_hex().to_string();
        self.put_hashed(&hash, bytes)?;
        Ok(hash)
    }

    /// Stores `bytes` already known to hash to `hash`. Written to a temporary file,
    /// synced, then renamed into place, so an object is either whole or absent.
    pub(crate) fn put_hashed(&self, hash: &str, bytes: &[u8]) -> Result<()> {
        let path = self.path(hash);
        if path.exists() {
            return Ok(());
        }
        let parent = path.parent().expect("object paths have a parent");
        std::fs::create_dir_all(parent).map_err(io("create", parent))?;
        let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = self
            .dir
            .join("tmp")
            .join(format!("{}-{n}", std::process::id()));
        let mut file = std::fs::File::create(&tmp).map_err(io("create", &tmp))?;
        file.write_all(bytes).map_err(io("write", &tmp))?;
        file.sync_all().map_err(io("sync", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(io("rename", &path))?;
        Ok(())
    }

    /// Removes objects (and leftover temporary files) not in `keep` and older than
    /// `min_age`. Returns how many were removed.
    pub(crate) fn sweep(
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
        if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::NotFound(hash.to_string()));
        }
        let path = self.path(hash);
        let bytes = std::fs::read(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::NotFound(hash.to_string()),
            _ => io("read", &path)(e),
        })?;
        if blake3::hash(&bytes).to_hex().as_str() != hash {
            return Err(Error::Corrupt(hash.to_string()));
        }
        Ok(bytes)
    }
}

pub(crate) fn hash_file(path: &Path) -> Result<(String, Vec<u8>)> {
    let bytes = std::fs::read(path).map_err(io("read", path))?;
    Ok((blake3::hash(&bytes).to_hex().to_string(), bytes))
}
