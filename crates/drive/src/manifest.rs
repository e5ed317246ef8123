//! Snapshot manifests: every path of a workspace with its kind and content hash.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde::{Deserialize, Serialize};
use walkdir::WalkDir;

use crate::statcache::StatCache;
use crate::store::{hash_file, ObjectStore};

/// Opens a file for a snapshot without following a link and without blocking (a
/// path swapped for a FIFO after the walk saw a file must not hang the snapshot).
/// `None` when what is there now is not a regular file.
fn open_regular(path: &Path) -> Result<Option<(std::fs::File, std::fs::Metadata)>> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::File::options()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_NOFOLLOW)
        .open(path)
        .map_err(io("open", path))?;
    let meta = file.metadata().map_err(io("stat", path))?;
    Ok(meta.is_file().then_some((file, meta)))
}
use crate::{io, Error, Result, EXCLUDED_DIR};

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
    },
    /// A symbolic link.
    Symlink {
        /// Where it points, as stored in the link.
        target: String,
    },
    /// A directory (listed so empty directories survive).
    Dir,
    /// A FIFO, socket or device: recorded by kind, never read (reading a FIFO would
    /// block the snapshot until something writes to it). A restore recreates a FIFO;
    /// sockets and devices cannot be recreated from a snapshot and are left absent.
    Special {
        /// `fifo`, `socket`, `char_device` or `block_device`.
        special: SpecialKind,
    },
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

impl SpecialKind {
    fn of(kind: std::fs::FileType) -> Option<Self> {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            Some(SpecialKind::Fifo)
        } else if kind.is_socket() {
            Some(SpecialKind::Socket)
        } else if kind.is_char_device() {
            Some(SpecialKind::CharDevice)
        } else if kind.is_block_device() {
            Some(SpecialKind::BlockDevice)
        } else {
            None
        }
    }
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
                Some(e) if e != entry => changes.push(Change {
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

fn walk(workspace: &Path) -> impl Iterator<Item = walkdir::Result<walkdir::DirEntry>> {
    WalkDir::new(workspace)
        .min_depth(1)
        .follow_links(false)
        .sort_by_file_name()
        .into_iter()
        .filter_entry(|e| !(e.depth() == 1 && e.file_name() == EXCLUDED_DIR))
}

fn relative(workspace: &Path, path: &Path) -> String {
    path.strip_prefix(workspace)
        .unwrap_or(path)
        .to_string_lossy()
        .into_owned()
}

fn walk_error(workspace: &Path, e: walkdir::Error) -> Error {
    let path = e.path().unwrap_or(workspace).to_path_buf();
    Error::Io {
        op: "walk",
        path,
        source: e.into(),
    }
}

/// Reads the workspace into a manifest, storing new file contents.
pub(crate) fn scan(
    workspace: &Path,
    cache: &mut StatCache,
    objects: &ObjectStore,
) -> Result<Manifest> {
    let mut manifest = Manifest::default();
    for item in walk(workspace) {
        let item = item.map_err(|e| walk_error(workspace, e))?;
        let rel = relative(workspace, item.path());
        let kind = item.file_type();
        let entry = if kind.is_dir() {
            Entry::Dir
        } else if kind.is_symlink() {
            let target = std::fs::read_link(item.path()).map_err(io("readlink", item.path()))?;
            Entry::Symlink {
                target: target.to_string_lossy().into_owned(),
            }
        } else if let Some(special) = SpecialKind::of(kind) {
            Entry::Special { special }
        } else {
            let meta = item.metadata().map_err(|e| walk_error(workspace, e))?;
            match cache.lookup(&rel, &meta) {
                Some(hash) => Entry::File {
                    hash,
                    size: meta.len(),
                    exec: meta.permissions().mode() & 0o111 != 0,
                },
                None => match open_regular(item.path())? {
                    None => {
                        let now = std::fs::symlink_metadata(item.path())
                            .map_err(io("stat", item.path()))?;
                        match SpecialKind::of(now.file_type()) {
                            Some(special) => Entry::Special { special },
                            None => continue, // gone or replaced mid-walk
                        }
                    }
                    Some((mut file, meta)) => {
                        let (hash, size) = objects.put_reader(item.path(), &mut file)?;
                        cache.record(&rel, &meta, &hash);
                        Entry::File {
                            hash,
                            size,
                            exec: meta.permissions().mode() & 0o111 != 0,
                        }
                    }
                },
            }
        };
        manifest.entries.insert(rel, entry);
    }
    Ok(manifest)
}

/// Makes the workspace equal to the manifest.
pub(crate) fn apply(
    manifest: &Manifest,
    workspace: &Path,
    cache: &mut StatCache,
    objects: &ObjectStore,
) -> Result<()> {
    std::fs::create_dir_all(workspace).map_err(io("create", workspace))?;
    // Children before parents, so a directory is empty of unwanted entries when reached.
    let existing: Vec<_> = WalkDir::new(workspace)
        .min_depth(1)
        .follow_links(false)
        .contents_first(true)
        .into_iter()
        .filter(|e| {
            // (filter_entry does not prune with contents_first, so filter by path.)
            e.as_ref().map_or(true, |e| {
                e.path()
                    .strip_prefix(workspace)
                    .map_or(true, |rel| !rel.starts_with(EXCLUDED_DIR))
            })
        })
        .collect::<walkdir::Result<_>>()
        .map_err(|e| walk_error(workspace, e))?;
    for item in existing {
        let rel = relative(workspace, item.path());
        let kind = item.file_type();
        let keep = match manifest.entries.get(&rel) {
            Some(Entry::Dir) => kind.is_dir(),
            Some(Entry::Symlink { .. }) => kind.is_symlink(),
            Some(Entry::File { .. }) => kind.is_file(),
            Some(Entry::Special { special }) => SpecialKind::of(kind) == Some(*special),
            None => false,
        };
        if !keep {
            let path = item.path();
            if kind.is_dir() {
                std::fs::remove_dir_all(path).map_err(io("remove", path))?;
            } else {
                std::fs::remove_file(path).map_err(io("remove", path))?;
            }
        }
    }
    for (rel, entry) in &manifest.entries {
        let path = workspace.join(rel);
        match entry {
            Entry::Dir => std::fs::create_dir_all(&path).map_err(io("create", &path))?,
            Entry::Symlink { target } => {
                if std::fs::read_link(&path).ok().as_deref() == Some(Path::new(target)) {
                    continue;
                }
                let _ = std::fs::remove_file(&path);
                std::os::unix::fs::symlink(target, &path).map_err(io("symlink", &path))?;
            }
            Entry::Special { special } => {
                if *special == SpecialKind::Fifo && std::fs::symlink_metadata(&path).is_err() {
                    nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o644))
                        .map_err(|e| io("mkfifo", &path)(e.into()))?;
                }
            }
            Entry::File { hash, exec, .. } => {
                let mode = if *exec { 0o755 } else { 0o644 };
                if let Ok(meta) = std::fs::symlink_metadata(&path) {
                    let same = match cache.lookup(rel, &meta) {
                        Some(h) => &h == hash,
                        None => meta.is_file() && hash_file(&path)? == *hash,
                    };
                    if same {
                        if (meta.permissions().mode() & 0o111 != 0) != *exec {
                            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                                .map_err(io("chmod", &path))?;
                        }
                        continue;
                    }
                }
                let tmp = path.with_file_name(format!(
                    ".{}.steadfast-restore",
                    path.file_name()
                        .map(|n| n.to_string_lossy())
                        .unwrap_or_default()
                ));
                objects.copy_to(hash, &tmp)?;
                std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))
                    .map_err(io("chmod", &tmp))?;
                std::fs::rename(&tmp, &path).map_err(io("rename", &path))?;
            }
        }
    }
    Ok(())
}
