//! The shared store behind a drive's local cache: any `object_store` backend (S3 and
//! its kin), holding every object under its BLAKE3 name so any host can restore any
//! recorded snapshot.
//!
//! The drive works in blocking threads; the store's client is asynchronous. Its calls
//! run on a small runtime of their own and are waited for here, so they work from any
//! thread, a Tokio worker's included.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use futures_util::{StreamExt, TryStreamExt};
use object_store::{path::Path as StorePath, ObjectStore};
use tokio::io::AsyncWriteExt;

use crate::{io, Error, Result};

/// How many objects move between the store and this host at once.
const IN_FLIGHT: usize = 16;

/// Objects bigger than this are uploaded in parts, read a part at a time.
const WHOLE_UPLOAD: u64 = 8 * 1024 * 1024;

/// An object store every host of a deployment shares.
#[derive(Debug, Clone)]
pub(crate) struct Remote {
    store: Arc<dyn ObjectStore>,
}

/// One stored object as a listing shows it.
pub(crate) struct Listed {
    pub(crate) hash: String,
    pub(crate) age: std::time::Duration,
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("drive-store")
            .enable_all()
            .build()
            .expect("the drive's store runtime starts")
    })
}

/// Runs `fut` on the drive's runtime and waits for it from this (blocking) thread.
fn wait<F>(fut: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    runtime().spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx.recv().expect("the drive's store runtime answers")
}

fn failed(what: &str, hash: &str, e: impl std::fmt::Display) -> Error {
    Error::Store(format!("{what} {hash}: {e}"))
}

impl Remote {
    pub(crate) fn new(store: Arc<dyn ObjectStore>) -> Self {
        Remote { store }
    }

    /// Uploads each `(hash, file holding it)`, several at once. Returns when every
    /// one is stored.
    pub(crate) fn upload(&self, objects: Vec<(String, PathBuf)>) -> Result<()> {
        if objects.is_empty() {
            return Ok(());
        }
        let store = self.store.clone();
        wait(async move {
            futures_util::stream::iter(objects)
                .map(|(hash, file)| upload_one(store.clone(), hash, file))
                .buffer_unordered(IN_FLIGHT)
                .try_collect::<()>()
                .await
        })
    }

    /// Downloads object `hash` into the new file `dest` (its readers check it).
    pub(crate) fn download(&self, hash: &str, dest: &Path) -> Result<()> {
        self.download_all(vec![(hash.to_string(), dest.to_path_buf())])
    }

    /// [`Self::download`] of each `(hash, dest)`, several at once.
    pub(crate) fn download_all(&self, objects: Vec<(String, PathBuf)>) -> Result<()> {
        let store = self.store.clone();
        wait(async move {
            futures_util::stream::iter(objects)
                .map(|(hash, dest)| download_one(store.clone(), hash, dest))
                .buffer_unordered(IN_FLIGHT)
                .try_collect::<()>()
                .await
        })
    }

    /// Whether object `hash` is stored.
    pub(crate) fn contains(&self, hash: &str) -> Result<bool> {
        let (store, hash) = (self.store.clone(), hash.to_string());
        wait(async move {
            match store.head(&StorePath::from(hash.as_str())).await {
                Ok(_) => Ok(true),
                Err(object_store::Error::NotFound { .. }) => Ok(false),
                Err(e) => Err(failed("look up", &hash, e)),
            }
        })
    }

    /// Every object stored, with how long ago it was written.
    pub(crate) fn list(&self) -> Result<Vec<Listed>> {
        let store = self.store.clone();
        wait(async move {
            let now = now_ms();
            let mut listing = store.list(None);
            let mut found = Vec::new();
            while let Some(meta) = listing.next().await {
                let meta = meta.map_err(|e| failed("list", "", e))?;
                let Some(name) = meta.location.filename() else {
                    continue;
                };
                let written = meta.last_modified.timestamp_millis();
                let age = u64::try_from(now - written).unwrap_or(0);
                found.push(Listed {
                    hash: name.to_string(),
                    age: std::time::Duration::from_millis(age),
                });
            }
            Ok(found)
        })
    }

    /// Removes the objects named (missing ones are not an error).
    pub(crate) fn delete(&self, hashes: Vec<String>) -> Result<()> {
        let store = self.store.clone();
        wait(async move {
            futures_util::stream::iter(hashes)
                .map(|hash| {
                    let store = store.clone();
                    async move {
                        match store.delete(&StorePath::from(hash.as_str())).await {
                            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                            Err(e) => Err(failed("delete", &hash, e)),
                        }
                    }
                })
                .buffer_unordered(IN_FLIGHT)
                .try_collect::<()>()
                .await
        })
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

async fn download_one(store: Arc<dyn ObjectStore>, hash: String, dest: PathBuf) -> Result<()> {
    let got = store
        .get(&StorePath::from(hash.as_str()))
        .await
        .map_err(|e| match e {
            object_store::Error::NotFound { .. } => Error::NotFound(hash.clone()),
            e => failed("download", &hash, e),
        })?;
    let mut out = tokio::fs::File::create(&dest)
        .await
        .map_err(io("create", &dest))?;
    // Not checked against its name here: every reader of an object checks it (a
    // tree stored as a delta is named by the tree it stands for, not by its bytes),
    // and drops a damaged cached copy to fetch it again.
    let mut chunks = got.into_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| failed("download", &hash, e))?;
        out.write_all(&chunk).await.map_err(io("write", &dest))?;
    }
    out.flush().await.map_err(io("write", &dest))?;
    Ok(())
}

async fn upload_one(store: Arc<dyn ObjectStore>, hash: String, file: PathBuf) -> Result<()> {
    let path = StorePath::from(hash.as_str());
    let len = tokio::fs::metadata(&file)
        .await
        .map_err(io("read", &file))?
        .len();
    if len <= WHOLE_UPLOAD {
        let bytes = tokio::fs::read(&file).await.map_err(io("read", &file))?;
        store
            .put(&path, bytes::Bytes::from(bytes).into())
            .await
            .map_err(|e| failed("upload", &hash, e))?;
        return Ok(());
    }
    let mut source = tokio::fs::File::open(&file)
        .await
        .map_err(io("read", &file))?;
    let mut sink = object_store::buffered::BufWriter::new(store, path);
    tokio::io::copy(&mut source, &mut sink)
        .await
        .map_err(|e| failed("upload", &hash, e))?;
    sink.shutdown()
        .await
        .map_err(|e| failed("upload", &hash, e))?;
    Ok(())
}
