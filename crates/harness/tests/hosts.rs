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
