//! Breakers and budgets (docs/ARCHITECTURE.md rule 7): each bound stops a running session in
//! `escalated` with the reason and the diff, and a `resume` signal (raising the bound)
//! lets it go on.

mod common;

use common::{bash, Setup};
use serde_json::json;
use steadfast_harness::{Harness, NewSession, Stop};
use steadfast_log::{Breaker, Event, Limits, RESUME_SIGNAL};
use steadfast_world::{InboundKind, World};

/// The last `escalated` record of the session: its breaker, reason and diff.
async fn escalation(harness: &Harness, id: &str) -> (Breaker, String, Vec<String>) {
    let log = harness.world().read(id, 1).await.unwrap();
    log.iter()
        .rev()
        .find_map(|r| match &r.event {
            Event::Escalated {
                breaker,
                reason,
                diff,
            } => Some((*breaker, reason.clone(), diff.clone())),
            _ => None,
        })
        .expect("an escalated record")
}

/// Sends the resume signal and drives the session again.
async fn resume(harness: &Harness, id: &str, payload: serde_json::Value) -> Stop {
    harness
        .world()
        .post(id, InboundKind::Signal, RESUME_SIGNAL, &payload)
        .await
        .unwrap();
    let mut driver = harness.wake_native(id).await.unwrap();
    let stop = driver.run().await.unwrap();
    driver.release().await.unwrap();
    stop
}

async fn start(harness: &Harness, setup: &Setup, model: &str, limits: Limits) -> String {
    let mut new = NewSession::native(model, &setup.workspace()).with_task("go");
    new.limits = limits;
    harness.start_session(new).await.unwrap()
}

async fn run(harness: &Harness, id: &str) -> Stop {
    let mut driver = harness.wake_native(id).await.unwrap();
    let stop = driver.run().await.unwrap();
    driver.release().await.unwrap();
    stop
}

fn escalated() -> Stop {
    Stop::Waiting(RESUME_SIGNAL.into())
}

#[tokio::test]
async fn a_runaway_turn_escalates_with_the_diff_and_resume_grants_more_steps() {
    let tick = bash("date >> clock.txt");
    let setup = Setup::new(json!([tick.clone(), tick.clone(), tick, {"text": "done"}])).await;
    let harness = setup.harness_with(|o| o.max_steps_per_turn = 2);
    let id = start(&harness, &setup, "fake/m", Limits::default()).await;

    assert_eq!(run(&harness, &id).await, escalated());
    let (breaker, reason, diff) = escalation(&harness, &id).await;
    assert_eq!(breaker, Breaker::Steps);
    assert!(reason.contains("step budget"), "{reason}");
    assert_eq!(diff, vec!["added clock.txt".to_string()]);
    assert_eq!(setup.fake.calls(), 2);
    let summary = harness.world().session(&id).await.unwrap();
    assert_eq!(summary.status, steadfast_log::Status::Escalated);

    // Waking without the signal does nothing more.
    assert_eq!(run(&harness, &id).await, escalated());
    assert_eq!(setup.fake.calls(), 2);

    // Resuming grants another step budget: two more calls finish the turn.
    assert_eq!(resume(&harness, &id, json!({})).await, Stop::Idle);
    assert_eq!(setup.fake.calls(), 4);
}

#[tokio::test]
async fn a_spend_cap_escalates_and_a_raised_cap_resumes() {
    let setup = Setup::new(json!([bash("true"), {"text": "done"}])).await;
    let harness = setup.harness();
    let limits = Limits {
        max_cost_micro_usd: Some(1),
        ..Limits::default()
    };
    let id = start(&harness, &setup, "anthropic/claude-sonnet-4-5", limits).await;
    assert_eq!(run(&harness, &id).await, escalated());
    let (breaker, reason, _) = escalation(&harness, &id).await;
    assert_eq!(
        (breaker, reason.contains("spend cap")),
        (Breaker::Cost, true)
    );
    assert_eq!(
        setup.fake.calls(),
        0,
        "a call that could cross the cap is not made"
    );

    assert_eq!(
        resume(&harness, &id, json!({"max_cost_usd": 10.0})).await,
        Stop::Idle
    );
    assert_eq!(setup.fake.calls(), 2);
    let state = harness.state(&id).await.unwrap();
    assert_eq!(state.limits.max_cost_micro_usd, Some(10_000_000));
}

#[tokio::test]
async fn a_spend_cap_is_never_crossed_calls_near_it_are_lowered_to_fit() {
    // Forty steps a turn at claude-sonnet's price could spend far past the cap; each
    // call is made only if its worst case fits in what is left, its output limit
    // lowered to fit near the end, and the session escalates before the one that
    // would not fit, having spent no more than the cap.
    let ticks: Vec<_> = (0..40)
        .map(|i| bash(&format!("echo {i} >> n.txt")))
        .collect();
    let setup = Setup::new(json!(ticks)).await;
    let harness = setup.harness();
    let cap = 200_000;
    let limits = Limits {
        max_cost_micro_usd: Some(cap),
        ..Limits::default()
    };
    let id = start(&harness, &setup, "anthropic/claude-sonnet-4-5", limits).await;
    assert_eq!(run(&harness, &id).await, escalated());
    let (breaker, reason, _) = escalation(&harness, &id).await;
    assert_eq!(breaker, Breaker::Cost);
    assert!(reason.contains("could cost up to"), "{reason}");
    let state = harness.state(&id).await.unwrap();
    assert!(
        state.cost_micro_usd <= cap,
        "spent {} of {cap}",
        state.cost_micro_usd
    );
    let asked: Vec<u64> = setup
        .fake
        .state()
        .requests()
        .iter()
        .map(|r| {
            serde_json::from_str::<serde_json::Value>(r).unwrap()["max_tokens"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert!(asked.len() > 2 && asked.len() < 40, "{asked:?}");
    assert_eq!(asked[0], 8192, "far from the cap, as configured");
    let last = *asked.last().unwrap();
    assert!(
        (1024..8192).contains(&last),
        "near the cap, lowered but not below a useful reply: {asked:?}"
    );
}

#[tokio::test]
async fn a_token_limit_escalates_and_a_resume_without_a_raise_stops_again() {
    let setup = Setup::new(json!([bash("true"), {"text": "done"}])).await;
    let harness = setup.harness();
    let limits = Limits {
        max_tokens: Some(1),
        ..Limits::default()
    };
    let id = start(&harness, &setup, "fake/m", limits).await;
    assert_eq!(run(&harness, &id).await, escalated());
    assert_eq!(escalation(&harness, &id).await.0, Breaker::Tokens);
    assert_eq!(setup.fake.calls(), 1);

    // A payload that raises nothing (here: values of the wrong kind, which are
    // ignored) leaves the bound in force: the session escalates again, calling nothing.
    assert_eq!(
        resume(
            &harness,
            &id,
            json!({"max_tokens": "lots", "max_turns": -1})
        )
        .await,
        escalated()
    );
    assert_eq!(setup.fake.calls(), 1);

    assert_eq!(
        resume(&harness, &id, json!({"max_tokens": 1_000_000})).await,
        Stop::Idle
    );
    assert_eq!(setup.fake.calls(), 2);
}

#[tokio::test]
async fn a_turn_limit_stops_the_next_turn_before_its_first_model_call() {
    let setup = Setup::new(json!([{"text": "one"}, {"text": "two"}])).await;
    let harness = setup.harness();
    let limits = Limits {
        max_turns: Some(1),
        ..Limits::default()
    };
    let id = start(&harness, &setup, "fake/m", limits).await;
    assert_eq!(run(&harness, &id).await, Stop::Idle);
    harness
        .world()
        .post(&id, InboundKind::Message, "", &json!("again"))
        .await
        .unwrap();
    assert_eq!(run(&harness, &id).await, escalated());
    assert_eq!(escalation(&harness, &id).await.0, Breaker::Turns);
    assert_eq!(setup.fake.calls(), 1);

    assert_eq!(
        resume(&harness, &id, json!({"max_turns": 2})).await,
        Stop::Idle
    );
    assert_eq!(setup.fake.calls(), 2);
    assert_eq!(harness.state(&id).await.unwrap().turn, 2);
}

#[tokio::test]
async fn a_wall_clock_limit_escalates_before_any_more_work() {
    let setup = Setup::new(json!([{"text": "done"}])).await;
    let harness = setup.harness();
    let limits = Limits {
        max_duration_ms: Some(1),
        ..Limits::default()
    };
    let id = start(&harness, &setup, "fake/m", limits).await;
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    assert_eq!(run(&harness, &id).await, escalated());
    let (breaker, reason, _) = escalation(&harness, &id).await;
    assert_eq!(breaker, Breaker::Duration, "{reason}");
    assert_eq!(setup.fake.calls(), 0);

    assert_eq!(
        resume(&harness, &id, json!({"max_duration_s": 3600})).await,
        Stop::Idle
    );
    assert_eq!(setup.fake.calls(), 1);
}

#[tokio::test]
async fn the_same_call_three_times_without_a_change_trips_the_loop_breaker() {
    let look = bash("cat hello.txt");
    let setup = Setup::new(json!([look.clone(), look.clone(), look, {"text": "done"}])).await;
    let harness = setup.harness();
    let id = start(&harness, &setup, "fake/m", Limits::default()).await;
    assert_eq!(run(&harness, &id).await, escalated());
    let (breaker, reason, diff) = escalation(&harness, &id).await;
    assert_eq!(breaker, Breaker::Loop);
    assert!(reason.contains("3 times"), "{reason}");
    assert!(diff.is_empty(), "{diff:?}");
    assert_eq!(setup.fake.calls(), 3);

    // A human looked and lets it go on: the count starts over.
    assert_eq!(resume(&harness, &id, json!({})).await, Stop::Idle);
    assert_eq!(setup.fake.calls(), 4);
}

#[tokio::test]
async fn repeating_a_call_that_changes_the_workspace_is_not_a_loop() {
    let grow = bash("echo x >> grow.txt");
    let setup =
        Setup::new(json!([grow.clone(), grow.clone(), grow.clone(), grow, {"text": "done"}])).await;
    let harness = setup.harness();
    let id = start(&harness, &setup, "fake/m", Limits::default()).await;
    assert_eq!(run(&harness, &id).await, Stop::Idle);
    assert_eq!(setup.fake.calls(), 5);
    assert_eq!(
        std::fs::read_to_string(setup.workspace().join("grow.txt")).unwrap(),
        "x\nx\nx\nx\n"
    );
}
