//! Workspaces as tar archives. Out: a snapshot for people and tools that want a
//! workspace as it was at some point of a session, streamed entry by entry (bounded
//! memory whatever the size), each file's bytes checked against its hash on the way
//! out. In: an uploaded archive (plain or gzip) unpacked into a new workspace, every
//! entry kept inside it.

use std::io::{Read, Write};
use std::path::Path;

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
        let path = self.local(hash)?;
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
    /// Writes snapshot `id` to `out` as a tar archive: directories and files (with their
    /// permission bits) and symbolic links under their workspace paths, and FIFOs;
    /// sockets and devices, which no snapshot can recreate, are left out. A file is
    /// dated when it was last modified, as the snapshot recorded it; every other entry
    /// (and a file of a snapshot from before times were kept) is dated `mtime` (seconds
    /// since the epoch; the caller passes when the snapshot was recorded). So an
    /// archive of one snapshot is the same bytes every time, and nothing in it looks
    /// 56 years old.
    pub fn export_tar(&self, id: &str, mtime: u64, out: impl Write) -> Result<()> {
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
            header.set_mtime(mtime);
            match entry {
                Entry::Dir { mode } => {
                    header.set_entry_type(tar::EntryType::Directory);
                    header.set_mode(mode.unwrap_or(0o755));
                    header.set_size(0);
                    tar.append_data(&mut header, format!("{path}/"), std::io::empty())
                }
                Entry::File {
                    hash,
                    size,
                    exec,
                    mode,
                    mtime: modified,
                } => {
                    if let Some(modified) = modified {
                        header.set_mtime((*modified).max(0) as u64);
                    }
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_mode(crate::manifest::file_bits(*exec, *mode));
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

/// What [`unpack_tar`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unpacked {
    /// Entries written (directories, files, links, FIFOs).
    pub entries: u64,
    /// Bytes of file content written.
    pub bytes: u64,
}

/// What an entry costs against an unpacking's bound beyond its content: a directory
/// takes a block of the filesystem, every entry an inode and its header. So an archive
/// of a million empty directories or files is refused as a bomb, as one that expands
/// to gigabytes of content is.
const DIRECTORY_COST: u64 = 4096;
const ENTRY_COST: u64 = 512;

/// Unpacks a tar archive (gzip-compressed or not) into `dst`: directories, files with
/// their permission bits, symbolic and hard links, FIFOs. An entry whose path leaves
/// `dst` (absolute, `..`, or through a link the archive made), a device node, or
/// more than `max_bytes` in all (content, and [`DIRECTORY_COST`] or [`ENTRY_COST`] for
/// each entry: a small archive that expands without bound) is refused, naming the
/// entry; the caller removes `dst` then.
pub fn unpack_tar(archive: &[u8], dst: &Path, max_bytes: u64) -> Result<Unpacked> {
    let refused = |m: String| Error::Archive(m);
    let reader: Box<dyn Read + '_> = if archive.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::read::GzDecoder::new(archive))
    } else {
        Box::new(archive)
    };
    let mut tar = tar::Archive::new(reader);
    tar.set_overwrite(true);
    tar.set_preserve_permissions(false);
    tar.set_unpack_xattrs(false);
    let mut done = Unpacked {
        entries: 0,
        bytes: 0,
    };
    let mut charged: u64 = 0;
    let entries = tar
        .entries()
        .map_err(|e| refused(format!("not a tar archive: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| refused(format!("not a tar archive: {e}")))?;
        let name = entry.path_bytes().escape_ascii().to_string();
        match entry.header().entry_type() {
            tar::EntryType::Block | tar::EntryType::Char => {
                return Err(refused(format!("`{name}`: a device node")));
            }
            tar::EntryType::XGlobalHeader | tar::EntryType::XHeader => continue,
            _ => {}
        }
        // An absolute name is not taken as relative to the workspace: refused.
        if entry.path_bytes().starts_with(b"/") {
            return Err(refused(format!("`{name}` is outside the workspace")));
        }
        let cost = match entry.header().entry_type() {
            tar::EntryType::Directory => DIRECTORY_COST,
            _ => ENTRY_COST,
        };
        charged = charged.saturating_add(cost).saturating_add(entry.size());
        if charged > max_bytes {
            return Err(refused(format!(
                "it unpacks to more than {max_bytes} bytes (counting {ENTRY_COST} for each entry, {DIRECTORY_COST} for each directory)"
            )));
        }
        if entry.header().entry_type() == tar::EntryType::Fifo {
            let path = entry
                .path()
                .map_err(|e| refused(format!("`{name}`: {e}")))?;
            make_fifo(dst, &path).map_err(|e| refused(format!("`{name}`{e}")))?;
            done.entries += 1;
            continue;
        }
        done.bytes = done.bytes.saturating_add(entry.size());
        let inside = entry
            .unpack_in(dst)
            .map_err(|e| refused(format!("`{name}`: {e}")))?;
        if !inside {
            return Err(refused(format!("`{name}` is outside the workspace")));
        }
        done.entries += 1;
    }
    Ok(done)
}

/// Makes a FIFO at `rel` under `dst` (the tar crate makes none), through real
/// directories only: a component that is a link, or `..`, would lead outside.
fn make_fifo(dst: &Path, rel: &Path) -> std::result::Result<(), String> {
    use std::path::Component;
    let mut at = dst.to_path_buf();
    let parts: Vec<_> = rel.components().collect();
    let Some((last, dirs)) = parts.split_last() else {
        return Err(": no name".into());
    };
    for part in dirs {
        match part {
            Component::Normal(name) => at.push(name),
            Component::CurDir => continue,
            _ => return Err(" is outside the workspace".into()),
        }
        match std::fs::symlink_metadata(&at) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Err(" is outside the workspace (through a link)".into()),
            Err(_) => std::fs::create_dir(&at).map_err(|e| format!(": {e}"))?,
        }
    }
    let Component::Normal(name) = last else {
        return Err(" is outside the workspace".into());
    };
    at.push(name);
    if std::fs::symlink_metadata(&at).is_ok() {
        std::fs::remove_file(&at).map_err(|e| format!(": {e}"))?;
    }
    nix::unistd::mkfifo(&at, nix::sys::stat::Mode::from_bits_truncate(0o644))
        .map_err(|e| format!(": {e}"))
}

#[cfg(test)]
mod unpack_tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    /// An archive entry with a raw name (as a hostile archive may carry).
    fn raw(
        tar: &mut tar::Builder<Vec<u8>>,
        name: &str,
        kind: tar::EntryType,
        link: &str,
        data: &[u8],
    ) {
        let mut header = tar::Header::new_gnu();
        header.as_gnu_mut().unwrap().name[..name.len()].copy_from_slice(name.as_bytes());
        header.set_entry_type(kind);
        header.set_mode(0o644);
        header.set_size(data.len() as u64);
        if !link.is_empty() {
            header.as_gnu_mut().unwrap().linkname[..link.len()].copy_from_slice(link.as_bytes());
        }
        header.set_cksum();
        tar.append(&header, data).unwrap();
    }

    fn archive(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut tar = tar::Builder::new(Vec::new());
        build(&mut tar);
        tar.into_inner().unwrap()
    }

    #[test]
    fn a_workspace_comes_back_whole_from_tar_or_gzip() {
        let bytes = archive(|t| {
            raw(t, "src/", tar::EntryType::Directory, "", b"");
            let mut header = tar::Header::new_gnu();
            header.set_path("src/run.sh").unwrap();
            header.set_mode(0o755);
            header.set_size(9);
            header.set_cksum();
            t.append(&header, &b"#!/bin/sh"[..]).unwrap();
            raw(t, "blob.bin", tar::EntryType::Regular, "", &[0, 255, 7, 0]);
            raw(t, "link", tar::EntryType::Symlink, "src/run.sh", b"");
            raw(t, "pipe", tar::EntryType::Fifo, "", b"");
        });
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&bytes).unwrap();
        for given in [bytes.clone(), gz.finish().unwrap()] {
            let dir = tempfile::tempdir().unwrap();
            let done = unpack_tar(&given, dir.path(), 1 << 20).unwrap();
            assert_eq!(
                done,
                Unpacked {
                    entries: 5,
                    bytes: 13
                }
            );
            assert_eq!(
                std::fs::read(dir.path().join("blob.bin")).unwrap(),
                [0, 255, 7, 0]
            );
            let mode = std::fs::metadata(dir.path().join("src/run.sh"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o111, 0o111, "the executable bit");
            assert_eq!(
                std::fs::read_link(dir.path().join("link")).unwrap(),
                Path::new("src/run.sh")
            );
            use std::os::unix::fs::FileTypeExt as _;
            assert!(std::fs::symlink_metadata(dir.path().join("pipe"))
                .unwrap()
                .file_type()
                .is_fifo());
        }
    }

    #[test]
    fn entries_that_leave_the_workspace_devices_and_bombs_are_refused() {
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().display().to_string();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (
                archive(|t| raw(t, "../escape.txt", tar::EntryType::Regular, "", b"x")),
                "outside",
            ),
            (
                archive(|t| {
                    raw(t, "out", tar::EntryType::Symlink, &target, b"");
                    raw(t, "out/planted.txt", tar::EntryType::Regular, "", b"x");
                }),
                "planted",
            ),
            (
                archive(|t| raw(t, "dev", tar::EntryType::Char, "", b"")),
                "device",
            ),
            (
                archive(|t| raw(t, "big", tar::EntryType::Regular, "", &[0; 4096])),
                "more than",
            ),
            (
                archive(|t| {
                    for i in 0..3 {
                        raw(t, &format!("empty{i}"), tar::EntryType::Directory, "", b"");
                    }
                }),
                "each directory",
            ),
            (
                archive(|t| {
                    for i in 0..5 {
                        raw(
                            t,
                            &format!("empty{i}.txt"),
                            tar::EntryType::Regular,
                            "",
                            b"",
                        );
                    }
                }),
                "each entry",
            ),
            (
                archive(|t| raw(t, "/etc/planted.txt", tar::EntryType::Regular, "", b"x")),
                "outside",
            ),
            (
                b"this is not an archive at all, not even close to one............".repeat(16),
                "tar",
            ),
        ];
        for (bytes, says) in cases {
            let dir = tempfile::tempdir().unwrap();
            let err = unpack_tar(&bytes, dir.path(), 2048)
                .unwrap_err()
                .to_string();
            assert!(err.contains(says), "{says}: {err}");
        }
        assert_eq!(
            std::fs::read_dir(outside.path()).unwrap().count(),
            0,
            "nothing written outside"
        );
    }
}
