//! A drive whose objects live in a store every host shares (here a real directory
//! through `object_store`'s file backend; the fleet test uses S3), each host with its
//! own cache and state.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use super::*;

/// The shared store, and where its objects are on disk (to damage or lose one).
fn shared(dir: &Path) -> (Arc<dyn object_store::ObjectStore>, PathBuf) {
    let root = dir.join("bucket");
    fs::create_dir_all(&root).unwrap();
    let store = object_store::local::LocalFileSystem::new_with_prefix(&root).unwrap();
    (Arc::new(store), root)
}

fn host(dir: &Path, name: &str, store: &Arc<dyn object_store::ObjectStore>, cache: u64) -> Drive {
    Drive::open_shared(dir.join(name), store.clone(), cache).unwrap()
}

/// The same workspace each time, to the file times: two of them are one snapshot.
fn workspace(ws: &Path) {
    fs::create_dir_all(ws.join("src/deep")).unwrap();
    fs::create_dir_all(ws.join(".git/refs")).unwrap();
    fs::write(ws.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
    for i in 0..40 {
        fs::write(
            ws.join(format!("src/deep/f{i}.rs")),
            format!("fn f{i}() {{}}\n").repeat(100),
        )
        .unwrap();
    }
    fs::write(ws.join("run.sh"), "#!/bin/sh\necho hi\n").unwrap();
    fs::set_permissions(ws.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    let written = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_600_000_000);
    for file in walkdir::WalkDir::new(ws).into_iter().filter_map(Result::ok) {
        if file.file_type().is_file() {
            fs::File::options()
                .write(true)
                .open(file.path())
                .unwrap()
                .set_modified(written)
                .unwrap();
        }
    }
    std::os::unix::fs::symlink("src/deep/f1.rs", ws.join("link")).unwrap();
    nix::unistd::mkfifo(
        &ws.join("pipe"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
}

fn listing(ws: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for e in walkdir::WalkDir::new(ws).min_depth(1).sort_by_file_name() {
        let e = e.unwrap();
        let rel = e.path().strip_prefix(ws).unwrap().display().to_string();
        let kind = e.file_type();
        let desc = if kind.is_symlink() {
            format!("-> {}", fs::read_link(e.path()).unwrap().display())
        } else if kind.is_dir() {
            "dir".into()
        } else if kind.is_file() {
            let mode = e.metadata().unwrap().permissions().mode() & 0o111;
            format!("{mode:o} {}", fs::read_to_string(e.path()).unwrap())
        } else {
            "special".into()
        };
        out.push((rel, desc));
    }
    out
}

fn cached_files(cache: &Path) -> Vec<PathBuf> {
    walkdir::WalkDir::new(cache)
        .min_depth(2)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file() && !e.path().starts_with(cache.join("tmp")))
        .map(|e| e.path().to_path_buf())
        .collect()
}

#[test]
fn a_snapshot_taken_on_one_host_is_restored_on_another_with_its_own_disk() {
    let dir = tempfile::tempdir().unwrap();
    let (store, bucket) = shared(dir.path());
    let a = host(dir.path(), "host-a", &store, 1 << 30);
    let ws = dir.path().join("a/ws_1");
    workspace(&ws);
    let id = a.snapshot(&ws).unwrap();
    assert!(
        fs::read_dir(&bucket).unwrap().count() > 40,
        "the objects are in the bucket"
    );

    let b = host(dir.path(), "host-b", &store, 1 << 30);
    let there = dir.path().join("b/ws_1");
    b.restore(&there, &id).unwrap();
    assert_eq!(listing(&there), listing(&ws));
    assert!(
        !cached_files(&dir.path().join("host-b/objects")).is_empty(),
        "b cached what it fetched"
    );
    // What b changes, a restores: the store carries it back.
    fs::write(there.join("src/deep/f3.rs"), "changed on b\n").unwrap();
    let id2 = b.snapshot(&there).unwrap();
    a.restore(&ws, &id2).unwrap();
    assert_eq!(listing(&ws), listing(&there));
    assert_eq!(a.diff(&id, &id2).unwrap().len(), 1);
    assert_eq!(
        a.read_file(&id2, "src/deep/f3.rs").unwrap().unwrap(),
        b"changed on b\n"
    );
}

#[test]
fn a_damaged_cached_object_is_fetched_again_and_a_damaged_stored_one_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (store, bucket) = shared(dir.path());
    let a = host(dir.path(), "host-a", &store, 1 << 30);
    let ws = dir.path().join("ws");
    workspace(&ws);
    let id = a.snapshot(&ws).unwrap();
    for object in cached_files(&dir.path().join("host-a/objects")) {
        fs::write(object, "scribbled").unwrap();
    }
    let fresh = dir.path().join("fresh");
    a.restore(&fresh, &id).unwrap();
    assert_eq!(
        listing(&fresh),
        listing(&ws),
        "the cache's damage was repaired from the store"
    );

    let hash = blake3::hash(&fs::read(ws.join("src/deep/f7.rs")).unwrap())
        .to_hex()
        .to_string();
    fs::write(bucket.join(&hash), "scribbled").unwrap();
    let b = host(dir.path(), "host-b", &store, 1 << 30);
    let err = b.restore(&dir.path().join("on-b"), &id).unwrap_err();
    assert!(matches!(err, Error::Corrupt(ref h) if *h == hash), "{err}");
    assert!(
        !dir.path().join("on-b/src/deep/f7.rs").exists(),
        "nothing corrupt written"
    );
}

#[test]
fn the_cache_keeps_within_its_bound_and_restores_still_work() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = shared(dir.path());
    let ws = dir.path().join("ws");
    workspace(&ws);
    let id = host(dir.path(), "host-a", &store, 1 << 30)
        .snapshot(&ws)
        .unwrap();
    let limit = 16 * 1024;
    let b = host(dir.path(), "host-b", &store, limit);
    for round in 0..3 {
        let there = dir.path().join(format!("b{round}"));
        b.restore(&there, &id).unwrap();
        assert_eq!(listing(&there), listing(&ws));
        let held: u64 = cached_files(&dir.path().join("host-b/objects"))
            .iter()
            .map(|p| fs::metadata(p).unwrap().len())
            .sum();
        assert!(
            held <= limit,
            "round {round}: the cache holds {held} > {limit} bytes"
        );
    }
}

#[test]
fn an_object_the_store_lost_is_uploaded_again_by_the_next_snapshot_that_writes_it() {
    let dir = tempfile::tempdir().unwrap();
    let (store, bucket) = shared(dir.path());
    let ws = dir.path().join("ws");
    workspace(&ws);
    host(dir.path(), "host-a", &store, 1 << 30)
        .snapshot(&ws)
        .unwrap();
    // gc on some host reclaimed everything (no log referred to it); host a's cache
    // still has every object.
    for object in fs::read_dir(&bucket).unwrap() {
        fs::remove_file(object.unwrap().path()).unwrap();
    }
    // A new process on host a writes the same files into another workspace.
    let a = host(dir.path(), "host-a", &store, 1 << 30);
    let again = dir.path().join("again");
    workspace(&again);
    let id = a.snapshot(&again).unwrap();
    let b = host(dir.path(), "host-b", &store, 1 << 30);
    let there = dir.path().join("there");
    b.restore(&there, &id).unwrap();
    assert_eq!(listing(&there), listing(&ws));
}

#[test]
fn gc_reclaims_from_the_store_what_no_kept_snapshot_reaches() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = shared(dir.path());
    let a = host(dir.path(), "host-a", &store, 1 << 30);
    let ws = dir.path().join("ws");
    workspace(&ws);
    let old = a.snapshot(&ws).unwrap();
    fs::write(ws.join("src/deep/f0.rs"), "only in the new one\n").unwrap();
    let new = a.snapshot(&ws).unwrap();
    let b = host(dir.path(), "host-b", &store, 1 << 30);
    let kept = std::slice::from_ref(&new);
    assert_eq!(
        b.gc(kept, std::time::Duration::from_secs(3600)).unwrap(),
        0,
        "all too young"
    );
    assert!(
        b.gc(kept, std::time::Duration::ZERO).unwrap() >= 2,
        "the old file and trees went"
    );
    let c = host(dir.path(), "host-c", &store, 1 << 30);
    c.restore(&dir.path().join("new"), &new).unwrap();
    assert_eq!(listing(&dir.path().join("new")), listing(&ws));
    assert!(
        c.restore(&dir.path().join("old"), &old).is_err(),
        "the old snapshot is gone"
    );
}

/// Sets every file under `dir` to have been written two hours ago.
fn age(dir: &Path) {
    let then = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
    for e in walkdir::WalkDir::new(dir)
        .into_iter()
        .filter_map(Result::ok)
    {
        if e.file_type().is_file() {
            let file = fs::File::options().write(true).open(e.path()).unwrap();
            file.set_modified(then).unwrap();
        }
    }
}

#[test]
fn an_old_object_a_new_snapshot_writes_again_is_fresh_for_gc_in_a_directory_and_a_store() {
    let dir = tempfile::tempdir().unwrap();
    let (store, bucket) = shared(dir.path());
    let hour = std::time::Duration::from_secs(3600);
    // Each kind of drive: an object from a snapshot no log refers to any more, aged
    // past the grace period, then written again by another workspace's snapshot
    // (which gc cannot know of yet): gc leaves it.
    for (name, objects) in [
        ("local", dir.path().join("local/objects")),
        ("shared", bucket),
    ] {
        let first = dir.path().join(format!("{name}-first"));
        workspace(&first);
        let drive = match name {
            "local" => Drive::open(dir.path().join("local")).unwrap(),
            _ => host(dir.path(), "host-a", &store, 1 << 30),
        };
        drive.snapshot(&first).unwrap();
        age(&objects);
        // A new process on the same host, as after a restart.
        let drive = match name {
            "local" => Drive::open(dir.path().join("local")).unwrap(),
            _ => host(dir.path(), "host-a", &store, 1 << 30),
        };
        let second = dir.path().join(format!("{name}-second"));
        workspace(&second);
        let id = drive.snapshot(&second).unwrap();
        assert_eq!(
            drive.gc(&[], hour).unwrap(),
            0,
            "{name}: nothing young enough went"
        );
        let elsewhere = host(dir.path(), "host-b", &store, 1 << 30);
        let check = match name {
            "local" => &drive,
            _ => &elsewhere,
        };
        check
            .restore(&dir.path().join(format!("{name}-back")), &id)
            .unwrap();
        assert_eq!(
            listing(&dir.path().join(format!("{name}-back"))),
            listing(&second)
        );
    }
}

/// How many of the bucket's objects were written in the last minute.
fn fresh_in(bucket: &Path) -> usize {
    fs::read_dir(bucket)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            e.metadata()
                .unwrap()
                .modified()
                .unwrap()
                .elapsed()
                .is_ok_and(|age| age.as_secs() < 60)
        })
        .count()
}

#[test]
fn a_logical_workspace_restored_on_a_new_host_does_not_upload_its_files_again() {
    let dir = tempfile::tempdir().unwrap();
    let (store, bucket) = shared(dir.path());
    let ws = dir.path().join("a/ws_0193aa");
    workspace(&ws);
    let id = host(dir.path(), "host-a", &store, 1 << 30)
        .snapshot(&ws)
        .unwrap();
    for (name, vouched) in [("ws_0193aa", true), ("users-own-dir", false)] {
        age(&bucket);
        let b = host(dir.path(), &format!("host-b-{name}"), &store, 1 << 30);
        let there = dir.path().join("b").join(name);
        b.restore(&there, &id).unwrap();
        // One file changed. The first snapshot trusts what the restore made in a
        // logical workspace, and re-reads every file of a user's directory.
        fs::write(there.join("src/deep/f9.rs"), "changed on b\n").unwrap();
        let after = b.snapshot(&there).unwrap();
        let uploaded = fresh_in(&bucket);
        if vouched {
            // The changed file, and the trees above it.
            assert!(uploaded <= 4, "{name}: {uploaded} objects uploaded again");
        } else {
            assert!(
                uploaded > 40,
                "{name}: a directory's objects are uploaded again"
            );
        }
        let c = host(dir.path(), &format!("host-c-{name}"), &store, 1 << 30);
        let back = dir.path().join("c").join(name);
        c.restore(&back, &after).unwrap();
        assert_eq!(listing(&back), listing(&there));
    }
}
