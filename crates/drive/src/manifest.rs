//! Snapshot manifests: every path of a workspace with its kind and content hash, the
//! flat view of a snapshot that inspection (listings, diffs, archives) works with.
//! Snapshots are stored as trees ([`crate::tree`]); old ones as one flat manifest.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// One path in a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Entry {
    /// A regular file.
    File {
        /// BLAKE3 of its content.
        hash: String,
        /// Its length.
        size: u64,
        /// Whether it is executable.
        exec: bool,
        /// Its permission bits (`0o600`), when not the usual ones for `exec`
        /// (`0o755` or `0o644`); see [`file_mode`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mode: Option<u32>,
        /// When its content was last modified, in whole seconds since the Unix epoch
        /// (as git and tar keep it); absent in snapshots taken before times were kept.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mtime: Option<i64>,
    },
    /// A symbolic link.
    Symlink {
        /// Where it points, as stored in the link.
        target: String,
    },
    /// A directory (listed so empty directories survive).
    Dir {
        /// Its permission bits (`0o700`), when not the usual `0o755`; see [`dir_mode`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mode: Option<u32>,
    },
    /// A FIFO, socket or device: recorded by kind, never read (reading a FIFO would
    /// block the snapshot until something writes to it). A restore recreates a FIFO;
    /// sockets and devices cannot be recreated from a snapshot and are left absent.
    Special {
        /// `fifo`, `socket`, `char_device` or `block_device`.
        special: SpecialKind,
    },
}

impl Entry {
    /// Whether `self` and `other` are the same (kind, content, permission bits),
    /// whatever their modification times: a file only touched is no change a diff
    /// shows.
    pub fn same_apart_from_time(&self, other: &Entry) -> bool {
        match (self, other) {
            (
                Entry::File {
                    hash,
                    size,
                    exec,
                    mode,
                    ..
                },
                Entry::File {
                    hash: h,
                    size: s,
                    exec: e,
                    mode: m,
                    ..
                },
            ) => hash == h && size == s && exec == e && mode == m,
            (a, b) => a == b,
        }
    }
}

/// The permission bits kept of a file or directory: read, write and execute for owner,
/// group and others. Set-user-id, set-group-id and sticky bits are not kept (a restore
/// by the harness must never make a set-user-id program of what a sandbox wrote).
const KEPT_BITS: u32 = 0o777;

/// A file's permission bits as a snapshot records them: `None` when they are the usual
/// ones for its executable bit (`0o755`, `0o644`), so most files' entries stay as they
/// were before modes were kept.
pub fn file_mode(st_mode: u32) -> Option<u32> {
    let bits = st_mode & KEPT_BITS;
    let usual = if bits & 0o111 != 0 { 0o755 } else { 0o644 };
    (bits != usual).then_some(bits)
}

/// A directory's permission bits as a snapshot records them (`None`: `0o755`).
pub fn dir_mode(st_mode: u32) -> Option<u32> {
    let bits = st_mode & KEPT_BITS;
    (bits != 0o755).then_some(bits)
}

/// The permission bits a file gets on restore.
pub fn file_bits(exec: bool, mode: Option<u32>) -> u32 {
    mode.unwrap_or(if exec { 0o755 } else { 0o644 })
}

/// The kind of a special file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SpecialKind {
    /// A named pipe.
    Fifo,
    /// A Unix socket.
    Socket,
    /// A character device.
    CharDevice,
    /// A block device.
    BlockDevice,
}

/// A snapshot: every path of the workspace, relative, `/`-separated, sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The entries by path.
    pub entries: BTreeMap<String, Entry>,
}

/// How a path differs between two snapshots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// Only in the second.
    Added,
    /// Only in the first.
    Removed,
    /// In both, different.
    Modified,
}

/// One changed path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// The path.
    pub path: String,
    /// How it changed.
    pub kind: ChangeKind,
}

impl Manifest {
    /// The format snapshots were stored in before trees (tests write old ones).
    #[cfg(test)]
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("manifests serialize")
    }

    pub(crate) fn from_bytes(id: &str, bytes: &[u8]) -> Result<Self> {
        serde_json::from_slice(bytes).map_err(|_| Error::Corrupt(id.to_string()))
    }

    /// What changed from `self` to `other`.
    pub fn diff(&self, other: &Manifest) -> Vec<Change> {
        let mut changes = Vec::new();
        for (path, entry) in &self.entries {
            match other.entries.get(path) {
                None => changes.push(Change {
                    path: path.clone(),
                    kind: ChangeKind::Removed,
                }),
                Some(e) if !e.same_apart_from_time(entry) => changes.push(Change {
                    path: path.clone(),
                    kind: ChangeKind::Modified,
                }),
                Some(_) => {}
            }
        }
        for path in other.entries.keys() {
            if !self.entries.contains_key(path) {
                changes.push(Change {
                    path: path.clone(),
                    kind: ChangeKind::Added,
                });
            }
        }
        changes.sort_by(|a, b| a.path.cmp(&b.path));
        changes
    }
}
