//! Tree objects: one per directory, as git stores them, so a snapshot writes only the
//! directories that changed (and their parents), two snapshots are compared by
//! skipping every subtree whose id they share, and a restore descends only where the
//! workspace differs.
//!
//! A snapshot's id is its root tree's id. Snapshots taken before trees existed are a
//! single flat manifest of every path; they are still read, and are turned into trees
//! the first time something needs them as trees.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::manifest::{Entry, Manifest, SpecialKind};
use crate::store::{Batch, ObjectStore};
use crate::{Error, Result};

/// One name in a directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum Node {
    /// A regular file, by content.
    File { hash: String, size: u64, exec: bool },
    /// A symbolic link.
    Symlink { target: String },
    /// A directory, by its tree's id.
    Dir { tree: String },
    /// A FIFO, socket or device, by kind.
    Special { special: SpecialKind },
}

impl Node {
    /// The manifest entry this node stands for (a directory loses its tree id).
    pub(crate) fn entry(&self) -> Entry {
        match self {
            Node::File { hash, size, exec } => Entry::File {
                hash: hash.clone(),
                size: *size,
                exec: *exec,
            },
            Node::Symlink { target } => Entry::Symlink {
                target: target.clone(),
            },
            Node::Dir { .. } => Entry::Dir,
            Node::Special { special } => Entry::Special { special: *special },
        }
    }
}

/// A directory's names, sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Tree {
    pub(crate) tree: BTreeMap<String, Node>,
}

impl Tree {
    /// The stored form: JSON, deflated (a tree is mostly hashes and repeated keys,
    /// so this stores about a third of the bytes; the same tree always gives the
    /// same bytes, and so the same id).
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        use std::io::Write;
        let json = serde_json::to_vec(self).expect("trees serialize");
        let mut out = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        out.write_all(&json).expect("writing to memory");
        out.finish().expect("writing to memory")
    }

    /// A tree from its stored form (deflated JSON), or `None` if it is not one.
    fn from_bytes(bytes: &[u8]) -> Option<Tree> {
        use std::io::Read;
        let mut json = Vec::new();
        flate2::read::ZlibDecoder::new(bytes)
            .read_to_end(&mut json)
            .ok()?;
        serde_json::from_slice(&json).ok()
    }
}

/// What a snapshot id names: a root tree, or an old flat manifest.
pub(crate) enum Stored {
    Tree(Tree),
    Flat(Manifest),
}

/// Reads object `id` as a tree or a flat manifest.
pub(crate) fn load(objects: &ObjectStore, id: &str) -> Result<Stored> {
    let bytes = objects.get(id)?;
    if bytes.first() != Some(&b'{') {
        if let Some(tree) = Tree::from_bytes(&bytes) {
            return Ok(Stored::Tree(tree));
        }
    } else if let Ok(tree) = serde_json::from_slice::<Tree>(&bytes) {
        // Trees were plain JSON for a while.
        return Ok(Stored::Tree(tree));
    }
    Manifest::from_bytes(id, &bytes).map(Stored::Flat)
}

/// Reads object `id`, which must be a tree.
pub(crate) fn load_tree(objects: &ObjectStore, id: &str) -> Result<Tree> {
    match load(objects, id)? {
        Stored::Tree(tree) => Ok(tree),
        Stored::Flat(_) => Err(Error::Corrupt(id.to_string())),
    }
}

/// The root tree of snapshot `id`: itself, or (for a flat manifest) the trees that
/// hold the same paths, stored now.
pub(crate) fn root_of(objects: &ObjectStore, id: &str) -> Result<String> {
    match load(objects, id)? {
        Stored::Tree(_) => Ok(id.to_string()),
        Stored::Flat(manifest) => {
            let mut batch = Batch::default();
            let root = store_flat(objects, &mut batch, &manifest)?;
            objects.finish(&mut batch)?;
            Ok(root)
        }
    }
}

/// Stores a flat manifest as trees and returns the root's id.
fn store_flat(objects: &ObjectStore, batch: &mut Batch, manifest: &Manifest) -> Result<String> {
    let mut dirs: BTreeMap<String, Tree> = BTreeMap::new();
    dirs.insert(String::new(), Tree::default());
    for (path, entry) in &manifest.entries {
        if matches!(entry, Entry::Dir) {
            dirs.entry(path.clone()).or_default();
        }
    }
    for (path, entry) in &manifest.entries {
        let (parent, name) = split(path);
        let node = match entry {
            Entry::File { hash, size, exec } => Node::File {
                hash: hash.clone(),
                size: *size,
                exec: *exec,
            },
            Entry::Symlink { target } => Node::Symlink {
                target: target.clone(),
            },
            Entry::Special { special } => Node::Special { special: *special },
            Entry::Dir => continue,
        };
        dirs.entry(parent.to_string())
            .or_default()
            .tree
            .insert(name.to_string(), node);
    }
    // Deepest first, so each directory's tree id is known before its parent's.
    let mut order: Vec<String> = dirs.keys().cloned().collect();
    order.sort_by_key(|p| std::cmp::Reverse(depth(p)));
    let mut root = String::new();
    for path in order {
        let tree = dirs.remove(&path).expect("listed");
        let id = objects.put(batch, &tree.to_bytes())?;
        if path.is_empty() {
            root = id;
        } else {
            let (parent, name) = split(&path);
            dirs.entry(parent.to_string())
                .or_default()
                .tree
                .insert(name.to_string(), Node::Dir { tree: id });
        }
    }
    Ok(root)
}

fn depth(path: &str) -> usize {
    if path.is_empty() {
        0
    } else {
        path.matches('/').count() + 1
    }
}

/// `("a/b", "c")` for `"a/b/c"`; `("", "c")` for `"c"`.
pub(crate) fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

/// `prefix/name`, or `name` at the root.
pub(crate) fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}/{name}")
    }
}

/// Every path under tree `id`, with `prefix` before each.
pub(crate) fn flatten(
    objects: &ObjectStore,
    id: &str,
    prefix: &str,
    out: &mut BTreeMap<String, Entry>,
) -> Result<()> {
    for (name, node) in load_tree(objects, id)?.tree {
        let path = join(prefix, &name);
        out.insert(path.clone(), node.entry());
        if let Node::Dir { tree } = &node {
            flatten(objects, tree, &path, out)?;
        }
    }
    Ok(())
}

/// The paths under `node` (itself, and everything inside when it is a directory).
fn flatten_node(
    objects: &ObjectStore,
    node: Option<&Node>,
    path: &str,
) -> Result<BTreeMap<String, Entry>> {
    let mut out = BTreeMap::new();
    if let Some(node) = node {
        out.insert(path.to_string(), node.entry());
        if let Node::Dir { tree } = node {
            flatten(objects, tree, path, &mut out)?;
        }
    }
    Ok(out)
}

/// What changed from tree `a` to tree `b`, by path, skipping shared subtrees.
pub(crate) fn diff(
    objects: &ObjectStore,
    a: &str,
    b: &str,
    prefix: &str,
    out: &mut Vec<crate::Change>,
) -> Result<()> {
    if a == b {
        return Ok(());
    }
    let (ta, tb) = (load_tree(objects, a)?, load_tree(objects, b)?);
    let names: std::collections::BTreeSet<&String> = ta.tree.keys().chain(tb.tree.keys()).collect();
    for name in names {
        let path = join(prefix, name);
        match (ta.tree.get(name), tb.tree.get(name)) {
            (Some(Node::Dir { tree: x }), Some(Node::Dir { tree: y })) => {
                diff(objects, x, y, &path, out)?
            }
            (x, y) if x == y => {}
            (x, y) => {
                let old = Manifest {
                    entries: flatten_node(objects, x, &path)?,
                };
                let new = Manifest {
                    entries: flatten_node(objects, y, &path)?,
                };
                out.extend(old.diff(&new));
            }
        }
    }
    Ok(())
}

/// The node at `path` in tree `root`, walking only the trees on the way.
pub(crate) fn lookup(objects: &ObjectStore, root: &str, path: &str) -> Result<Option<Node>> {
    let mut tree = load_tree(objects, root)?;
    let mut parts = path.split('/').peekable();
    while let Some(part) = parts.next() {
        let Some(node) = tree.tree.remove(part) else {
            return Ok(None);
        };
        if parts.peek().is_none() {
            return Ok(Some(node));
        }
        match node {
            Node::Dir { tree: id } => tree = load_tree(objects, &id)?,
            _ => return Ok(None),
        }
    }
    Ok(None)
}

/// Adds to `seen` every object reachable from snapshot `id` (trees, files, or a flat
/// manifest's files), visiting each subtree once however many snapshots share it.
pub(crate) fn mark(objects: &ObjectStore, id: &str, seen: &mut HashSet<String>) -> Result<()> {
    if !seen.insert(id.to_string()) {
        return Ok(());
    }
    let stored = match load(objects, id) {
        Ok(stored) => stored,
        // Already gone: nothing under it can be kept.
        Err(Error::NotFound(_)) => return Ok(()),
        Err(e) => return Err(e),
    };
    match stored {
        Stored::Flat(manifest) => {
            for entry in manifest.entries.values() {
                if let Entry::File { hash, .. } = entry {
                    seen.insert(hash.clone());
                }
            }
        }
        Stored::Tree(tree) => {
            for node in tree.tree.values() {
                match node {
                    Node::File { hash, .. } => {
                        seen.insert(hash.clone());
                    }
                    Node::Dir { tree } => mark(objects, tree, seen)?,
                    _ => {}
                }
            }
        }
    }
    Ok(())
}
