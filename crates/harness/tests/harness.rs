//! The harness against a real SQLite world, real workspace and the fake provider.

use serde_json::json;
use steadfast_harness::{Error, NewSession, Stop};
use steadfast_log::{EndState, Event, Output};
use steadfast_world::{Holder, World};

mod common;

use common::{bash, read, write, Setup};

#[tokio::test]
async fn a_second_driver_is_fenced_out_and_the_log_never_interleaves() -> anyhow::Result<()> {
    let setup = Setup::new(json!([bash("echo a >> out.txt"), bash("echo b >> out.txt"), bash("echo c >> out.txt"), {"text": "done"}])).await;
    let one = setup.harness();
    let two = setup.harness();
    let id = one
        .start_session(NewSession::native("fake/m", &setup.workspace()))
        .await?;

    let mut a = one.wake_native(&id).await?;
    a.send("go").await?;
    a.step().await?; // model call
    assert!(matches!(
        two.wake_native(&id).await,
        Err(Error::World(steadfast_world::Error::LeaseHeld { .. }))
    ));

    // A's lease lapses (say its host stalled); B takes the session over.
    let db = rusqlite::Connection::open(setup.dir.path().join("home/world.db"))?;
    db.execute("UPDATE sessions SET lease_expires_ms = 0", [])?;
    let mut b = two.wake_native(&id).await?;
    assert_eq!(b.run().await?, Stop::Idle);

    // A wakes up and tries to carry on: every append is rejected by the store.
    let err = a.step().await.unwrap_err();
    assert!(
        matches!(err, Error::World(steadfast_world::Error::StaleFence { .. })),
        "{err}"
    );

    let log = one.world().read(&id, 1).await?;
    for pair in log.windows(2) {
        assert!(
            pair[0].epoch <= pair[1].epoch,
            "interleaved at #{}",
            pair[1].seq
        );
    }
    assert_eq!(
        std::fs::read_to_string(setup.workspace().join("out.txt"))?,
        "a\nb\nc\n"
    );
    assert_eq!(setup.fake.calls(), 4);
    Ok(())
}

/// A short read runs before the reply that asks for it is committed, and the whole
/// step waits for the driver's next commit; if the lease is lost meanwhile, that
/// commit is refused, the driver appends nothing more (its state is ahead of the log),
/// and the new holder takes the step again: the reply lost with the lease is asked
/// for again (the one call a crash just before a commit costs), the read runs again,
/// nothing else is repeated and nothing is lost.
#[tokio::test]
async fn a_staged_step_lost_with_the_lease_is_taken_again_by_the_new_holder() -> anyhow::Result<()>
{
    // The write first, so the sandbox runs by the read (a read waits for none to start).
    let setup = Setup::new(json!([
        write("out.txt", "out\n"),
        read("hello.txt"),
        read("hello.txt"),
        {"text": "done"}
    ]))
    .await;
    let (one, two) = (setup.harness(), setup.harness());
    let id = one
        .start_session(NewSession::native("fake/m", &setup.workspace()))
        .await?;
    let mut a = one.wake_native(&id).await?;
    a.send("go").await?;
    assert_eq!(a.step().await?, None); // the first model call
    assert_eq!(a.step().await?, None); // the write
    let written = one.world().read(&id, 1).await?.len() as u64;
    assert_eq!(a.state().last_seq, written, "a write commits alone");
    assert_eq!(a.step().await?, None); // the second model call and the read
    let log = one.world().read(&id, 1).await?;
    assert!(
        matches!(
            log.last().map(|r| &r.event),
            Some(Event::ModelCallIntent { .. })
        ),
        "the reply and the read are held for the next commit: {:?}",
        log.last()
    );
    // The reply's last piece and outcome, the read's intent and its outcome.
    assert_eq!(a.state().last_seq, log.len() as u64 + 4);

    let db = rusqlite::Connection::open(setup.dir.path().join("home/world.db"))?;
    db.execute("UPDATE sessions SET lease_expires_ms = 0", [])?;
    let mut b = two.wake_native(&id).await?;
    assert_eq!(b.run().await?, Stop::Idle);

    let err = a.step().await.unwrap_err();
    assert!(
        matches!(err, Error::World(steadfast_world::Error::StaleFence { .. })),
        "{err}"
    );
    let err = a.step().await.unwrap_err();
    assert!(
        matches!(err, Error::World(steadfast_world::Error::OutOfStep(_))),
        "{err}"
    );

    let log = one.world().read(&id, 1).await?;
    steadfast_log::fold::fold(&log)?;
    let count = |kind: &str| log.iter().filter(|r| r.event.kind() == kind).count();
    assert_eq!(count("model_call_interrupted"), 1, "{log:#?}");
    assert_eq!(count("model_call_outcome"), 4, "{log:#?}");
    assert_eq!(count("tool_call_outcome"), 3, "{log:#?}");
    assert_eq!(count("tool_call_interrupted"), 0, "{log:#?}");
    assert_eq!(
        setup.fake.calls(),
        5,
        "four calls, and the one whose reply was lost with the lease asked again"
    );
    Ok(())
}

/// A driver stopped between steps (its run dropped, as a graceful stop does) commits
/// what it holds for the next commit: the reply and its read go into the log, and the
/// next holder asks the model for nothing twice.
#[tokio::test]
async fn a_graceful_stop_commits_the_staged_step() -> anyhow::Result<()> {
    let setup = Setup::new(json!([
        write("out.txt", "out\n"),
        read("hello.txt"),
        {"text": "done"}
    ]))
    .await;
    let harness = setup.harness();
    let id = harness
        .start_session(NewSession::native("fake/m", &setup.workspace()))
        .await?;
    let mut a = harness.wake_native(&id).await?;
    a.send("go").await?;
    for _ in 0..3 {
        assert_eq!(a.step().await?, None); // the write's call, the write, the read's call
    }
    let before = harness.world().read(&id, 1).await?.len() as u64;
    assert!(a.state().last_seq > before, "the read's step is held");
    a.commit_staged().await?;
    let log = harness.world().read(&id, 1).await?;
    assert_eq!(log.len() as u64, a.state().last_seq);
    assert!(
        matches!(
            log.last().map(|r| &r.event),
            Some(Event::ToolCallOutcome { .. })
        ),
        "{:?}",
        log.last()
    );
    a.release().await?;

    let mut b = harness.wake_native(&id).await?;
    assert_eq!(b.run().await?, Stop::Idle);
    assert_eq!(setup.fake.calls(), 3, "no model call asked twice");
    Ok(())
}

#[tokio::test]
async fn big_outputs_go_to_the_blob_store_with_excerpts_in_context() -> anyhow::Result<()> {
    let setup = Setup::new(json!([
        bash("printf '\\033[31mFIRST\\033[0m\\n'; head -c 300000 /dev/zero | tr '\\0' y; echo; echo LAST"),
        {"text": "done"}
    ]))
    .await;
    let harness = setup.harness();
    let id = harness
        .start_session(NewSession::native("fake/m", &setup.workspace()))
        .await?;
    let mut driver = harness.wake_native(&id).await?;
    driver.send("go").await?;
    assert_eq!(driver.run().await?, Stop::Idle);

    let log = harness.world().read(&id, 1).await?;
    let blob = log
        .iter()
        .find_map(|r| match &r.event {
            Event::ToolCallOutcome {
                output: Output::Blob(b),
                ..
            } => Some(b.clone()),
            _ => None,
        })
        .expect("the big output is a blob reference");
    assert!(blob.size > 300_000);
    assert!(
        blob.head.starts_with("FIRST\n"),
        "ANSI stripped: {:?}",
        &blob.head[..10]
    );
    assert!(blob.tail.ends_with("LAST\n"));
    assert!(blob.uri.starts_with("file://") && blob.uri.ends_with(&blob.hash));
    let stored_record = log
        .iter()
        .map(|r| serde_json::to_vec(&r.event).unwrap().len())
        .max()
        .unwrap();
    assert!(stored_record < 64 * 1024, "no record holds the payload");
    let blobs = steadfast_world::Blobs::local(&setup.dir.path().join("home/blobs"))?;
    assert_eq!(blobs.get(&blob.hash).await?.len() as u64, blob.size);
    let shown = driver.state().conversation[2].content[0].clone();
    let steadfast_log::Block::ToolResult { content, .. } = shown else {
        panic!()
    };
    assert!(content.contains("output truncated") && content.len() < 20_000);
    Ok(())
}

#[tokio::test]
async fn a_rejected_model_call_fails_the_session_clearly() -> anyhow::Result<()> {
    let setup = Setup::new(json!([{"text": "x", "fail": {"status": 400, "times": 5}}])).await;
    let harness = setup.harness();
    let id = harness
        .start_session(NewSession::native("fake/m", &setup.workspace()))
        .await?;
    let mut driver = harness.wake_native(&id).await?;
    driver.send("go").await?;
    assert_eq!(driver.run().await?, Stop::Ended(EndState::Failed));
    let state = harness.state(&id).await?;
    assert!(state.end_reason().unwrap().contains("400"));
    assert_eq!(setup.fake.calls(), 1, "a 4xx is not retried");
    Ok(())
}

#[tokio::test]
async fn a_message_is_refused_while_a_turn_is_open() -> anyhow::Result<()> {
    let setup = Setup::new(json!([bash("true"), {"text": "done"}])).await;
    let harness = setup.harness();
    let id = harness
        .start_session(NewSession::native("fake/m", &setup.workspace()))
        .await?;
    let mut driver = harness.wake_native(&id).await?;
    driver.send("go").await?;
    assert!(matches!(driver.send("again").await, Err(Error::Invalid(_))));
    assert!(matches!(
        harness.wake_native("ses_unknown").await,
        Err(Error::World(steadfast_world::Error::NotFound(_)))
    ));
    assert!(harness
        .start_session(NewSession::native("no-slash", &setup.workspace()))
        .await
        .is_err());
    Ok(())
}

#[tokio::test]
async fn the_harness_credentials_never_reach_a_command() -> anyhow::Result<()> {
    std::env::set_var("ANTHROPIC_API_KEY", "sk-ant-harness-secret");
    std::env::set_var("STEADFAST_TEST_TOKEN", "tok-harness-secret");
    let setup =
        Setup::new(json!([bash("env; cat /proc/self/environ | tr '\\0' '\\n'"), {"text": "done"}]))
            .await;
    let harness = setup.harness();
    let id = harness
        .start_session(NewSession::native("fake/m", &setup.workspace()))
        .await?;
    let mut driver = harness.wake_native(&id).await?;
    driver.send("go").await?;
    driver.run().await?;
    let log = harness.world().read(&id, 1).await?;
    let output = log
        .iter()
        .find_map(|r| match &r.event {
            Event::ToolCallOutcome {
                output: Output::Inline { text },
                ..
            } => Some(text.clone()),
            _ => None,
        })
        .unwrap();
    assert!(output.contains("PATH="), "{output}");
    assert!(!output.contains("harness-secret"), "{output}");
    Ok(())
}

#[tokio::test]
async fn a_steer_is_taken_after_the_call_in_flight() -> anyhow::Result<()> {
    let setup = Setup::new(json!([bash("sleep 1; echo first"), {"text": "done"}])).await;
    let harness = setup.harness();
    let new = NewSession::native("fake/m", &setup.workspace()).with_task("go");
    let id = harness.start_session(new).await?;
    let mut driver = harness.wake_native(&id).await?;
    let steer = async {
        tokio::time::sleep(std::time::Duration::from_millis(400)).await;
        harness
            .world()
            .post(
                &id,
                steadfast_world::InboundKind::Steer,
                "",
                &json!("use python instead"),
            )
            .await
            .unwrap();
    };
    let (stop, ()) = tokio::join!(driver.run(), steer);
    assert_eq!(stop?, Stop::Idle);
    let log = harness.world().read(&id, 1).await?;
    let kinds: Vec<&str> = log
        .iter()
        .map(|r| r.event.kind())
        .filter(|k| *k != "model_delta")
        .collect();
    let steer_at = kinds
        .iter()
        .position(|k| *k == "steered")
        .expect("steer in the log");
    assert_eq!(
        kinds[steer_at - 1],
        "tool_call_outcome",
        "after the tool call in flight: {kinds:?}"
    );
    assert_eq!(
        kinds[steer_at + 1],
        "model_call_intent",
        "before the next model call: {kinds:?}"
    );
    let state = harness.state(&id).await?;
    let with_steer = &state.conversation[2];
    assert!(with_steer.text().contains("use python instead"));
    assert!(harness.world().inbox(&id).await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn the_approval_tool_waits_for_a_signal_holding_nothing() -> anyhow::Result<()> {
    let setup = Setup::new(json!([
        {"text": "asking", "tool_calls": [{"name": "request_approval", "input": {"reason": "push to main"}}]},
        {"text": "approved; done"}
    ]))
    .await;
    let harness = setup.harness();
    let id = harness
        .start_session(NewSession::native("fake/m", &setup.workspace()).with_task("go"))
        .await?;
    let mut driver = harness.wake_native(&id).await?;
    assert_eq!(driver.run().await?, Stop::Waiting("approval".into()));
    driver.release().await?;
    assert_eq!(
        harness.world().session(&id).await?.status,
        steadfast_log::Status::Waiting
    );
    let other = Holder::new("someone-else");
    assert!(
        harness
            .world()
            .claim(&other, std::time::Duration::from_secs(5))
            .await?
            .is_none(),
        "nothing to do yet"
    );

    harness
        .world()
        .post(
            &id,
            steadfast_world::InboundKind::Signal,
            "approval",
            &json!({"approved": true, "message": "go ahead"}),
        )
        .await?;
    let lease = harness
        .world()
        .claim(&other, std::time::Duration::from_secs(5))
        .await?
        .expect("claimable now");
    let mut driver = harness.wake_leased(lease).await?;
    assert_eq!(driver.run().await?, Stop::Idle);
    let results: Vec<String> = driver.state().conversation[2]
        .content
        .iter()
        .filter_map(|b| match b {
            steadfast_log::Block::ToolResult { content, .. } => Some(content.clone()),
            _ => None,
        })
        .collect();
    assert!(results[0].contains("go ahead"), "{results:?}");
    Ok(())
}

#[tokio::test]
async fn external_effects_wait_for_approval_when_asked_and_a_denial_skips_them(
) -> anyhow::Result<()> {
    let setup = Setup::new(
        json!([bash("curl -s http://127.0.0.1:9/ ; touch ran.txt"), {"text": "ok, not deploying"}]),
    )
    .await;
    let harness = setup.harness();
    let mut new = NewSession::native("fake/m", &setup.workspace()).with_task("deploy");
    new.approve_external = true;
    let id = harness.start_session(new).await?;
    let mut driver = harness.wake_native(&id).await?;
    assert_eq!(driver.run().await?, Stop::Waiting("approval".into()));
    assert!(!setup.workspace().join("ran.txt").exists());
    harness
        .world()
        .post(
            &id,
            steadfast_world::InboundKind::Signal,
            "approval",
            &json!({"approved": false, "message": "not today"}),
        )
        .await?;
    assert_eq!(driver.run().await?, Stop::Idle);
    assert!(
        !setup.workspace().join("ran.txt").exists(),
        "a denied call never runs"
    );
    let log = harness.world().read(&id, 1).await?;
    assert!(!log.iter().any(|r| r.event.kind() == "tool_call_intent"));
    let last_user = &driver.state().conversation[2];
    assert!(last_user.content.iter().any(|b| matches!(b, steadfast_log::Block::ToolResult { content, is_error: true, .. } if content.contains("not today"))));
    Ok(())
}

#[tokio::test]
async fn a_worker_takes_queued_messages_from_the_world() -> anyhow::Result<()> {
    let setup = Setup::new(json!([{"text": "first reply"}, {"text": "second reply"}])).await;
    let harness = setup.harness();
    let id = harness
        .start_session(NewSession::native("fake/m", &setup.workspace()))
        .await?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let worker = harness.work(stop_rx);
    let client = async {
        let world = harness.world();
        world
            .post(
                &id,
                steadfast_world::InboundKind::Message,
                "",
                &json!("one"),
            )
            .await
            .unwrap();
        world
            .post(
                &id,
                steadfast_world::InboundKind::Message,
                "",
                &json!("two"),
            )
            .await
            .unwrap();
        for _ in 0..200 {
            let s = harness.state(&id).await.unwrap();
            if s.turn == 2 && s.phase.status() == steadfast_log::Status::Idle {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        stop_tx.send(true).unwrap();
    };
    tokio::join!(worker, client);
    let state = harness.state(&id).await?;
    assert_eq!(
        (state.turn, state.phase.status()),
        (2, steadfast_log::Status::Idle)
    );
    assert_eq!(state.last_reply().as_deref(), Some("second reply"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_provider_is_retried_later_with_backoff_and_no_lease_held() -> anyhow::Result<()>
{
    use std::time::Duration;
    let setup = Setup::new(json!([
        {"text": "back again", "fail": {"status": 503, "times": 3}}
    ]))
    .await;
    let base_url = setup.fake.base_url();
    let backoff = steadfast_harness::Backoff {
        first: Duration::from_millis(300),
        max: Duration::from_millis(500),
    };
    let harness = setup.harness_with(|o| {
        // One attempt per wake: the provider's own retries are not what is measured.
        o.models = one_attempt(base_url);
        o.retry_backoff = backoff;
    });
    let mut session = NewSession::native("fake/m", &setup.workspace());
    session.task = Some("go".into());
    let id = harness.start_session(session).await?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let worker = harness.work(stop_rx);
    let watch = async {
        let (mut retrying_seen, mut free_seen) = (false, 0);
        for _ in 0..400 {
            let summary = harness.world().session(&id).await.unwrap();
            if summary.status == steadfast_log::Status::Retrying {
                retrying_seen = true;
                // Between attempts nobody holds the session: another worker, or a
                // close, could take it at once. (The worker may just be letting go,
                // or already back once the time has come.)
                let probe = harness
                    .world()
                    .acquire_lease(&id, &Holder::new("probe"), Duration::from_secs(5))
                    .await;
                if let Ok(lease) = probe {
                    harness.world().release_lease(&lease).await.unwrap();
                    free_seen += 1;
                }
            }
            if summary.status == steadfast_log::Status::Idle {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop_tx.send(true).unwrap();
        (retrying_seen, free_seen)
    };
    let ((), (retrying_seen, free_seen)) = tokio::join!(worker, watch);
    assert!(retrying_seen, "the status said `retrying` between attempts");
    assert!(
        free_seen > 0,
        "no lease is held while a session waits to retry"
    );
    let log = harness.world().read(&id, 1).await?;
    let failures: Vec<(u64, u32, u64)> = log
        .iter()
        .filter_map(|r| match &r.event {
            Event::DriveFailed {
                attempt,
                retry_at_ms: Some(at),
                ..
            } => Some((r.at_ms, *attempt, *at)),
            _ => None,
        })
        .collect();
    assert_eq!(
        failures.iter().map(|f| f.1).collect::<Vec<_>>(),
        [1, 2, 3],
        "three failures in a row, counted: {failures:?}"
    );
    for (at, attempt, retry_at) in &failures {
        let full = (backoff.first * 2u32.pow(attempt - 1)).min(backoff.max);
        let delay = Duration::from_millis(retry_at - at);
        assert!(
            delay >= full / 2 && delay <= full,
            "attempt {attempt}: waited {delay:?}, backoff {full:?} with jitter"
        );
    }
    // No attempt began before its time.
    for pair in failures.windows(2) {
        assert!(
            pair[1].0 >= pair[0].2,
            "an attempt came early: {failures:?}"
        );
    }
    let state = harness.state(&id).await?;
    assert_eq!(state.last_reply().as_deref(), Some("back again"));
    assert!(state.retry.is_none() && state.failures_in_row == 0);
    assert_eq!(
        harness.world().session(&id).await?.status,
        steadfast_log::Status::Idle
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_reaches_a_session_waiting_to_retry_at_once() -> anyhow::Result<()> {
    use std::time::{Duration, Instant};
    let setup = Setup::new(json!([
        {"text": "never", "fail": {"status": 503, "times": 1000}}
    ]))
    .await;
    let base_url = setup.fake.base_url();
    let harness = setup.harness_with(|o| {
        o.models = one_attempt(base_url);
        // Far longer than the test: only the interrupt can bring the session back.
        o.retry_backoff = steadfast_harness::Backoff {
            first: Duration::from_secs(600),
            max: Duration::from_secs(600),
        };
    });
    let mut session = NewSession::native("fake/m", &setup.workspace());
    session.task = Some("go".into());
    let id = harness.start_session(session).await?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let worker = harness.work(stop_rx);
    let client = async {
        let deadline = Instant::now() + Duration::from_secs(30);
        while harness.world().session(&id).await.unwrap().status != steadfast_log::Status::Retrying
        {
            assert!(Instant::now() < deadline, "the first attempt failed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        harness.interrupt(&id, "alice").await.unwrap();
        let asked = Instant::now();
        while harness.world().session(&id).await.unwrap().status != steadfast_log::Status::Idle {
            assert!(
                asked.elapsed() < Duration::from_secs(20),
                "the interrupt did not wait out the 600 s retry"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop_tx.send(true).unwrap();
    };
    tokio::join!(worker, client);
    let state = harness.state(&id).await?;
    assert_eq!(state.interrupted_by(), Some("alice"));
    assert!(state.retry.is_none());
    Ok(())
}

/// Models at the fake provider `base_url` that try each call once, so a failure
/// reaches the worker at once instead of the provider client's own retries.
fn one_attempt(base_url: String) -> steadfast_harness::ModelResolver {
    std::sync::Arc::new(move |_spec: &steadfast_log::ModelSpec| {
        let endpoint = steadfast_model::Endpoint {
            base_url: base_url.clone(),
            api_key: "k".into(),
        };
        let once = steadfast_model::RetryPolicy {
            max_attempts: 1,
            ..Default::default()
        };
        steadfast_model::ModelClient::new("anthropic", endpoint, once)
    })
}

#[tokio::test]
async fn every_wake_of_a_harness_calls_the_provider_over_its_one_connection_pool(
) -> anyhow::Result<()> {
    let setup = Setup::new(json!([
        {"text": "one"}, {"text": "two"}, {"text": "three"},
    ]))
    .await;
    let harness = setup.harness();
    let id = harness
        .start_session(NewSession::native("fake/m", &setup.workspace()))
        .await?;
    // Each turn is a wake of its own, as a worker takes each turn.
    for text in ["go", "again"] {
        let mut driver = harness.wake_native(&id).await?;
        driver.send(text).await?;
        driver.run().await?;
        driver.release().await?;
    }
    assert_eq!(setup.fake.calls(), 2);
    assert_eq!(
        setup.fake.state().connections(),
        1,
        "the second wake reused the first one's connection (no new TLS handshake)"
    );
    // Another harness (another process) has a pool of its own.
    let other = setup.harness();
    let mut driver = other.wake_native(&id).await?;
    driver.send("and again").await?;
    driver.run().await?;
    driver.release().await?;
    assert_eq!(setup.fake.state().connections(), 2);
    Ok(())
}

/// Between turns a directory session's files are its user's too: what a person changed
/// while the session was down is recorded (`workspace_edited`, what changed), kept (the
/// native loop used to put the directory back to its last snapshot, discarding it),
/// and told to the model with the next message. A session nobody touched records
/// nothing.
#[tokio::test]
async fn edits_made_between_turns_are_kept_recorded_and_told() -> anyhow::Result<()> {
    let setup = Setup::new(json!([
        write("made.txt", "by the agent\n"),
        {"text": "turn one done"},
        {"text": "turn two done"},
        {"text": "turn three done"}
    ]))
    .await;
    let harness = setup.harness();
    let id = harness
        .start_session(NewSession::native("fake/m", &setup.workspace()))
        .await?;
    let mut driver = harness.wake_native(&id).await?;
    driver.send("one").await?;
    driver.run().await?;
    driver.release().await?;

    // A person edits a file, adds one and deletes the agent's, while no one drives it.
    let ws = setup.workspace();
    std::fs::write(ws.join("hello.txt"), "hello, edited by a person\n")?;
    std::fs::write(ws.join("notes.txt"), "a person's notes\n")?;
    std::fs::remove_file(ws.join("made.txt"))?;

    let mut driver = harness.wake_native(&id).await?;
    driver.send("two").await?;
    driver.run().await?;
    driver.release().await?;
    assert_eq!(
        std::fs::read_to_string(ws.join("hello.txt"))?,
        "hello, edited by a person\n"
    );
    assert!(ws.join("notes.txt").exists() && !ws.join("made.txt").exists());
    let log = harness.world().read(&id, 1).await?;
    let edits: Vec<&Vec<String>> = log
        .iter()
        .filter_map(|r| match &r.event {
            Event::WorkspaceEdited { changes, .. } => Some(changes),
            _ => None,
        })
        .collect();
    assert_eq!(edits.len(), 1, "{log:?}");
    assert_eq!(
        edits[0],
        &vec![
            "modified hello.txt".to_string(),
            "removed made.txt".to_string(),
            "added notes.txt".to_string()
        ]
    );
    let told = setup.fake.state().requests();
    let last = told.last().unwrap();
    assert!(last.contains("was changed from outside"), "{last}");
    assert!(last.contains("added notes.txt"), "{last}");

    // Untouched, the next turn records no edit.
    let mut driver = harness.wake_native(&id).await?;
    driver.send("three").await?;
    driver.run().await?;
    driver.release().await?;
    let log = harness.world().read(&id, 1).await?;
    let edited = log
        .iter()
        .filter(|r| matches!(r.event, Event::WorkspaceEdited { .. }))
        .count();
    assert_eq!(edited, 1);
    Ok(())
}
