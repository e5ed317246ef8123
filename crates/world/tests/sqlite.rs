//! The SQLite world against the shared contract suite, plus its storage-specific cases.

use steadfast_log::Event;
use steadfast_world::{conformance, Error, Holder, SqliteWorld, World};

fn world() -> (tempfile::TempDir, SqliteWorld) {
    let dir = tempfile::tempdir().unwrap();
    let world = SqliteWorld::open(dir.path().join("world.db")).unwrap();
    (dir, world)
}

#[tokio::test]
async fn an_append_says_whether_the_inbox_is_empty() {
    let (dir, here) = world();
    // A second connection to the same file: another process posting.
    let there = SqliteWorld::open(dir.path().join("world.db")).unwrap();
    conformance::an_append_says_whether_the_inbox_is_empty(&here, &there).await;
}

#[tokio::test]
async fn append_then_read() {
    conformance::append_then_read(&world().1).await;
}

#[tokio::test]
async fn unknown_and_duplicate_sessions() {
    conformance::unknown_and_duplicate_sessions(&world().1).await;
}

#[tokio::test]
async fn leases_fence_appends() {
    conformance::leases_fence_appends(&world().1).await;
}

#[tokio::test]
async fn summaries_follow_the_log() {
    conformance::summaries_follow_the_log(&world().1).await;
}

#[tokio::test]
async fn listings_page_and_filter() {
    conformance::listings_page_and_filter(&world().1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_writers_never_interleave() {
    let (dir, one) = world();
    // A second connection to the same file: two harnesses, not two handles of one.
    let two = SqliteWorld::open(dir.path().join("world.db")).unwrap();
    conformance::racing_writers_never_interleave(&one, &two).await;
}

#[tokio::test]
async fn a_flipped_byte_is_reported_with_session_and_position() -> anyhow::Result<()> {
    let (dir, world) = world();
    world.create_session("s1", "alice").await?;
    let lease = world
        .acquire_lease("s1", &Holder::new("h"), std::time::Duration::from_secs(60))
        .await?;
    let events: Vec<Event> = (1..=3)
        .map(|turn| Event::UserMessage {
            turn,
            text: format!("message {turn}"),
            inbox_id: None,
        })
        .collect();
    world.append(&lease, &events).await?;
    drop(world);

    // Flip one bit of the stored body of record #2, directly in the database file.
    let conn = rusqlite::Connection::open(dir.path().join("world.db"))?;
    let mut body: Vec<u8> = conn.query_row(
        "SELECT body FROM events WHERE session_id = 's1' AND seq = 2",
        [],
        |r| r.get(0),
    )?;
    body[10] ^= 0x04;
    conn.execute(
        "UPDATE events SET body = ?1 WHERE session_id = 's1' AND seq = 2",
        [&body],
    )?;
    drop(conn);

    let world = SqliteWorld::open(dir.path().join("world.db"))?;
    let err = world.read("s1", 1).await.unwrap_err();
    assert!(
        matches!(&err, Error::Corrupt { session, seq: 2, .. } if session == "s1"),
        "{err}"
    );
    assert!(err.to_string().contains("s1") && err.to_string().contains("position 2"));
    // The records before it are intact and readable on their own.
    assert_eq!(world.read("s1", 3).await?.len(), 1);
    Ok(())
}

#[tokio::test]
async fn a_missing_record_is_reported_not_skipped() -> anyhow::Result<()> {
    let (dir, world) = world();
    world.create_session("s1", "alice").await?;
    let lease = world
        .acquire_lease("s1", &Holder::new("h"), std::time::Duration::from_secs(60))
        .await?;
    for turn in 1..=3 {
        world
            .append(
                &lease,
                &[Event::UserMessage {
                    turn,
                    text: "x".into(),
                    inbox_id: None,
                }],
            )
            .await?;
    }
    let conn = rusqlite::Connection::open(dir.path().join("world.db"))?;
    conn.execute("DELETE FROM events WHERE session_id = 's1' AND seq = 3", [])?;
    let err = world.read("s1", 1).await.unwrap_err();
    assert!(matches!(err, Error::Corrupt { seq: 3, .. }), "{err}");
    Ok(())
}

#[tokio::test]
async fn a_database_from_a_newer_build_is_refused() -> anyhow::Result<()> {
    let (dir, world) = world();
    drop(world);
    let conn = rusqlite::Connection::open(dir.path().join("world.db"))?;
    conn.pragma_update(None, "user_version", 99)?;
    drop(conn);
    let err = SqliteWorld::open(dir.path().join("world.db"))
        .err()
        .unwrap();
    assert!(err.to_string().contains("upgrade steadfast"), "{err}");
    Ok(())
}

#[tokio::test]
async fn inbox_feeds_the_turn_queue() {
    conformance::inbox_feeds_the_turn_queue(&world().1).await;
}

#[tokio::test]
async fn big_records_spill_to_the_blob_store() {
    let (dir, world) = world();
    let blobs = steadfast_world::Blobs::local(&dir.path().join("blobs")).unwrap();
    conformance::big_records_spill_to_the_blob_store(&world.with_spill(blobs.clone()), &blobs)
        .await;
}

/// A live view of a session stays the fold of its log even when something else
/// appended under the same lease meanwhile (a late call of an earlier run).
#[tokio::test]
async fn a_live_session_catches_up_with_appends_made_around_it() {
    let (_dir, world) = world();
    world.create_session("s", "me").await.unwrap();
    let lease = world
        .acquire_lease("s", &Holder::new("h"), std::time::Duration::from_secs(30))
        .await
        .unwrap();
    let model = steadfast_log::ModelSpec {
        provider: "fake".into(),
        model: "m".into(),
    };
    world
        .append(&lease, &[Event::bare_start("claude-code", model, "/w")])
        .await
        .unwrap();
    let live = steadfast_world::LiveSession::open(world.clone(), lease.clone())
        .await
        .unwrap();
    let message = |turn| Event::UserMessage {
        turn,
        text: format!("turn {turn}"),
        inbox_id: None,
    };
    world.append(&lease, &[message(1)]).await.unwrap();
    live.append(&[Event::TurnEnded {
        turn: 1,
        reply: Some("done".into()),
    }])
    .await
    .unwrap();
    let state = live.state();
    assert_eq!(state.last_seq, 3);
    assert_eq!(state.turn, 1);
    assert_eq!(state.phase.status(), steadfast_log::Status::Idle);
}

#[tokio::test]
async fn an_empty_or_truncated_world_file_is_damage_not_a_fresh_start() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("world.db");
    // A world with some sessions in it, big enough to span many pages.
    {
        let world = SqliteWorld::open(&path)?;
        let holder = Holder::new("t");
        for i in 0..40 {
            let id = format!("ses_{i}");
            world.create_session(&id, "local").await?;
            let lease = world
                .acquire_lease(&id, &holder, std::time::Duration::from_secs(5))
                .await?;
            let start = Event::bare_start(
                "native",
                steadfast_log::ModelSpec {
                    provider: "fake".into(),
                    model: "m".into(),
                },
                &"w".repeat(2000),
            );
            world.append(&lease, &[start]).await?;
        }
    }
    let good = std::fs::read(&path)?;
    // Truncated to half: refused, and the file is left as it was found.
    std::fs::write(&path, &good[..good.len() / 2])?;
    let err = SqliteWorld::open(&path).err().unwrap();
    assert!(matches!(err, Error::CorruptStore { .. }), "{err}");
    assert!(err.to_string().contains("truncated"), "{err}");
    assert_eq!(std::fs::metadata(&path)?.len(), (good.len() / 2) as u64);
    // Emptied: refused, never given a new schema.
    std::fs::write(&path, b"")?;
    let err = SqliteWorld::open(&path).err().unwrap();
    assert!(err.to_string().contains("is empty"), "{err}");
    assert_eq!(std::fs::metadata(&path)?.len(), 0, "nothing was written");
    // Something else entirely.
    std::fs::write(&path, "not a database at all, but long enough to have a header........................................................")?;
    assert!(matches!(
        SqliteWorld::open(&path),
        Err(Error::CorruptStore { .. })
    ));
    // Put back whole, it opens with everything in it.
    std::fs::write(&path, &good)?;
    assert_eq!(
        SqliteWorld::open(&path)?
            .list_sessions(&Default::default())
            .await?
            .sessions
            .len(),
        40
    );
    Ok(())
}

#[tokio::test]
async fn a_scheduled_retry_holds_the_session_back() {
    conformance::a_scheduled_retry_holds_the_session_back(&world().1).await;
}

#[tokio::test]
async fn census_counts_sessions_and_the_queue() {
    conformance::census_counts_sessions_and_the_queue(&world().1).await;
}

#[tokio::test]
async fn the_outbox_queues_notable_records_with_their_append() {
    conformance::the_outbox_queues_notable_records_with_their_append(&world().1).await;
}

#[tokio::test]
async fn the_vault_keeps_each_owners_sealed_credentials() {
    conformance::the_vault_keeps_each_owners_sealed_credentials(&world().1).await;
}

#[tokio::test]
async fn hooks_take_each_delivery_once() {
    conformance::hooks_take_each_delivery_once(&world().1).await;
}

#[tokio::test]
async fn retention_prunes_deltas_in_place() {
    conformance::retention_prunes_deltas_in_place(&world().1).await;
}

#[tokio::test]
async fn tokens_and_the_audit_log() {
    conformance::tokens_and_the_audit_log(&world().1).await;
}

#[tokio::test]
async fn forks_share_the_parents_log() {
    conformance::forks_share_the_parents_log(&world().1).await;
}

#[tokio::test]
async fn rewinds_set_records_aside_without_reusing_positions() {
    conformance::rewinds_set_records_aside_without_reusing_positions(&world().1).await;
}

/// Another process's commit wakes this one's listeners: SQLite says nothing across
/// connections, so each world watches the database's data version, which any other
/// connection's commit moves.
#[tokio::test]
async fn another_process_s_writes_wake_listeners_through_the_data_version() {
    let (dir, here) = world();
    let elsewhere = SqliteWorld::open(dir.path().join("world.db")).unwrap();
    let mut changes = here.changes();
    // Let the watcher read the version once before anything changes.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    changes.borrow_and_update();
    elsewhere.create_session("s1", "alice").await.unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(5), changes.changed())
        .await
        .expect("the other connection's commit is seen")
        .unwrap();
    // Nothing else moves it.
    changes.borrow_and_update();
    assert!(
        tokio::time::timeout(std::time::Duration::from_millis(500), changes.changed())
            .await
            .is_err(),
        "no commit, no wake"
    );
}

#[tokio::test]
async fn a_worker_takes_back_what_it_held_once_its_lease_lapses() {
    conformance::a_worker_takes_back_what_it_held_once_its_lease_lapses(&world().1).await;
}

/// A store that stops answering (here another process holds SQLite's write lock, as a
/// long transaction or a stalled disk would) leaves the holder unable to renew: its
/// heartbeat declares the lease lost before the lease can lapse (three quarters of the
/// time to live), a `LiveSession` fenced by it appends nothing more, and once the
/// store answers again, another holder takes the session over as the lease lapses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_cannot_renew_knows_its_lease_lost_before_it_lapses() {
    use std::time::{Duration, Instant};
    let (dir, world) = world();
    world.create_session("s1", "alice").await.unwrap();
    let ttl = Duration::from_secs(2);
    let lease = world
        .acquire_lease("s1", &Holder::new("first"), ttl)
        .await
        .unwrap();
    let heartbeat = steadfast_world::Heartbeat::start(world.clone(), lease.clone(), ttl);
    world
        .append(
            &lease,
            &[Event::bare_start(
                "native",
                steadfast_log::ModelSpec {
                    provider: "anthropic".into(),
                    model: "m".into(),
                },
                "/w",
            )],
        )
        .await
        .unwrap();
    let live = steadfast_world::LiveSession::open(world.clone(), lease.clone())
        .await
        .unwrap();
    live.fence(heartbeat.watch());
    // Renewals go through for a while.
    tokio::time::sleep(ttl * 2).await;
    assert!(!heartbeat.watch().is_lost(), "renewed all along");

    let (locked, release) = (
        std::sync::Arc::new(std::sync::Barrier::new(2)),
        std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
    );
    let holder = {
        let (locked, release) = (locked.clone(), release.clone());
        let db = dir.path().join("world.db");
        std::thread::spawn(move || {
            let conn = rusqlite::Connection::open(db).unwrap();
            conn.execute_batch("BEGIN EXCLUSIVE").unwrap();
            locked.wait();
            while !release.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(10));
            }
            conn.execute_batch("COMMIT").unwrap();
        })
    };
    locked.wait();
    let stalled = Instant::now();
    tokio::time::timeout(ttl, heartbeat.watch().lost())
        .await
        .expect("the lease is known lost before it could lapse");
    assert!(stalled.elapsed() < ttl, "{:?}", stalled.elapsed());
    release.store(true, std::sync::atomic::Ordering::SeqCst);
    holder.join().unwrap();
    match live.append(&[]).await {
        Err(Error::LeaseLost(session)) => assert_eq!(session, "s1"),
        other => panic!("a lost lease takes no appends: {other:?}"),
    }
    // It lapses (a renewal still queued behind the lock may have landed late, which
    // only delays that), and another holder takes the session over.
    let deadline = Instant::now() + ttl * 3;
    loop {
        match world.acquire_lease("s1", &Holder::new("second"), ttl).await {
            Ok(_) => break,
            Err(Error::LeaseHeld { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("the lapsed lease is another holder's: {e}"),
        }
    }
}

#[tokio::test]
async fn rate_buckets_are_shared_and_refill() {
    let (dir, one) = world();
    // A second connection to the same file: a second API process.
    let two = SqliteWorld::open(dir.path().join("world.db")).unwrap();
    conformance::rate_buckets_are_shared_and_refill(&one, &two).await;
}

#[tokio::test]
async fn an_owners_kept_bytes_sum_their_sessions() {
    let (dir, one) = world();
    let two = SqliteWorld::open(dir.path().join("world.db")).unwrap();
    conformance::an_owners_kept_bytes_sum_their_sessions(&one, &two).await;
}

#[tokio::test]
async fn work_is_what_a_worker_claims() {
    conformance::work_is_what_a_worker_claims(&world().1).await;
}

/// A failure of the store keeps what caused it: the operating system's error is the
/// world error's source, and the message names it after what was being done.
#[test]
fn a_store_failure_keeps_its_cause() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("a-file");
    std::fs::write(&file, "not a directory")?;
    let err = SqliteWorld::open(file.join("world").join("world.db"))
        .err()
        .expect("a world cannot live under a file");
    assert!(matches!(err, Error::Backend { .. }), "{err}");
    assert!(err.is_retryable());
    let cause = std::error::Error::source(&err).expect("the cause is kept");
    let io = cause
        .downcast_ref::<std::io::Error>()
        .expect("the operating system's own error");
    assert_eq!(io.kind(), std::io::ErrorKind::NotADirectory);
    assert!(err.to_string().contains(&io.to_string()), "{err}");
    assert!(err.to_string().contains("a-file"), "{err}");
    Ok(())
}
