//! Forks of a session in a real git repository (history, uncommitted and untracked
//! changes, a 1 MiB binary, a symlink, `node_modules`): each fork's workspace is the
//! parent's recorded at the fork point, byte for byte; forks and parent go on
//! independently; nothing the forks share with the parent is asked of the model again.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{bash, Setup};
use serde_json::json;
use steadfast_harness::{ForkRequest, Harness, NewSession, Stop};
use steadfast_log::{Event, Status};
use steadfast_world::World;

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git runs");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A repository as people have them: two commits, a tracked file changed and not
/// committed, an untracked file, a 1 MiB binary, a symlink, `node_modules`.
fn real_repository(dir: &Path) {
    std::fs::create_dir_all(dir.join("node_modules/left-pad")).unwrap();
    git(dir, &["init", "-q", "-b", "main"]);
    git(dir, &["config", "user.email", "dev@example.com"]);
    git(dir, &["config", "user.name", "Dev"]);
    std::fs::write(dir.join("README.md"), "# app\n").unwrap();
    std::fs::write(dir.join(".gitignore"), "node_modules/\n").unwrap();
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-qm", "first"]);
    std::fs::write(dir.join("notes.txt"), "zero\n").unwrap();
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-qm", "second"]);
    std::fs::write(dir.join("README.md"), "# app\n\nchanged, not committed\n").unwrap();
    std::fs::write(dir.join("scratch.txt"), "untracked\n").unwrap();
    let binary: Vec<u8> = (0..1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(dir.join("model.bin"), binary).unwrap();
    std::os::unix::fs::symlink("README.md", dir.join("link.md")).unwrap();
    std::fs::write(
        dir.join("node_modules/left-pad/index.js"),
        "module.exports = 1;\n",
    )
    .unwrap();
}

/// Every entry under `dir`: file bytes and mode, symlink targets, directories.
fn tree(dir: &Path) -> BTreeMap<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let rel = path.strip_prefix(dir).unwrap().to_path_buf();
            let what = if meta.file_type().is_symlink() {
                format!("link {}", std::fs::read_link(&path).unwrap().display())
            } else if meta.is_dir() {
                stack.push(path.clone());
                "dir".to_string()
            } else {
                let bytes = std::fs::read(&path).unwrap();
                format!(
                    "{:o} {}",
                    meta.permissions().mode() & 0o777,
                    blake3::hash(&bytes)
                )
            };
            out.insert(rel, what);
        }
    }
    out
}

async fn workspace_of(harness: &Harness, session: &str) -> PathBuf {
    harness
        .workspace_dir(&harness.state(session).await.unwrap())
        .unwrap()
}

#[tokio::test]
async fn forks_begin_where_the_parent_was_and_go_their_own_way() -> anyhow::Result<()> {
    let setup = Setup::new(json!([
        bash("echo one >> notes.txt && printf '// edited\\n' >> node_modules/left-pad/index.js"),
        bash("echo two >> notes.txt && git add -A && git commit -qm two"),
        {"text": "turn one done"},
        bash("echo three >> notes.txt"),
        {"text": "turn two done"},
    ]))
    .await;
    let repo = setup.dir.path().join("repo");
    real_repository(&repo);
    let harness = setup.harness_with(|o| o.sandbox.backend = steadfast_sandbox::Backend::Local);
    let parent = harness
        .start_session(NewSession::native("fake/m", &repo).with_task("work"))
        .await?;
    let mut driver = harness.wake_native(&parent).await?;
    assert_eq!(driver.run().await?, Stop::Idle);
    driver.release().await?;
    let after_turn_one = tree(&repo);
    let end_of_turn_one = harness.state(&parent).await?.last_seq;

    // Inside turn 1: just after the first command's outcome.
    let records = harness.world().read(&parent, 1).await?;
    let inside = records
        .iter()
        .find(|r| matches!(r.event, Event::ToolCallOutcome { .. }))
        .map(|r| r.seq)
        .expect("a recorded command");
    let (at_inside, _) =
        steadfast_world::load_state_at(harness.world(), harness.blobs(), &parent, inside).await?;
    let snapshot_inside = at_inside.last_snapshot.clone().expect("a snapshot");

    let mid = harness
        .fork(&ForkRequest {
            parent: parent.clone(),
            at: Some(inside),
            count: 2,
            owner: "local".into(),
            ..Default::default()
        })
        .await?;
    let idle = harness
        .fork(&ForkRequest {
            parent: parent.clone(),
            at: None,
            count: 1,
            owner: "local".into(),
            title: Some("from the end of turn one".into()),
            ..Default::default()
        })
        .await?;
    assert_eq!(mid.len(), 2);
    for fork in &mid {
        assert_eq!(
            fork.status,
            steadfast_log::Status::Running,
            "a fork inside a turn carries it on"
        );
        assert_eq!(fork.forked_at, Some(inside));
        assert_eq!(fork.parent.as_deref(), Some(parent.as_str()));
    }
    assert_eq!(
        (idle[0].status.as_str(), idle[0].forked_at),
        ("idle", Some(end_of_turn_one))
    );
    assert_eq!(idle[0].title, "from the end of turn one");
    let mut children = harness.world().forks(&parent).await?;
    children.sort();
    let mut made: Vec<String> = mid.iter().chain(&idle).map(|s| s.id.clone()).collect();
    made.sort();
    assert_eq!(children, made);

    // Each fork's workspace, once a driver takes it up, is the parent's at the fork
    // point: the same snapshot, and a repository git finds sound and unchanged.
    let (a, b, c) = (&mid[0].id, &mid[1].id, &idle[0].id);
    let restored = setup.dir.path().join("restored-at-fork-point");
    harness
        .drive()
        .restore_async(&restored, &snapshot_inside)
        .await?;
    // (Before git looks: `git status` refreshes the index it reads.)
    let expected_tree = tree(&restored);
    let expected_status = git(&restored, &["status", "--porcelain", "--ignored"]);
    let mut driver_a = harness.wake_native(a).await?;
    let dir_a = workspace_of(&harness, a).await;
    assert_ne!(dir_a, repo);
    assert_eq!(tree(&dir_a), expected_tree);
    assert_eq!(harness.drive().snapshot(&dir_a)?, snapshot_inside);
    assert_eq!(
        git(&dir_a, &["status", "--porcelain", "--ignored"]),
        expected_status
    );
    git(&dir_a, &["fsck", "--strict", "--no-progress"]);
    assert!(expected_status.contains(" M README.md") && expected_status.contains("?? scratch.txt"));

    // Fork a finishes the turn by itself, in its own workspace.
    assert_eq!(driver_a.run().await?, Stop::Idle);
    driver_a.release().await?;
    assert_eq!(
        std::fs::read_to_string(dir_a.join("notes.txt"))?,
        "zero\none\ntwo\n"
    );
    assert_eq!(git(&dir_a, &["log", "--format=%s"]), "two\nsecond\nfirst\n");
    assert_eq!(
        tree(&repo),
        after_turn_one,
        "the parent's directory is untouched"
    );

    // Fork b, taken up after a ran, still starts at the fork point.
    let mut driver_b = harness.wake_native(b).await?;
    let dir_b = workspace_of(&harness, b).await;
    assert_eq!(harness.drive().snapshot(&dir_b)?, snapshot_inside);
    assert_eq!(driver_b.run().await?, Stop::Idle);
    driver_b.release().await?;

    // Fork c, from the end of turn 1, is the parent's directory as turn 1 left it.
    let mut driver_c = harness.wake_native(c).await?;
    let dir_c = workspace_of(&harness, c).await;
    assert_eq!(tree(&dir_c), after_turn_one);
    driver_c.send("more").await?;
    assert_eq!(driver_c.run().await?, Stop::Idle);
    driver_c.release().await?;

    // The parent goes on as if nothing happened.
    let mut driver = harness.wake_native(&parent).await?;
    driver.send("more").await?;
    assert_eq!(driver.run().await?, Stop::Idle);
    driver.release().await?;
    for dir in [&repo, &dir_c] {
        assert_eq!(
            std::fs::read_to_string(dir.join("notes.txt"))?,
            "zero\none\ntwo\nthree\n"
        );
    }
    assert_eq!(
        std::fs::read_to_string(dir_b.join("notes.txt"))?,
        "zero\none\ntwo\n"
    );
    assert_eq!(
        harness.state(c).await?.last_reply().as_deref(),
        Some("turn two done")
    );

    // Nothing shared was asked again: the first reply was asked once (by the
    // parent), the rest of turn 1 by the parent and the two forks inside it, turn 2
    // by the parent and the fork after it.
    assert_eq!(setup.fake.state().calls_per_step(), [1, 3, 3, 2, 2]);
    for fork in [a, b, c] {
        let state = harness.state(fork).await?;
        assert_eq!(state.phase.status(), Status::Idle);
        assert_eq!(
            state.former_workspaces.first().map(PathBuf::from),
            Some(repo.canonicalize()?)
        );
        let named = repo.canonicalize()?.display().to_string();
        assert!(
            !state.system.contains(&named),
            "the prompt names the parent's directory"
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_rewind_goes_back_to_a_turns_end_and_keeps_what_followed_aside() -> anyhow::Result<()> {
    let setup = Setup::new(json!([
        bash("echo a > a.txt"),
        {"text": "turn one done"},
        bash("echo b > b.txt && curl -s -m 2 -X POST http://127.0.0.1:9/deploy; true"),
        {"text": "turn two done"},
    ]))
    .await;
    let harness = setup.harness_with(|o| o.sandbox.backend = steadfast_sandbox::Backend::Local);
    let workspace = setup.workspace();
    let id = harness
        .start_session(NewSession::native("fake/m", &workspace).with_task("one"))
        .await?;
    let mut driver = harness.wake_native(&id).await?;
    assert_eq!(driver.run().await?, Stop::Idle);
    let end_of_turn_one = driver.state().last_seq;
    driver.send("two").await?;
    assert_eq!(driver.run().await?, Stop::Idle);
    driver.release().await?;
    let before = harness.state(&id).await?;
    assert!(workspace.join("b.txt").exists());

    // Refused: a position inside a turn, and positions outside the log.
    let inside = harness
        .world()
        .read(&id, 1)
        .await?
        .iter()
        .find(|r| matches!(r.event, Event::ToolCallOutcome { .. }))
        .unwrap()
        .seq;
    for to in [0, inside, before.last_seq] {
        let refused = harness.rewind(&id, to, "tester").await.unwrap_err();
        assert!(refused.to_string().contains("to:"), "{to}: {refused}");
    }

    let report = harness.rewind(&id, end_of_turn_one, "tester").await?;
    assert_eq!(report.status, Status::Idle);
    assert_eq!(report.facts.len(), 1, "{:?}", report.facts);
    assert!(
        report.facts[0].contains("curl -s -m 2 -X POST"),
        "{:?}",
        report.facts
    );
    // The workspace and the state are the ones at the turn's end.
    let (then, _) =
        steadfast_world::load_state_at(harness.world(), harness.blobs(), &id, end_of_turn_one)
            .await?;
    assert!(!workspace.join("b.txt").exists() && workspace.join("a.txt").exists());
    assert_eq!(
        Some(harness.drive().snapshot(&workspace)?),
        then.last_snapshot
    );
    let now = harness.state(&id).await?;
    assert_eq!(now.conversation, then.conversation);
    assert_eq!(
        now.last_seq,
        before.last_seq + 1,
        "positions only move forward"
    );
    // What followed is kept whole in the branch.
    let branch = harness.world().read(&report.branch, 1).await?;
    assert!(branch.len() as u64 > before.last_seq);
    assert_eq!(
        harness.state(&report.branch).await?.last_reply().as_deref(),
        Some("turn two done")
    );

    // What was set aside is reached through the branch, not the session.
    let refused = harness
        .fork(&ForkRequest {
            parent: id.clone(),
            at: Some(before.last_seq),
            count: 1,
            owner: "local".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("set aside by a rewind"),
        "{refused}"
    );

    // The next turn's request carries the history up to the rewind and the facts.
    let mut driver = harness.wake_native(&id).await?;
    driver.send("again").await?;
    assert_eq!(driver.run().await?, Stop::Idle);
    driver.release().await?;
    let request = setup.fake.state().requests().last().cloned().unwrap();
    assert!(request.contains("This session was rewound"), "{request}");
    assert!(request.contains("curl -s -m 2 -X POST"), "{request}");
    assert!(
        !request.contains("turn two done"),
        "the set-aside turn is not in the context"
    );
    assert_eq!(
        harness.state(&id).await?.last_reply().as_deref(),
        Some("turn two done")
    );
    Ok(())
}

#[tokio::test]
async fn a_fork_at_a_call_in_flight_resolves_it_against_the_fork_point() -> anyhow::Result<()> {
    let setup = Setup::new(json!([
        bash("echo one >> notes.txt"),
        {"text": "done"},
    ]))
    .await;
    let harness = setup.harness_with(|o| o.sandbox.backend = steadfast_sandbox::Backend::Local);
    let workspace = setup.workspace();
    std::fs::write(workspace.join("notes.txt"), "zero\n")?;
    let parent = harness
        .start_session(NewSession::native("fake/m", &workspace).with_task("go"))
        .await?;
    let mut driver = harness.wake_native(&parent).await?;
    assert_eq!(driver.run().await?, Stop::Idle);
    driver.release().await?;
    // At the command's intent: the parent went on to run it, but the fork's history
    // ends before any outcome.
    let intent = harness
        .world()
        .read(&parent, 1)
        .await?
        .iter()
        .find(|r| matches!(r.event, Event::ToolCallIntent { .. }))
        .unwrap()
        .seq;
    let fork = harness
        .fork(&ForkRequest {
            parent: parent.clone(),
            at: Some(intent),
            count: 1,
            owner: "local".into(),
            ..Default::default()
        })
        .await?
        .remove(0);
    assert_eq!(fork.status, steadfast_log::Status::Running);
    let mut driver = harness.wake_native(&fork.id).await?;
    assert_eq!(driver.run().await?, Stop::Idle);
    driver.release().await?;
    let own: Vec<Event> = harness
        .world()
        .read(&fork.id, intent + 1)
        .await?
        .into_iter()
        .map(|r| r.event)
        .collect();
    assert!(
        own.iter().any(|e| matches!(
            e,
            Event::ToolCallInterrupted {
                resolution: steadfast_log::ToolResolution::RolledBack { .. },
                ..
            }
        )),
        "the cut-off mutation was rolled back in the fork: {own:?}"
    );
    // Rolled back to the snapshot before it, then run again by the model's choice:
    // once in the fork's workspace, never twice.
    let dir = workspace_of(&harness, &fork.id).await;
    assert_eq!(
        std::fs::read_to_string(dir.join("notes.txt"))?,
        "zero\none\n"
    );
    assert_eq!(
        std::fs::read_to_string(workspace.join("notes.txt"))?,
        "zero\none\n"
    );
    Ok(())
}
