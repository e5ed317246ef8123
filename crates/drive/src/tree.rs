//! Tree objects: one per directory, as git stores them, so a snapshot writes only the
//! directories that changed (and their parents), two snapshots are compared by
//! skipping every subtree whose id they share, and a restore descends only where the
//! workspace differs.
//!
//! A tree is named by the hash of its canonical form, and stored either whole or,
//! when few names changed since its directory was last stored, as a delta against
//! that whole tree, so a snapshot stores about what changed even in a directory of
//! thousands of names. A snapshot's id is its root tree's id.
//!
//! Snapshots taken before trees existed are a single flat manifest of every path;
//! they are still read, and are turned into trees the first time something needs
//! them as trees. Trees stored before they were named by content are named by their
//! bytes, and are still read.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use serde::{Deserialize, Serialize};

use crate::manifest::{Entry, Manifest, SpecialKind};
use crate::store::{Batch, ObjectStore};
use crate::{Error, Result};

/// One name in a directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum Node {
    /// A regular file, by content.
    File {
        hash: String,
        size: u64,
        exec: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mode: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mtime: Option<i64>,
    },
    /// A symbolic link.
    Symlink { target: String },
    /// A directory, by its tree's id.
    Dir {
        tree: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mode: Option<u32>,
    },
    /// A FIFO, socket or device, by kind.
    Special { special: SpecialKind },
}

impl Node {
    /// The manifest entry this node stands for (a directory loses its tree id).
    pub(crate) fn entry(&self) -> Entry {
        match self {
            Node::File {
                hash,
                size,
                exec,
                mode,
                mtime,
            } => Entry::File {
                hash: hash.clone(),
                size: *size,
                exec: *exec,
                mode: *mode,
                mtime: *mtime,
            },
            Node::Symlink { target } => Entry::Symlink {
                target: target.clone(),
            },
            Node::Dir { mode, .. } => Entry::Dir { mode: *mode },
            Node::Special { special } => Entry::Special { special: *special },
        }
    }
}

/// A directory's names, sorted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Tree {
    pub(crate) tree: BTreeMap<String, Node>,
}

/// How a tree is stored: whole, or as the names that differ from a whole tree (its
/// base). Either way the object is named by the tree it stands for — the hash of
/// that tree's canonical form — so the same directory always has the same id, and a
/// tree is checked against its name once it is rebuilt.
#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
enum Form {
    Delta {
        base: String,
        set: BTreeMap<String, Node>,
        del: BTreeSet<String>,
    },
    Whole(Tree),
}

/// A directory smaller than this is always stored whole: its delta would not be
/// much smaller.
const DELTA_MIN_NAMES: usize = 8;

/// A directory's tree when last stored: its id and names.
pub(crate) type Previous<'a> = (&'a str, &'a BTreeMap<String, Node>);

/// The canonical form of a tree of `nodes` (JSON, names sorted) and the id it gives:
/// the tree's name.
pub(crate) fn canonical(nodes: &BTreeMap<String, Node>) -> (String, Vec<u8>) {
    #[derive(Serialize)]
    struct Borrowed<'a> {
        tree: &'a BTreeMap<String, Node>,
    }
    let json = serde_json::to_vec(&Borrowed { tree: nodes }).expect("trees serialize");
    (blake3::hash(&json).to_hex().to_string(), json)
}

/// The names of tree `id`, which must be stored whole.
fn load_whole(objects: &ObjectStore, id: &str) -> Option<BTreeMap<String, Node>> {
    match load(objects, id).ok()? {
        Stored::Tree { tree, base: None } => Some(tree.tree),
        _ => None,
    }
}

impl Tree {
    /// See [`canonical`].
    pub(crate) fn identify(&self) -> (String, Vec<u8>) {
        canonical(&self.tree)
    }
}

/// Stores the tree of `nodes` (canonical form `json`, id `id`) unless the store has
/// it: as a delta against the whole tree behind `previous` (this directory's tree
/// when last stored) when few names differ from it, else whole. A delta keeps what a
/// snapshot stores in proportion to what changed, not to the directory's size; it is
/// always against a whole tree, so reading one takes two objects at most.
pub(crate) fn store(
    objects: &ObjectStore,
    batch: &mut Batch,
    id: &str,
    json: &[u8],
    nodes: &BTreeMap<String, Node>,
    previous: Option<Previous>,
) -> Result<()> {
    if objects.holds(id) {
        objects.reuse(batch, id);
        return Ok(());
    }
    let delta = previous.and_then(|p| delta_from(objects, nodes, p));
    let bytes = match delta {
        Some((base, form)) => {
            // The base must outlive the snapshot's record, like any reused object.
            objects.reuse(batch, &base);
            deflate(&serde_json::to_vec(&form).expect("trees serialize"))
        }
        None => deflate(json),
    };
    objects.put_hashed(batch, id, &bytes)
}

/// The tree of `nodes` as a delta against the whole tree `previous` is stored
/// against (or is), if that is small enough to be worth it. `None` on any doubt: the
/// base unreadable, or an old kind of object.
fn delta_from(
    objects: &ObjectStore,
    nodes: &BTreeMap<String, Node>,
    (previous, previous_nodes): Previous,
) -> Option<(String, Form)> {
    if nodes.len() < DELTA_MIN_NAMES {
        return None;
    }
    let based_on = objects
        .get_checked(previous, |b| Ok(base_named(b)))
        .ok()??;
    let loaded;
    let (base, whole) = match based_on {
        // Stored whole: the index's names for it are its content when they hash to its
        // name (so the index, a hint, can never skew a delta).
        None if canonical(previous_nodes).0 == previous => (previous.to_string(), previous_nodes),
        None => {
            loaded = load_whole(objects, previous)?;
            (previous.to_string(), &loaded)
        }
        Some(base) => {
            loaded = load_whole(objects, &base)?;
            (base, &loaded)
        }
    };
    let mut set = BTreeMap::new();
    let mut del = BTreeSet::new();
    for (name, node) in nodes {
        if whole.get(name) != Some(node) {
            set.insert(name.clone(), node.clone());
        }
    }
    for name in whole.keys() {
        if !nodes.contains_key(name) {
            del.insert(name.clone());
        }
    }
    if (set.len() + del.len()) * 2 > nodes.len() {
        return None;
    }
    Some((base.clone(), Form::Delta { base, set, del }))
}

/// Deflates a stored form (a tree is mostly hashes and repeated keys, so this
/// stores about a third of the bytes).
fn deflate(json: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut out = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
    out.write_all(json).expect("writing to memory");
    out.finish().expect("writing to memory")
}

fn inflate(bytes: &[u8]) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut json = Vec::new();
    flate2::read::ZlibDecoder::new(bytes)
        .read_to_end(&mut json)
        .ok()?;
    Some(json)
}

/// For stored bytes of a tree: `Some(Some(base))` for a delta, `Some(None)` for a
/// whole tree, `None` for anything else. Reads only the head of the stored form.
fn base_named(bytes: &[u8]) -> Option<Option<String>> {
    use std::io::Read;
    const HEAD: &[u8] = b"{\"base\":\"";
    let mut head = vec![0u8; HEAD.len() + 64];
    let mut decoder = flate2::read::ZlibDecoder::new(bytes);
    let mut filled = 0;
    while filled < head.len() {
        match decoder.read(&mut head[filled..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => filled += n,
        }
    }
    let head = &head[..filled];
    if head.starts_with(HEAD) && head.len() == HEAD.len() + 64 {
        let base = std::str::from_utf8(&head[HEAD.len()..]).ok()?;
        return Some(Some(base.to_string()));
    }
    head.starts_with(b"{\"tree\":").then_some(None)
}

/// What a snapshot id names: a root tree (and, stored as a delta, its base), or an
/// old flat manifest.
pub(crate) enum Stored {
    Tree { tree: Tree, base: Option<String> },
    Flat(Manifest),
}

/// Reads object `id` as a tree or a flat manifest, checking it against its name.
pub(crate) fn load(objects: &ObjectStore, id: &str) -> Result<Stored> {
    objects.get_checked(id, |bytes| {
        let corrupt = || Error::Corrupt(id.to_string());
        if blake3::hash(bytes).to_hex().as_str() == id {
            // Named by its bytes: stored before trees were named by their content.
            return legacy(id, bytes);
        }
        let json = inflate(bytes).ok_or_else(corrupt)?;
        let (tree, base) = match serde_json::from_slice::<Form>(&json).map_err(|_| corrupt())? {
            Form::Whole(tree) => (tree, None),
            Form::Delta { base, set, del } => {
                let Stored::Tree {
                    mut tree,
                    base: None,
                } = load(objects, &base)?
                else {
                    // A delta's base is always a whole tree.
                    return Err(corrupt());
                };
                tree.tree.retain(|name, _| !del.contains(name));
                tree.tree.extend(set);
                (tree, Some(base))
            }
        };
        if tree.identify().0 != id {
            return Err(corrupt());
        }
        Ok(Stored::Tree { tree, base })
    })
}

/// An object named by the hash of its bytes: a deflated or plain JSON tree, or a
/// flat manifest.
fn legacy(id: &str, bytes: &[u8]) -> Result<Stored> {
    let tree = if bytes.first() == Some(&b'{') {
        serde_json::from_slice::<Tree>(bytes).ok()
    } else {
        inflate(bytes).and_then(|json| serde_json::from_slice::<Tree>(&json).ok())
    };
    match tree {
        Some(tree) => Ok(Stored::Tree { tree, base: None }),
        None => Manifest::from_bytes(id, bytes).map(Stored::Flat),
    }
}

/// Reads object `id`, which must be a tree.
pub(crate) fn load_tree(objects: &ObjectStore, id: &str) -> Result<Tree> {
    match load(objects, id)? {
        Stored::Tree { tree, .. } => Ok(tree),
        Stored::Flat(_) => Err(Error::Corrupt(id.to_string())),
    }
}

/// The root tree of snapshot `id`: itself, or (for a flat manifest) the trees that
/// hold the same paths, stored now.
pub(crate) fn root_of(objects: &ObjectStore, id: &str) -> Result<String> {
    match load(objects, id)? {
        Stored::Tree { .. } => Ok(id.to_string()),
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
        if matches!(entry, Entry::Dir { .. }) {
            dirs.entry(path.clone()).or_default();
        }
    }
    for (path, entry) in &manifest.entries {
        let (parent, name) = split(path);
        let node = match entry {
            Entry::File {
                hash,
                size,
                exec,
                mode,
                mtime,
            } => Node::File {
                hash: hash.clone(),
                size: *size,
                exec: *exec,
                mode: *mode,
                mtime: *mtime,
            },
            Entry::Symlink { target } => Node::Symlink {
                target: target.clone(),
            },
            Entry::Special { special } => Node::Special { special: *special },
            Entry::Dir { .. } => continue,
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
        let (id, json) = tree.identify();
        store(objects, batch, &id, &json, &tree.tree, None)?;
        if path.is_empty() {
            root = id;
        } else {
            let (parent, name) = split(&path);
            dirs.entry(parent.to_string()).or_default().tree.insert(
                name.to_string(),
                Node::Dir {
                    tree: id,
                    mode: match manifest.entries.get(&path) {
                        Some(Entry::Dir { mode }) => *mode,
                        _ => None,
                    },
                },
            );
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
        if let Node::Dir { tree, .. } = &node {
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
        if let Node::Dir { tree, .. } = node {
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
            (
                Some(Node::Dir {
                    tree: x,
                    mode: mode_x,
                }),
                Some(Node::Dir {
                    tree: y,
                    mode: mode_y,
                }),
            ) => {
                if mode_x != mode_y {
                    out.push(crate::Change {
                        path: path.clone(),
                        kind: crate::ChangeKind::Modified,
                    });
                }
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
            Node::Dir { tree: id, .. } => tree = load_tree(objects, &id)?,
            _ => return Ok(None),
        }
    }
    Ok(None)
}

/// Adds to `out` every object reachable from snapshot `id` that is missing, or (with
/// `read`) does not hash to its name, each once (`seen`): what a snapshot lost. A tree
/// that cannot be read hides what is under it, so only it is named.
pub(crate) fn damage(
    objects: &ObjectStore,
    id: &str,
    read: bool,
    seen: &mut HashSet<String>,
    out: &mut Vec<(String, String)>,
) {
    if !seen.insert(id.to_string()) {
        return;
    }
    let stored = match load(objects, id) {
        Ok(stored) => stored,
        Err(e) => {
            out.push((id.to_string(), problem(&e)));
            return;
        }
    };
    let mut files = Vec::new();
    let mut dirs = Vec::new();
    match stored {
        Stored::Flat(manifest) => {
            for entry in manifest.entries.into_values() {
                if let Entry::File { hash, .. } = entry {
                    files.push(hash);
                }
            }
        }
        Stored::Tree { tree, .. } => {
            for node in tree.tree.into_values() {
                match node {
                    Node::File { hash, .. } => files.push(hash),
                    Node::Dir { tree, .. } => dirs.push(tree),
                    _ => {}
                }
            }
        }
    }
    for hash in files {
        if !seen.insert(hash.clone()) {
            continue;
        }
        let lost = match read {
            true => objects.get(&hash).err().map(|e| problem(&e)),
            false => match objects.contains(&hash) {
                Ok(true) => None,
                Ok(false) => Some("missing".to_string()),
                Err(e) => Some(problem(&e)),
            },
        };
        if let Some(why) = lost {
            out.push((hash, why));
        }
    }
    for dir in dirs {
        damage(objects, &dir, read, seen, out);
    }
}

/// How a lost object is described: `missing`, `corrupt`, or what reading it said.
fn problem(e: &Error) -> String {
    match e {
        Error::NotFound(_) => "missing".into(),
        Error::Corrupt(_) => "corrupt".into(),
        other => format!("unreadable: {other}"),
    }
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
        Stored::Tree { tree, base } => {
            if let Some(base) = base {
                seen.insert(base);
            }
            for node in tree.tree.values() {
                match node {
                    Node::File { hash, .. } => {
                        seen.insert(hash.clone());
                    }
                    Node::Dir { tree, .. } => mark(objects, tree, seen)?,
                    _ => {}
                }
            }
        }
    }
    Ok(())
}
