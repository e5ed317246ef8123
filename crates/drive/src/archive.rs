//! A snapshot as a tar archive, for people and tools that want a workspace as it was
//! at some point of a session: streamed entry by entry (bounded memory whatever the
//! size), each file's bytes checked against its hash on the way out.

use std::io::{Read, Write};

use crate::manifest::{Entry, SpecialKind};
use crate::store::ObjectStore;
use crate::{Drive, Error, Result};

/// Reads a stored object, hashing as it goes; at its end, a content that no longer
/// hashes to its name is an error, so a corrupt object cannot pass as good bytes.
struct Verified {
    file: std::fs::File,
    hasher: blake3::Hasher,
    hash: String,
}

impl Read for Verified {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read(buf)?;
        if n == 0 && !buf.is_empty() && self.hasher.finalize().to_hex().as_str() != self.hash {
            return Err(std::io::Error::other(format!(
                "drive object {} is corrupt",
                self.hash
            )));
        }
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

impl ObjectStore {
    fn open_verified(&self, hash: &str) -> Result<Verified> {
        let path = self.checked_path(hash)?;
        let file = std::fs::File::open(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::NotFound(hash.to_string()),
            _ => crate::io("read", &path)(e),
        })?;
        Ok(Verified {
            file,
            hasher: blake3::Hasher::new(),
            hash: hash.to_string(),
        })
    }
}

impl Drive {
    /// Writes snapshot `id` to `out` as a tar archive: directories, files (with their
    /// executable bit) and symbolic links under their workspace paths, and FIFOs;
    /// sockets and devices, which no snapshot can recreate, are left out. Times are
    /// fixed, so a snapshot's archive is the same bytes every time.
    pub fn export_tar(&self, id: &str, out: impl Write) -> Result<()> {
        let manifest = self.manifest(id)?;
        let mut tar = tar::Builder::new(out);
        tar.mode(tar::HeaderMode::Deterministic);
        tar.follow_symlinks(false);
        let failed = |e: std::io::Error| Error::Io {
            op: "archive",
            path: id.into(),
            source: e,
        };
        for (path, entry) in &manifest.entries {
            let mut header = tar::Header::new_gnu();
            header.set_mtime(0);
            match entry {
                Entry::Dir => {
                    header.set_entry_type(tar::EntryType::Directory);
                    header.set_mode(0o755);
                    header.set_size(0);
                    tar.append_data(&mut header, format!("{path}/"), std::io::empty())
                }
                Entry::File { hash, size, exec } => {
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_mode(if *exec { 0o755 } else { 0o644 });
                    header.set_size(*size);
                    let object = self.objects.open_verified(hash)?;
                    tar.append_data(&mut header, path, object)
                }
                Entry::Symlink { target } => {
                    header.set_entry_type(tar::EntryType::Symlink);
                    header.set_mode(0o777);
                    header.set_size(0);
                    tar.append_link(&mut header, path, target)
                }
                Entry::Special {
                    special: SpecialKind::Fifo,
                } => {
                    header.set_entry_type(tar::EntryType::Fifo);
                    header.set_mode(0o644);
                    header.set_size(0);
                    tar.append_data(&mut header, path, std::io::empty())
                }
                Entry::Special { .. } => continue,
            }
            .map_err(failed)?;
        }
        tar.into_inner().map_err(failed)?.flush().map_err(failed)
    }
}
