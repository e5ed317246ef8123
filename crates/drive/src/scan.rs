//! Reading a workspace into trees, a directory at a time, reusing what the index
//! says is unchanged.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::index::{DirRecord, Index, Stamp};
use crate::manifest::SpecialKind;
use crate::store::{Batch, ObjectStore};
use crate::tree::{join, Node, Tree};
use crate::{io, Result, EXCLUDED_DIR};

/// What a pass does with what it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Take a snapshot: store new contents and trees, update the index.
    Store,
    /// Only find out what is there (before a restore): store nothing, change nothing.
    Probe,
}

/// One pass over a workspace.
pub(crate) struct Scanner<'a> {
    objects: &'a ObjectStore,
    index: &'a mut Index,
    mode: Mode,
    /// New objects of this pass, committed by the caller.
    pub(crate) batch: Batch,
    /// In [`Mode::Probe`], every directory found: its tree id and names.
    pub(crate) found: crate::restore::Found,
    /// Files read whole in this pass.
    pub(crate) files_read: u64,
}

impl<'a> Scanner<'a> {
    pub(crate) fn new(objects: &'a ObjectStore, index: &'a mut Index, mode: Mode) -> Self {
        index.begin();
        Scanner {
            objects,
            index,
            mode,
            batch: Batch::default(),
            found: HashMap::new(),
            files_read: 0,
        }
    }

    /// Reads directory `abs` (workspace path `rel`) and returns its tree id. `None`
    /// when it vanished before it could be read.
    pub(crate) fn dir(&mut self, abs: &Path, rel: &str) -> Result<Option<String>> {
        let listing = match std::fs::read_dir(abs) {
            Ok(listing) => listing,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !rel.is_empty() => {
                return Ok(None)
            }
            Err(e) => return Err(io("read", abs)(e)),
        };
        let mut children = Vec::new();
        for child in listing {
            let child = child.map_err(io("read", abs))?;
            let name = child.file_name().to_string_lossy().into_owned();
            if rel.is_empty() && name == EXCLUDED_DIR {
                continue;
            }
            children.push((name, child));
        }
        children.sort_by(|a, b| a.0.cmp(&b.0));

        let record = self.index.take(rel);
        let mut nodes = BTreeMap::new();
        let mut stamps = BTreeMap::new();
        for (name, child) in children {
            let path = child.path();
            let Ok(kind) = child.file_type() else {
                continue; // gone
            };
            let node = if kind.is_dir() {
                match self.dir(&path, &join(rel, &name))? {
                    Some(tree) => Node::Dir { tree },
                    None => continue,
                }
            } else if kind.is_symlink() {
                match std::fs::read_link(&path) {
                    Ok(target) => Node::Symlink {
                        target: target.to_string_lossy().into_owned(),
                    },
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(io("readlink", &path)(e)),
                }
            } else if let Some(special) = SpecialKind::of(kind) {
                Node::Special { special }
            } else {
                match self.file(&child, &name, record.as_ref(), &mut stamps)? {
                    Some(node) => node,
                    None => continue,
                }
            };
            nodes.insert(name, node);
        }

        let unchanged = record.as_ref().filter(|r| r.nodes == nodes);
        let tree = match unchanged {
            Some(r) => r.tree.clone(),
            None => {
                let bytes = Tree {
                    tree: nodes.clone(),
                }
                .to_bytes();
                match self.mode {
                    Mode::Store => self.objects.put(&mut self.batch, &bytes)?,
                    Mode::Probe => blake3::hash(&bytes).to_hex().to_string(),
                }
            }
        };
        let same_stamps = unchanged.is_some_and(|r| r.stamps == stamps);
        match self.mode {
            Mode::Store if !same_stamps => {
                let tree = tree.clone();
                self.index.put(
                    rel,
                    DirRecord {
                        tree,
                        nodes,
                        stamps,
                    },
                )?;
            }
            Mode::Store => self.index.keep(rel, record.expect("unchanged")),
            Mode::Probe => {
                if let Some(record) = record {
                    self.index.keep(rel, record);
                }
                self.found.insert(rel.to_string(), (tree.clone(), nodes));
            }
        }
        Ok(Some(tree))
    }

    /// The node of regular file `path`: from the index when its stamp is unchanged,
    /// else read (and, in [`Mode::Store`], stored). `None` when it is gone.
    fn file(
        &mut self,
        child: &std::fs::DirEntry,
        name: &str,
        record: Option<&DirRecord>,
        stamps: &mut BTreeMap<String, Stamp>,
    ) -> Result<Option<Node>> {
        let path = &child.path();
        let meta = match child.metadata() {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io("stat", path)(e)),
        };
        let stamp = Stamp::of(&meta);
        if let Some(record) = record {
            if record.stamps.get(name) == Some(&stamp) {
                if let Some(node @ Node::File { .. }) = record.nodes.get(name) {
                    stamps.insert(name.to_string(), stamp);
                    return Ok(Some(node.clone()));
                }
            }
        }
        let Some((mut file, meta)) = open_regular(path)? else {
            // Replaced by something else since the listing: record what is there now.
            let now = match std::fs::symlink_metadata(path) {
                Ok(now) => now,
                Err(_) => return Ok(None),
            };
            return Ok(SpecialKind::of(now.file_type()).map(|special| Node::Special { special }));
        };
        let stamp = Stamp::of(&meta);
        self.files_read += 1;
        let (hash, size) = match self.mode {
            Mode::Store => self.objects.put_reader(&mut self.batch, path, &mut file)?,
            Mode::Probe => {
                let mut hasher = blake3::Hasher::new();
                let size = std::io::copy(&mut file, &mut hasher).map_err(io("read", path))?;
                (hasher.finalize().to_hex().to_string(), size)
            }
        };
        if self.mode == Mode::Store && stamp.settled(self.index.now_ns) {
            stamps.insert(name.to_string(), stamp);
        }
        Ok(Some(Node::File {
            hash,
            size,
            exec: meta.permissions().mode() & 0o111 != 0,
        }))
    }
}

/// Opens a file for a snapshot without following a link and without blocking (a
/// path swapped for a FIFO after the listing saw a file must not hang the snapshot).
/// `None` when what is there now is not a regular file, or nothing is.
fn open_regular(path: &Path) -> Result<Option<(std::fs::File, std::fs::Metadata)>> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = match std::fs::File::options()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_NOFOLLOW)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(nix::libc::ELOOP) => return Ok(None),
        Err(e) => return Err(io("open", path)(e)),
    };
    let meta = file.metadata().map_err(io("stat", path))?;
    Ok(meta.is_file().then_some((file, meta)))
}
