//! Where a session's workspace is on each host: a logical workspace is materialized
//! under whichever host's root drives it, from the drive every host shares; a
//! directory given by path stays on its host, which alone drives the session.

use std::path::Path;

use serde_json::json;
use steadfast_harness::{Harness, HarnessOptions, NewSession};
use steadfast_testkit::{FakeProvider, Script};
use steadfast_world::{Blobs, SqliteWorld};

/// A harness as host `name` would run it: its own home, the shared world and blobs.
fn host(
    dir: &Path,
    name: &str,
    world: &SqliteWorld,
    blobs: &Blobs,
    fake: &FakeProvider,
) -> Harness {
    let mut options = HarnessOptions::fake_provider(&fake.base_url());
    options.host = name.to_string();
    options.sandbox.backend = steadfast_sandbox::Backend::Local;
    Harness::with_world_and_blobs(&dir.join(name), world.clone(), blobs.clone(), options).unwrap()
}

async fn fleet(steps: serde_json::Value) -> (tempfile::TempDir, SqliteWorld, Blobs, FakeProvider) {
    let script: Script = serde_json::from_value(json!({ "steps": steps })).unwrap();
    let fake = FakeProvider::start(script).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The one store every host shares (a network filesystem, or a bucket).
    let blobs = Blobs::local(&dir.path().join("shared-blobs")).unwrap();
    let world = SqliteWorld::open(dir.path().join("world.db"))
        .unwrap()
        .with_spill(blobs.clone());
    (dir, world, blobs, fake)
}

#[tokio::test]
async fn a_logical_workspace_follows_its_session_from_host_to_host() -> anyhow::Result<()> {
    let append = |line: &str| json!({"text": "appending", "tool_calls": [{"name": "bash", "input": {"command": format!("echo {line} >> notes.txt")}}]});
    let (dir, world, blobs, fake) = fleet(json!([
        append("one"), {"text": "turn one done"},
        append("two"), {"text": "turn two done"},
        append("three"), {"text": "turn three done"},
    ]))
    .await;
    let a = host(dir.path(), "a", &world, &blobs, &fake);
    let b = host(dir.path(), "b", &world, &blobs, &fake);

    // Created on a, in a's workspace root.
    let workspace_id = steadfast_harness::new_workspace_id();
    let on_a = a.workspace_dir_of(&workspace_id)?;
    std::fs::create_dir_all(&on_a)?;
    std::fs::write(on_a.join("notes.txt"), "zero\n")?;
    let mut new = NewSession::native("fake/m", &on_a);
    new.workspace_id = Some(workspace_id.clone());
    let id = a.start_session(new).await?;
    let state = a.state(&id).await?;
    assert_eq!(
        state.workspace, workspace_id,
        "the log names no host's path"
    );
    assert_eq!(state.workspace_host, None);
    assert!(!state.system.contains(&on_a.display().to_string()));

    // Turn 1 on b: the workspace appears under b's root, with a's files.
    let mut driver = b.wake_native(&id).await?;
    driver.send("go").await?;
    driver.run().await?;
    driver.release().await?;
    let on_b = b.workspace_dir_of(&workspace_id)?;
    assert_ne!(on_a, on_b);
    assert_eq!(
        std::fs::read_to_string(on_b.join("notes.txt"))?,
        "zero\none\n"
    );
    assert_eq!(std::fs::read_to_string(on_a.join("notes.txt"))?, "zero\n");

    // Turn 2 back on a: its stale copy is brought up to date first.
    let mut driver = a.wake_native(&id).await?;
    driver.send("again").await?;
    driver.run().await?;
    driver.release().await?;
    assert_eq!(
        std::fs::read_to_string(on_a.join("notes.txt"))?,
        "zero\none\ntwo\n"
    );

    // Turn 3 on a host that never saw it, with an empty disk.
    let c = host(dir.path(), "c", &world, &blobs, &fake);
    let mut driver = c.wake_native(&id).await?;
    // Materialized on waking, before any sandbox or tool needs it.
    assert_eq!(
        std::fs::read_to_string(c.workspace_dir_of(&workspace_id)?.join("notes.txt"))?,
        "zero\none\ntwo\n"
    );
    driver.send("and again").await?;
    driver.run().await?;
    driver.release().await?;
    let on_c = c.workspace_dir_of(&workspace_id)?;
    assert_eq!(
        std::fs::read_to_string(on_c.join("notes.txt"))?,
        "zero\none\ntwo\nthree\n"
    );
    Ok(())
}

#[tokio::test]
async fn a_directory_given_by_path_is_driven_only_on_its_host() -> anyhow::Result<()> {
    let (dir, world, blobs, fake) = fleet(json!([{"text": "done"}])).await;
    let a = host(dir.path(), "a", &world, &blobs, &fake);
    let b = host(dir.path(), "b", &world, &blobs, &fake);
    let mine = dir.path().join("my-repo");
    std::fs::create_dir_all(&mine)?;
    let id = a
        .start_session(NewSession::native("fake/m", &mine).with_task("look"))
        .await?;
    let state = a.state(&id).await?;
    assert_eq!(state.workspace_host.as_deref(), Some("a"));
    assert_eq!(Path::new(&state.workspace), mine.canonicalize()?);

    let refused = match b.wake_native(&id).await {
        Ok(_) => panic!("host b drove a session bound to host a's directory"),
        Err(e) => e,
    };
    assert!(
        matches!(refused, steadfast_harness::Error::NotHere(ref m) if m.contains("host `a`")),
        "{refused}"
    );
    let mut driver = a.wake_native(&id).await?;
    driver.run().await?;
    assert_eq!(a.state(&id).await?.last_reply().as_deref(), Some("done"));
    Ok(())
}

#[tokio::test]
async fn a_home_made_before_the_drive_moved_beside_the_blobs_keeps_its_snapshots(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let home = dir.path().join("home");
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws)?;
    std::fs::write(ws.join("kept.txt"), "from before\n")?;
    let id = steadfast_drive::Drive::open(home.join("drive"))?.snapshot(&ws)?;
    let blobs = Blobs::local(&home.join("blobs"))?;
    let drive = steadfast_harness::open_drive(&home, &blobs, steadfast_harness::DRIVE_CACHE_BYTES)?;
    let back = dir.path().join("back");
    drive.restore(&back, &id)?;
    assert_eq!(
        std::fs::read_to_string(back.join("kept.txt"))?,
        "from before\n"
    );
    assert!(home.join("blobs/drive").is_dir() && !home.join("drive/objects").exists());
    Ok(())
}

#[tokio::test]
async fn a_directory_bound_session_moves_only_at_its_users_word() -> anyhow::Result<()> {
    let append = |line: &str| json!({"text": "appending", "tool_calls": [{"name": "bash", "input": {"command": format!("echo {line} >> notes.txt")}}]});
    let (dir, world, blobs, fake) = fleet(json!([
        append("one"), {"text": "turn one done"},
        append("two"), {"text": "turn two done"},
    ]))
    .await;
    let a = host(dir.path(), "a", &world, &blobs, &fake);
    let b = host(dir.path(), "b", &world, &blobs, &fake);
    let mine = dir.path().join("a-disk/repo");
    std::fs::create_dir_all(mine.join("src"))?;
    std::fs::write(mine.join("notes.txt"), "zero\n")?;
    std::fs::write(mine.join("src/lib.rs"), "fn main() {}\n")?;
    std::os::unix::fs::symlink("src/lib.rs", mine.join("lib"))?;
    let id = a.start_session(NewSession::native("fake/m", &mine)).await?;
    let mut driver = a.wake_native(&id).await?;
    driver.send("go").await?;
    driver.run().await?;

    // Not while a drives it.
    let theirs = dir.path().join("b-disk/repo");
    let refused = b.move_workspace_here(&id, &theirs).await.unwrap_err();
    assert!(refused.to_string().contains("being driven"), "{refused}");
    assert!(!theirs.exists(), "a refused move leaves nothing behind");
    driver.release().await?;

    // Not into a directory with something in it.
    let occupied = dir.path().join("occupied");
    std::fs::create_dir_all(&occupied)?;
    std::fs::write(occupied.join("keep"), "mine")?;
    let before = a.state(&id).await?.last_seq;
    let refused = b.move_workspace_here(&id, &occupied).await.unwrap_err();
    assert!(refused.to_string().contains("not empty"), "{refused}");
    assert_eq!(std::fs::read_to_string(occupied.join("keep"))?, "mine");
    assert_eq!(a.state(&id).await?.last_seq, before, "nothing recorded");

    // Moved to b: the new directory is at the last snapshot, the log says so.
    let moved = b.move_workspace_here(&id, &theirs).await?;
    assert_eq!(moved, theirs.canonicalize()?);
    assert_eq!(
        std::fs::read_to_string(theirs.join("notes.txt"))?,
        "zero\none\n"
    );
    assert_eq!(
        std::fs::read_link(theirs.join("lib"))?,
        Path::new("src/lib.rs")
    );
    let state = b.state(&id).await?;
    assert_eq!(Path::new(&state.workspace), moved);
    assert_eq!(state.workspace_host.as_deref(), Some("b"));
    assert_eq!(
        state.former_workspaces,
        [mine.canonicalize()?.display().to_string()]
    );
    assert!(
        state.system.contains(&moved.display().to_string()),
        "the prompt names the new place"
    );
    assert!(!state
        .system
        .contains(&mine.canonicalize()?.display().to_string()));
    // Moving it again to where it is changes nothing.
    b.move_workspace_here(&id, &theirs).await?;
    assert_eq!(b.state(&id).await?.last_seq, state.last_seq);

    // Now b drives it and a does not; a's directory is left as it was.
    let refused = match a.wake_native(&id).await {
        Ok(_) => panic!("host a drove a session moved to host b"),
        Err(e) => e,
    };
    assert!(
        matches!(refused, steadfast_harness::Error::NotHere(ref m) if m.contains("host `b`")),
        "{refused}"
    );
    let mut driver = b.wake_native(&id).await?;
    driver.send("again").await?;
    driver.run().await?;
    driver.release().await?;
    assert_eq!(
        std::fs::read_to_string(theirs.join("notes.txt"))?,
        "zero\none\ntwo\n"
    );
    assert_eq!(
        std::fs::read_to_string(mine.join("notes.txt"))?,
        "zero\none\n"
    );
    // The full fold and the checkpointed one agree.
    let records = world_records(&world, &id).await;
    assert_eq!(steadfast_log::fold(&records)?, b.state(&id).await?);

    // A logical workspace has nothing to move.
    let logical = steadfast_harness::new_workspace_id();
    let on_a = a.workspace_dir_of(&logical)?;
    std::fs::create_dir_all(&on_a)?;
    let mut new = NewSession::native("fake/m", &on_a);
    new.workspace_id = Some(logical);
    let other = a.start_session(new).await?;
    let refused = b
        .move_workspace_here(&other, &dir.path().join("x"))
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("logical workspace"),
        "{refused}"
    );
    assert!(!dir.path().join("x").exists());

    // A move whose restore fails (the store lost the snapshot) records nothing and
    // leaves no directory it made behind.
    let lost = dir.path().join("lost-repo");
    std::fs::create_dir_all(&lost)?;
    std::fs::write(lost.join("f"), "x")?;
    let other = a.start_session(NewSession::native("fake/m", &lost)).await?;
    let before = a.state(&other).await?.last_seq;
    let drive = dir.path().join("shared-blobs/drive");
    std::fs::rename(&drive, dir.path().join("drive-away"))?;
    let target = dir.path().join("fresh/parent/repo");
    let failed = b.move_workspace_here(&other, &target).await;
    std::fs::rename(dir.path().join("drive-away"), &drive)?;
    assert!(failed.is_err());
    assert!(
        !dir.path().join("fresh").exists(),
        "no directory left behind"
    );
    assert_eq!(a.state(&other).await?.last_seq, before, "nothing recorded");
    Ok(())
}

async fn world_records(world: &SqliteWorld, id: &str) -> Vec<steadfast_log::Record> {
    use steadfast_world::World;
    world.read(id, 1).await.unwrap()
}
