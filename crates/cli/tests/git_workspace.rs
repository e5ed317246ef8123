//! Workspaces from git, through a real `steadfast serve` with bwrap sandboxes and a real
//! git server (`git http-backend` behind basic auth, on loopback): the server clones
//! with a credential from the caller's vault; the sandbox sees the history and a remote
//! with no secret, and finds the credential nowhere (files, environment, processes);
//! inside, `git push` has neither credential nor route; the agent commits and asks for
//! `git_push`, which the harness does with the credential (for the native agent and
//! every wrapped CLI, whose `git_push` comes through the journal). A worker SIGKILLed right
//! after the push (or right before it) is replaced, and the branch is pushed exactly
//! once either way. Nothing Steadfast stores holds the credential.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use steadfast_testkit::git_server::GitServer;
use steadfast_testkit::{FakeProvider, Script};

mod common;

use common::{call, event_page, git, holding, put_credential, wait_for, VaultSite};

const TOKEN: &str = "git-token-7d3e91ab";

/// A bare repository `<root>/<name>.git` with three commits, a binary file and a
/// symlink.
fn repository(root: &Path, name: &str) {
    let work = root.join(format!("{name}-work"));
    std::fs::create_dir_all(work.join("src")).unwrap();
    git(&work, &["init", "-q", "-b", "main"]);
    std::fs::write(work.join("README.md"), "# widgets\n").unwrap();
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-qm", "first"]);
    std::fs::write(work.join("src/lib.rs"), "pub fn answer() -> u32 { 42 }\n").unwrap();
    std::fs::write(
        work.join("logo.bin"),
        (0..=255u8).cycle().take(70_000).collect::<Vec<_>>(),
    )
    .unwrap();
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-qm", "second"]);
    std::os::unix::fs::symlink("src/lib.rs", work.join("lib-link.rs")).unwrap();
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-qm", "third"]);
    git(
        root,
        &[
            "clone",
            "-q",
            "--bare",
            &format!("{name}-work"),
            &format!("{name}.git"),
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cloned_repository_is_pushed_once_with_a_credential_the_sandbox_never_sees() {
    let dir = tempfile::tempdir().unwrap();
    let repos = dir.path().join("repos");
    std::fs::create_dir_all(&repos).unwrap();
    // One repository per crash: right after the push, and right before it, in the
    // native loop; right after it in each wrapped CLI, whose `git_push` comes through
    // the journaled MCP server.
    let wrapped = ["claude-code", "codex", "pi", "opencode"];
    for agent in wrapped {
        common::installed(agent).await;
    }
    let rounds: Vec<(&str, &str)> = [
        (steadfast_fault::points::TOOL_EFFECT, "native"),
        (steadfast_fault::points::TOOL_INTENT, "native"),
    ]
    .into_iter()
    .chain(
        wrapped
            .iter()
            .map(|agent| (steadfast_fault::points::TOOL_EFFECT, *agent)),
    )
    .collect();
    for i in 0..rounds.len() {
        repository(&repos, &format!("widgets{i}"));
    }
    let server = GitServer::start(repos.clone(), "x-access-token", TOKEN)
        .await
        .unwrap();

    // The probe looks for the secret everywhere the sandbox can, without naming it.
    let probe = "mkdir -p probe; echo probe/ >> .git/info/exclude; \
         git log --oneline > probe/log.txt; cat .git/config > probe/config.txt; \
         env > probe/env.txt; cat /proc/*/environ /proc/*/cmdline 2>/dev/null | tr '\\0' '\\n' > probe/environ.txt; \
         a=git-token; b=7d3e91ab; \
         grep -rsl \"$a-$b\" / --exclude-dir=proc --exclude-dir=sys --exclude-dir=usr > probe/found.txt; \
         GIT_TERMINAL_PROMPT=0 timeout 20 git push origin HEAD:refs/heads/sneaky > probe/push.txt 2>&1; \
         echo \"rc=$?\" >> probe/push.txt; true";
    let commit = "printf 'pub fn twice(x: u32) -> u32 { 2 * x }\\n' > src/twice.rs && \
         git add -A && git commit -qm 'add twice' && git rev-parse HEAD > probe/head.txt";
    let script: Script = serde_json::from_value(json!({"steps": [
        {"text": "looking", "tool_calls": [{"name": "bash", "input": {"command": probe}}]},
        {"text": "committing", "tool_calls": [{"name": "bash", "input": {"command": commit}}]},
        {"text": "pushing", "tool_calls": [{"name": "git_push", "input": {"branch": "agent/twice"}}]},
        {"text": "pushed"}
    ]}))
    .unwrap();
    let fake = FakeProvider::start(script).await.unwrap();
    // The forge is on this host: the operator opens its one port, and nothing else
    // internal, to what sessions name.
    let forge = server.url("x");
    let forge = forge
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let site = VaultSite::new(
        dir.path(),
        &format!("[sandbox]\nbackend = \"bwrap\"\ninternal-hosts = [\"{forge}\"]\n"),
    );
    let home = site.home.clone();
    // (Codex's model is OpenAI's, played by the same fake.)
    let command = |args: &[&str]| {
        let mut command = site.command(&fake, args);
        command
            .env("OPENAI_API_KEY", "sk-openai-the-harness-real-key")
            .env("OPENAI_BASE_URL", format!("{}/v1", fake.base_url()));
        command
    };
    let mut _api = command(&["serve", "--listen", "127.0.0.1:0", "--workers", "0"])
        .spawn()
        .unwrap();
    let url = common::printed_url(&mut _api).await;
    put_credential(&url, "forge", TOKEN).await;
    put_credential(&url, "stale", "not-the-token").await;
    let sessions = format!("{url}/v1/sessions");
    let workspaces = home.join("workspaces");
    let made_before = std::fs::read_dir(&workspaces).map_or(0, |d| d.count());

    // Refused, naming the field, leaving nothing behind: a secret in the URL, a
    // transport other than HTTP, a credential not in the vault, a wrong one, a bad ref.
    let repo0 = server.url("widgets0");
    for (workspace, says) in [
        (
            json!({"kind": "git", "url": repo0.replace("http://", &format!("http://u:{TOKEN}@"))}),
            "workspace.url",
        ),
        (
            json!({"kind": "git", "url": format!("file://{}", repos.display())}),
            "workspace.url",
        ),
        (
            json!({"kind": "git", "url": repo0, "credential": "nothing"}),
            "workspace.credential",
        ),
        (
            json!({"kind": "git", "url": repo0, "credential": "stale"}),
            "workspace: clone",
        ),
        (
            json!({"kind": "git", "url": repo0, "credential": "forge", "ref": "-x"}),
            "workspace.ref",
        ),
        (
            json!({"kind": "git", "url": repo0, "credential": "forge", "ref": "gone"}),
            "workspace: clone",
        ),
        // Internal destinations the operator did not open, however they are spelled:
        // the forge's host at another port, the host itself as one number, the cloud
        // metadata address.
        (
            json!({"kind": "git", "url": "http://127.0.0.1:1/widgets0"}),
            "the remote is not allowed",
        ),
        (
            json!({"kind": "git", "url": format!("http://2130706433:{}/widgets0", forge.rsplit(':').next().unwrap().parse::<u16>().unwrap() + 1)}),
            "the remote is not allowed",
        ),
        (
            json!({"kind": "git", "url": "http://169.254.169.254/latest.git"}),
            "the remote is not allowed",
        ),
    ] {
        let (status, body) = call(
            reqwest::Method::POST,
            &sessions,
            Some(json!({"workspace": workspace})),
        )
        .await;
        assert_eq!(status, 422, "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{message}");
        assert!(!message.contains(TOKEN), "{message}");
    }
    assert_eq!(
        std::fs::read_dir(&workspaces).map_or(0, |d| d.count()),
        made_before,
        "a refused session leaves no workspace"
    );

    // A commit named by its id is checked out detached, with the history up to it.
    let first = git(
        &repos.join("widgets0.git"),
        &["rev-list", "--max-parents=0", "main"],
    );
    let (status, created) = call(
        reqwest::Method::POST,
        &sessions,
        Some(json!({"workspace": {"kind": "git", "url": repo0, "credential": "forge", "ref": first}})))
    .await;
    assert_eq!(status, 201, "{created}");
    let at_first = common::workspace_in(&home, &created);
    assert!(at_first.join("README.md").exists() && !at_first.join("src").exists());
    assert_eq!(git(&at_first, &["rev-parse", "HEAD"]), first);

    for (i, (fault, agent)) in rounds.iter().enumerate() {
        let name = format!("widgets{i}");
        let (status, created) = call(
            reqwest::Method::POST,
            &sessions,
            Some(json!({
                "task": "add a twice function and push it",
                "agent": agent,
                "model": if *agent == "codex" { "openai/gpt-5" } else { "anthropic/claude-sonnet-4-5" },
                "workspace": {"kind": "git", "url": server.url(&name), "credential": "forge", "ref": "main"},
            })))
        .await;
        assert_eq!(status, 201, "{created}");
        let id = created["id"].as_str().unwrap().to_string();
        let workspace = common::workspace_in(&home, &created);

        // The third tool call is the push: the first worker dies at `fault` in it.
        let mut doomed = command(&["worker"]);
        doomed.env("STEADFAST_FAULT", format!("{fault}:3"));
        let status = tokio::time::timeout(std::time::Duration::from_secs(120), doomed.status())
            .await
            .expect("the worker reached the fault")
            .unwrap();
        assert!(!status.success(), "{fault}: the worker was to abort");
        let mut worker = command(&["worker"]).spawn().unwrap();
        wait_for("the turn to end", async || {
            reqwest::get(format!("{sessions}/{id}"))
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()["status"]
                == "idle"
        })
        .await;
        worker.kill().await.unwrap();

        let bare = repos.join(format!("{name}.git"));
        let head = std::fs::read_to_string(workspace.join("probe/head.txt")).unwrap();
        assert_eq!(
            git(&bare, &["rev-parse", "refs/heads/agent/twice"]),
            head.trim(),
            "{agent} {fault}: the agent's commit is on the remote branch"
        );
        let pushes = server
            .requests()
            .iter()
            .filter(|r| r.is_push() && r.authorized && r.uri.starts_with(&format!("/{name}.git/")))
            .count();
        assert_eq!(pushes, 1, "{agent} {fault}: pushed exactly once");
        assert!(
            git(&bare, &["branch", "--list", "sneaky"]).is_empty(),
            "the sandbox pushed nothing itself"
        );

        let probe =
            |file: &str| std::fs::read_to_string(workspace.join("probe").join(file)).unwrap();
        assert_eq!(
            probe("log.txt").lines().count(),
            3,
            "the clone has the history"
        );
        assert!(probe("config.txt").contains(&server.url(&name)));
        for file in ["config.txt", "env.txt", "environ.txt"] {
            let text = probe(file);
            assert!(!text.is_empty() && !text.contains(TOKEN), "{file}: {text}");
        }
        assert!(
            probe("found.txt").trim().is_empty(),
            "readable files hold it: {}",
            probe("found.txt")
        );
        let pushed_inside = probe("push.txt");
        assert!(!pushed_inside.contains("rc=0"), "{pushed_inside}");
        assert!(std::fs::symlink_metadata(workspace.join("lib-link.rs"))
            .unwrap()
            .is_symlink());
        assert_eq!(
            std::fs::read(workspace.join("logo.bin")).unwrap().len(),
            70_000
        );
        assert!(!workspace.join(".steadfast-push.bundle").exists());

        // The log says how the cut-off push was resolved.
        // The log says how the cut-off push was resolved: after the push, seen done on
        // the remote (and not pushed again); before it, seen not done and run once.
        let log = event_page(&format!("{sessions}/{id}/events")).await;
        let resolutions: Vec<&Value> = log
            .iter()
            .filter(|e| e["type"] == "tool_call_interrupted")
            .map(|e| &e["resolution"])
            .collect();
        let done = *fault == steadfast_fault::points::TOOL_EFFECT;
        assert_eq!(resolutions.len(), 1, "{agent}: {resolutions:?}");
        assert_eq!(resolutions[0]["kind"], "reconciled", "{agent}");
        assert_eq!(resolutions[0]["done"], done, "{fault}: {}", resolutions[0]);
        assert!(holding(&workspace, TOKEN).is_empty());
    }
    // Nothing Steadfast stored holds the credential: the world, blobs, snapshots.
    assert_eq!(holding(&home, TOKEN), Vec::<PathBuf>::new());
    assert!(
        !server
            .requests()
            .iter()
            .any(|r| !r.authorized && r.uri.contains("receive-pack")),
        "no push without the credential reached the server"
    );
}
