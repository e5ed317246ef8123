//! The contract suite every [`World`] backend must pass.
//!
//! Each function takes fresh handles to an empty world and panics on a contract
//! violation. A backend's tests call every function here (see `tests/sqlite.rs`), so
//! a new backend is correct exactly when it passes the same suite.

use std::time::Duration;

use steadfast_log::{Event, Status};

use std::collections::BTreeMap;

use crate::{Cursor, Error, Holder, SessionPatch, SessionQuery, World};

const TTL: Duration = Duration::from_secs(60);

fn message(turn: u32, text: &str) -> Event {
    Event::UserMessage {
        turn,
        text: text.to_string(),
        inbox_id: None,
    }
}

/// Appended events come back in order, with contiguous positions and their epoch.
pub async fn append_then_read<W: World>(world: &W) {
    world.create_session("s1", "alice").await.unwrap();
    let lease = world
        .acquire_lease("s1", &Holder::new("h1"), TTL)
        .await
        .unwrap();
    let first = world
        .append(&lease, &[message(1, "a"), message(2, "b")])
        .await
        .unwrap();
    assert_eq!(first.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![1, 2]);
    world.append(&lease, &[message(3, "c")]).await.unwrap();
    let all = world.read("s1", 1).await.unwrap();
    assert_eq!(all.len(), 3);
    assert!(all.iter().all(|r| r.epoch == lease.epoch));
    assert_eq!(all[2].event, message(3, "c"));
    let tail = world.read("s1", 3).await.unwrap();
    assert_eq!(tail.len(), 1);
    assert!(world.read("s1", 4).await.unwrap().is_empty());
    assert_eq!(world.session("s1").await.unwrap().last_seq, 3);
    let ended = Event::TurnEnded {
        turn: 3,
        reply: None,
    };
    world.append(&lease, &[ended]).await.unwrap();
    assert_eq!(
        world.turn_began("s1", 4).await.unwrap(),
        3,
        "the last turn began at 3"
    );
    assert_eq!(world.turn_began("s1", 2).await.unwrap(), 2);
    assert_eq!(
        world.turn_began("s1", 0).await.unwrap(),
        0,
        "no turn before the log"
    );
    assert_eq!(
        world
            .last_of_kind("s1", "user_message", u64::MAX)
            .await
            .unwrap(),
        3
    );
    assert_eq!(
        world.last_of_kind("s1", "user_message", 2).await.unwrap(),
        2
    );
    assert_eq!(
        world
            .last_of_kind("s1", "turn_ended", u64::MAX)
            .await
            .unwrap(),
        4
    );
    assert_eq!(world.last_of_kind("s1", "turn_ended", 3).await.unwrap(), 0);
    assert_eq!(
        world
            .last_of_kind("s1", "checkpoint", u64::MAX)
            .await
            .unwrap(),
        0
    );
}

/// Unknown sessions are `NotFound`; a duplicate create is `AlreadyExists`.
pub async fn unknown_and_duplicate_sessions<W: World>(world: &W) {
    assert!(matches!(
        world.read("nope", 1).await,
        Err(Error::NotFound(_))
    ));
    assert!(matches!(
        world.acquire_lease("nope", &Holder::new("h"), TTL).await,
        Err(Error::NotFound(_))
    ));
    world.create_session("s1", "alice").await.unwrap();
    assert!(matches!(
        world.create_session("s1", "bob").await,
        Err(Error::AlreadyExists(_))
    ));
}

/// A live holder keeps the lease; a lapsed or released one does not; every new
/// acquisition raises the epoch; appends under the old epoch are stale.
pub async fn leases_fence_appends<W: World>(world: &W) {
    world.create_session("s1", "alice").await.unwrap();
    let a = world
        .acquire_lease("s1", &Holder::new("a"), TTL)
        .await
        .unwrap();
    assert!(matches!(
        world.acquire_lease("s1", &Holder::new("b"), TTL).await,
        Err(Error::LeaseHeld { .. })
    ));
    world.append(&a, &[message(1, "from a")]).await.unwrap();
    world.renew_lease(&a, Duration::ZERO).await.unwrap();
    let b = world
        .acquire_lease("s1", &Holder::new("b"), TTL)
        .await
        .unwrap();
    assert!(b.epoch > a.epoch);
    let err = world.append(&a, &[message(2, "late a")]).await.unwrap_err();
    assert!(
        matches!(err, Error::StaleFence { epoch, current, .. } if epoch == a.epoch && current == b.epoch)
    );
    assert!(matches!(
        world.renew_lease(&a, TTL).await,
        Err(Error::StaleFence { .. })
    ));
    world.append(&b, &[message(2, "from b")]).await.unwrap();
    world.release_lease(&a).await.unwrap(); // a stale release changes nothing
    assert!(matches!(
        world.acquire_lease("s1", &Holder::new("c"), TTL).await,
        Err(Error::LeaseHeld { .. })
    ));
    // Records that change nothing but the log (the commonest kind) take whatever
    // fast path a world has; a released lease writes none of them either.
    world.append(&b, &[intent(1)]).await.unwrap();
    world.release_lease(&b).await.unwrap();
    let err = world.append(&b, &[intent(2)]).await.unwrap_err();
    assert!(matches!(err, Error::StaleFence { .. }), "{err}");
    let c = world
        .acquire_lease("s1", &Holder::new("c"), TTL)
        .await
        .unwrap();
    assert!(c.epoch > b.epoch);
    let log = world.read("s1", 1).await.unwrap();
    assert_eq!(log.len(), 3);
    assert_eq!(log[0].epoch, a.epoch);
    assert_eq!(log[1].epoch, b.epoch);
    assert_eq!(log[2].epoch, b.epoch);
}

/// Each append answers, in its own transaction, whether the inbox was empty, so a
/// driver skips reading it before a model call; what it says must be true. A post
/// from this process (`here`) clears the answer at once; one from another (`there`)
/// is seen at the next append.
pub async fn an_append_says_whether_the_inbox_is_empty<W: World>(here: &W, there: &W) {
    use crate::InboundKind;
    here.create_session("s1", "alice").await.unwrap();
    let lease = here
        .acquire_lease("s1", &Holder::new("w"), TTL)
        .await
        .unwrap();
    assert!(!here.inbox_seen_empty(&lease), "no append yet");
    here.append(&lease, &[started()]).await.unwrap();
    here.append(&lease, &[delta("a")]).await.unwrap();
    assert!(here.inbox_seen_empty(&lease), "nothing was posted");

    let steer = serde_json::json!("look at b");
    let id = there
        .post("s1", InboundKind::Steer, "", &steer)
        .await
        .unwrap();
    assert!(
        here.inbox_seen_empty(&lease),
        "as of the last append (a read finds another process's steer a step later)"
    );
    here.append(&lease, &[delta("b"), delta("c")])
        .await
        .unwrap();
    assert!(!here.inbox_seen_empty(&lease), "a steer waits");
    here.append(&lease, &[delta("d")]).await.unwrap();
    assert!(!here.inbox_seen_empty(&lease), "it still waits");
    let taken = Event::Steered {
        text: "look at b".into(),
        inbox_id: id,
    };
    here.append(&lease, &[taken]).await.unwrap();
    assert!(here.inbox("s1").await.unwrap().is_empty());
    assert!(
        here.inbox_seen_empty(&lease),
        "the append that took the steer leaves the inbox empty"
    );

    // A post from this process is not waited out.
    here.post("s1", InboundKind::Steer, "", &steer)
        .await
        .unwrap();
    assert!(!here.inbox_seen_empty(&lease), "posted here");

    // Another holder's lease: this process's answer was for the old epoch.
    here.append(&lease, &[delta("e")]).await.unwrap();
    here.release_lease(&lease).await.unwrap();
    let other = here
        .acquire_lease("s1", &Holder::new("v"), TTL)
        .await
        .unwrap();
    assert!(!here.inbox_seen_empty(&lease));
    assert!(!here.inbox_seen_empty(&other), "no append under it yet");
}

/// Two harnesses (separate handles to one store) race for a session and append as
/// fast as they can, each stealing the lease as soon as it lapses. Exactly one is
/// accepted at a time: every rejected append is a stale fence, and the log's epochs
/// never go back (no interleaving).
pub async fn racing_writers_never_interleave<W: World + Clone>(one: &W, two: &W) {
    one.create_session("race", "alice").await.unwrap();
    let mut tasks = Vec::new();
    for (name, world) in [("one", one.clone()), ("two", two.clone())] {
        tasks.push(tokio::spawn(async move {
            let holder = Holder::new(name);
            let (mut accepted, mut rejected) = (0u32, 0u32);
            for i in 0..40 {
                let lease = match world
                    .acquire_lease("race", &holder, Duration::from_millis(5))
                    .await
                {
                    Ok(l) => l,
                    Err(Error::LeaseHeld { .. }) => {
                        tokio::task::yield_now().await;
                        continue;
                    }
                    Err(e) => panic!("{e}"),
                };
                for j in 0..3 {
                    match world.append(&lease, &[message(i * 10 + j, name)]).await {
                        Ok(_) => accepted += 1,
                        Err(Error::StaleFence { .. }) => rejected += 1,
                        Err(e) => panic!("{e}"),
                    }
                }
            }
            (accepted, rejected)
        }));
    }
    let mut accepted = 0;
    for t in tasks {
        accepted += t.await.unwrap().0;
    }
    let log = one.read("race", 1).await.unwrap();
    assert_eq!(
        log.len() as u32,
        accepted,
        "every accepted append is in the log"
    );
    for pair in log.windows(2) {
        assert!(
            pair[0].epoch <= pair[1].epoch,
            "epochs interleave at #{}",
            pair[1].seq
        );
        if pair[0].epoch == pair[1].epoch {
            assert_eq!(pair[0].event_writer(), pair[1].event_writer());
        }
    }
}

trait Writer {
    fn event_writer(&self) -> String;
}

impl Writer for steadfast_log::Record {
    fn event_writer(&self) -> String {
        match &self.event {
            Event::UserMessage { text, .. } => text.clone(),
            _ => String::new(),
        }
    }
}

/// The session list shows status and title from the events appended.
pub async fn summaries_follow_the_log<W: World>(world: &W) {
    world.create_session("s1", "alice").await.unwrap();
    let lease = world
        .acquire_lease("s1", &Holder::new("h"), TTL)
        .await
        .unwrap();
    world
        .append(&lease, &[message(1, "fix the tests")])
        .await
        .unwrap();
    let list = world
        .list_sessions(&SessionQuery::default())
        .await
        .unwrap()
        .sessions;
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].status, Status::Running);
    assert_eq!(list[0].title, "fix the tests");
    assert_eq!(list[0].owner, "alice");
    let first_change = list[0].updated_at_ms;

    // Records that change nothing but the log still move the position and the time
    // of the last change, however the world stores them.
    std::thread::sleep(Duration::from_millis(5));
    for step in 1..=3 {
        world.append(&lease, &[intent(step)]).await.unwrap();
    }
    world.append(&lease, &[intent(4), intent(5)]).await.unwrap();
    let summary = world.session("s1").await.unwrap();
    assert_eq!(summary.last_seq, 6);
    assert_eq!(summary.status, Status::Running);
    assert!(summary.updated_at_ms > first_change, "{summary:?}");
    assert_eq!(
        world
            .list_sessions(&SessionQuery::default())
            .await
            .unwrap()
            .sessions[0]
            .last_seq,
        6
    );

    // A retry time is cleared by whatever is recorded next, even a plain record.
    let failed = Event::DriveFailed {
        reason: "provider down".into(),
        attempt: 1,
        retry_at_ms: Some(crate::now_ms() + 60_000),
    };
    world.append(&lease, &[failed]).await.unwrap();
    assert_eq!(world.session("s1").await.unwrap().status, Status::Retrying);
    world.append(&lease, &[intent(6)]).await.unwrap();
    let summary = world.session("s1").await.unwrap();
    assert_eq!(summary.status, Status::Running);
    assert_eq!(summary.last_seq, 8);
    assert_eq!(world.read("s1", 1).await.unwrap().len(), 8);
}

fn intent(step: u32) -> Event {
    Event::ModelCallIntent {
        call_id: format!("mc_{step}"),
        step,
        fingerprint: "f".repeat(64),
    }
}

/// A piece of a streamed reply holding `text`.
fn delta(text: &str) -> Event {
    Event::ModelDelta {
        call_id: "m1".into(),
        text: text.into(),
        restart: false,
    }
}

/// Listings: one owner's sessions a page at a time, newest first, with a cursor that
/// holds while sessions come and go; filters by status, agent, labels, time and title;
/// titles, labels and metadata set and changed, a set title kept over the first
/// message's.
pub async fn listings_page_and_filter<W: World>(world: &W) {
    let holder = Holder::new("h");
    let labels = |pairs: &[(&str, Option<&str>)]| -> BTreeMap<String, Option<String>> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.map(str::to_string)))
            .collect()
    };
    // Bob's 7 sessions and one of Alice's, interleaved; every other of Bob's labelled.
    for i in 0..8 {
        let (id, owner) = match i {
            3 => ("alice-1".to_string(), "alice"),
            _ => (format!("bob-{i}"), "bob"),
        };
        world.create_session(&id, owner).await.unwrap();
        if i % 2 == 0 {
            let patch = SessionPatch {
                labels: labels(&[("team", Some("infra")), ("ticket", Some(&format!("t{i}")))]),
                ..Default::default()
            };
            world.update_session(&id, &patch).await.unwrap();
        }
        if i < 6 {
            let lease = world.acquire_lease(&id, &holder, TTL).await.unwrap();
            let start = match i {
                5 => Event::bare_start(
                    "claude-code",
                    steadfast_log::ModelSpec {
                        provider: "fake".into(),
                        model: "m".into(),
                    },
                    "/w",
                ),
                _ => started(),
            };
            let events = match i {
                0 => vec![start, message(1, "Fix the FLAKY test")],
                _ => vec![start],
            };
            world.append(&lease, &events).await.unwrap();
            world.release_lease(&lease).await.unwrap();
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let ids = |page: &crate::SessionPage| -> Vec<String> {
        page.sessions.iter().map(|s| s.id.clone()).collect()
    };
    let bob = SessionQuery {
        owner: Some("bob".into()),
        limit: Some(3),
        ..Default::default()
    };

    // Pages of three, newest first, none of Alice's; a session created meanwhile
    // neither repeats nor shifts what follows.
    let first = world.list_sessions(&bob).await.unwrap();
    assert_eq!(ids(&first), ["bob-7", "bob-6", "bob-5"]);
    world.create_session("bob-8", "bob").await.unwrap();
    let second = world
        .list_sessions(&SessionQuery {
            after: first.next.clone(),
            ..bob.clone()
        })
        .await
        .unwrap();
    assert_eq!(ids(&second), ["bob-4", "bob-2", "bob-1"]);
    let third = world
        .list_sessions(&SessionQuery {
            after: second.next.clone(),
            ..bob.clone()
        })
        .await
        .unwrap();
    assert_eq!(ids(&third), ["bob-0"]);
    assert_eq!(third.next, None, "the last page says so");
    let cursor: Cursor = first.next.unwrap().to_string().parse().unwrap();
    assert_eq!(cursor.id, "bob-5");

    // Filters, alone and together.
    let find = |q: SessionQuery| async move {
        let page = world
            .list_sessions(&SessionQuery {
                owner: Some("bob".into()),
                ..q
            })
            .await
            .unwrap();
        ids(&page)
    };
    assert_eq!(
        find(SessionQuery {
            statuses: vec![Status::New],
            ..Default::default()
        })
        .await,
        ["bob-8", "bob-7", "bob-6"]
    );
    assert_eq!(
        find(SessionQuery {
            statuses: vec![Status::Running, Status::Idle],
            ..Default::default()
        })
        .await,
        ["bob-5", "bob-4", "bob-2", "bob-1", "bob-0"]
    );
    assert_eq!(
        find(SessionQuery {
            agent: Some("claude-code".into()),
            ..Default::default()
        })
        .await,
        ["bob-5"]
    );
    let infra = BTreeMap::from([("team".to_string(), "infra".to_string())]);
    assert_eq!(
        find(SessionQuery {
            labels: infra.clone(),
            ..Default::default()
        })
        .await,
        ["bob-6", "bob-4", "bob-2", "bob-0"]
    );
    let mut infra_t4 = infra.clone();
    infra_t4.insert("ticket".into(), "t4".into());
    assert_eq!(
        find(SessionQuery {
            labels: infra_t4,
            ..Default::default()
        })
        .await,
        ["bob-4"]
    );
    assert_eq!(
        find(SessionQuery {
            title: Some("flaky".into()),
            ..Default::default()
        })
        .await,
        ["bob-0"]
    );
    let all = world
        .list_sessions(&SessionQuery {
            owner: Some("bob".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let at = |id: &str| {
        all.sessions
            .iter()
            .find(|s| s.id == id)
            .map(|s| s.created_at_ms)
            .unwrap()
    };
    assert_eq!(
        find(SessionQuery {
            created_after: Some(at("bob-2")),
            created_before: Some(at("bob-5")),
            ..Default::default()
        })
        .await,
        ["bob-4", "bob-2"]
    );
    // Timestamps are whole milliseconds and `updated_after` is inclusive: the mark must
    // fall strictly after bob-8's creation (the queries above can all run inside one
    // millisecond on a fast machine) and strictly before bob-1's change.
    std::thread::sleep(Duration::from_millis(5));
    let before_change = crate::now_ms();
    std::thread::sleep(Duration::from_millis(5));
    let lease = world.acquire_lease("bob-1", &holder, TTL).await.unwrap();
    world.append(&lease, &[message(1, "later")]).await.unwrap();
    world.release_lease(&lease).await.unwrap();
    assert_eq!(
        find(SessionQuery {
            updated_after: Some(before_change),
            ..Default::default()
        })
        .await,
        ["bob-1"]
    );
    assert_eq!(
        find(SessionQuery {
            updated_before: Some(before_change),
            statuses: vec![Status::Idle],
            ..Default::default()
        })
        .await,
        ["bob-5", "bob-4", "bob-2"]
    );

    // A title set by the owner is kept over the first message's; labels merge key by
    // key (a `None` removes one); metadata comes back as set.
    let patch = SessionPatch {
        title: Some("Nightly flake hunt".into()),
        labels: labels(&[("ticket", None), ("env", Some("prod"))]),
        metadata: labels(&[("requested-by", Some("Bob <bob@example.com>"))]),
    };
    world.update_session("bob-2", &patch).await.unwrap();
    let lease = world.acquire_lease("bob-2", &holder, TTL).await.unwrap();
    world.append(&lease, &[message(1, "do it")]).await.unwrap();
    let s = world.session("bob-2").await.unwrap();
    assert_eq!(s.title, "Nightly flake hunt");
    assert_eq!(
        s.labels,
        BTreeMap::from([
            ("env".to_string(), "prod".to_string()),
            ("team".to_string(), "infra".to_string())
        ])
    );
    assert_eq!(s.metadata["requested-by"], "Bob <bob@example.com>");
    assert_eq!(s.agent, "native");
    assert_eq!(world.session("bob-1").await.unwrap().title, "later");
    assert!(matches!(
        world.update_session("nobody", &patch).await,
        Err(Error::NotFound(_))
    ));
    let too_many = SessionPatch {
        labels: (0..=crate::listing::MAX_LABELS)
            .map(|i| (format!("k{i}"), Some("v".to_string())))
            .collect(),
        ..Default::default()
    };
    assert!(matches!(
        world.update_session("bob-2", &too_many).await,
        Err(Error::Invalid(_))
    ));
    assert_eq!(
        world.session("bob-2").await.unwrap().labels.len(),
        2,
        "refused whole"
    );
}

/// Issued tokens are found by hash, listed newest first and revoked (kept, no longer
/// live); the audit log keeps entries in order and pages by id.
pub async fn tokens_and_the_audit_log<W: World>(world: &W) {
    use crate::access::{Scope, ServiceToken};
    let token = |id: &str, at: u64| ServiceToken {
        id: id.into(),
        name: format!("{id} for ci"),
        owner: "ci-bot".into(),
        scopes: vec![Scope::Read, Scope::Run],
        hash: format!("hash-of-{id}"),
        created_at_ms: at,
        created_by: "admin".into(),
        expires_at_ms: (id == "tok_2").then_some(at + 1000),
        revoked_at_ms: None,
    };
    world.token_issue(&token("tok_1", 1_000)).await.unwrap();
    world.token_issue(&token("tok_2", 2_000)).await.unwrap();
    assert!(
        world.token_issue(&token("tok_1", 3_000)).await.is_err(),
        "ids are unique"
    );
    let listed: Vec<String> = world
        .tokens()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(listed, ["tok_2", "tok_1"]);
    let found = world.token_by_hash("hash-of-tok_2").await.unwrap().unwrap();
    assert_eq!(found, token("tok_2", 2_000));
    assert!(found.is_live(2_500) && !found.is_live(3_000), "expires");
    assert_eq!(world.token_by_hash("hash-of-nothing").await.unwrap(), None);
    assert!(world.token_revoke("tok_1", 5_000).await.unwrap());
    assert!(!world.token_revoke("tok_1", 6_000).await.unwrap(), "once");
    assert!(!world.token_revoke("tok_9", 6_000).await.unwrap());
    let revoked = world.token_by_hash("hash-of-tok_1").await.unwrap().unwrap();
    assert_eq!(revoked.revoked_at_ms, Some(5_000));
    assert!(!revoked.is_live(5_001));

    for i in 0..5 {
        world
            .audit(
                "admin",
                "token.issued",
                &format!("tok_{i}"),
                &serde_json::json!({"i": i}),
            )
            .await
            .unwrap();
    }
    let first = world.audit_log(0, 3, None).await.unwrap();
    assert_eq!(first.len(), 3);
    assert_eq!(first[0].target, "tok_0");
    assert_eq!(first[2].detail["i"], 2);
    let rest = world.audit_log(first[2].id, 10, None).await.unwrap();
    let targets: Vec<&str> = rest.iter().map(|e| e.target.as_str()).collect();
    assert_eq!(targets, ["tok_3", "tok_4"]);
    assert!(rest[0].at_ms > 0 && rest[0].actor == "admin");

    // A session's own entries: about it, and about a session, its hooks, its
    // previews or its shells only (a credential someone named like the session is not its business).
    let note = |actor: &'static str, action: &'static str, target: &'static str| async move {
        world
            .audit(actor, action, target, &serde_json::json!({}))
            .await
            .unwrap()
    };
    note("alice", "session.created", "ses_a").await;
    note("mallory", "vault.put", "ses_a").await;
    note("alice", "session.created", "ses_b").await;
    note("hook:ci", "hook.delivered", "ses_a").await;
    note("link:pl_1", "preview.woke", "ses_a").await;
    note("alice", "shell.attached", "ses_a").await;
    let about = world.audit_log(0, 10, Some("ses_a")).await.unwrap();
    let actions: Vec<&str> = about.iter().map(|e| e.action.as_str()).collect();
    assert_eq!(
        actions,
        [
            "session.created",
            "hook.delivered",
            "preview.woke",
            "shell.attached"
        ]
    );
    let later = world
        .audit_log(about[0].id, 10, Some("ses_a"))
        .await
        .unwrap();
    assert_eq!(later.len(), 3);
    // Past the last id any store can hold, there is nothing (not an error).
    for about in [None, Some("ses_a")] {
        assert!(world
            .audit_log(u64::MAX, 10, about)
            .await
            .unwrap()
            .is_empty());
    }
}

/// A fork reads its parent's records up to the fork point, then its own, as one log;
/// it is appended to independently of the parent (which is not disturbed, even while
/// it is held); deleting the parent leaves every fork whole; once nothing reads them,
/// the records are gone.
pub async fn forks_share_the_parents_log<W: World>(world: &W) {
    let ended = |turn| Event::TurnEnded { turn, reply: None };
    let forked = |parent: &str, at, workspace: &str| Event::Forked {
        parent: parent.into(),
        at,
        workspace: workspace.into(),
        model: None,
        limits: None,
        agent: None,
        instructions: None,
        explorer: None,
    };
    let fork = |parent: &str, child: &str, at| crate::Fork {
        parent: parent.into(),
        child: child.into(),
        owner: "bob".into(),
        at,
        event: forked(parent, at, &format!("ws_{child}")),
        status: Status::Idle,
        waiting_for: None,
        title: None,
    };
    world.create_session("p", "alice").await.unwrap();
    let held = world
        .acquire_lease("p", &Holder::new("h"), TTL)
        .await
        .unwrap();
    let parent_log = [
        started(),
        message(1, "a"),
        ended(1),
        message(2, "b"),
        ended(2),
    ];
    world.append(&held, &parent_log).await.unwrap();

    let c1 = world.fork_session(&fork("p", "c1", 3)).await.unwrap();
    assert_eq!(
        (
            c1.owner.as_str(),
            c1.parent.as_deref(),
            c1.forked_at,
            c1.last_seq,
            c1.status.as_str()
        ),
        ("bob", Some("p"), Some(3), 4, "idle")
    );
    assert_eq!(c1.agent, "native", "the agent is the parent's");
    let read = world.read("c1", 1).await.unwrap();
    assert_eq!(read.iter().map(|r| r.seq).collect::<Vec<_>>(), [1, 2, 3, 4]);
    assert_eq!(
        read[..3].iter().map(|r| &r.event).collect::<Vec<_>>(),
        parent_log[..3].iter().collect::<Vec<_>>()
    );
    assert_eq!(read[3].event, forked("p", 3, "ws_c1"));
    assert_eq!(
        world.read("c1", 3).await.unwrap().len(),
        2,
        "a read from inside the shared part"
    );
    assert_eq!(world.forks("p").await.unwrap(), ["c1"]);

    // The child goes on by itself; the parent, still held, is untouched.
    let lease = world
        .acquire_lease("c1", &Holder::new("w"), TTL)
        .await
        .unwrap();
    let own = world.append(&lease, &[message(2, "c")]).await.unwrap();
    assert_eq!(own[0].seq, 5);
    world.append(&held, &[message(3, "d")]).await.unwrap();
    assert_eq!(world.read("p", 1).await.unwrap().len(), 6);
    assert_eq!(world.read("p", 4).await.unwrap()[0].event, message(2, "b"));
    assert_eq!(world.turn_began("c1", 5).await.unwrap(), 5);
    assert_eq!(
        world.turn_began("c1", 4).await.unwrap(),
        2,
        "found in the shared part"
    );
    assert_eq!(
        world
            .last_of_kind("c1", "turn_ended", u64::MAX)
            .await
            .unwrap(),
        3
    );
    assert_eq!(
        world
            .last_of_kind("p", "turn_ended", u64::MAX)
            .await
            .unwrap(),
        5
    );

    // A fork of a fork, inside the fork's own records, reads through both.
    world.fork_session(&fork("c1", "g", 5)).await.unwrap();
    let g = world.read("g", 1).await.unwrap();
    assert_eq!(
        g.iter().map(|r| r.seq).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5, 6]
    );
    assert_eq!(g[4].event, message(2, "c"));

    // Bad forks change nothing.
    for at in [0, 7] {
        assert!(matches!(
            world.fork_session(&fork("p", "x", at)).await,
            Err(Error::Invalid(_))
        ));
    }
    assert!(matches!(
        world.fork_session(&fork("nope", "x", 1)).await,
        Err(Error::NotFound(_))
    ));
    assert!(matches!(
        world.fork_session(&fork("p", "c1", 2)).await,
        Err(Error::AlreadyExists(_))
    ));
    assert!(matches!(world.session("x").await, Err(Error::NotFound(_))));

    // Deleting ancestors never breaks a descendant.
    world.delete_session("p").await.unwrap();
    assert!(matches!(world.session("p").await, Err(Error::NotFound(_))));
    assert_eq!(world.read("c1", 1).await.unwrap().len(), 5);
    world.delete_session("c1").await.unwrap();
    let again = world.read("g", 1).await.unwrap();
    assert_eq!(again, g, "the grandchild reads as before");
    // Once nothing reads them, the records are gone: the ids can begin again.
    world.delete_session("g").await.unwrap();
    for id in ["p", "c1", "g"] {
        world.create_session(id, "alice").await.unwrap();
        let lease = world
            .acquire_lease(id, &Holder::new("h2"), TTL)
            .await
            .unwrap();
        world.append(&lease, &[started()]).await.unwrap();
        assert_eq!(world.read(id, 1).await.unwrap().len(), 1, "{id}");
    }
}

/// A rewind: the log reads as its records up to the point, then the rewind's record,
/// stored after all it had (positions only move forward); what it set aside stays
/// readable through a fork taken before; a stale holder cannot rewind; deleting the
/// session leaves the fork whole.
pub async fn rewinds_set_records_aside_without_reusing_positions<W: World>(world: &W) {
    let ended = |turn| Event::TurnEnded { turn, reply: None };
    let rewound = |to| Event::Rewound {
        to,
        branch: None,
        facts: vec![],
    };
    let rewind = |lease: &crate::Lease, to| crate::Rewind {
        lease: lease.clone(),
        to,
        event: rewound(to),
        status: Status::Idle,
        waiting_for: None,
    };
    world.create_session("s", "alice").await.unwrap();
    let lease = world
        .acquire_lease("s", &Holder::new("h"), TTL)
        .await
        .unwrap();
    let log = [
        started(),
        message(1, "a"),
        ended(1),
        message(2, "b"),
        ended(2),
    ];
    world.append(&lease, &log).await.unwrap();
    world
        .fork_session(&crate::Fork {
            parent: "s".into(),
            child: "kept".into(),
            owner: "alice".into(),
            at: 5,
            event: Event::Forked {
                parent: "s".into(),
                at: 5,
                workspace: "ws_kept".into(),
                model: None,
                limits: None,
                agent: None,
                instructions: None,
                explorer: None,
            },
            status: Status::Idle,
            waiting_for: None,
            title: None,
        })
        .await
        .unwrap();

    for to in [0, 5, 9] {
        assert!(
            matches!(
                world.rewind_session(&rewind(&lease, to)).await,
                Err(Error::Invalid(_))
            ),
            "{to}"
        );
    }
    let record = world.rewind_session(&rewind(&lease, 3)).await.unwrap();
    assert_eq!(record.seq, 6);
    let seqs =
        |records: Vec<steadfast_log::Record>| records.iter().map(|r| r.seq).collect::<Vec<_>>();
    assert_eq!(seqs(world.read("s", 1).await.unwrap()), [1, 2, 3, 6]);
    assert_eq!(
        seqs(world.read("s", 4).await.unwrap()),
        [6],
        "a cursor inside what was set aside"
    );
    let summary = world.session("s").await.unwrap();
    assert_eq!((summary.last_seq, summary.status), (6, Status::Idle));
    assert_eq!(
        world
            .last_of_kind("s", "turn_ended", u64::MAX)
            .await
            .unwrap(),
        3
    );

    // The holder goes on from there; a stale one cannot rewind.
    world.append(&lease, &[message(2, "c")]).await.unwrap();
    assert_eq!(seqs(world.read("s", 1).await.unwrap()), [1, 2, 3, 6, 7]);
    assert_eq!(world.turn_began("s", 7).await.unwrap(), 7);
    assert_eq!(
        world.turn_began("s", 6).await.unwrap(),
        2,
        "the set-aside turn is not found"
    );
    world.renew_lease(&lease, Duration::ZERO).await.unwrap();
    let other = world
        .acquire_lease("s", &Holder::new("h2"), TTL)
        .await
        .unwrap();
    assert!(matches!(
        world.rewind_session(&rewind(&lease, 2)).await,
        Err(Error::StaleFence { .. })
    ));

    // Rewound again, further back.
    world.rewind_session(&rewind(&other, 2)).await.unwrap();
    assert_eq!(seqs(world.read("s", 1).await.unwrap()), [1, 2, 8]);

    // What was set aside reads whole through the fork, before and after the session goes.
    let kept = world.read("kept", 1).await.unwrap();
    assert_eq!(seqs(kept.clone()), [1, 2, 3, 4, 5, 6]);
    assert_eq!(kept[3].event, message(2, "b"));
    world.delete_session("s").await.unwrap();
    assert_eq!(world.read("kept", 1).await.unwrap(), kept);
}

/// A session's first event, for tests of a world that need one.
pub fn started() -> Event {
    Event::bare_start(
        "native",
        steadfast_log::ModelSpec {
            provider: "fake".into(),
            model: "m".into(),
        },
        "/w",
    )
}

/// Makes `session`, started and idle, its lease free.
async fn idle_session<W: World>(world: &W, session: &str) {
    world.create_session(session, "alice").await.unwrap();
    let lease = world
        .acquire_lease(session, &Holder::new("api"), TTL)
        .await
        .unwrap();
    world.append(&lease, &[started()]).await.unwrap();
    world.release_lease(&lease).await.unwrap();
}

/// What a worker claims is what [`crate::work::has_work`] says has work: a stray
/// interrupt or a signal queued for a later wait leaves an idle session alone; a
/// message does not.
pub async fn work_is_what_a_worker_claims<W: World>(world: &W) {
    let worker = Holder::new("worker");
    idle_session(world, "s1").await;
    let state = steadfast_log::fold(&world.read("s1", 1).await.unwrap()).unwrap();
    let posts = [
        (
            crate::InboundKind::Signal,
            steadfast_log::INTERRUPT_SIGNAL,
            false,
        ),
        (crate::InboundKind::Signal, "approval", false),
        (crate::InboundKind::Message, "", true),
    ];
    for (kind, name, work) in posts {
        world
            .post("s1", kind, name, &serde_json::json!("x"))
            .await
            .unwrap();
        let inbox = world.inbox("s1").await.unwrap();
        assert_eq!(crate::work::has_work(&state, &inbox), work, "{name:?}");
        let claimed = world.claim(&worker, TTL).await.unwrap();
        assert_eq!(claimed.is_some(), work, "{name:?}: the store agrees");
    }
}

/// A worker whose failure could not be recorded (a full disk refuses every write,
/// the lease's renewal too) still holds the session's lease; once that lease lapses,
/// the same worker takes the session again, as any other would. Before, a worker
/// skipped every session it held, so with one worker slot such a session stayed
/// `running` for good.
pub async fn a_worker_takes_back_what_it_held_once_its_lease_lapses<W: World>(world: &W) {
    let worker = Holder::new("worker");
    idle_session(world, "s1").await;
    world
        .post(
            "s1",
            crate::InboundKind::Message,
            "",
            &serde_json::json!("go"),
        )
        .await
        .unwrap();
    let held = world.claim(&worker, TTL).await.unwrap().expect("queued");
    assert_eq!(
        world.claim(&worker, TTL).await.unwrap(),
        None,
        "not while its lease lasts"
    );
    world.renew_lease(&held, Duration::ZERO).await.unwrap();
    let again = world
        .claim(&worker, TTL)
        .await
        .unwrap()
        .expect("its lapsed lease is taken again");
    assert_eq!(again.session, "s1");
    assert!(
        again.epoch > held.epoch,
        "a new epoch fences anything left of the old"
    );
}

/// The inbox and the turn queue: a session is claimable exactly when it needs a
/// driver (a turn left running, a message for an idle session, the signal a waiting
/// session awaits) and its lease is free; taking an entry into the log removes it
/// from the inbox atomically.
pub async fn inbox_feeds_the_turn_queue<W: World>(world: &W) {
    use crate::InboundKind;
    use serde_json::json;
    let (worker_a, worker_b) = (Holder::new("worker-a"), Holder::new("worker-b"));
    let mut changes = world.changes();
    idle_session(world, "s1").await;
    assert!(
        changes.has_changed().unwrap(),
        "appends move the change counter"
    );
    changes.mark_unchanged();
    assert_eq!(
        world.claim(&worker_a, TTL).await.unwrap(),
        None,
        "idle, nothing queued"
    );

    let id = world
        .post("s1", InboundKind::Message, "", &json!("fix it"))
        .await
        .unwrap();
    assert!(
        changes.has_changed().unwrap(),
        "posts move the change counter"
    );
    let inbox = world.inbox("s1").await.unwrap();
    assert_eq!(inbox.len(), 1);
    assert_eq!(
        (inbox[0].id, inbox[0].kind, &inbox[0].body),
        (id, InboundKind::Message, &json!("fix it"))
    );

    let claimed = world
        .claim(&worker_a, TTL)
        .await
        .unwrap()
        .expect("a queued message");
    assert_eq!(claimed.session, "s1");
    assert_eq!(
        world.claim(&worker_b, TTL).await.unwrap(),
        None,
        "held by worker a"
    );
    world
        .append(
            &claimed,
            &[Event::UserMessage {
                turn: 1,
                text: "fix it".into(),
                inbox_id: Some(id),
            }],
        )
        .await
        .unwrap();
    assert!(
        world.inbox("s1").await.unwrap().is_empty(),
        "taken with the append"
    );

    // Worker a's lease lapses mid-turn: the running turn is claimable by another.
    world.renew_lease(&claimed, Duration::ZERO).await.unwrap();
    let taken_over = world
        .claim(&worker_b, TTL)
        .await
        .unwrap()
        .expect("a turn left running");
    assert!(taken_over.epoch > claimed.epoch);

    // A waiting session is claimable only once its own signal arrives.
    world
        .append(
            &taken_over,
            &[Event::WaitStarted {
                name: "approval".into(),
                reason: "push?".into(),
                call_id: None,
                before_call: None,
            }],
        )
        .await
        .unwrap();
    world.release_lease(&taken_over).await.unwrap();
    assert_eq!(world.session("s1").await.unwrap().status, Status::Waiting);
    assert_eq!(world.claim(&worker_a, TTL).await.unwrap(), None);
    world
        .post("s1", InboundKind::Signal, "deploy-done", &json!({}))
        .await
        .unwrap();
    world
        .post("s1", InboundKind::Message, "", &json!("queued for later"))
        .await
        .unwrap();
    assert_eq!(
        world.claim(&worker_a, TTL).await.unwrap(),
        None,
        "not the awaited signal"
    );
    world
        .post(
            "s1",
            InboundKind::Signal,
            "approval",
            &json!({"approved": true}),
        )
        .await
        .unwrap();
    let resumed = world
        .claim(&worker_a, TTL)
        .await
        .unwrap()
        .expect("the awaited signal");
    assert_eq!(world.inbox("s1").await.unwrap().len(), 3);

    // An escalated session takes messages and is claimable once `resume` arrives.
    let signal = world.inbox("s1").await.unwrap()[2].id;
    world
        .append(
            &resumed,
            &[
                Event::SignalReceived {
                    name: "approval".into(),
                    payload: json!({"approved": true}),
                    inbox_id: signal,
                },
                Event::Escalated {
                    breaker: steadfast_log::Breaker::Tokens,
                    reason: "token limit".into(),
                    diff: vec![],
                },
            ],
        )
        .await
        .unwrap();
    world.release_lease(&resumed).await.unwrap();
    assert_eq!(world.session("s1").await.unwrap().status, Status::Escalated);
    assert_eq!(world.claim(&worker_a, TTL).await.unwrap(), None);
    world
        .post(
            "s1",
            InboundKind::Signal,
            steadfast_log::RESUME_SIGNAL,
            &json!({"max_tokens": 9}),
        )
        .await
        .unwrap();
    let resumed = world
        .claim(&worker_a, TTL)
        .await
        .unwrap()
        .expect("the resume signal");

    world
        .append(
            &resumed,
            &[Event::SessionEnded {
                state: steadfast_log::EndState::Completed,
                reason: "done".into(),
                diff: vec![],
            }],
        )
        .await
        .unwrap();
    assert!(matches!(
        world
            .post("s1", InboundKind::Message, "", &json!("x"))
            .await,
        Err(Error::Ended(_))
    ));
    assert!(matches!(
        world
            .post("nope", InboundKind::Message, "", &json!("x"))
            .await,
        Err(Error::NotFound(_))
    ));
    world.release_lease(&resumed).await.unwrap();
    assert_eq!(
        world.claim(&worker_a, TTL).await.unwrap(),
        None,
        "ended sessions are never claimed"
    );

    world.delete_session("s1").await.unwrap();
    assert!(matches!(world.read("s1", 1).await, Err(Error::NotFound(_))));
    assert!(world.inbox("s1").await.unwrap().is_empty());
    assert!(matches!(
        world.delete_session("s1").await,
        Err(Error::NotFound(_))
    ));
}

/// Records over 64 KiB keep their body in the blob store and read back whole; a lost
/// body is reported as corruption of that position, never skipped.
pub async fn big_records_spill_to_the_blob_store<W: World>(world: &W, blobs: &crate::Blobs) {
    world.create_session("big", "alice").await.unwrap();
    let lease = world
        .acquire_lease("big", &Holder::new("h"), TTL)
        .await
        .unwrap();
    let big = message(1, &"x".repeat(200_000));
    world
        .append(&lease, std::slice::from_ref(&big))
        .await
        .unwrap();
    world.append(&lease, &[message(2, "small")]).await.unwrap();
    let log = world.read("big", 1).await.unwrap();
    assert_eq!(log[0].event, big);
    assert_eq!(log[1].event, message(2, "small"));
    let hash = blake3::hash(&serde_json::to_vec(&big).unwrap())
        .to_hex()
        .to_string();
    assert!(
        blobs.get(&hash).await.is_ok(),
        "the body is in the blob store"
    );
    assert_eq!(
        world.spilled("big").await.unwrap(),
        std::slice::from_ref(&hash),
        "the world names the blobs its records live in (gc keeps them)"
    );
    let keep = std::collections::HashSet::from([hash.clone()]);
    assert_eq!(blobs.sweep(&keep, Duration::ZERO).await.unwrap(), 0);
    assert!(
        blobs.get(&hash).await.is_ok(),
        "a kept blob survives a sweep"
    );
    blobs.delete(&hash).await.unwrap();
    let err = world.read("big", 1).await.unwrap_err();
    assert!(matches!(err, Error::Corrupt { seq: 1, .. }), "{err}");
}

/// A retry scheduled after a failure holds the session back from the turn queue until
/// its time, shows it as `retrying`, and whatever the session records next clears it.
pub async fn a_scheduled_retry_holds_the_session_back<W: World>(world: &W) {
    let worker = Holder::new("worker");
    world.create_session("s1", "alice").await.unwrap();
    let lease = world.acquire_lease("s1", &worker, TTL).await.unwrap();
    world
        .append(&lease, &[started(), message(1, "go")])
        .await
        .unwrap();
    let failed = |retry_at_ms| Event::DriveFailed {
        reason: "provider down".into(),
        attempt: 1,
        retry_at_ms: Some(retry_at_ms),
    };
    world
        .append(&lease, &[failed(crate::now_ms() + 60_000)])
        .await
        .unwrap();
    world.release_lease(&lease).await.unwrap();
    assert_eq!(world.session("s1").await.unwrap().status, Status::Retrying);
    assert!(
        world.claim(&worker, TTL).await.unwrap().is_none(),
        "not claimed before its retry time"
    );

    let lease = world
        .acquire_lease("s1", &Holder::new("api"), TTL)
        .await
        .unwrap();
    world
        .append(&lease, &[failed(crate::now_ms())])
        .await
        .unwrap();
    world.release_lease(&lease).await.unwrap();
    let claimed = world.claim(&worker, TTL).await.unwrap();
    assert!(claimed.is_some(), "claimed once its time has come");
    let lease = claimed.unwrap();
    let ended = Event::TurnEnded {
        turn: 1,
        reply: None,
    };
    world.append(&lease, &[ended]).await.unwrap();
    assert_eq!(
        world.session("s1").await.unwrap().status,
        Status::Idle,
        "the next record clears the retry"
    );
}

/// The census counts sessions by status and, as the queue's depth, exactly those with
/// work due that no holder keeps.
pub async fn census_counts_sessions_and_the_queue<W: World>(world: &W) {
    use crate::InboundKind;
    let count = |census: &crate::Census, status: &str| {
        census
            .by_status
            .iter()
            .find(|(s, _)| s == status)
            .map_or(0, |(_, n)| *n)
    };
    assert_eq!(world.census().await.unwrap(), crate::Census::default());
    for id in ["a", "b", "c"] {
        world.create_session(id, "alice").await.unwrap();
        let lease = world
            .acquire_lease(id, &Holder::new("api"), TTL)
            .await
            .unwrap();
        world.append(&lease, &[started()]).await.unwrap();
        world.release_lease(&lease).await.unwrap();
    }
    world.create_session("fresh", "bob").await.unwrap();
    let census = world.census().await.unwrap();
    assert_eq!((count(&census, "idle"), count(&census, "new")), (3, 1));
    assert_eq!(census.queued, 0, "idle with nothing queued is no work");

    // A queued message is work until a worker holds the session.
    world
        .post("a", InboundKind::Message, "", &serde_json::json!("go"))
        .await
        .unwrap();
    assert_eq!(world.census().await.unwrap().queued, 1);
    let worker = Holder::new("worker");
    let claimed = world.claim(&worker, TTL).await.unwrap().expect("queued");
    assert_eq!(world.census().await.unwrap().queued, 0, "held: not waiting");
    world.append(&claimed, &[message(1, "go")]).await.unwrap();
    let census = world.census().await.unwrap();
    assert_eq!((count(&census, "running"), count(&census, "idle")), (1, 2));
    // A running turn whose driver let go is waiting for a worker again.
    world.release_lease(&claimed).await.unwrap();
    assert_eq!(world.census().await.unwrap().queued, 1);
}

/// The outbox queues exactly the records of [`crate::OUTBOX_KINDS`], with the append
/// that commits them (a refused append queues nothing); a taken entry is held from
/// other takers until settled or its hold lapses; a failure is retried when due and
/// given up when said; delivered and given-up entries are never taken again; pruning
/// forgets old entries.
pub async fn the_outbox_queues_notable_records_with_their_append<W: World>(world: &W) {
    use crate::{Settled, OUTBOX_KINDS};
    let worker = Holder::new("worker");
    world.create_session("s1", "alice").await.unwrap();
    let lease = world.acquire_lease("s1", &worker, TTL).await.unwrap();
    let notable = [
        Event::WaitStarted {
            name: "approval".into(),
            reason: "may I?".into(),
            call_id: None,
            before_call: None,
        },
        Event::Escalated {
            breaker: steadfast_log::Breaker::Turns,
            reason: "turns".into(),
            diff: vec![],
        },
        Event::TurnEnded {
            turn: 1,
            reply: None,
        },
        Event::TurnInterrupted {
            turn: 1,
            by: "alice".into(),
            inbox_id: 1,
            call_id: None,
            stopped: true,
            not_begun: Vec::new(),
        },
        Event::SessionEnded {
            state: steadfast_log::EndState::Completed,
            reason: "closed".into(),
            diff: vec![],
        },
    ];
    assert_eq!(
        notable.iter().map(Event::kind).collect::<Vec<_>>(),
        OUTBOX_KINDS,
        "every kind the outbox names is tested"
    );
    world
        .append(&lease, &[started(), message(1, "go")])
        .await
        .unwrap();
    let now = crate::now_ms();
    assert!(world.outbox_take(now, 1_000, 10).await.unwrap().is_empty());
    let records = world.append(&lease, &notable).await.unwrap();
    // A stale holder's append commits nothing, so it queues nothing.
    world.release_lease(&lease).await.unwrap();
    let other = world
        .acquire_lease("s1", &Holder::new("other"), TTL)
        .await
        .unwrap();
    let ended = Event::TurnEnded {
        turn: 2,
        reply: None,
    };
    assert!(world.append(&lease, &[ended]).await.is_err());
    world.append(&other, &[message(2, "more")]).await.unwrap();

    let taken = world.outbox_take(now, 60_000, 10).await.unwrap();
    assert_eq!(
        taken
            .iter()
            .map(|i| (i.session.as_str(), i.seq, i.kind.as_str(), i.attempts))
            .collect::<Vec<_>>(),
        records
            .iter()
            .map(|r| ("s1", r.seq, r.event.kind(), 0))
            .collect::<Vec<_>>()
    );
    assert!(taken.windows(2).all(|w| w[0].id < w[1].id));
    assert_eq!(taken[0].at_ms, records[0].at_ms);
    // Held: no other taker gets them before the hold lapses.
    assert!(world
        .outbox_take(now + 1, 1_000, 10)
        .await
        .unwrap()
        .is_empty());
    let later = now + 60_000;
    assert_eq!(world.outbox_take(later, 1_000, 2).await.unwrap().len(), 2);

    world
        .outbox_settle(taken[0].id, &Settled::Delivered { status: 200 })
        .await
        .unwrap();
    world
        .outbox_settle(
            taken[1].id,
            &Settled::Failed {
                error: "503".into(),
                retry_at_ms: Some(later + 5_000),
            },
        )
        .await
        .unwrap();
    world
        .outbox_settle(
            taken[2].id,
            &Settled::Failed {
                error: "gone".into(),
                retry_at_ms: None,
            },
        )
        .await
        .unwrap();
    let due = world.outbox_take(later + 1_000, 1_000, 10).await.unwrap();
    assert_eq!(
        due.iter().map(|i| i.id).collect::<Vec<_>>(),
        [taken[3].id, taken[4].id],
        "the failed one waits for its retry; delivered and given-up ones are done"
    );
    // The failed one is due at its retry time, with its attempt counted; the two
    // taken above and never settled (their taker died) are due again.
    let retried = world.outbox_take(later + 5_000, 1_000, 10).await.unwrap();
    assert_eq!(
        retried
            .iter()
            .map(|i| (i.id, i.attempts))
            .collect::<Vec<_>>(),
        [(taken[1].id, 1), (taken[3].id, 0), (taken[4].id, 0)]
    );

    assert_eq!(world.outbox_prune(records[0].at_ms + 1).await.unwrap(), 5);
    assert!(world
        .outbox_take(later + 600_000, 1_000, 10)
        .await
        .unwrap()
        .is_empty());
}

/// The vault stores sealed values per owner and name: a write replaces, a read finds
/// only the owner's own, listings are by owner (or all, for a re-key), deletes say
/// whether there was one. The store holds only what it was given, sealed.
pub async fn the_vault_keeps_each_owners_sealed_credentials<W: World>(world: &W) {
    let keys = crate::VaultKeys::new(&[3u8; 32], &[]).unwrap();
    let one = keys.seal("alice", "github", b"ghp_one");
    world.vault_put("alice", "github", &one).await.unwrap();
    world
        .vault_put("bob", "github", &keys.seal("bob", "github", b"ghp_bob"))
        .await
        .unwrap();
    let got = world.vault_get("alice", "github").await.unwrap().unwrap();
    assert_eq!((got.sealed.clone(), got.name.as_str()), (one, "github"));
    assert_eq!(
        keys.open("alice", "github", &got.sealed).unwrap(),
        b"ghp_one"
    );
    assert!(world.vault_get("alice", "gitlab").await.unwrap().is_none());
    assert!(world.vault_get("carol", "github").await.unwrap().is_none());

    let two = keys.seal("alice", "github", b"ghp_two");
    world.vault_put("alice", "github", &two).await.unwrap();
    world
        .vault_put("alice", "api", &keys.seal("alice", "api", b"k"))
        .await
        .unwrap();
    let mine = world.vault_list(Some("alice")).await.unwrap();
    assert_eq!(
        mine.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
        ["api", "github"]
    );
    assert_eq!(mine[1].sealed, two, "a write replaces");
    assert_eq!(world.vault_list(None).await.unwrap().len(), 3);

    assert!(world.vault_delete("alice", "github").await.unwrap());
    assert!(!world.vault_delete("alice", "github").await.unwrap());
    assert!(world.vault_get("alice", "github").await.unwrap().is_none());
    assert!(world.vault_get("bob", "github").await.unwrap().is_some());
}

/// A session's hooks: one per name, kept with their secret as given (a token's hash
/// or a sealed key), listed by name, revoked one by one and with their session; each
/// delivery is taken once, a replay refused, an untaken one taken again, and
/// deliveries older than the window forgotten.
pub async fn hooks_take_each_delivery_once<W: World>(world: &W) {
    use crate::{Hook, HookCheck, HookSecret, HookThen};
    world.create_session("h1", "alice").await.unwrap();
    world.create_session("h2", "alice").await.unwrap();
    let keys = crate::VaultKeys::new(&[5u8; 32], &[]).unwrap();
    let sealed = keys.seal("h1", &Hook::sealed_name("ci"), b"whsec");
    let ci = Hook {
        session: "h1".into(),
        name: "ci".into(),
        check: HookCheck::Github,
        then: HookThen::Signal,
        secret: HookSecret::Sealed(sealed.clone()),
        created_at_ms: 1_000,
        created_by: "alice".into(),
    };
    let page = Hook {
        name: "page".into(),
        check: HookCheck::Token,
        then: HookThen::Message,
        secret: HookSecret::TokenHash("ab12".into()),
        ..ci.clone()
    };
    assert!(world.hook_create(&page).await.unwrap());
    assert!(world.hook_create(&ci).await.unwrap());
    assert!(
        !world
            .hook_create(&Hook {
                then: HookThen::Message,
                ..ci.clone()
            })
            .await
            .unwrap(),
        "a name is taken once"
    );
    assert!(world
        .hook_create(&Hook {
            session: "h2".into(),
            ..ci.clone()
        })
        .await
        .unwrap());
    let got = world.hooks(Some("h1")).await.unwrap();
    assert_eq!(got, vec![ci.clone(), page.clone()]);
    let HookSecret::Sealed(stored) = &got[0].secret else {
        panic!("{got:?}")
    };
    assert_eq!(
        keys.open("h1", &Hook::sealed_name("ci"), stored).unwrap(),
        b"whsec"
    );

    assert!(world
        .hook_take_delivery("h1", "ci", "d-1", 10_000, 0)
        .await
        .unwrap());
    assert!(
        !world
            .hook_take_delivery("h1", "ci", "d-1", 10_001, 0)
            .await
            .unwrap(),
        "a replay"
    );
    assert!(
        world
            .hook_take_delivery("h1", "page", "d-1", 10_001, 0)
            .await
            .unwrap(),
        "per hook"
    );
    assert!(
        world
            .hook_take_delivery("h2", "ci", "d-1", 10_001, 0)
            .await
            .unwrap(),
        "per session"
    );
    world.hook_untake_delivery("h1", "ci", "d-1").await.unwrap();
    assert!(
        world
            .hook_take_delivery("h1", "ci", "d-1", 10_002, 0)
            .await
            .unwrap(),
        "untaken"
    );
    // Past the window, an old id is forgotten (the sender's own check refuses it).
    assert!(world
        .hook_take_delivery("h1", "ci", "d-1", 90_000, 50_000)
        .await
        .unwrap());

    // A re-key replaces a sealed key; a token hook has none to replace.
    let resealed = keys.seal("h1", &Hook::sealed_name("ci"), b"whsec");
    assert!(world.hook_reseal("h1", "ci", &resealed).await.unwrap());
    assert!(!world.hook_reseal("h1", "page", &resealed).await.unwrap());
    let every = world.hooks(None).await.unwrap();
    assert_eq!(
        every
            .iter()
            .map(|h| (h.session.as_str(), h.name.as_str()))
            .collect::<Vec<_>>(),
        [("h1", "ci"), ("h1", "page"), ("h2", "ci")]
    );
    assert_eq!(every[0].secret, HookSecret::Sealed(resealed));
    assert_eq!(every[1].secret, page.secret, "untouched");

    assert!(world.hook_delete("h1", "ci").await.unwrap());
    assert!(!world.hook_delete("h1", "ci").await.unwrap());
    assert_eq!(world.hooks(Some("h1")).await.unwrap(), vec![page]);
    // A hook made again under a revoked name starts with no deliveries.
    assert!(world.hook_create(&ci).await.unwrap());
    assert!(world
        .hook_take_delivery("h1", "ci", "d-1", 90_001, 0)
        .await
        .unwrap());
    world.delete_session("h1").await.unwrap();
    assert!(
        world.hooks(Some("h1")).await.unwrap().is_empty(),
        "they go with their session"
    );
    assert_eq!(world.hooks(Some("h2")).await.unwrap().len(), 1);
}

/// Retention prunes the streamed pieces of replies before a position: each keeps its
/// place as a `pruned` record that verifies, and nothing else changes.
pub async fn retention_prunes_deltas_in_place<W: World>(world: &W) {
    world.create_session("r1", "alice").await.unwrap();
    let lease = world
        .acquire_lease("r1", &Holder::new("h1"), TTL)
        .await
        .unwrap();
    world
        .append(
            &lease,
            &[
                message(1, "a"),
                delta("Hello, "),
                delta("world"),
                message(2, "b"),
            ],
        )
        .await
        .unwrap();
    world.append(&lease, &[delta("later")]).await.unwrap();
    let before = world.read("r1", 1).await.unwrap();

    assert_eq!(world.prune_deltas("r1", 5).await.unwrap(), 2);
    let after = world.read("r1", 1).await.unwrap();
    assert_eq!(after.len(), before.len(), "every position stays");
    for (old, new) in before.iter().zip(&after) {
        assert_eq!(
            (old.seq, old.epoch, old.at_ms),
            (new.seq, new.epoch, new.at_ms)
        );
        match (&old.event, new.seq) {
            (Event::ModelDelta { .. }, 2 | 3) => {
                let bytes = serde_json::to_vec(&old.event).unwrap().len() as u64;
                assert_eq!(
                    new.event,
                    Event::Pruned {
                        was: "model_delta".into(),
                        bytes
                    }
                );
            }
            _ => assert_eq!(old.event, new.event, "at {}", old.seq),
        }
    }
    assert_eq!(world.prune_deltas("r1", 5).await.unwrap(), 0, "done once");
    // The session goes on appending after its log was pruned.
    world.append(&lease, &[message(3, "c")]).await.unwrap();
    assert_eq!(world.read("r1", 1).await.unwrap().len(), 6);
}

/// Rate buckets are shared by every handle on the world (two API processes count
/// against one bucket), a draw that does not fit takes nothing, and buckets refill.
pub async fn rate_buckets_are_shared_and_refill<W: World>(one: &W, two: &W) {
    use crate::rate::Draw;
    let draw = |key: &str, amount: f64, capacity: f64, window_ms: u64| Draw {
        key: key.into(),
        amount,
        capacity,
        window_ms,
    };
    let create = draw("create/alice", 1.0, 3.0, 3_600_000);
    for (i, world) in [one, two, one].into_iter().enumerate() {
        assert!(world.take_tokens(&create).await.unwrap(), "draw {i}");
    }
    assert!(
        !two.take_tokens(&create).await.unwrap(),
        "the bucket is shared"
    );
    assert!(!one.take_tokens(&create).await.unwrap());
    assert!(
        two.take_tokens(&draw("create/bob", 1.0, 3.0, 3_600_000))
            .await
            .unwrap(),
        "each caller has its own"
    );
    // An upload's bytes: a draw larger than what is left takes nothing, and a smaller
    // one still fits; one larger than the bucket never does.
    let bytes = |n| draw("upload/alice", n, 100.0, 3_600_000);
    assert!(one.take_tokens(&bytes(60.0)).await.unwrap());
    assert!(!two.take_tokens(&bytes(60.0)).await.unwrap());
    assert!(two.take_tokens(&bytes(40.0)).await.unwrap());
    assert!(!one
        .take_tokens(&draw("upload/carol", 101.0, 100.0, 1000))
        .await
        .unwrap());
    // A bucket refills over its window.
    let quick = draw("signals/s1", 1.0, 1.0, 200);
    assert!(one.take_tokens(&quick).await.unwrap());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(two.take_tokens(&quick).await.unwrap(), "refilled");
}

/// A tool call's outcome that stored `bytes` in the drive.
fn stored(call: &str, bytes: u64) -> Event {
    Event::ToolCallOutcome {
        call_id: call.into(),
        is_error: false,
        exit_code: Some(0),
        output: steadfast_log::Output::Inline { text: "ok".into() },
        snapshot_after: Some("s".into()),
        stored_bytes: bytes,
    }
}

/// What the sessions of one owner keep is summed across them, whichever process
/// appended it, and a deleted session's share goes with it.
pub async fn an_owners_kept_bytes_sum_their_sessions<W: World>(one: &W, two: &W) {
    for (id, owner) in [("k1", "alice"), ("k2", "alice"), ("k3", "bob")] {
        one.create_session(id, owner).await.unwrap();
    }
    assert_eq!(one.owner_kept_bytes("k1").await.unwrap(), 0);
    let k1 = one
        .acquire_lease("k1", &Holder::new("h1"), TTL)
        .await
        .unwrap();
    let k2 = two
        .acquire_lease("k2", &Holder::new("h2"), TTL)
        .await
        .unwrap();
    let k3 = one
        .acquire_lease("k3", &Holder::new("h1"), TTL)
        .await
        .unwrap();
    one.append(&k1, &[stored("c1", 1000)]).await.unwrap();
    one.append(&k1, &[intent(1), stored("c2", 24)])
        .await
        .unwrap();
    two.append(&k2, &[stored("c1", 500)]).await.unwrap();
    one.append(&k3, &[stored("c1", 7)]).await.unwrap();
    // Records that keep nothing beyond the log add nothing.
    two.append(&k2, &[intent(2)]).await.unwrap();
    for (session, owner_total) in [("k1", 1524), ("k2", 1524), ("k3", 7)] {
        assert_eq!(one.owner_kept_bytes(session).await.unwrap(), owner_total);
        assert_eq!(two.owner_kept_bytes(session).await.unwrap(), owner_total);
    }
    one.delete_session("k1").await.unwrap();
    assert_eq!(two.owner_kept_bytes("k2").await.unwrap(), 500);
    assert_eq!(one.owner_kept_bytes("gone").await.unwrap(), 0);
}
