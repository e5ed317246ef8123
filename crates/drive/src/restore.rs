//! Making a workspace equal to a snapshot, touching only what differs: the workspace
//! is probed first (stat only, through the index), and every directory whose tree
//! already matches is skipped whole.
//!
//! A restore knows what it leaves in each directory it makes equal to a tree, so it
//! leaves the index knowing it too ([`Seeds`]): the next snapshot finds each restored
//! file's stamp unchanged and reads none of them. A workspace hydrated on a new host
//! (a session taken over, a sandbox made again) then snapshots as quickly as a warm
//! one, instead of reading every file before its first call.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::index::{DirRecord, Index, Stamp};
use crate::manifest::SpecialKind;
use crate::store::ObjectStore;
use crate::tree::{join, load_tree, Node};
use crate::{io, Result};

/// Each directory found in the workspace: its tree id and names.
pub(crate) type Found = HashMap<String, (String, BTreeMap<String, Node>)>;

/// What the workspace holds now: the directories the probe listed, and those it
/// did not need to (the watcher vouched for them), as the index has them.
pub(crate) struct Current<'a> {
    pub(crate) found: &'a Found,
    pub(crate) index: &'a Index,
}

impl Current<'_> {
    /// Directory `rel`'s tree id and names; `None` if neither knows it (which a
    /// directory the probe saw in its parent never is).
    fn get(&self, rel: &str) -> Option<(&str, &BTreeMap<String, Node>)> {
        match self.found.get(rel) {
            Some((tree, nodes)) => Some((tree, nodes)),
            None => self.index.record(rel).map(|r| (r.tree.as_str(), &r.nodes)),
        }
    }
}

/// The index records a restore leaves behind, by directory: each directory it made
/// equal to a tree, with the stamps of its files as the restore left them.
pub(crate) type Seeds = Vec<(String, DirRecord)>;

/// Makes directory `abs` (workspace path `rel`) equal to tree `target`. `fresh`: it
/// was just made, empty. What it made is added to `seeds`.
pub(crate) fn apply(
    objects: &ObjectStore,
    current: &Current,
    abs: &Path,
    rel: &str,
    target: &str,
    fresh: bool,
    seeds: &mut Seeds,
) -> Result<()> {
    let none = BTreeMap::new();
    let have = if fresh {
        &none
    } else {
        match current.get(rel) {
            Some((tree, _)) if tree == target => return Ok(()),
            Some((_, nodes)) => nodes,
            None => return Err(crate::Error::NotFound(format!("the workspace's {rel}/"))),
        }
    };
    let want = load_tree(objects, target)?.tree;
    let wanted: Vec<&str> = want
        .iter()
        .filter_map(|(name, node)| match (node, have.get(name)) {
            (Node::File { hash, .. }, Some(Node::File { hash: had, .. })) if had == hash => None,
            (Node::File { hash, .. }, _) => Some(hash.as_str()),
            _ => None,
        })
        .collect();
    objects.prefetch(&wanted)?;
    for (name, node) in have {
        if !want.get(name).is_some_and(|w| same_kind(node, w)) {
            let path = abs.join(name);
            if matches!(node, Node::Dir { .. }) {
                std::fs::remove_dir_all(&path).map_err(io("remove", &path))?;
            } else {
                std::fs::remove_file(&path).map_err(io("remove", &path))?;
            }
        }
    }
    for (name, node) in &want {
        let path = abs.join(name);
        // What is there now, unless the loop above removed it.
        let had = have.get(name).filter(|h| same_kind(h, node));
        match node {
            Node::Dir { tree, mode } => {
                let fresh = !matches!(had, Some(Node::Dir { .. }));
                if fresh {
                    std::fs::create_dir(&path).map_err(io("create", &path))?;
                }
                // Writable while it is filled; its own bits once it is.
                let bits = mode.unwrap_or(0o755);
                if bits & 0o700 != 0o700 {
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700))
                        .map_err(io("chmod", &path))?;
                }
                apply(
                    objects,
                    current,
                    &path,
                    &join(rel, name),
                    tree,
                    fresh,
                    seeds,
                )?;
                let had_bits = match had {
                    Some(Node::Dir { mode, .. }) => mode.unwrap_or(0o755),
                    _ => 0o755,
                };
                if fresh || had_bits != bits || bits & 0o700 != 0o700 {
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(bits))
                        .map_err(io("chmod", &path))?;
                }
            }
            Node::File {
                hash,
                exec,
                mode,
                mtime,
                ..
            } => {
                let mode = crate::manifest::file_bits(*exec, *mode);
                match had {
                    Some(Node::File {
                        hash: had_hash,
                        exec: had_exec,
                        mode: had_mode,
                        mtime: had_mtime,
                        ..
                    }) if had_hash == hash => {
                        if crate::manifest::file_bits(*had_exec, *had_mode) != mode {
                            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                                .map_err(io("chmod", &path))?;
                        }
                        if had_mtime != mtime {
                            set_mtime(&path, *mtime)?;
                        }
                    }
                    _ => {
                        let tmp = abs.join(format!(
                            ".{name}.steadfast-restore-{}",
                            crate::unique_temp_suffix()
                        ));
                        objects.copy_to(hash, &tmp)?;
                        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))
                            .map_err(io("chmod", &tmp))?;
                        set_mtime(&tmp, *mtime)?;
                        std::fs::rename(&tmp, &path).map_err(io("rename", &path))?;
                    }
                }
            }
            Node::Symlink { target } => {
                if had == Some(node) {
                    continue;
                }
                if had.is_some() {
                    std::fs::remove_file(&path).map_err(io("remove", &path))?;
                }
                std::os::unix::fs::symlink(target, &path).map_err(io("symlink", &path))?;
            }
            Node::Special { special } => {
                if *special == SpecialKind::Fifo && had.is_none() {
                    nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o644))
                        .map_err(|e| io("mkfifo", &path)(e.into()))?;
                }
            }
        }
    }
    seeds.push((
        rel.to_string(),
        DirRecord {
            tree: target.to_string(),
            stamps: stamps_of(abs, &want, current.index.now_ns),
            nodes: want,
        },
    ));
    Ok(())
}

/// The stamps of the files of `want` in directory `abs` that can be trusted as they
/// are: the file is what the restore made it (its size, bits and time as recorded),
/// and its time, which the restore set, is old enough that any later write gives it
/// a new one (the rule that makes a stamp trustworthy, applied to a time the restore
/// chose rather than the clock). The rest are read again by the next snapshot.
fn stamps_of(abs: &Path, want: &BTreeMap<String, Node>, now_ns: i128) -> BTreeMap<String, Stamp> {
    use nix::fcntl::AtFlags;
    let mut stamps = BTreeMap::new();
    for (name, node) in want {
        let Node::File {
            size,
            exec,
            mode,
            mtime: Some(mtime),
            ..
        } = node
        else {
            continue;
        };
        let Ok(stat) = nix::sys::stat::fstatat(
            nix::fcntl::AT_FDCWD,
            &abs.join(name),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        ) else {
            continue;
        };
        let as_made = stat.st_mode & nix::libc::S_IFMT == nix::libc::S_IFREG
            && stat.st_size as u64 == *size
            && (stat.st_mode & 0o111 != 0) == *exec
            && crate::manifest::file_mode(stat.st_mode) == *mode
            && stat.st_mtime == *mtime
            && stat.st_mtime_nsec == 0;
        let old_enough = now_ns - *mtime as i128 * 1_000_000_000 >= crate::index::SETTLE_NS;
        if as_made && old_enough {
            stamps.insert(name.clone(), Stamp::of(&stat));
        }
    }
    stamps
}

/// Gives the file at `path` the modification time a snapshot recorded (none: a
/// snapshot from before times were kept, and the file keeps the time it was written).
fn set_mtime(path: &Path, mtime: Option<i64>) -> Result<()> {
    let Some(seconds) = mtime else {
        return Ok(());
    };
    nix::sys::stat::utimensat(
        nix::fcntl::AT_FDCWD,
        path,
        &nix::sys::time::TimeSpec::UTIME_OMIT,
        &nix::sys::time::TimeSpec::new(seconds, 0),
        nix::sys::stat::UtimensatFlags::NoFollowSymlink,
    )
    .map_err(|e| io("utimensat", path)(e.into()))
}

/// Whether `a` can be turned into `b` in place (else it is removed first).
fn same_kind(a: &Node, b: &Node) -> bool {
    match (a, b) {
        (Node::Dir { .. }, Node::Dir { .. })
        | (Node::File { .. }, Node::File { .. })
        | (Node::Symlink { .. }, Node::Symlink { .. }) => true,
        (Node::Special { special: x }, Node::Special { special: y }) => x == y,
        _ => false,
    }
}
