//! The deployment in `deploy/` works as `docs/deploy.md` says, with podman and
//! nothing from a container registry. The page's commands run as written: a base
//! image from Debian's packages, the Steadfast image on it, PostgreSQL and an S3
//! store on the same base, the compose stack (the API, two workers, PostgreSQL, the
//! store) and a session through it. Then the stack is restarted with a scripted
//! model whose command is long, the worker container holding the session is killed
//! mid-command, and the other worker finishes it. A worker container that cannot
//! mount a sandbox's `/proc` refuses to start, saying how to fix it. The systemd
//! units verify and their command lines run a session.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{json, Value};

const TOKEN: &str = "sft-container-test-token";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn have(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Podman as this machine needs it. Where the host's cgroups are v1 (or hybrid),
/// crun refuses and runc is used; containers get this process's own open-file
/// limit, since a host that withholds CAP_SYS_RESOURCE cannot raise it.
struct Podman {
    conf: tempfile::NamedTempFile,
}

impl Podman {
    fn new() -> Self {
        let v1 = Command::new("podman")
            .args(["info", "--format", "{{.Host.CgroupsVersion}}"])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "v1");
        let mut limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
        limits = limits
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .and_then(|l| l.split_whitespace().nth(3))
            .unwrap_or("1024")
            .to_string();
        let mut conf = format!(
            "[containers]\ndefault_ulimits = [\"nofile={limits}:{limits}\", \"nproc=32768:32768\"]\n"
        );
        if v1 {
            conf.push_str("[engine]\nruntime = \"runc\"\n");
        }
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), conf).unwrap();
        Podman { conf: file }
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("CONTAINERS_CONF", self.conf.path());
        cmd
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command("podman").args(args).output().unwrap()
    }
}

/// The page's runnable commands: its `sh` blocks run by this test, as one script.
fn page_script() -> String {
    let page = std::fs::read_to_string(repo().join("docs/deploy.md")).unwrap();
    let mut script = String::new();
    let mut inside = false;
    for line in page.lines() {
        if let Some(tag) = line.strip_prefix("```") {
            inside = !inside
                && tag.starts_with("sh")
                && tag.contains("run as written by crates/cli/tests/containers.rs");
            continue;
        }
        if inside {
            script.push_str(line);
            script.push('\n');
        }
    }
    assert!(
        script.contains("podman-compose"),
        "the page's commands were found"
    );
    script
}

/// This build's `steadfast` first on `PATH`, as a reader who built it has it.
fn path_with_steadfast() -> std::ffi::OsString {
    let bin = Path::new(env!("CARGO_BIN_EXE_steadfast"))
        .parent()
        .unwrap()
        .to_path_buf();
    std::env::join_paths(
        std::iter::once(bin).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap())),
    )
    .unwrap()
}

/// A compose project of this test: brought down, with its volumes, when dropped.
struct Stack<'a> {
    podman: &'a Podman,
    project: String,
    env: Vec<(String, String)>,
    files: Vec<PathBuf>,
}

impl Stack<'_> {
    fn compose(&self, args: &[&str]) -> Output {
        let mut cmd = self.podman.command("podman-compose");
        cmd.args(["--project-name", &self.project]);
        for file in &self.files {
            cmd.arg("--file").arg(file);
        }
        cmd.args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .current_dir(repo().join("deploy"))
            .output()
            .unwrap()
    }

    fn container(&self, service: &str) -> String {
        format!("{}_{service}_1", self.project)
    }

    fn logs(&self, service: &str) -> String {
        text(&self.podman.run(&["logs", &self.container(service)]))
    }
}

impl Drop for Stack<'_> {
    fn drop(&mut self) {
        let _ = self.compose(&["down", "--volumes"]);
        // podman-compose leaves the project's network behind.
        let _ = self
            .podman
            .run(&["network", "rm", &format!("{}_default", self.project)]);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn api(
    client: &reqwest::Client,
    token: &str,
    method: reqwest::Method,
    url: String,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = client
        .request(method, url)
        .bearer_auth(token)
        .header("accept", "application/json");
    if let Some(body) = body {
        req = req.json(&body);
    }
    match req.send().await {
        Ok(resp) => {
            let status = resp.status().as_u16();
            (status, resp.json().await.unwrap_or(Value::Null))
        }
        Err(_) => (0, Value::Null),
    }
}

/// The scripted model of this test: a file written, a long command (the worker is
/// killed during it), then a command that shows who the sandbox runs as.
fn script(dir: &Path) -> PathBuf {
    let path = dir.join("script.json");
    std::fs::write(
        &path,
        json!({"steps": [
            {"text": "Writing the first file.", "tool_calls": [{"name": "write", "input": {"file_path": "a.txt", "content": "before the kill\n"}}]},
            {"text": "A long build.", "tool_calls": [{"name": "bash", "input": {"command": "sleep 30; echo built > b.txt"}}]},
            {"text": "Who am I?", "tool_calls": [{"name": "bash", "input": {"command": "id -u > c.txt; cat c.txt"}}]},
            {"text": "All done."}
        ]})
        .to_string(),
    )
    .unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deploy_page_runs_as_written_and_a_session_survives_its_worker_container() {
    for tool in ["podman", "podman-compose"] {
        assert!(
            have(tool),
            "{tool} is not installed (.ci/run installs podman, podman-compose, runc, debootstrap)"
        );
    }
    assert!(
        Path::new("/usr/sbin/debootstrap").exists() || have("debootstrap"),
        "debootstrap is not installed (.ci/run installs it)"
    );
    let podman = Podman::new();
    let port = free_port();
    // Made before the stack, so they outlive its teardown (which reads the files).
    let home = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cargo"));
    let mut stack = Stack {
        podman: &podman,
        project: "steadfast".into(),
        env: vec![("STEADFAST_PORT".into(), port.to_string())],
        files: vec![repo().join("deploy/compose.yaml")],
    };
    // What an earlier run may have left.
    let _ = stack.compose(&["down", "--volumes"]);

    // The page, as written, from the checkout; a line of the test's own prints what
    // it made, for what follows.
    let commands = format!(
        "set -euo pipefail\n{}\necho \"PAGE session=$session token=$TOKEN\"\n",
        page_script()
    );
    let page = podman
        .command("bash")
        .arg("-c")
        .arg(&commands)
        .current_dir(repo())
        .env("HOME", home.path())
        .env("CARGO_HOME", &cargo_home)
        .env("PATH", path_with_steadfast())
        .env("STEADFAST_PORT", port.to_string())
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .env_remove("BASE")
        .output()
        .unwrap();
    let said = text(&page);
    assert!(
        page.status.success(),
        "the page's commands failed:\n{said}\n{}\n{}",
        stack.logs("migrate"),
        stack.logs("api")
    );
    let made = String::from_utf8_lossy(&page.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("PAGE ").map(str::to_string))
        .expect("the page ran to its end");
    let field = |name: &str| {
        made.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{name}=")).map(str::to_string))
            .unwrap()
    };
    let (page_session, token) = (field("session"), field("token"));
    assert!(said.contains("\"status\": \"idle\""), "{said}");
    assert!(
        podman
            .run(&["image", "exists", "localhost/steadfast:latest"])
            .status
            .success(),
        "deploy/build-image made the image"
    );

    // The stack again, with a scripted model whose second command is long: stopped
    // (its volumes kept) and started with an override file, as an operator adds
    // settings of their own.
    let script_file = script(dir.path());
    let extra = dir.path().join("compose.test.yaml");
    let mount = format!("{}:/etc/steadfast/script.json:ro", script_file.display());
    let mut overrides = String::from("services:\n");
    for service in ["migrate", "api", "worker-1", "worker-2"] {
        overrides.push_str(&format!(
            "  {service}:\n    environment:\n      STEADFAST_FAKE_SCRIPT: /etc/steadfast/script.json\n    volumes:\n      - {mount}\n"
        ));
    }
    std::fs::write(&extra, overrides).unwrap();
    let config = home.path().join("steadfast-deploy/steadfast.toml");
    stack.env.extend([
        (
            "POSTGRES_IMAGE".into(),
            "localhost/steadfast-postgres".into(),
        ),
        ("S3_IMAGE".into(), "localhost/steadfast-s3".into()),
        ("STEADFAST_CONFIG_FILE".into(), config.display().to_string()),
    ]);
    let down = stack.compose(&["down"]);
    assert!(down.status.success(), "compose down: {}", text(&down));
    stack.files.push(extra);
    let up = stack.compose(&["up", "--detach"]);
    assert!(up.status.success(), "compose up: {}", text(&up));

    let url = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let call = |method: reqwest::Method, path: String, body: Option<Value>| {
        api(&client, &token, method, format!("{url}{path}"), body)
    };
    let mut ready = false;
    for _ in 0..240 {
        if call(reqwest::Method::GET, "/readyz".into(), None).await.0 == 200 {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        ready,
        "the API never got ready again:\n{}",
        stack.logs("api")
    );
    // What the page made is still there: the log is in PostgreSQL's volume.
    let (_, kept) = call(
        reqwest::Method::GET,
        format!("/v1/sessions/{page_session}"),
        None,
    )
    .await;
    assert_eq!(kept["status"], "idle", "{kept}");
    let anonymous = reqwest::get(format!("{url}/v1/sessions")).await.unwrap();
    assert_eq!(
        anonymous.status().as_u16(),
        401,
        "production refuses callers without a token"
    );

    let (status, created) = call(
        reqwest::Method::POST,
        "/v1/sessions".into(),
        Some(json!({"workspace": {"kind": "empty", "files": {"README.md": "a project\n"}}})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let (status, queued) = call(
        reqwest::Method::POST,
        format!("/v1/sessions/{id}/messages"),
        Some(json!({"text": "build it"})),
    )
    .await;
    assert_eq!(status, 202, "{queued}");

    // Wait for the long command to start, then kill the worker container holding
    // the session, and keep it down.
    let events = format!("/v1/sessions/{id}/events?after=0&limit=1000");
    let mut seen: Vec<Value> = Vec::new();
    for _ in 0..240 {
        let (_, page) = call(reqwest::Method::GET, events.clone(), None).await;
        seen = page["events"].as_array().cloned().unwrap_or_default();
        if seen.iter().any(|e| {
            e["type"] == "tool_call_intent"
                && e["input"]["command"]
                    .as_str()
                    .is_some_and(|c| c.starts_with("sleep 30"))
        }) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        seen.iter().any(|e| e["type"] == "tool_call_intent"),
        "the long command never started: {seen:?}\n{}\n{}",
        stack.logs("worker-1"),
        stack.logs("worker-2")
    );
    let holder = ["worker-1", "worker-2"]
        .into_iter()
        .find(|w| stack.logs(w).contains(&id))
        .expect("one worker's log names the session");
    let other = if holder == "worker-1" {
        "worker-2"
    } else {
        "worker-1"
    };
    let killed = podman.run(&["kill", "--signal", "KILL", &stack.container(holder)]);
    assert!(killed.status.success(), "{}", text(&killed));
    let removed = podman.run(&["rm", "--force", &stack.container(holder)]);
    assert!(removed.status.success(), "{}", text(&removed));

    // The other worker takes the session over once the lease lapses, and the turn
    // ends with the work recorded before the kill in the workspace.
    let mut shown = Value::Null;
    for _ in 0..360 {
        shown = call(reqwest::Method::GET, format!("/v1/sessions/{id}"), None)
            .await
            .1;
        if shown["status"] == "idle" && shown["turn"].as_u64() >= Some(1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        shown["status"],
        "idle",
        "the session was not carried on: {shown}\n{}",
        stack.logs(other)
    );
    assert_eq!(shown["reply"], "All done.", "{shown}");
    assert!(
        stack.logs(other).contains(&id),
        "the other worker took the session over"
    );
    let file = |path: &str| {
        let client = client.clone();
        let url = format!("{url}/v1/sessions/{id}/files/{path}");
        let token = token.clone();
        async move {
            let resp = client.get(url).bearer_auth(token).send().await.unwrap();
            (
                resp.status().as_u16(),
                resp.text().await.unwrap_or_default(),
            )
        }
    };
    assert_eq!(file("a.txt").await, (200, "before the kill\n".to_string()));
    // The sandbox inside the worker container runs commands as its own unprivileged
    // user (bubblewrap's), not as the container's.
    assert_eq!(file("c.txt").await, (200, "1000\n".to_string()));
    let (_, page) = call(reqwest::Method::GET, events, None).await;
    let all = page["events"].as_array().cloned().unwrap_or_default();
    let outcomes = all
        .iter()
        .filter(|e| e["type"] == "tool_call_outcome")
        .count();
    assert!(
        outcomes >= 2,
        "the calls before and after the kill are recorded: {all:?}"
    );

    // A worker container whose runtime masks /proc cannot start a sandbox: it
    // refuses at start, saying what to unmask.
    let refused = podman.run(&[
        "run",
        "--rm",
        "--volume",
        &format!("{}:/etc/steadfast/steadfast.toml:ro", config.display()),
        "--env",
        "STEADFAST_CONFIG=/etc/steadfast/steadfast.toml",
        "localhost/steadfast:latest",
        "worker",
    ]);
    let said = text(&refused);
    assert!(!refused.status.success(), "{said}");
    assert!(
        said.contains("refuses to start without an isolating sandbox") && said.contains("unmask"),
        "{said}"
    );
}

/// The systemd units are valid (`systemd-analyze verify`), and their command lines,
/// run as systemd would run them with the environment file's settings pointed at
/// this machine's PostgreSQL, migrate, serve and drive a session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_systemd_units_verify_and_their_commands_run_a_session() {
    let units = repo().join("deploy/systemd");
    let dir = tempfile::tempdir().unwrap();
    let binary = env!("CARGO_BIN_EXE_steadfast");
    let mut exec = std::collections::BTreeMap::new();
    for name in [
        "steadfast-migrate.service",
        "steadfast-api.service",
        "steadfast-worker@.service",
    ] {
        let unit = std::fs::read_to_string(units.join(name)).unwrap();
        assert!(
            unit.contains("EnvironmentFile=/etc/steadfast/steadfast.env"),
            "{name}"
        );
        let start = unit
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .unwrap_or_else(|| panic!("{name} has an ExecStart"))
            .replace("/usr/local/bin/steadfast", binary);
        exec.insert(name, start);
        let instance = name.replace("@.", "@1.");
        std::fs::write(
            dir.path().join(&instance),
            unit.replace("/usr/local/bin/steadfast", binary),
        )
        .unwrap();
    }
    if have("systemd-analyze") {
        let out = Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .args([
                "steadfast-migrate.service",
                "steadfast-api.service",
                "steadfast-worker@1.service",
            ])
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "systemd-analyze verify: {}",
            text(&out)
        );
    }

    // The environment file's settings, pointed at a database of this test.
    let db = common::TestDatabase::create("systemd_units").await;
    let env_file = std::fs::read_to_string(units.join("steadfast.env")).unwrap();
    let mut env: Vec<(String, String)> = env_file
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains('='))
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap();
            (k.to_string(), v.to_string())
        })
        .collect();
    let keys: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
    assert!(
        keys.contains(&"STEADFAST_WORLD") && keys.contains(&"STEADFAST_BLOBS"),
        "{keys:?}"
    );
    let home = dir.path().join("var-lib-steadfast");
    let blobs = dir.path().join("blobs");
    let config = dir.path().join("steadfast.toml");
    std::fs::write(&config, "").unwrap();
    for (k, v) in &mut env {
        match k.as_str() {
            "STEADFAST_WORLD" => *v = db.url.clone(),
            "STEADFAST_BLOBS" => *v = blobs.display().to_string(),
            "STEADFAST_HOME" => *v = home.display().to_string(),
            "STEADFAST_CONFIG" => *v = config.display().to_string(),
            _ => {}
        }
    }
    let port = free_port();
    let run = |line: &str, extra: &[(&str, String)]| {
        let words: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        let mut cmd = tokio::process::Command::new(&words[0]);
        cmd.args(&words[1..])
            .envs(env.iter().map(|(k, v)| (k.clone(), v.clone())))
            .envs(extra.iter().map(|(k, v)| (k.to_string(), v.clone())))
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("OPENAI_API_KEY")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        cmd
    };
    let migrate = run(&exec["steadfast-migrate.service"], &[])
        .output()
        .await
        .unwrap();
    assert!(
        migrate.status.success(),
        "{}",
        String::from_utf8_lossy(&migrate.stderr)
    );
    // The API unit names its own listener; the test moves it to a free port. It
    // runs with tokens (production), so one is configured.
    std::fs::write(
        &config,
        format!(
            "[[server.tokens]]\nowner = \"tester\"\ntoken-hash = \"{}\"\n",
            steadfast_server::hash_token(TOKEN)
        ),
    )
    .unwrap();
    let mut api_process = run(
        &exec["steadfast-api.service"],
        &[("STEADFAST_LISTEN", format!("127.0.0.1:{port}"))],
    )
    .spawn()
    .unwrap();
    // The instance's metrics port moves to a free one too.
    let worker_line = exec["steadfast-worker@.service"]
        .replace("127.0.0.1:970%i", &format!("127.0.0.1:{}", free_port()))
        .replace("%i", "1");
    assert!(!worker_line.contains('%'), "{worker_line}");
    let mut worker = run(
        &worker_line,
        &[(
            "STEADFAST_HOME",
            home.join("worker-1").display().to_string(),
        )],
    )
    .spawn()
    .unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let mut ready = false;
    for _ in 0..200 {
        if api(
            &client,
            TOKEN,
            reqwest::Method::GET,
            format!("{url}/readyz"),
            None,
        )
        .await
        .0 == 200
        {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ready, "the API unit's command never got ready");
    let (status, created) = api(
        &client,
        TOKEN,
        reqwest::Method::POST,
        format!("{url}/v1/sessions"),
        Some(json!({"workspace": {"kind": "empty"}})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap();
    let (status, _) = api(
        &client,
        TOKEN,
        reqwest::Method::POST,
        format!("{url}/v1/sessions/{id}/messages"),
        Some(json!({"text": "hello"})),
    )
    .await;
    assert_eq!(status, 202);
    let mut shown = Value::Null;
    for _ in 0..600 {
        shown = api(
            &client,
            TOKEN,
            reqwest::Method::GET,
            format!("{url}/v1/sessions/{id}"),
            None,
        )
        .await
        .1;
        if shown["status"] == "idle" && shown["turn"].as_u64() >= Some(1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        shown["status"], "idle",
        "the worker unit's command drove the turn: {shown}"
    );
    let _ = api_process.start_kill();
    let _ = worker.start_kill();
    let _ = api_process.wait().await;
    let _ = worker.wait().await;
    db.drop_now().await;
}
