//! Reading a workspace into trees, a directory at a time, reusing what the index
//! says is unchanged. Directories are opened relative to their parent and entries
//! stat'ed relative to their directory (`openat`, `fstatat`), so an unchanged entry
//! costs one system call and no path is resolved twice.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::path::Path;

use nix::dir::{Dir, Type};
use nix::fcntl::AtFlags;
use nix::fcntl::OFlag;
use nix::sys::stat::{fstatat, FileStat, Mode as Perm};

use crate::index::{DirRecord, Index, Stamp};
use crate::manifest::SpecialKind;
use crate::store::{Batch, ObjectStore};
use crate::tree::{self, canonical, join, Node};
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
    /// In an incremental pass, the only directories to look at (the others are as
    /// the index has them); `None` to look at everything.
    pub(crate) touched: Option<std::collections::HashSet<String>>,
}

fn errno(op: &'static str, path: &Path) -> impl FnOnce(nix::Error) -> crate::Error {
    let path = path.to_path_buf();
    move |e| io(op, &path)(e.into())
}

fn kind_of(stat: &FileStat) -> Type {
    match stat.st_mode & nix::libc::S_IFMT {
        nix::libc::S_IFDIR => Type::Directory,
        nix::libc::S_IFLNK => Type::Symlink,
        nix::libc::S_IFIFO => Type::Fifo,
        nix::libc::S_IFSOCK => Type::Socket,
        nix::libc::S_IFCHR => Type::CharacterDevice,
        nix::libc::S_IFBLK => Type::BlockDevice,
        _ => Type::File,
    }
}

fn special(kind: Type) -> Option<SpecialKind> {
    match kind {
        Type::Fifo => Some(SpecialKind::Fifo),
        Type::Socket => Some(SpecialKind::Socket),
        Type::CharacterDevice => Some(SpecialKind::CharDevice),
        Type::BlockDevice => Some(SpecialKind::BlockDevice),
        _ => None,
    }
}

/// Whether an error means the entry went away (or turned into something else)
/// between the listing and now.
fn vanished(e: nix::Error) -> bool {
    matches!(
        e,
        nix::Error::ENOENT | nix::Error::ENOTDIR | nix::Error::ELOOP
    )
}

const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

impl<'a> Scanner<'a> {
    pub(crate) fn new(objects: &'a ObjectStore, index: &'a mut Index, mode: Mode) -> Self {
        index.begin();
        Scanner {
            objects,
            index,
            mode,
            batch: Batch::default(),
            found: Default::default(),
            files_read: 0,
            touched: None,
        }
    }

    /// Whether this is an incremental pass and the watcher vouches for the root.
    pub(crate) fn trusts_root(&self) -> bool {
        self.touched.is_some() && self.index.trusts("")
    }

    /// Reads the workspace at `root` and returns its root tree id.
    pub(crate) fn root(&mut self, root: &Path) -> Result<String> {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let fd = nix::fcntl::open(root, flags, Perm::empty()).map_err(errno("read", root))?;
        let trusted = self.trusts_root();
        if self.mode == Mode::Store {
            self.index.watch(root, "");
        }
        self.dir(fd, root, "", trusted)
    }

    /// Reads directory `fd` (at `abs`, workspace path `rel`) and returns its tree id.
    /// `trusted`: it has been watched since it was last listed, so those of its
    /// subdirectories that are too and reported nothing are taken from the index.
    fn dir(&mut self, fd: OwnedFd, abs: &Path, rel: &str, trusted: bool) -> Result<String> {
        let listing = fd.try_clone().map_err(io("read", abs))?;
        let mut listing = Dir::from_fd(listing).map_err(errno("read", abs))?;
        let mut children = Vec::new();
        for entry in listing.iter() {
            let entry = entry.map_err(errno("read", abs))?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let name = String::from_utf8_lossy(name).into_owned();
            if rel.is_empty() && name == EXCLUDED_DIR {
                continue;
            }
            children.push((name, entry.file_type()));
        }
        drop(listing);
        children.sort_unstable_by(|a, b| a.0.cmp(&b.0));

        let record = self.index.take(rel);
        let mut nodes = BTreeMap::new();
        let mut stamps = BTreeMap::new();
        for (name, kind) in children {
            let mut stat = None;
            let kind = match kind {
                Some(kind) => kind,
                None => match fstatat(&fd, name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                    Ok(s) => {
                        let kind = kind_of(&s);
                        stat = Some(s);
                        kind
                    }
                    Err(e) if vanished(e) => continue,
                    Err(e) => return Err(errno("stat", &abs.join(&name))(e)),
                },
            };
            let node = match kind {
                Type::Directory => {
                    let rel_child = join(rel, &name);
                    // Its permission bits (one stat per directory listed, however its
                    // contents are found).
                    let st_mode = match &stat {
                        Some(s) => s.st_mode,
                        None => match fstatat(&fd, name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                            Ok(s) => s.st_mode,
                            Err(e) if vanished(e) => continue,
                            Err(e) => return Err(errno("stat", &abs.join(&name))(e)),
                        },
                    };
                    let mode = crate::manifest::dir_mode(st_mode);
                    let child_trusted = trusted && self.index.trusts(&rel_child);
                    if child_trusted {
                        if let Some(tree) = self.unchanged_dir(&rel_child) {
                            nodes.insert(name, Node::Dir { tree, mode });
                            continue;
                        }
                    }
                    if self.mode == Mode::Store {
                        self.index.watch(&abs.join(&name), &rel_child);
                    }
                    let child =
                        match nix::fcntl::openat(&fd, name.as_str(), DIR_FLAGS, Perm::empty()) {
                            Ok(child) => child,
                            Err(e) if vanished(e) => continue,
                            Err(e) => return Err(errno("read", &abs.join(&name))(e)),
                        };
                    let tree = self.dir(child, &abs.join(&name), &rel_child, child_trusted)?;
                    Node::Dir { tree, mode }
                }
                Type::Symlink => match nix::fcntl::readlinkat(&fd, name.as_str()) {
                    Ok(target) => Node::Symlink {
                        target: target.to_string_lossy().into_owned(),
                    },
                    Err(e) if vanished(e) || e == nix::Error::EINVAL => continue,
                    Err(e) => return Err(errno("readlink", &abs.join(&name))(e)),
                },
                Type::File => {
                    match self.file(&fd, abs, &name, stat, record.as_ref(), &mut stamps)? {
                        Some(node) => node,
                        None => continue,
                    }
                }
                other => Node::Special {
                    special: special(other).expect("the other kinds are special"),
                },
            };
            nodes.insert(name, node);
        }

        if self.mode == Mode::Store {
            let files = nodes.values().filter(|n| matches!(n, Node::File { .. }));
            if files.count() > stamps.len() {
                self.index.unsettled.insert(rel.to_string());
            } else {
                self.index.unsettled.remove(rel);
            }
        }
        let unchanged = record.as_ref().filter(|r| r.nodes == nodes);
        let tree = match unchanged {
            Some(r) => r.tree.clone(),
            None => {
                let (id, json) = canonical(&nodes);
                if self.mode == Mode::Store {
                    let previous = record.as_ref().map(|r| (r.tree.as_str(), &r.nodes));
                    tree::store(self.objects, &mut self.batch, &id, &json, &nodes, previous)?;
                }
                id
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
        Ok(tree)
    }

    /// In an incremental pass, the tree of directory `rel` when nothing was reported
    /// in or under it since it was stored.
    fn unchanged_dir(&self, rel: &str) -> Option<String> {
        let touched = self.touched.as_ref()?;
        if touched.contains(rel) {
            return None;
        }
        self.index.tree_of(rel).map(str::to_string)
    }

    /// The node of regular file `name` in directory `fd`: from the index when its
    /// stamp is unchanged, else read (and, in [`Mode::Store`], stored). `None` when it
    /// is gone.
    fn file(
        &mut self,
        fd: &OwnedFd,
        abs: &Path,
        name: &str,
        stat: Option<FileStat>,
        record: Option<&DirRecord>,
        stamps: &mut BTreeMap<String, Stamp>,
    ) -> Result<Option<Node>> {
        let stat = match stat {
            Some(stat) => stat,
            None => match fstatat(fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(stat) => stat,
                Err(e) if vanished(e) => return Ok(None),
                Err(e) => return Err(errno("stat", &abs.join(name))(e)),
            },
        };
        let stamp = Stamp::of(&stat);
        if let Some(record) = record {
            if record.stamps.get(name) == Some(&stamp) {
                if let Some(node @ Node::File { .. }) = record.nodes.get(name) {
                    stamps.insert(name.to_string(), stamp);
                    return Ok(Some(node.clone()));
                }
            }
        }
        // Opened without following a link and without blocking: a path swapped for
        // a FIFO after the listing saw a file must not hang the snapshot.
        let path = abs.join(name);
        let flags = OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let mut file = match nix::fcntl::openat(fd, name, flags, Perm::empty()) {
            Ok(file) => std::fs::File::from(file),
            Err(e) if vanished(e) => return Ok(None),
            Err(e) => return Err(errno("open", &path)(e)),
        };
        let stat = nix::sys::stat::fstat(&file).map_err(errno("stat", &path))?;
        let kind = kind_of(&stat);
        if kind != Type::File {
            // Replaced by something else since the listing: record what is there now.
            return Ok(special(kind).map(|special| Node::Special { special }));
        }
        let stamp = Stamp::of(&stat);
        self.files_read += 1;
        let (hash, size) = match self.mode {
            Mode::Store => self.objects.put_reader(&mut self.batch, &path, &mut file)?,
            Mode::Probe => {
                let mut hasher = blake3::Hasher::new();
                let size = std::io::copy(&mut file, &mut hasher).map_err(io("read", &path))?;
                (hasher.finalize().to_hex().to_string(), size)
            }
        };
        if self.mode == Mode::Store && stamp.settled(self.index.now_ns) {
            stamps.insert(name.to_string(), stamp);
        }
        Ok(Some(Node::File {
            hash,
            size,
            exec: stat.st_mode & 0o111 != 0,
            mode: crate::manifest::file_mode(stat.st_mode),
            mtime: Some(stat.st_mtime),
        }))
    }
}
