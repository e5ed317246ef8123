//! The blob store: payloads too big for the log, by content hash.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use object_store::{local::LocalFileSystem, path::Path as ObjectPath, ObjectStore};
use steadfast_log::BlobRef;

use crate::{Error, Result};

/// Payloads larger than this go to the blob store (docs/ARCHITECTURE.md rule 7).
pub const INLINE_LIMIT: usize = 64 * 1024;
const EXCERPT: usize = 8 * 1024;

/// What [`Blobs::check_writable`] writes.
const PROBE: &[u8] = b"steadfast: this store can be written and read\n";
/// A prefix nothing is stored under, listed by [`Blobs::ping`].
const PROBE_PREFIX: &str = "steadfast-ping";

/// A content-addressed blob store over any `object_store` backend.
#[derive(Debug, Clone)]
pub struct Blobs {
    store: Arc<dyn ObjectStore>,
    base_uri: String,
    /// The directory, when the store is one.
    dir: Option<std::path::PathBuf>,
}

/// Where a drive keeps its snapshot objects beside a blob store: in the same place,
/// so every host that shares the blobs shares the snapshots.
#[derive(Debug, Clone)]
pub enum DriveObjects {
    /// A directory (under the blob directory): the drive writes it directly.
    Dir(std::path::PathBuf),
    /// An object store (the blob store's `drive/` prefix): the drive caches it.
    Store(Arc<dyn ObjectStore>),
}

/// Where in a blob store the drive's objects go; blob sweeps leave it alone.
const DRIVE_PREFIX: &str = "drive";

impl Blobs {
    /// Blobs in a local directory (created if needed).
    pub fn local(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| Error::blob_in(dir.display().to_string(), e))?;
        let dir = dir
            .canonicalize()
            .map_err(|e| Error::blob_in(dir.display().to_string(), e))?;
        let store = LocalFileSystem::new_with_prefix(&dir).map_err(Error::blob)?;
        Ok(Blobs {
            store: Arc::new(store),
            base_uri: format!("file://{}", dir.display()),
            dir: Some(dir),
        })
    }

    /// Blobs where `url` says: `s3://bucket/prefix` (any S3-compatible store, set up
    /// by the usual `AWS_*` variables: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    /// `AWS_REGION`, `AWS_ENDPOINT` for non-AWS stores, `AWS_ALLOW_HTTP`), or a
    /// local directory (a path or `file://` URL).
    pub fn open(url: &str) -> Result<Self> {
        if let Some(rest) = url.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(Error::blob_says(format!("no bucket in {url}")));
            }
            let store = object_store::aws::AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
                .build()
                .map_err(|e| Error::blob_in(url.to_string(), e))?;
            let prefix = prefix.trim_matches('/');
            let store: Arc<dyn ObjectStore> = if prefix.is_empty() {
                Arc::new(store)
            } else {
                Arc::new(object_store::prefix::PrefixStore::new(store, prefix))
            };
            return Ok(Blobs {
                store,
                base_uri: url.trim_end_matches('/').to_string(),
                dir: None,
            });
        }
        Self::local(Path::new(url.strip_prefix("file://").unwrap_or(url)))
    }

    /// Where the drive's snapshot objects live beside these blobs.
    pub fn drive_objects(&self) -> DriveObjects {
        match &self.dir {
            Some(dir) => DriveObjects::Dir(dir.join(DRIVE_PREFIX)),
            None => DriveObjects::Store(Arc::new(object_store::prefix::PrefixStore::new(
                self.store.clone(),
                DRIVE_PREFIX,
            ))),
        }
    }

    /// Stores `bytes` and returns the reference the log keeps: hash, size, URI and
    /// ANSI-stripped head and tail excerpts.
    pub async fn put(&self, bytes: &[u8]) -> Result<BlobRef> {
        let hash = blake3::hash(bytes).to_hex().to_string();
        let path = ObjectPath::from(hash.as_str());
        self.store
            .put(&path, bytes::Bytes::copy_from_slice(bytes).into())
            .await
            .map_err(Error::blob)?;
        let text = strip_ansi(&String::from_utf8_lossy(bytes));
        Ok(BlobRef {
            uri: format!("{}/{hash}", self.base_uri),
            hash,
            size: bytes.len() as u64,
            head: head(&text, EXCERPT).to_string(),
            tail: tail(&text, EXCERPT).to_string(),
        })
    }

    /// Stores `bytes` under their BLAKE3 hash and returns the hash (no excerpts: for
    /// log records too big to keep inline).
    pub async fn put_raw(&self, bytes: &[u8]) -> Result<String> {
        let hash = blake3::hash(bytes).to_hex().to_string();
        self.store
            .put(
                &ObjectPath::from(hash.as_str()),
                bytes::Bytes::copy_from_slice(bytes).into(),
            )
            .await
            .map_err(Error::blob)?;
        Ok(hash)
    }

    /// Removes every blob that is not in `keep` and is older than `min_age` (a blob
    /// written a moment ago may belong to a record not yet appended). Blobs are
    /// shared by content between sessions and owners, so they are never deleted
    /// with one session: this sweep, over what every log still refers to, is the one
    /// way they go. Returns how many were removed.
    pub async fn sweep(
        &self,
        keep: &std::collections::HashSet<String>,
        min_age: std::time::Duration,
    ) -> Result<usize> {
        use futures_util::StreamExt;
        let now_ms = crate::now_ms() as i64;
        let mut listing = self.store.list(None);
        let mut doomed = Vec::new();
        while let Some(meta) = listing.next().await {
            let meta = meta.map_err(Error::blob)?;
            // Blobs are top-level names; deeper paths are the drive's (its own gc).
            if meta.location.parts().count() != 1 {
                continue;
            }
            let Some(name) = meta.location.filename() else {
                continue;
            };
            let age_ms = now_ms - meta.last_modified.timestamp_millis();
            if !keep.contains(name) && age_ms >= min_age.as_millis() as i64 {
                doomed.push(meta.location.clone());
            }
        }
        for path in &doomed {
            match self.store.delete(path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(Error::blob(e)),
            }
        }
        Ok(doomed.len())
    }

    /// Reads the store once, a listing that names nothing (one request, whatever the
    /// store holds): a readiness check. A missing bucket, refused credentials or an
    /// endpoint that cannot be reached fail it.
    pub async fn ping(&self) -> Result<()> {
        self.store
            .list_with_delimiter(Some(&ObjectPath::from(PROBE_PREFIX)))
            .await
            .map(|_| ())
            .map_err(Error::blob)
    }

    /// Writes a small blob and reads it back: what a server or worker checks before
    /// it takes any work, so a store it cannot use is named at start rather than by
    /// the first session that needs it. (The blob is content-addressed: every check
    /// writes the same one.)
    pub async fn check_writable(&self) -> Result<()> {
        let hash = self.put_raw(PROBE).await?;
        self.get(&hash).await.map(|_| ())
    }

    /// Removes a blob (a missing one is not an error).
    pub async fn delete(&self, hash: &str) -> Result<()> {
        match self.store.delete(&ObjectPath::from(hash)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(Error::blob(e)),
        }
    }

    /// Reads a blob back, verifying its hash; [`Error::NotFound`] when none has it.
    pub async fn get(&self, hash: &str) -> Result<Vec<u8>> {
        let got = self
            .store
            .get(&ObjectPath::from(hash))
            .await
            .map_err(|e| match e {
                object_store::Error::NotFound { .. } => Error::NotFound(format!("blob {hash}")),
                e => Error::blob(e),
            })?;
        let bytes = got.bytes().await.map_err(Error::blob)?;
        if blake3::hash(&bytes).to_hex().as_str() != hash {
            return Err(Error::blob_says(format!("blob {hash} is corrupt")));
        }
        Ok(bytes.to_vec())
    }
}

/// A log record whose blob cannot be read back as written.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct BlobDamage {
    /// The record's position in its session's log.
    pub seq: u64,
    /// The blob's hash.
    pub blob: String,
    /// `missing` or `corrupt`, with what the store said.
    pub problem: String,
}

impl Blobs {
    /// Every record of `records` whose blob is missing from the store or no longer
    /// hashes to its name: lost data is reported with its position, never ignored.
    pub async fn damaged(&self, records: &[steadfast_log::Record]) -> Vec<BlobDamage> {
        let mut damage = Vec::new();
        for record in records {
            let Some(blob) = record.event.blob_ref() else {
                continue;
            };
            let problem = match self.store.get(&ObjectPath::from(blob.hash.as_str())).await {
                Err(object_store::Error::NotFound { .. }) => Some("missing".to_string()),
                Err(e) => Some(format!("unreadable: {e}")),
                Ok(got) => match got.bytes().await {
                    Err(e) => Some(format!("unreadable: {e}")),
                    Ok(bytes) if blake3::hash(&bytes).to_hex().as_str() != blob.hash => {
                        Some(format!(
                            "corrupt: {} bytes that do not hash to its name",
                            bytes.len()
                        ))
                    }
                    Ok(_) => None,
                },
            };
            if let Some(problem) = problem {
                damage.push(BlobDamage {
                    seq: record.seq,
                    blob: blob.hash.clone(),
                    problem,
                });
            }
        }
        damage
    }
}

fn head(s: &str, n: usize) -> &str {
    if s.len() <= n {
        return s;
    }
    let mut end = n;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn tail(s: &str, n: usize) -> &str {
    if s.len() <= n {
        return s;
    }
    let mut start = s.len() - n;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// Removes ANSI escape sequences (colours, cursor movement, OSC titles) from terminal
/// output, so the model's context is not spent on them.
pub fn strip_ansi(s: &str) -> String {
    static RE: OnceLock<regex::Regex> = OnceLock::new();
    let re = RE.get_or_init(|| {
        regex::Regex::new(
            r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]",
        )
        .expect("valid regex")
    });
    re.replace_all(s, "").into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_colours_and_titles() {
        assert_eq!(
            strip_ansi("\x1b[1;31merror\x1b[0m: \x1b]0;title\x07done\x1b[2K"),
            "error: done"
        );
    }

    #[tokio::test]
    async fn big_payload_roundtrips_with_excerpts() {
        let dir = tempfile::tempdir().unwrap();
        let blobs = Blobs::local(dir.path()).unwrap();
        let mut data = b"\x1b[32mSTART\x1b[0m".to_vec();
        data.extend(std::iter::repeat_n(b'x', 100_000));
        data.extend(b"END");
        let r = blobs.put(&data).await.unwrap();
        assert_eq!(r.size, data.len() as u64);
        assert!(r.head.starts_with("START"));
        assert!(r.tail.ends_with("END"));
        assert!(r.head.len() <= EXCERPT);
        assert!(r.uri.ends_with(&r.hash));
        assert_eq!(blobs.get(&r.hash).await.unwrap(), data);
    }
}
