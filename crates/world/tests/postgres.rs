//! The PostgreSQL world against the shared contract suite, on the machine's real
//! PostgreSQL server, each test in a database of its own.
//!
//! `STEADFAST_TEST_POSTGRES` names the server (default
//! `postgres://postgres@127.0.0.1:5432/postgres`).

use steadfast_log::Event;
use steadfast_world::{conformance, Error, Holder, PostgresWorld, World};
use tokio_postgres::NoTls;

fn admin_url() -> String {
    std::env::var("STEADFAST_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// A fresh database, dropped when the test ends.
struct TestDb {
    name: String,
    url: String,
}

impl TestDb {
    async fn new() -> Self {
        let name = format!("steadfast_test_{}", uuid_like());
        let (client, conn) = tokio_postgres::connect(&admin_url(), NoTls)
            .await
            .expect("PostgreSQL must be running for these tests (see .ci/run)");
        tokio::spawn(conn);
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .unwrap();
        let base = admin_url();
        let url = format!("{}/{name}", &base[..base.rfind('/').unwrap()]);
        TestDb { name, url }
    }

    async fn world(&self) -> PostgresWorld {
        PostgresWorld::connect_and_migrate(&self.url).await.unwrap()
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Best effort, on a thread of its own: drop cannot await.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok((client, conn)) = tokio_postgres::connect(&admin_url(), NoTls).await {
                    tokio::spawn(conn);
                    let _ = client
                        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .await;
                }
            });
        })
        .join();
    }
}

fn uuid_like() -> String {
    use std::time::{SystemTime, UNIX_EPOCH};
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{:x}_{}", nanos, std::process::id())
}

#[tokio::test]
async fn append_then_read() {
    let db = TestDb::new().await;
    conformance::append_then_read(&db.world().await).await;
}

#[tokio::test]
async fn unknown_and_duplicate_sessions() {
    let db = TestDb::new().await;
    conformance::unknown_and_duplicate_sessions(&db.world().await).await;
}

#[tokio::test]
async fn leases_fence_appends() {
    let db = TestDb::new().await;
    conformance::leases_fence_appends(&db.world().await).await;
}

#[tokio::test]
async fn summaries_follow_the_log() {
    let db = TestDb::new().await;
    conformance::summaries_follow_the_log(&db.world().await).await;
}

#[tokio::test]
async fn listings_page_and_filter() {
    let db = TestDb::new().await;
    conformance::listings_page_and_filter(&db.world().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_writers_never_interleave() {
    let db = TestDb::new().await;
    // Two pools: two harnesses on different connections.
    conformance::racing_writers_never_interleave(&db.world().await, &db.world().await).await;
}

#[tokio::test]
async fn a_stale_epoch_cannot_commit_even_bypassing_the_client_check() {
    let db = TestDb::new().await;
    let world = db.world().await;
    world.create_session("s1", "alice").await.unwrap();
    let lease = world
        .acquire_lease("s1", &Holder::new("a"), std::time::Duration::from_secs(60))
        .await
        .unwrap();
    world
        .append(
            &lease,
            &[Event::UserMessage {
                turn: 1,
                text: "x".into(),
                inbox_id: None,
            }],
        )
        .await
        .unwrap();
    // A writer that skips the fence check and inserts directly is stopped by the
    // database's trigger.
    let (client, conn) = tokio_postgres::connect(&db.url, NoTls).await.unwrap();
    tokio::spawn(conn);
    let err = client
        .execute(
            "INSERT INTO steadfast_events (session_id, seq, epoch, at_ms, schema, kind, body, checksum) VALUES ('s1', 2, $1, 0, 1, 'x', '\\x00', 'x')",
            &[&((lease.epoch - 1) as i64)],
        )
        .await
        .unwrap_err();
    assert_eq!(err.code().map(|c| c.code()), Some("SF001"), "{err}");
    // Nor can a released lease, even at the current epoch.
    world.release_lease(&lease).await.unwrap();
    let err = client
        .execute(
            "INSERT INTO steadfast_events (session_id, seq, epoch, at_ms, schema, kind, body, checksum) VALUES ('s1', 2, $1, 0, 1, 'x', '\\x00', 'x')",
            &[&(lease.epoch as i64)],
        )
        .await
        .unwrap_err();
    assert_eq!(err.code().map(|c| c.code()), Some("SF001"), "{err}");
}

#[tokio::test]
async fn the_database_refuses_events_of_a_missing_session_and_deleting_leaves_none() {
    let db = TestDb::new().await;
    let world = db.world().await;
    let (client, conn) = tokio_postgres::connect(&db.url, NoTls).await.unwrap();
    tokio::spawn(conn);
    // No foreign key repeats the check: the fence itself refuses a session it
    // cannot find.
    let err = client
        .execute(
            "INSERT INTO steadfast_events (session_id, seq, epoch, at_ms, schema, kind, body, checksum) VALUES ('ghost', 1, 0, 0, 1, 'x', '\\x00', 'x')",
            &[],
        )
        .await
        .unwrap_err();
    assert_eq!(err.code().map(|c| c.code()), Some("SF001"), "{err}");

    world.create_session("s1", "alice").await.unwrap();
    let lease = world
        .acquire_lease("s1", &Holder::new("a"), std::time::Duration::from_secs(60))
        .await
        .unwrap();
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
            .await
            .unwrap();
    }
    world.delete_session("s1").await.unwrap();
    let left: i64 = client
        .query_one(
            "SELECT count(*) FROM steadfast_events WHERE session_id = 's1'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "a deleted session's events go with it");
    let err = world
        .append(
            &lease,
            &[Event::UserMessage {
                turn: 4,
                text: "late".into(),
                inbox_id: None,
            }],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::StaleFence { .. } | Error::NotFound(_)),
        "{err}"
    );
}

#[tokio::test]
async fn a_flipped_byte_is_reported_with_session_and_position() {
    let db = TestDb::new().await;
    let world = db.world().await;
    world.create_session("s1", "alice").await.unwrap();
    let lease = world
        .acquire_lease("s1", &Holder::new("h"), std::time::Duration::from_secs(60))
        .await
        .unwrap();
    let events: Vec<Event> = (1..=3)
        .map(|turn| Event::UserMessage {
            turn,
            text: format!("m{turn}"),
            inbox_id: None,
        })
        .collect();
    world.append(&lease, &events).await.unwrap();
    let (client, conn) = tokio_postgres::connect(&db.url, NoTls).await.unwrap();
    tokio::spawn(conn);
    client
        .execute(
            "UPDATE steadfast_events SET body = overlay(body placing '\\x7a' from 12 for 1) WHERE session_id = 's1' AND seq = 2",
            &[],
        )
        .await
        .unwrap();
    let err = world.read("s1", 1).await.unwrap_err();
    assert!(
        matches!(&err, Error::Corrupt { session, seq: 2, .. } if session == "s1"),
        "{err}"
    );
}

#[tokio::test]
async fn an_unmigrated_database_is_refused_with_the_fix() {
    let db = TestDb::new().await;
    let err = PostgresWorld::connect(&db.url).await.unwrap_err();
    assert!(err.to_string().contains("steadfast migrate"), "{err}");
    let world = PostgresWorld::connect_and_migrate(&db.url).await.unwrap();
    assert!(
        world.migrate().await.unwrap().is_empty(),
        "migrations apply once"
    );
    PostgresWorld::connect(&db.url).await.unwrap();
}

#[tokio::test]
async fn inbox_feeds_the_turn_queue() {
    let db = TestDb::new().await;
    conformance::inbox_feeds_the_turn_queue(&db.world().await).await;
}

#[tokio::test]
async fn another_process_s_writes_wake_listeners_through_notify() {
    let db = TestDb::new().await;
    let here = db.world().await;
    let elsewhere = db.world().await; // another pool, as another process would have
                                      // Let the listener connect (it bumps the counter once when it does).
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let mut changes = here.changes();
    elsewhere.create_session("s1", "alice").await.unwrap();
    let lease = elsewhere
        .acquire_lease("s1", &Holder::new("w"), std::time::Duration::from_secs(60))
        .await
        .unwrap();
    elsewhere
        .append(
            &lease,
            &[Event::UserMessage {
                turn: 1,
                text: "x".into(),
                inbox_id: None,
            }],
        )
        .await
        .unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(5), changes.changed())
        .await
        .expect("a NOTIFY from the other pool arrives")
        .unwrap();
}

#[tokio::test]
async fn big_records_spill_to_the_blob_store() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let blobs = steadfast_world::Blobs::local(dir.path()).unwrap();
    conformance::big_records_spill_to_the_blob_store(
        &db.world().await.with_spill(blobs.clone()),
        &blobs,
    )
    .await;
}

#[tokio::test]
async fn a_scheduled_retry_holds_the_session_back() {
    let db = TestDb::new().await;
    conformance::a_scheduled_retry_holds_the_session_back(&db.world().await).await;
}

/// The lease row's liveness token, read around the world.
async fn liveness(url: &str, session: &str) -> Option<String> {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(conn);
    client
        .query_one(
            "SELECT lease_liveness FROM steadfast_sessions WHERE id = $1",
            &[&session],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_on_another_host_whose_process_dies_is_taken_over_at_once() {
    use std::time::{Duration, Instant};
    let db = TestDb::new().await;
    let ttl = Duration::from_secs(60);
    // The holder is a process "on another machine": no pid this host could check.
    let far = Holder {
        id: "worker-far".into(),
        host: "another-machine".into(),
        pid: 1,
    };
    let holder_world = db.world().await;
    holder_world.create_session("s1", "alice").await.unwrap();
    // Its notification connection is its liveness, up by the time connecting
    // returns: even the first lease of a process that just started carries it.
    let lease = holder_world.acquire_lease("s1", &far, ttl).await.unwrap();
    assert!(
        liveness(&db.url, "s1").await.is_some(),
        "the holder's liveness is recorded with its first lease"
    );
    let started = Event::bare_start(
        "native",
        steadfast_log::ModelSpec {
            provider: "fake".into(),
            model: "m".into(),
        },
        "/w",
    );
    let running = Event::UserMessage {
        turn: 1,
        text: "go".into(),
        inbox_id: None,
    };
    holder_world
        .append(&lease, &[started, running])
        .await
        .unwrap();

    let here = Holder::new("worker-here");
    let other = db.world().await;
    assert!(
        other.claim(&here, ttl).await.unwrap().is_none(),
        "a live holder keeps its lease"
    );

    // The holder's process dies: its connections close, as the kernel closes a
    // killed process's sockets.
    drop(holder_world);
    let died = Instant::now();
    let taken = loop {
        if let Some(taken) = other.claim(&here, ttl).await.unwrap() {
            break taken;
        }
        assert!(
            died.elapsed() < Duration::from_secs(20),
            "taken over long before the {ttl:?} lease lapses"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(taken.epoch, lease.epoch + 1);
    // The dead holder's lease is fenced, should anything of it still write.
    let stale = other
        .append(
            &lease,
            &[Event::TurnEnded {
                turn: 1,
                reply: None,
            }],
        )
        .await
        .unwrap_err();
    assert!(matches!(stale, Error::StaleFence { .. }), "{stale}");
}

#[tokio::test]
async fn census_counts_sessions_and_the_queue() {
    let db = TestDb::new().await;
    conformance::census_counts_sessions_and_the_queue(&db.world().await).await;
}

#[tokio::test]
async fn the_outbox_queues_notable_records_with_their_append() {
    let db = TestDb::new().await;
    conformance::the_outbox_queues_notable_records_with_their_append(&db.world().await).await;
}

#[tokio::test]
async fn the_vault_keeps_each_owners_sealed_credentials() {
    let db = TestDb::new().await;
    conformance::the_vault_keeps_each_owners_sealed_credentials(&db.world().await).await;
}

#[tokio::test]
async fn hooks_take_each_delivery_once() {
    let db = TestDb::new().await;
    conformance::hooks_take_each_delivery_once(&db.world().await).await;
}

#[tokio::test]
async fn retention_prunes_deltas_in_place() {
    let db = TestDb::new().await;
    conformance::retention_prunes_deltas_in_place(&db.world().await).await;
}

#[tokio::test]
async fn an_append_says_whether_the_inbox_is_empty() {
    let db = TestDb::new().await;
    // A second pool: another process posting.
    conformance::an_append_says_whether_the_inbox_is_empty(&db.world().await, &db.world().await)
        .await;
}

/// A lean append (a tool call's intent): it changes nothing but the log.
fn intent(n: usize) -> Event {
    Event::ToolCallIntent {
        call_id: format!("toolu_{n}"),
        tool: "read".into(),
        input: serde_json::json!({ "path": format!("src/{n}.rs") }),
        class: steadfast_log::ToolClass::Read,
        snapshot_before: None,
    }
}

/// Many sessions appending at once through one process share commits (group
/// commit): each append still returns only once its rows are in, every log stays
/// whole and in order, each append answers for its own session's inbox, and stale
/// holders among them are refused on their own, without failing the appends they
/// were grouped with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sessions_share_commits_and_stale_holders_among_them_are_refused_alone() {
    const SESSIONS: usize = 16;
    const APPENDS: usize = 30;
    // Sessions g0..g3 lose their leases to another process before anyone appends.
    const STALE: usize = 4;
    let stale = |session: &str| session[1..].parse::<usize>().unwrap() < STALE;
    let db = TestDb::new().await;
    let world = db.world().await;
    let other = db.world().await;
    let mut leases = Vec::new();
    for n in 0..SESSIONS {
        let session = format!("g{n}");
        world.create_session(&session, "alice").await.unwrap();
        // The stale sessions' leases are short: another process takes them below.
        let ttl = std::time::Duration::from_millis(if n < STALE { 50 } else { 60_000 });
        let lease = world
            .acquire_lease(&session, &Holder::new("a"), ttl)
            .await
            .unwrap();
        world.append(&lease, &[intent(0)]).await.unwrap();
        leases.push(lease);
    }
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    for lease in &leases[..STALE] {
        let taken = other
            .acquire_lease(
                &lease.session,
                &Holder::new("b"),
                std::time::Duration::from_secs(60),
            )
            .await
            .unwrap();
        assert!(taken.epoch > lease.epoch);
    }
    // Another process leaves session g5 a message: each grouped append must answer
    // for its own session's inbox, not its neighbours'.
    other
        .post(
            "g5",
            steadfast_world::InboundKind::Message,
            "",
            &serde_json::json!("steer"),
        )
        .await
        .unwrap();

    // Everyone's first append at once: a stale holder's first append is the one that
    // goes through the group (after a refusal it takes the locking path).
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(SESSIONS));
    let mut tasks = Vec::new();
    for lease in leases {
        let world = world.clone();
        let start = start.clone();
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            let mut refused = 0;
            for i in 1..=APPENDS {
                match world.append(&lease, &[intent(i)]).await {
                    Ok(records) => assert_eq!(records[0].seq, 1 + i as u64),
                    Err(Error::StaleFence { .. }) => refused += 1,
                    Err(e) => panic!("{}: {e}", lease.session),
                }
            }
            let seen_empty = world.inbox_seen_empty(&lease);
            (lease.session, refused, seen_empty)
        }));
    }
    for task in tasks {
        let (session, refused, seen_empty) = task.await.unwrap();
        match session.as_str() {
            s if stale(s) => {}
            "g5" => assert!(!seen_empty, "g5's appends saw its pending message"),
            _ => assert!(seen_empty, "{session}: its inbox is empty"),
        }
        let log = world.read(&session, 1).await.unwrap();
        if stale(&session) {
            assert_eq!(
                refused, APPENDS,
                "every append of the stale holder is refused"
            );
            assert_eq!(log.len(), 1, "nothing of the stale holder's lands");
        } else {
            assert_eq!(refused, 0, "{session}: no append refused");
            assert_eq!(log.len(), 1 + APPENDS, "{session}: every append is in");
            let seqs: Vec<u64> = log.iter().map(|r| r.seq).collect();
            assert_eq!(seqs, (1..=1 + APPENDS as u64).collect::<Vec<_>>());
        }
    }

    // Rows of different sessions committed in one transaction: they were grouped.
    let (client, conn) = tokio_postgres::connect(&db.url, NoTls).await.unwrap();
    tokio::spawn(conn);
    let shared: i64 = client
        .query_one(
            "SELECT count(*) FROM (SELECT xmin::text FROM steadfast_events GROUP BY xmin::text \
             HAVING count(DISTINCT session_id) > 1) t",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(shared > 0, "no two sessions' appends shared a commit");
}

#[tokio::test]
async fn tokens_and_the_audit_log() {
    let db = TestDb::new().await;
    conformance::tokens_and_the_audit_log(&db.world().await).await;
}

#[tokio::test]
async fn forks_share_the_parents_log() {
    let db = TestDb::new().await;
    conformance::forks_share_the_parents_log(&db.world().await).await;
}

#[tokio::test]
async fn rewinds_set_records_aside_without_reusing_positions() {
    let db = TestDb::new().await;
    conformance::rewinds_set_records_aside_without_reusing_positions(&db.world().await).await;
}

/// `steadfast migrate` from many replicas at once (a compose file's or a rollout's):
/// they take turns under a lock, every one succeeds, and each migration is applied
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_from_many_replicas_at_once_apply_once() {
    let db = TestDb::new().await;
    let replicas = (0..6).map(|_| {
        let url = db.url.clone();
        tokio::spawn(async move { PostgresWorld::connect_and_migrate(&url).await.map(drop) })
    });
    for replica in futures_util::future::join_all(replicas).await {
        replica.unwrap().unwrap();
    }
    let world = db.world().await;
    assert!(
        world.migrate().await.unwrap().is_empty(),
        "all were applied"
    );
    let (client, conn) = tokio_postgres::connect(&db.url, NoTls).await.unwrap();
    tokio::spawn(conn);
    let row = client
        .query_one(
            "SELECT count(*), count(DISTINCT version) FROM steadfast_schema",
            &[],
        )
        .await
        .unwrap();
    let (all, distinct): (i64, i64) = (row.get(0), row.get(1));
    assert_eq!(all, distinct);
    assert!(all > 10, "{all}");
}

#[tokio::test]
async fn a_worker_takes_back_what_it_held_once_its_lease_lapses() {
    let db = TestDb::new().await;
    conformance::a_worker_takes_back_what_it_held_once_its_lease_lapses(&db.world().await).await;
}

#[tokio::test]
async fn rate_buckets_are_shared_and_refill() {
    let db = TestDb::new().await;
    // A second pool: a second API process.
    conformance::rate_buckets_are_shared_and_refill(&db.world().await, &db.world().await).await;
}

#[tokio::test]
async fn an_owners_kept_bytes_sum_their_sessions() {
    let db = TestDb::new().await;
    conformance::an_owners_kept_bytes_sum_their_sessions(&db.world().await, &db.world().await)
        .await;
}

#[tokio::test]
async fn work_is_what_a_worker_claims() {
    let db = TestDb::new().await;
    conformance::work_is_what_a_worker_claims(&db.world().await).await;
}
