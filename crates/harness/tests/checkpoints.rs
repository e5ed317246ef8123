//! Checkpointed wake: a session of many turns stores its folded state now and then,
//! and waking it reads the latest checkpoint and only the records after it. The state
//! so loaded is the state a fold of the whole log gives, at every checkpoint and at
//! the end; a checkpoint of another format, or one whose blob is gone, is passed over
//! for a full fold with the same result.

use serde_json::{json, Value};
use steadfast_harness::{NewSession, Stop};
use steadfast_log::{fold, Event};
use steadfast_world::{Holder, World};

mod common;

use common::Setup;

const TURNS: usize = 8;
const STEPS_PER_TURN: usize = 30;

fn script() -> Value {
    let mut steps = Vec::new();
    for turn in 0..TURNS {
        for step in 0..STEPS_PER_TURN {
            steps.push(json!({"text": format!("turn {turn}, step {step}"),
                "tool_calls": [{"name": "read", "input": {"file_path": "hello.txt", "offset": step + 1}}]}));
        }
        steps.push(json!({"text": format!("turn {turn} done")}));
    }
    Value::Array(steps)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waking_from_a_checkpoint_gives_the_state_a_full_fold_gives() -> anyhow::Result<()> {
    let setup = Setup::new(script()).await;
    let harness = setup.harness();
    let id = harness
        .start_session(NewSession::native("fake/m", &setup.workspace()))
        .await?;
    for turn in 0..TURNS {
        let mut driver = harness.wake_native(&id).await?;
        driver.send(&format!("turn {turn}")).await?;
        assert_eq!(driver.run().await?, Stop::Idle);
        driver.release().await?;
    }
    let records = harness.world().read(&id, 1).await?;
    let checkpoints: Vec<_> = records
        .iter()
        .filter_map(|r| match &r.event {
            Event::Checkpoint { blob, .. } => Some((r.seq, blob.clone())),
            _ => None,
        })
        .collect();
    assert!(
        checkpoints.len() >= 3,
        "{} records, {} checkpoints",
        records.len(),
        checkpoints.len()
    );

    // At every checkpoint, the stored state is the fold of the log before it.
    for (seq, blob) in &checkpoints {
        let stored: steadfast_log::fold::Checkpoint =
            serde_json::from_slice(&harness.blobs().get(&blob.hash).await?)?;
        assert_eq!(
            stored.state,
            fold(&records[..(*seq - 1) as usize])?,
            "checkpoint #{seq}"
        );
    }
    // Waking reads from the last one, and comes to the same state.
    let whole = fold(&records)?;
    let (loaded, read) = harness.load(&id).await?;
    assert_eq!(read.first().map(|r| r.seq), checkpoints.last().map(|c| c.0));
    assert!(
        read.len() < records.len() / 2,
        "{} of {}",
        read.len(),
        records.len()
    );
    assert_eq!(loaded, whole);

    // One whose blob is gone is passed over: the log is folded in full.
    let (_, last) = checkpoints.last().unwrap();
    let stored: Vec<_> = walkdir::WalkDir::new(setup.dir.path().join("home"))
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy() == last.hash)
        .collect();
    assert_eq!(stored.len(), 1, "the checkpoint's blob is stored");
    let saved = std::fs::read(stored[0].path())?;
    std::fs::remove_file(stored[0].path())?;
    let (loaded, read) = harness.load(&id).await?;
    assert_eq!(read.len(), records.len(), "folded in full");
    assert_eq!(loaded, whole);
    std::fs::write(stored[0].path(), saved)?;

    // So is one of another format.
    let mut foreign = serde_json::to_value(steadfast_log::fold::Checkpoint {
        version: steadfast_log::fold::CHECKPOINT_VERSION,
        state: whole.clone(),
    })?;
    foreign["version"] = json!(steadfast_log::fold::CHECKPOINT_VERSION + 1);
    foreign["state"]["turn"] = json!(999);
    let blob = harness.blobs().put(&serde_json::to_vec(&foreign)?).await?;
    let lease = harness
        .world()
        .acquire_lease(
            &id,
            &Holder::new("test"),
            std::time::Duration::from_secs(30),
        )
        .await?;
    harness
        .world()
        .append(&lease, &[Event::Checkpoint { blob, version: 2 }])
        .await?;
    harness.world().release_lease(&lease).await?;
    let (loaded, read) = harness.load(&id).await?;
    let records = harness.world().read(&id, 1).await?;
    assert_eq!(read.len(), records.len(), "folded in full");
    assert_eq!(loaded, fold(&records)?);
    assert_eq!(loaded.turn as usize, TURNS);

    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compact_signal_compacts_before_the_next_call_once() -> anyhow::Result<()> {
    let read = |line: u32| json!({"text": "reading", "tool_calls": [{"name": "read", "input": {"file_path": "hello.txt", "offset": line}}]});
    let setup = Setup::new(json!([
        read(1),
        read(2),
        read(3),
        {"text": "first done"},
        read(4),
        {"text": "second done"}
    ]))
    .await;
    let harness = setup.harness();
    let id = harness
        .start_session(NewSession::native("fake/m", &setup.workspace()))
        .await?;
    let mut driver = harness.wake_native(&id).await?;
    driver.send("first").await?;
    assert_eq!(driver.run().await?, Stop::Idle);
    driver.release().await?;

    // Asked while idle (it answers no wait, so it is queued, never refused)...
    let (inbox_id, answers) = harness
        .signal(&id, "compact", &json!({}), Default::default())
        .await?;
    assert_eq!(answers, None);
    let mut driver = harness.wake_native(&id).await?;
    driver.send("second").await?;
    assert_eq!(driver.run().await?, Stop::Idle);
    driver.release().await?;

    // ...it compacted before the next call, once, and the model kept its place.
    let records = harness.world().read(&id, 1).await?;
    let intents: Vec<_> = records
        .iter()
        .filter_map(|r| match &r.event {
            Event::CompactionIntent { inbox_id, .. } => Some(*inbox_id),
            _ => None,
        })
        .collect();
    assert_eq!(intents, vec![Some(inbox_id)]);
    let state = fold(&records)?;
    assert_eq!(state.compactions, 1);
    assert_eq!(state.compacted_turns, 3);
    assert!(!state.compact_asked);
    assert_eq!(setup.fake.state().summaries(), 1);
    assert!(setup.fake.state().calls_per_step().iter().all(|&n| n == 1));
    assert_eq!(state.last_reply().as_deref(), Some("second done"));
    assert!(
        harness.world().inbox(&id).await?.is_empty(),
        "the signal was taken"
    );
    Ok(())
}
