use std::fs;
use std::os::unix::fs::PermissionsExt;

use super::*;

fn setup() -> (tempfile::TempDir, Drive, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let drive = Drive::open(dir.path().join("drive")).unwrap();
    let ws = dir.path().join("ws");
    fs::create_dir_all(ws.join("src")).unwrap();
    fs::create_dir_all(ws.join(".git/refs")).unwrap();
    fs::create_dir_all(ws.join("empty")).unwrap();
    fs::write(ws.join("src/lib.rs"), "fn a() {}\n").unwrap();
    fs::write(ws.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
    fs::write(ws.join("run.sh"), "#!/bin/sh\n").unwrap();
    fs::set_permissions(ws.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("src/lib.rs", ws.join("link")).unwrap();
    (dir, drive, ws)
}

fn tree(ws: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for e in walkdir::WalkDir::new(ws).min_depth(1).sort_by_file_name() {
        let e = e.unwrap();
        let rel = e.path().strip_prefix(ws).unwrap().display().to_string();
        let desc = if e.file_type().is_symlink() {
            format!("-> {}", fs::read_link(e.path()).unwrap().display())
        } else if e.file_type().is_dir() {
            "dir".into()
        } else {
            let mode = e.metadata().unwrap().permissions().mode() & 0o111;
            format!("{mode:o} {}", fs::read_to_string(e.path()).unwrap())
        };
        out.push((rel, desc));
    }
    out
}

#[test]
fn restore_returns_every_kind_of_entry_including_git() {
    let (_d, drive, ws) = setup();
    let before = tree(&ws);
    let id = drive.snapshot(&ws).unwrap();

    fs::write(ws.join("src/lib.rs"), "broken").unwrap();
    fs::remove_file(ws.join(".git/HEAD")).unwrap();
    fs::remove_dir(ws.join("empty")).unwrap();
    fs::create_dir_all(ws.join("new/deep")).unwrap();
    fs::write(ws.join("new/deep/file"), "x").unwrap();
    fs::set_permissions(ws.join("run.sh"), fs::Permissions::from_mode(0o644)).unwrap();
    fs::remove_file(ws.join("link")).unwrap();
    fs::write(ws.join("link"), "now a file").unwrap();
    assert_ne!(tree(&ws), before);

    drive.restore(&ws, &id).unwrap();
    assert_eq!(tree(&ws), before);
    assert_eq!(drive.snapshot(&ws).unwrap(), id, "same tree, same id");
}

#[test]
fn restore_hydrates_an_empty_directory() {
    let (d, drive, ws) = setup();
    let id = drive.snapshot(&ws).unwrap();
    let fresh = d.path().join("fresh");
    drive.restore(&fresh, &id).unwrap();
    assert_eq!(tree(&fresh), tree(&ws));
}

#[test]
fn a_change_within_one_timestamp_tick_is_seen() {
    let (_d, drive, ws) = setup();
    let a = drive.snapshot(&ws).unwrap();
    fs::write(ws.join("src/lib.rs"), "fn b() {}\n").unwrap(); // same size
    let b = drive.snapshot(&ws).unwrap();
    assert_ne!(a, b);
    let changes = drive.diff(&a, &b).unwrap();
    assert_eq!(
        changes,
        vec![Change {
            path: "src/lib.rs".into(),
            kind: ChangeKind::Modified
        }]
    );
}

#[test]
fn diff_names_added_removed_and_modified_paths() {
    let (_d, drive, ws) = setup();
    let a = drive.snapshot(&ws).unwrap();
    fs::write(ws.join("added"), "1").unwrap();
    fs::remove_file(ws.join("run.sh")).unwrap();
    fs::write(ws.join(".git/HEAD"), "detached").unwrap();
    let b = drive.snapshot(&ws).unwrap();
    let kinds: Vec<_> = drive
        .diff(&a, &b)
        .unwrap()
        .into_iter()
        .map(|c| (c.path, c.kind))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (".git/HEAD".into(), ChangeKind::Modified),
            ("added".into(), ChangeKind::Added),
            ("run.sh".into(), ChangeKind::Removed),
        ]
    );
}

#[test]
fn the_runtime_directory_is_left_out() {
    let (_d, drive, ws) = setup();
    let a = drive.snapshot(&ws).unwrap();
    fs::create_dir_all(ws.join(EXCLUDED_DIR)).unwrap();
    fs::write(ws.join(EXCLUDED_DIR).join("world.db"), "db").unwrap();
    assert_eq!(drive.snapshot(&ws).unwrap(), a);
    drive.restore(&ws, &a).unwrap();
    assert!(ws.join(EXCLUDED_DIR).join("world.db").exists());
}

#[test]
fn a_corrupt_object_is_reported() {
    let (d, drive, ws) = setup();
    let id = drive.snapshot(&ws).unwrap();
    let manifest = drive.manifest(&id).unwrap();
    let Some(Entry::File { hash, .. }) = manifest.entries.get("src/lib.rs") else {
        panic!("file missing")
    };
    let path = d
        .path()
        .join("drive/objects")
        .join(&hash[..2])
        .join(&hash[2..]);
    fs::write(&path, "tampered").unwrap();
    fs::write(ws.join("src/lib.rs"), "changed").unwrap();
    assert!(matches!(drive.restore(&ws, &id), Err(Error::Corrupt(h)) if &h == hash));
    assert!(matches!(drive.manifest("nope"), Err(Error::NotFound(_))));
}

#[test]
fn gc_keeps_what_snapshots_reference_and_removes_the_rest() {
    let (_d, drive, ws) = setup();
    let old = drive.snapshot(&ws).unwrap();
    fs::write(ws.join("src/lib.rs"), "fn only_in_new() {}\n").unwrap();
    let new = drive.snapshot(&ws).unwrap();
    // Nothing is old enough yet: a snapshot in progress is never swept.
    assert_eq!(
        drive
            .gc(
                std::slice::from_ref(&new),
                std::time::Duration::from_secs(3600)
            )
            .unwrap(),
        0
    );
    let removed = drive
        .gc(std::slice::from_ref(&new), std::time::Duration::ZERO)
        .unwrap();
    assert_eq!(removed, 3, "the old root and src trees and the old lib.rs");
    assert!(matches!(drive.manifest(&old), Err(Error::NotFound(_))));
    let fresh = ws.parent().unwrap().join("fresh");
    drive.restore(&fresh, &new).unwrap();
    assert_eq!(
        tree(&fresh),
        tree(&ws),
        "everything the kept snapshot needs is there"
    );
}

#[test]
fn special_files_are_recorded_by_kind_and_never_read() {
    let (_d, drive, ws) = setup();
    nix::unistd::mkfifo(
        &ws.join("pipe"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let _socket = std::os::unix::net::UnixListener::bind(ws.join("sock")).unwrap();
    // On a thread with a deadline: reading the FIFO would block forever.
    let (tx, rx) = std::sync::mpsc::channel();
    let (d2, ws2) = (drive.clone(), ws.clone());
    std::thread::spawn(move || tx.send(d2.snapshot(&ws2)).unwrap());
    let id = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("a snapshot over a FIFO finishes")
        .unwrap();
    let manifest = drive.manifest(&id).unwrap();
    assert_eq!(
        manifest.entries["pipe"],
        Entry::Special {
            special: SpecialKind::Fifo
        }
    );
    assert_eq!(
        manifest.entries["sock"],
        Entry::Special {
            special: SpecialKind::Socket
        }
    );
    // A restore brings the FIFO back and leaves the rest as it was.
    fs::remove_file(ws.join("pipe")).unwrap();
    drive.restore(&ws, &id).unwrap();
    use std::os::unix::fs::FileTypeExt;
    assert!(fs::symlink_metadata(ws.join("pipe"))
        .unwrap()
        .file_type()
        .is_fifo());
    assert_eq!(drive.snapshot(&ws).unwrap(), id);
}

#[test]
fn big_files_are_streamed_and_checked_on_the_way_back() {
    let (_d, drive, ws) = setup();
    // Bigger than what is read whole, with content that is not all one byte.
    let big: Vec<u8> = (0..5_000_000u32).map(|i| (i % 251) as u8).collect();
    fs::write(ws.join("big.bin"), &big).unwrap();
    let id = drive.snapshot(&ws).unwrap();
    let Entry::File { hash, size, .. } = drive.manifest(&id).unwrap().entries["big.bin"].clone()
    else {
        panic!()
    };
    assert_eq!(size, big.len() as u64);
    assert_eq!(hash, blake3::hash(&big).to_hex().to_string());
    fs::write(ws.join("big.bin"), "changed").unwrap();
    drive.restore(&ws, &id).unwrap();
    assert_eq!(fs::read(ws.join("big.bin")).unwrap(), big);

    // A corrupt object is refused and leaves the workspace's file alone.
    let object = drive.objects_dir().join(&hash[..2]).join(&hash[2..]);
    fs::write(&object, b"tampered").unwrap();
    fs::write(ws.join("big.bin"), "changed").unwrap();
    assert!(matches!(drive.restore(&ws, &id), Err(Error::Corrupt(_))));
    assert_eq!(fs::read(ws.join("big.bin")).unwrap(), b"changed");
}

#[test]
fn sparse_files_are_stored_and_restored_as_holes() {
    use std::os::unix::fs::{FileExt as _, MetadataExt as _};
    let (_d, drive, ws) = setup();
    // 256 MiB long, with a little data in the middle and at the end: a few KiB on disk.
    let file = fs::File::create(ws.join("sparse.img")).unwrap();
    file.set_len(256 << 20).unwrap();
    file.write_all_at(b"middle", 100 << 20).unwrap();
    file.write_all_at(b"end", (256 << 20) - 3).unwrap();
    drop(file);
    let on_disk = |path: &Path| fs::metadata(path).unwrap().blocks() * 512;
    assert!(on_disk(&ws.join("sparse.img")) < 1 << 20);
    let id = drive.snapshot(&ws).unwrap();
    let Entry::File { hash, size, .. } = drive.manifest(&id).unwrap().entries["sparse.img"].clone()
    else {
        panic!()
    };
    assert_eq!(size, 256 << 20);
    let object = drive.objects_dir().join(&hash[..2]).join(&hash[2..]);
    assert_eq!(fs::metadata(&object).unwrap().len(), 256 << 20);
    assert!(
        on_disk(&object) < 1 << 20,
        "the store keeps the holes: {} bytes on disk",
        on_disk(&object)
    );

    fs::remove_file(ws.join("sparse.img")).unwrap();
    drive.restore(&ws, &id).unwrap();
    let back = ws.join("sparse.img");
    assert_eq!(fs::metadata(&back).unwrap().len(), 256 << 20);
    assert!(on_disk(&back) < 1 << 20, "restored as holes too");
    let mut word = [0u8; 6];
    fs::File::open(&back)
        .unwrap()
        .read_exact_at(&mut word, 100 << 20)
        .unwrap();
    assert_eq!(&word, b"middle");
    let mut tail = [0u8; 3];
    fs::File::open(&back)
        .unwrap()
        .read_exact_at(&mut tail, (256 << 20) - 3)
        .unwrap();
    assert_eq!(&tail, b"end");
    assert_eq!(drive.snapshot(&ws).unwrap(), id, "the same content");
}

#[test]
fn a_snapshot_exports_as_a_tar_that_tar_unpacks_to_the_same_tree() {
    let (dir, drive, ws) = setup();
    let long = "d".repeat(120);
    fs::create_dir_all(ws.join(&long)).unwrap();
    fs::write(ws.join(&long).join("deep.txt"), "far down\n").unwrap();
    nix::unistd::mkfifo(&ws.join("pipe"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let id = drive.snapshot(&ws).unwrap();
    let mut archive = Vec::new();
    drive.export_tar(&id, 1_800_000_000, &mut archive).unwrap();
    let mut again = Vec::new();
    drive.export_tar(&id, 1_800_000_000, &mut again).unwrap();
    assert_eq!(archive, again, "the same snapshot gives the same bytes");

    // The system's tar, as a person downloading it would use.
    let out = dir.path().join("out");
    fs::create_dir_all(&out).unwrap();
    let mut tar = std::process::Command::new("tar")
        .args(["-x", "-f", "-", "-C"])
        .arg(&out)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(tar.stdin.as_mut().unwrap(), &archive).unwrap();
    drop(tar.stdin.take());
    assert!(tar.wait().unwrap().success());
    use std::os::unix::fs::FileTypeExt;
    let pipe = fs::symlink_metadata(out.join("pipe")).unwrap();
    assert!(pipe.file_type().is_fifo(), "a FIFO stays a FIFO");
    fs::remove_file(ws.join("pipe")).unwrap();
    fs::remove_file(out.join("pipe")).unwrap();
    assert_eq!(tree(&out), tree(&ws));
    // A file carries the time it was last modified; a directory the time the caller
    // gave (when the snapshot was recorded).
    use std::os::unix::fs::MetadataExt;
    let dated = fs::symlink_metadata(out.join("src/lib.rs")).unwrap();
    let written = fs::symlink_metadata(ws.join("src/lib.rs")).unwrap();
    assert_eq!(dated.mtime(), written.mtime());
    let directory = fs::symlink_metadata(out.join("src")).unwrap();
    assert_eq!(directory.mtime(), 1_800_000_000);

    // A corrupt object cuts the archive short with an error, never wrong bytes.
    let Entry::File { hash, .. } = drive.manifest(&id).unwrap().entries["src/lib.rs"].clone()
    else {
        panic!()
    };
    let object = drive.objects_dir().join(&hash[..2]).join(&hash[2..]);
    fs::write(&object, b"fn b() {}\n").unwrap();
    assert!(drive.export_tar(&id, 0, std::io::sink()).is_err());
}

fn object_count(drive: &Drive) -> usize {
    walkdir::WalkDir::new(drive.objects_dir())
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_type().is_file() && !e.path().starts_with(drive.objects_dir().join("tmp"))
        })
        .count()
}

fn wide_tree(ws: &Path) {
    for d in 0..20 {
        for f in 0..20 {
            let dir = ws.join(format!("pkg{d}/sub"));
            fs::create_dir_all(&dir).unwrap();
            fs::write(
                dir.join(format!("f{f}.txt")),
                format!("{d}/{f}\n").repeat(50),
            )
            .unwrap();
        }
    }
}

#[test]
fn a_snapshot_with_nothing_changed_stores_nothing() {
    let (_d, drive, ws) = setup();
    wide_tree(&ws);
    let a = drive.snapshot(&ws).unwrap();
    let (objects, bytes) = (object_count(&drive), drive.stored_bytes());
    assert_eq!(drive.snapshot(&ws).unwrap(), a);
    assert_eq!(object_count(&drive), objects);
    assert_eq!(drive.stored_bytes(), bytes);
}

#[test]
fn a_change_stores_its_file_and_the_trees_above_it_only() {
    let (_d, drive, ws) = setup();
    wide_tree(&ws);
    let a = drive.snapshot(&ws).unwrap();
    let (objects, bytes) = (object_count(&drive), drive.stored_bytes());
    fs::write(ws.join("pkg7/sub/f3.txt"), "changed\n").unwrap();
    let b = drive.snapshot(&ws).unwrap();
    assert_eq!(
        object_count(&drive) - objects,
        4,
        "the file, and the trees of pkg7/sub, pkg7 and the root"
    );
    let stored = drive.stored_bytes() - bytes;
    let sub_tree = drive.manifest(&b).unwrap().entries.len(); // a bound, not exact
    assert!(
        stored < 8 * 1024,
        "stored {stored} bytes for one 8-byte change ({sub_tree} paths)"
    );
    assert_eq!(
        drive.diff(&a, &b).unwrap(),
        vec![Change {
            path: "pkg7/sub/f3.txt".into(),
            kind: ChangeKind::Modified
        }]
    );
}

/// Collects everything snapshot `id` does not reach, then restores it into `dest` and
/// checks that it equals `ws`.
fn restores_after_gc_keeping_only(drive: &Drive, id: &str, dest: &Path, ws: &Path) {
    drive
        .gc(&[id.to_string()], std::time::Duration::ZERO)
        .unwrap();
    drive.restore(dest, id).unwrap();
    assert_eq!(
        tree(dest),
        tree(ws),
        "everything snapshot {id} needs is kept"
    );
}

/// Directories of 200 files each: stored whole, one's tree is about 10 KB.
fn big_directories(ws: &Path) {
    for d in 0..10 {
        let dir = ws.join(format!("pkg{d}/sub"));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..200 {
            fs::write(dir.join(format!("f{f}.txt")), format!("{d}/{f}\n")).unwrap();
        }
    }
}

#[test]
fn changes_in_big_directories_store_about_what_changed_and_read_back_whole() {
    let (d, drive, ws) = setup();
    big_directories(&ws);
    drive.snapshot(&ws).unwrap();
    let mut last = String::new();
    for round in 0..6 {
        let before = drive.stored_bytes();
        let mut changed = 0;
        for d in 0..10 {
            let body = format!("round {round} of pkg{d}\n");
            changed += body.len();
            fs::write(ws.join(format!("pkg{d}/sub/f{round}.txt")), body).unwrap();
        }
        last = drive.snapshot(&ws).unwrap();
        // Whole trees would be about 100 KB: ten 200-name directories rewritten.
        let stored = (drive.stored_bytes() - before) as usize;
        assert!(
            stored < changed + 21 * 600,
            "round {round}: stored {stored} bytes for {changed} changed"
        );
    }
    // The trees are named by what they hold, however stored: a drive that never
    // saw the earlier versions names the same files alike.
    let fresh = Drive::open(d.path().join("fresh-drive")).unwrap();
    assert_eq!(fresh.snapshot(&ws).unwrap(), last);

    // A delta builds on a whole tree that only an older snapshot names: gc keeping
    // the newest alone keeps it, and the newest reads back whole.
    let sub = match tree::lookup(&drive.objects, &last, "pkg3/sub").unwrap() {
        Some(tree::Node::Dir { tree, .. }) => tree,
        other => panic!("pkg3/sub is {other:?}"),
    };
    let Ok(tree::Stored::Tree {
        base: Some(base), ..
    }) = tree::load(&drive.objects, &sub)
    else {
        panic!("pkg3/sub is stored as a delta")
    };
    restores_after_gc_keeping_only(&drive, &last, &d.path().join("elsewhere"), &ws);

    // A damaged base is reported, never read as some other tree.
    fs::write(drive.objects_dir().join(&base[..2]).join(&base[2..]), "x").unwrap();
    let again = d.path().join("again");
    assert!(matches!(drive.restore(&again, &last), Err(Error::Corrupt(h)) if h == base));
}

#[test]
fn restore_rewrites_only_what_differs() {
    use std::os::unix::fs::MetadataExt;
    let (_d, drive, ws) = setup();
    wide_tree(&ws);
    let id = drive.snapshot(&ws).unwrap();
    let inode = |p: &str| fs::metadata(ws.join(p)).unwrap().ino();
    let (same_dir, other_dir) = (inode("pkg7/sub/f4.txt"), inode("pkg2/sub/f1.txt"));
    fs::write(ws.join("pkg7/sub/f3.txt"), "changed\n").unwrap();
    fs::remove_dir_all(ws.join("pkg9")).unwrap();
    drive.restore(&ws, &id).unwrap();
    assert_eq!(drive.snapshot(&ws).unwrap(), id);
    assert_eq!(
        inode("pkg7/sub/f4.txt"),
        same_dir,
        "an equal file is left in place"
    );
    assert_eq!(inode("pkg2/sub/f1.txt"), other_dir);
    assert_eq!(
        fs::read_to_string(ws.join("pkg7/sub/f3.txt")).unwrap(),
        "7/3\n".repeat(50)
    );
}

#[test]
fn snapshots_stored_as_one_flat_manifest_are_still_read() {
    let (d, drive, ws) = setup();
    let tree_id = drive.snapshot(&ws).unwrap();
    // The format snapshots had before trees: one manifest of every path.
    let flat = drive.manifest(&tree_id).unwrap();
    let mut batch = store::Batch::default();
    let flat_id = drive.objects.put(&mut batch, &flat.to_bytes()).unwrap();
    drive.objects.finish(&mut batch).unwrap();
    assert_ne!(flat_id, tree_id);

    assert_eq!(drive.manifest(&flat_id).unwrap(), flat);
    assert!(drive.diff(&flat_id, &tree_id).unwrap().is_empty());
    assert_eq!(
        drive.read_file(&flat_id, "src/lib.rs").unwrap().unwrap(),
        b"fn a() {}\n"
    );
    let fresh = d.path().join("fresh");
    drive.restore(&fresh, &flat_id).unwrap();
    assert_eq!(tree(&fresh), tree(&ws));
    // gc keeps what the flat manifest names.
    restores_after_gc_keeping_only(&drive, &flat_id, &d.path().join("again"), &ws);
}

#[test]
fn the_index_is_read_back_by_a_new_process() {
    let (d, drive, ws) = setup();
    wide_tree(&ws);
    drive.snapshot(&ws).unwrap();
    // Stamps are kept only for files that have settled.
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let id = drive.snapshot(&ws).unwrap();
    let read = drive.files_read();
    assert_eq!(drive.snapshot(&ws).unwrap(), id);
    assert_eq!(
        drive.files_read(),
        read,
        "nothing is read when nothing changed"
    );

    // A new drive on the same directory (a restarted process) reads the index back.
    let reopened = Drive::open(d.path().join("drive")).unwrap();
    assert_eq!(reopened.snapshot(&ws).unwrap(), id);
    assert_eq!(reopened.files_read(), 0);
    fs::write(ws.join("pkg3/sub/f1.txt"), "new").unwrap();
    reopened.snapshot(&ws).unwrap();
    assert_eq!(reopened.files_read(), 1, "only the changed file is read");
}

/// Gives every file under `dir` a modification time a minute ago, as a session's
/// files mostly have.
fn age(dir: &Path) {
    let then = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
    for e in walkdir::WalkDir::new(dir) {
        let e = e.unwrap();
        if e.file_type().is_file() {
            fs::File::options()
                .write(true)
                .open(e.path())
                .unwrap()
                .set_modified(then)
                .unwrap();
        }
    }
}

#[test]
fn a_workspace_restored_on_another_host_snapshots_without_reading_a_file() {
    let (d, drive, ws) = setup();
    wide_tree(&ws);
    age(&ws);
    let id = drive.snapshot(&ws).unwrap();
    // Another host: its own index over the same objects, and nothing of the workspace.
    let host = Drive::open_at(d.path().join("host2"), d.path().join("drive/objects")).unwrap();
    let there = d.path().join("there");
    host.restore(&there, &id).unwrap();
    let read = host.files_read();
    assert_eq!(host.snapshot(&there).unwrap(), id);
    assert_eq!(
        host.files_read(),
        read,
        "the restore told the index what it made"
    );
    // A process started afresh on that host reads the index back too.
    let restarted = Drive::open_at(d.path().join("host2"), d.path().join("drive/objects")).unwrap();
    assert_eq!(restarted.snapshot(&there).unwrap(), id);
    assert_eq!(restarted.files_read(), 0);
    // A write after the restore, even one keeping the size, is seen.
    let changed = there.join("pkg3/sub/f1.txt");
    let len = fs::metadata(&changed).unwrap().len() as usize;
    fs::write(&changed, "x".repeat(len)).unwrap();
    let after = restarted.snapshot(&there).unwrap();
    assert_ne!(after, id);
    assert_eq!(restarted.files_read(), 1, "only the changed file is read");
    assert_eq!(
        restarted
            .read_file(&after, "pkg3/sub/f1.txt")
            .unwrap()
            .unwrap(),
        "x".repeat(len).as_bytes()
    );
    // A file whose recorded time is too recent to be told from a write made in the same
    // moment is read again, not trusted.
    fs::write(ws.join("fresh.txt"), "new").unwrap();
    let with_fresh = drive.snapshot(&ws).unwrap();
    let third = d.path().join("third");
    host.restore(&third, &with_fresh).unwrap();
    let read = host.files_read();
    assert_eq!(host.snapshot(&third).unwrap(), with_fresh);
    assert_eq!(host.files_read(), read + 1, "only the fresh file is read");
}

/// A small deterministic generator (no dependency for a test's dice).
struct Dice(u64);

impl Dice {
    fn roll(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        (!items.is_empty()).then(|| &items[self.roll(items.len())])
    }
}

fn listing(ws: &Path) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let (mut dirs, mut files) = (vec![ws.to_path_buf()], Vec::new());
    for e in walkdir::WalkDir::new(ws).min_depth(1) {
        let e = e.unwrap();
        if e.file_type().is_dir() {
            dirs.push(e.path().to_path_buf());
        } else if e.file_type().is_file() {
            files.push(e.path().to_path_buf());
        }
    }
    (dirs, files)
}

/// One random change to the workspace; returns what it did.
fn random_change(ws: &Path, dice: &mut Dice) -> String {
    let names = ["a", "b", "c", "x.txt", "y.rs", "z"];
    let (dirs, files) = listing(ws);
    let dir = dice.pick(&dirs).unwrap().clone();
    let name = names[dice.roll(names.len())];
    let target = dir.join(name);
    let exists = target.symlink_metadata().is_ok();
    match dice.roll(9) {
        0 | 1 if !exists => {
            let size = 1 + dice.roll(40);
            fs::write(&target, "q".repeat(size)).unwrap();
            format!("write {}", target.display())
        }
        2 => match dice.pick(&files) {
            // Same size, other bytes: only the content tells.
            Some(f) => {
                let len = fs::metadata(f).unwrap().len() as usize;
                let fill = ["1", "2", "3"][dice.roll(3)];
                fs::write(f, fill.repeat(len)).unwrap();
                format!("rewrite {}", f.display())
            }
            None => "nothing".into(),
        },
        3 => match dice.pick(&files) {
            Some(f) => {
                fs::remove_file(f).unwrap();
                format!("remove {}", f.display())
            }
            None => "nothing".into(),
        },
        4 if !exists => {
            fs::create_dir_all(target.join("deep")).unwrap();
            fs::write(target.join("deep/f"), "f").unwrap();
            format!("mkdir {}", target.display())
        }
        5 if dir != ws => {
            // Move a directory, with what it holds, somewhere else (not into itself).
            let to = dice
                .pick(&dirs)
                .unwrap()
                .join(format!("moved{}", dice.roll(100)));
            if to.starts_with(&dir) || to.symlink_metadata().is_ok() {
                return "nothing".into();
            }
            fs::rename(&dir, &to).unwrap();
            format!("move {} to {}", dir.display(), to.display())
        }
        6 => match dice.pick(&files) {
            Some(f) => {
                let mode = fs::metadata(f).unwrap().permissions().mode() ^ 0o111;
                fs::set_permissions(f, fs::Permissions::from_mode(mode)).unwrap();
                format!("chmod {}", f.display())
            }
            None => "nothing".into(),
        },
        7 if dir != ws => {
            fs::remove_dir_all(&dir).unwrap();
            format!("rm -r {}", dir.display())
        }
        8 if !exists || target.is_symlink() => {
            let _ = fs::remove_file(&target);
            let to = ["x.txt", "../a", "nowhere"][dice.roll(3)];
            std::os::unix::fs::symlink(to, &target).unwrap();
            format!("symlink {} -> {to}", target.display())
        }
        _ => "nothing".into(),
    }
}

#[test]
fn watched_snapshots_equal_full_scans_through_random_changes() {
    let (d, drive, ws) = setup();
    drive.snapshot(&ws).unwrap();
    let seed = std::env::var("STEADFAST_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x9E37_79B9_7F4A_7C15);
    let mut dice = Dice(seed);
    let mut taken = Vec::new();
    let full_scan = |ws: &Path| {
        // A drive with no index at all reads every file.
        let fresh_dir = d.path().join("fresh-drive");
        let _ = fs::remove_dir_all(&fresh_dir);
        Drive::open(&fresh_dir).unwrap().snapshot(ws).unwrap()
    };
    for step in 0..300 {
        let mut done: Vec<String> = (0..1 + dice.roll(3))
            .map(|_| random_change(&ws, &mut dice))
            .collect();
        if step % 7 == 6 {
            // Back to an earlier snapshot (a rollback), then changed again.
            let back: &String = dice.pick(&taken).unwrap();
            drive.restore(&ws, back).unwrap();
            assert_eq!(full_scan(&ws), *back, "seed {seed}, step {step}: restored");
            done.push(format!("restore {back}"));
            done.push(random_change(&ws, &mut dice));
        }
        let watched = drive.snapshot(&ws).unwrap();
        assert_eq!(
            watched,
            full_scan(&ws),
            "seed {seed}, step {step} after {done:?}"
        );
        taken.push(watched);
    }
    // Once every file has settled (and been looked at once more to keep its stamp),
    // a snapshot with nothing changed reads nothing.
    std::thread::sleep(std::time::Duration::from_millis(2100));
    drive.snapshot(&ws).unwrap();
    let read = drive.files_read();
    drive.snapshot(&ws).unwrap();
    assert_eq!(drive.files_read(), read);
}

/// Two states of a workspace that differ in many files and directories, so a restore
/// from one to the other takes long enough for other passes to land in the middle.
fn two_states(drive: &Drive, ws: &Path) -> (String, String) {
    for d in 0..8 {
        for f in 0..40 {
            let dir = ws.join(format!("d{d}"));
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join(format!("f{f}.txt")), format!("a {d} {f}\n")).unwrap();
        }
    }
    let a = drive.snapshot(ws).unwrap();
    for d in 0..8 {
        for f in 0..40 {
            let path = ws.join(format!("d{d}/f{f}.txt"));
            if f % 3 == 0 {
                fs::remove_file(&path).unwrap();
            } else {
                fs::write(&path, format!("b {d} {f}\n")).unwrap();
            }
        }
        fs::write(ws.join(format!("d{d}/new.txt")), "only in b\n").unwrap();
    }
    let b = drive.snapshot(ws).unwrap();
    assert_ne!(a, b);
    (a, b)
}

#[test]
fn sixteen_concurrent_snapshots_and_restores_of_one_workspace_never_collide_or_mix() {
    let (_dir, drive, ws) = setup();
    let (a, b) = two_states(&drive, &ws);
    let threads: Vec<_> = (0..16)
        .map(|i| {
            let (drive, ws, a, b) = (drive.clone(), ws.clone(), a.clone(), b.clone());
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                for round in 0..12 {
                    if i % 2 == 0 {
                        let to = if (i / 2 + round) % 2 == 0 { &a } else { &b };
                        drive.restore(&ws, to).unwrap();
                    } else {
                        seen.push(drive.snapshot(&ws).unwrap());
                    }
                }
                seen
            })
        })
        .collect();
    for t in threads {
        for id in t.join().unwrap() {
            // A snapshot never records a restore half done.
            assert!(id == a || id == b, "a snapshot of a mixed workspace: {id}");
        }
    }
    // Whatever the order, the workspace ends whole and restores to either state.
    for id in [&a, &b] {
        drive.restore(&ws, id).unwrap();
        assert_eq!(&drive.snapshot(&ws).unwrap(), id);
    }
    let leftovers: Vec<_> = walkdir::WalkDir::new(&ws)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .contains("steadfast-restore")
        })
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

#[test]
fn drives_opened_twice_on_one_directory_snapshot_one_workspace_at_once() {
    // Two processes on one host share the per-host index files: their temporary
    // files never collide.
    let (dir, drive, ws) = setup();
    let (_, b) = two_states(&drive, &ws);
    for _ in 0..5 {
        // No index files: every pass writes every directory's record at once.
        fs::remove_dir_all(dir.path().join("drive/statcache")).unwrap();
        let start = Arc::new(std::sync::Barrier::new(8));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (drive_dir, ws, start) = (dir.path().join("drive"), ws.clone(), start.clone());
                std::thread::spawn(move || {
                    let drive = Drive::open(drive_dir).unwrap();
                    start.wait();
                    drive.snapshot(&ws).unwrap()
                })
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap(), b);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_past_its_deadline_is_abandoned_with_a_timeout() {
    let (_dir, drive, ws) = setup();
    two_states(&drive, &ws);
    // A fresh drive over the same store has no index: a full pass, never done at once.
    let fresh = Drive::open(_dir.path().join("drive")).unwrap();
    match fresh.snapshot_within(&ws, std::time::Duration::ZERO).await {
        Err(Error::Io {
            op: "snapshot",
            source,
            ..
        }) => {
            assert_eq!(source.kind(), std::io::ErrorKind::TimedOut)
        }
        other => panic!("{other:?}"),
    }
    // Given time, the same snapshot is taken.
    let id = fresh
        .snapshot_within(&ws, std::time::Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(id.id, drive.snapshot(&ws).unwrap());
}

/// Restores one after another with no snapshot between them, then a snapshot, in a
/// random order: each restore brings the workspace to its target, and each snapshot
/// records it. (A restore once trusted the index for directories an earlier restore
/// had already changed, and left the workspace where that one put it.)
#[test]
fn restores_in_a_row_each_reach_their_target() {
    let (_dir, drive, ws) = setup();
    let (a, b) = two_states(&drive, &ws);
    let mut x: u64 = 12345; // xorshift: the same order every run
    let mut ops = Vec::new();
    let mut at = b.clone();
    for round in 0..150 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let target = match x % 4 {
            0 => Some((&a, "restore a")),
            1 => Some((&b, "restore b")),
            _ => None,
        };
        match target {
            Some((to, op)) => {
                drive.restore(&ws, to).unwrap();
                at = to.clone();
                ops.push(op);
            }
            None => {
                ops.push("snapshot");
                let got = drive.snapshot(&ws).unwrap();
                let recent = &ops[ops.len().saturating_sub(8)..];
                assert_eq!(got, at, "round {round}, after {recent:?}");
            }
        }
    }
}

/// Permission bits come back as they were, on another host's directory and in the
/// archive: a 600 file, a 700 directory, a read-only directory with files in it, an
/// executable; a change of mode alone is a change of snapshot; set-user-id is not kept.
#[test]
fn file_and_directory_modes_survive_restore_and_archive() {
    let (dir, drive, ws) = setup();
    let mode = |p: &Path| fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777;
    let set = |p: &Path, m: u32| fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap();
    fs::write(ws.join("secret.txt"), "key").unwrap();
    set(&ws.join("secret.txt"), 0o600);
    fs::write(ws.join("suid"), "#!/bin/sh\n").unwrap();
    set(&ws.join("suid"), 0o4755);
    fs::create_dir_all(ws.join("private")).unwrap();
    set(&ws.join("private"), 0o700);
    fs::create_dir_all(ws.join("frozen/inner")).unwrap();
    fs::write(ws.join("frozen/inner/f"), "x").unwrap();
    set(&ws.join("frozen/inner"), 0o555);
    set(&ws.join("frozen"), 0o555);
    let id = drive.snapshot(&ws).unwrap();

    // Another host's directory, from nothing.
    let other = dir.path().join("elsewhere");
    drive.restore(&other, &id).unwrap();
    let expected = [
        ("secret.txt", 0o600),
        ("suid", 0o755),
        ("run.sh", 0o755),
        ("src/lib.rs", 0o644),
        ("private", 0o700),
        ("frozen", 0o555),
        ("frozen/inner", 0o555),
        ("src", 0o755),
    ];
    for (path, want) in expected {
        assert_eq!(mode(&other.join(path)), want, "{path} restored");
    }
    assert_eq!(
        fs::read_to_string(other.join("frozen/inner/f")).unwrap(),
        "x"
    );

    // A mode changed alone is a new snapshot; restoring the old one puts it back.
    set(&ws.join("secret.txt"), 0o640);
    set(&ws.join("private"), 0o750);
    let changed = drive.snapshot(&ws).unwrap();
    assert_ne!(changed, id);
    let kinds: Vec<String> = drive
        .diff(&id, &changed)
        .unwrap()
        .iter()
        .map(|c| c.path.clone())
        .collect();
    assert_eq!(kinds, ["private", "secret.txt"]);
    drive.restore(&ws, &id).unwrap();
    assert_eq!(mode(&ws.join("secret.txt")), 0o600);
    assert_eq!(mode(&ws.join("private")), 0o700);

    // The archive says the same.
    let mut bytes = Vec::new();
    drive.export_tar(&id, 0, &mut bytes).unwrap();
    let mut archive = tar::Archive::new(&bytes[..]);
    let modes: std::collections::BTreeMap<String, u32> = archive
        .entries()
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let path = e.path().unwrap().display().to_string();
            (
                path.trim_end_matches('/').to_string(),
                e.header().mode().unwrap(),
            )
        })
        .collect();
    for (path, want) in expected {
        assert_eq!(modes[path], want, "{path} in the archive");
    }
    // Left writable by its owner, so the test's directory can be removed.
    set(&other.join("frozen/inner"), 0o755);
    set(&other.join("frozen"), 0o755);
    set(&ws.join("frozen/inner"), 0o755);
    set(&ws.join("frozen"), 0o755);
}

/// When each file was last modified comes back as it was, on another directory and
/// in the archive; a file only touched is a new snapshot (its time is kept) but no
/// change a diff shows; a snapshot from before times were kept still restores.
#[test]
fn modification_times_survive_restore_and_archive() {
    let (dir, drive, ws) = setup();
    let mtime = |p: &Path| {
        use std::os::unix::fs::MetadataExt;
        fs::symlink_metadata(p).unwrap().mtime()
    };
    let touch = |p: &Path, at: i64| {
        let time = std::time::UNIX_EPOCH + std::time::Duration::from_secs(at as u64);
        fs::File::options()
            .write(true)
            .open(p)
            .unwrap()
            .set_modified(time)
            .unwrap();
    };
    fs::write(ws.join("old.txt"), "written long ago").unwrap();
    touch(&ws.join("old.txt"), 1_000_000_000);
    touch(&ws.join("src/lib.rs"), 1_500_000_000);
    let id = drive.snapshot(&ws).unwrap();

    let other = dir.path().join("elsewhere");
    drive.restore(&other, &id).unwrap();
    assert_eq!(mtime(&other.join("old.txt")), 1_000_000_000);
    assert_eq!(mtime(&other.join("src/lib.rs")), 1_500_000_000);
    assert_eq!(
        drive.snapshot(&other).unwrap(),
        id,
        "the restored directory is the snapshot it came from"
    );

    // Touched: a new snapshot, no change; restoring the old one puts the time back
    // (the content was the same, so only the time is written).
    touch(&ws.join("old.txt"), 1_700_000_000);
    let touched = drive.snapshot(&ws).unwrap();
    assert_ne!(touched, id);
    assert!(drive.diff(&id, &touched).unwrap().is_empty());
    drive.restore(&ws, &id).unwrap();
    assert_eq!(mtime(&ws.join("old.txt")), 1_000_000_000);

    // The archive dates each file as it was.
    let mut bytes = Vec::new();
    drive.export_tar(&id, 42, &mut bytes).unwrap();
    let mut archive = tar::Archive::new(&bytes[..]);
    let times: std::collections::BTreeMap<String, u64> = archive
        .entries()
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let path = e.path().unwrap().display().to_string();
            (path, e.header().mtime().unwrap())
        })
        .collect();
    assert_eq!(times["old.txt"], 1_000_000_000);
    assert_eq!(times["src/lib.rs"], 1_500_000_000);
    assert_eq!(times["src/"], 42, "a directory is dated as the archive");

    // A snapshot stored before times were kept: its files keep the time they are
    // written at.
    let mut manifest = drive.manifest(&id).unwrap();
    for entry in manifest.entries.values_mut() {
        if let Entry::File { mtime, .. } = entry {
            *mtime = None;
        }
    }
    let mut batch = store::Batch::default();
    let old_id = drive.objects.put(&mut batch, &manifest.to_bytes()).unwrap();
    drive.objects.finish(&mut batch).unwrap();
    let third = dir.path().join("third");
    drive.restore(&third, &old_id).unwrap();
    assert_eq!(
        fs::read_to_string(third.join("old.txt")).unwrap(),
        "written long ago"
    );
    assert!(mtime(&third.join("old.txt")) > 1_700_000_000);
}

/// What a snapshot lost is named object by object: a missing file content, a corrupt
/// one (found only when reading), a missing directory tree; an absent path is no loss.
#[test]
fn a_snapshot_names_the_objects_it_lost() {
    let d = tempfile::tempdir().unwrap();
    let ws = d.path().join("ws");
    std::fs::create_dir_all(ws.join("src/deep")).unwrap();
    std::fs::write(ws.join("a.txt"), "alpha\n").unwrap();
    std::fs::write(ws.join("b.txt"), "beta\n").unwrap();
    std::fs::write(ws.join("src/deep/c.txt"), "gamma\n").unwrap();
    let drive = Drive::open(d.path().join("drive")).unwrap();
    let id = drive.snapshot(&ws).unwrap();
    assert!(drive.damage(std::slice::from_ref(&id), true).is_empty());
    assert_eq!(
        drive.read_file(&id, "nope.txt").unwrap(),
        None,
        "no such file"
    );

    let object = |text: &str| blake3::hash(text.as_bytes()).to_hex().to_string();
    let path_of = |hash: &str| drive.objects.local(hash).unwrap();
    std::fs::remove_file(path_of(&object("alpha\n"))).unwrap();
    std::fs::write(path_of(&object("beta\n")), "tampered\n").unwrap();
    let lost = drive.damage(std::slice::from_ref(&id), true);
    let named: Vec<(&str, &str)> = lost
        .iter()
        .map(|l| (l.object.as_str(), l.problem.as_str()))
        .collect();
    assert!(
        named.contains(&(object("alpha\n").as_str(), "missing")),
        "{lost:?}"
    );
    assert!(
        named.contains(&(object("beta\n").as_str(), "corrupt")),
        "{lost:?}"
    );
    assert_eq!(lost.len(), 2, "{lost:?}");
    assert!(lost.iter().all(|l| l.snapshot == id));
    // Without reading, only what is missing is seen.
    let quick = drive.damage(std::slice::from_ref(&id), false);
    assert_eq!(quick.len(), 1, "{quick:?}");
    // A lost object is an error when read, never an absent file.
    assert!(matches!(
        drive.read_file(&id, "a.txt"),
        Err(Error::NotFound(_))
    ));
}

/// A snapshot says what it stored: the new objects' bytes, nothing for what the store
/// held already (an unchanged workspace, a file another snapshot stored).
#[test]
fn a_snapshot_says_what_it_stored() {
    let (_dir, drive, ws) = setup();
    std::fs::write(ws.join("big.bin"), vec![7u8; 300_000]).unwrap();
    let first = drive.take(&ws).unwrap();
    assert!(
        (300_000..301_000).contains(&first.stored_bytes),
        "{first:?}"
    );
    assert_eq!(
        drive.take(&ws).unwrap(),
        Taken {
            stored_bytes: 0,
            ..first.clone()
        }
    );
    // The same content under another name stores only a new tree.
    std::fs::write(ws.join("copy.bin"), vec![7u8; 300_000]).unwrap();
    let copied = drive.take(&ws).unwrap();
    assert!(copied.stored_bytes < 1000, "{copied:?}");
    std::fs::write(ws.join("new.bin"), vec![9u8; 50_000]).unwrap();
    let grown = drive.take(&ws).unwrap();
    assert!((50_000..51_000).contains(&grown.stored_bytes), "{grown:?}");
}
