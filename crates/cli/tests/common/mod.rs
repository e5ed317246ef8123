//! Helpers shared by the CLI's process-level tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

/// The records of one kind in a `steadfast log --json` listing.
pub fn events<'a>(log: &'a [Value], kind: &str) -> Vec<&'a Value> {
    // Events are stored externally tagged: {"event": {"<kind>": {...}}}.
    log.iter().filter_map(|r| r["event"].get(kind)).collect()
}

/// Every file under `dir` with its bytes and executable bit (`.git` included).
pub fn tree(dir: &Path) -> BTreeMap<String, (Vec<u8>, bool)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = BTreeMap::new();
    for entry in walkdir(dir) {
        let meta = std::fs::symlink_metadata(&entry).unwrap();
        let rel = entry.strip_prefix(dir).unwrap().display().to_string();
        let bytes = if meta.is_file() {
            std::fs::read(&entry).unwrap()
        } else {
            Vec::new()
        };
        out.insert(
            rel,
            (
                bytes,
                meta.permissions().mode() & 0o111 != 0 && meta.is_file(),
            ),
        );
    }
    out
}

fn walkdir(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        out.push(path.clone());
        if path.is_dir() && !path.is_symlink() {
            out.extend(walkdir(&path));
        }
    }
    out
}

/// Where the session `created` (a `POST /v1/sessions` answer) has its workspace on
/// the host whose home is `home`: its logical id under the home's workspace root.
pub fn workspace_in(home: &Path, created: &Value) -> PathBuf {
    let id = created["workspace"].as_str().unwrap();
    assert!(steadfast_log::is_workspace_id(id), "{created}");
    home.join("workspaces").join(id)
}

/// A command's standard output read as JSON lines (`sessions --json`, `log --json`).
pub fn json_lines(out: &Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Where the wrapped CLIs are installed for the tests (kept between runs; installed by
/// the first test that needs them, from the npm registry).
pub fn agents_dir() -> PathBuf {
    std::env::var_os("STEADFAST_TEST_AGENTS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/steadfast-test-agents"))
}

/// Installs `agent` at its pinned version with `steadfast install-agent` (which does
/// nothing when it is already installed at that version), one install at a time.
pub async fn installed(agent: &str) {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _one_at_a_time = LOCK.lock().await;
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_steadfast"))
        .args(["install-agent", agent])
        .env("STEADFAST_AGENTS_DIR", agents_dir())
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "install: {}", stderr(&out));
}

/// A PostgreSQL database of a test's own on the real server (`STEADFAST_TEST_POSTGRES`,
/// default the local trust-auth server), made empty; dropped by [`TestDatabase::drop_now`],
/// or when it goes out of scope (a failing test leaves no database behind).
pub struct TestDatabase {
    /// The world URL of the database.
    pub url: String,
    name: String,
    admin: tokio_postgres::Client,
    admin_url: String,
    dropped: bool,
}

impl TestDatabase {
    /// Creates (or re-creates, empty) the database `name`.
    pub async fn create(name: &str) -> Self {
        let admin_url = std::env::var("STEADFAST_TEST_POSTGRES")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
        let (admin, conn) = tokio_postgres::connect(&admin_url, tokio_postgres::NoTls)
            .await
            .expect("PostgreSQL must be running");
        tokio::spawn(conn);
        // One statement each: CREATE DATABASE cannot run in a (multi-statement) block.
        for sql in [
            format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
            format!("CREATE DATABASE {name}"),
        ] {
            admin.batch_execute(&sql).await.unwrap();
        }
        let url = format!("{}/{name}", &admin_url[..admin_url.rfind('/').unwrap()]);
        TestDatabase {
            url,
            name: name.to_string(),
            admin,
            admin_url,
            dropped: false,
        }
    }

    /// Drops the database, whoever is still connected.
    pub async fn drop_now(mut self) {
        let _ = self
            .admin
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .await;
        self.dropped = true;
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        if self.dropped {
            return;
        }
        // Not dropped yet (the test panicked): on a thread of its own, which may block.
        let (url, sql) = (
            self.admin_url.clone(),
            format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        );
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async {
                let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                    .await
                    .ok()?;
                tokio::spawn(conn);
                client.batch_execute(&sql).await.ok()
            })
        })
        .join();
    }
}

/// `steadfast` with `args` as a service of the world in `home`, its model calls going
/// to `fake` (Anthropic's API, `claude-sonnet-4-5`), stdout piped (`serve` prints its
/// URL there), stderr to the test's service log (`steadfast_testkit::service_log`),
/// killed when dropped.
pub fn service(
    home: &Path,
    fake: &steadfast_testkit::FakeProvider,
    args: &[&str],
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_steadfast"));
    cmd.args(args);
    service_env(&mut cmd, home, fake);
    cmd
}

/// The environment of a service over `home` calling `fake` (see [`service`]), for a
/// command that starts `steadfast` through another program.
pub fn service_env(
    cmd: &mut tokio::process::Command,
    home: &Path,
    fake: &steadfast_testkit::FakeProvider,
) {
    cmd.env("STEADFAST_HOME", home)
        .env("ANTHROPIC_API_KEY", "test-key")
        .env("ANTHROPIC_BASE_URL", fake.base_url())
        .env("STEADFAST_MODEL", "anthropic/claude-sonnet-4-5")
        .env_remove("OPENAI_API_KEY")
        .env_remove("STEADFAST_FAULT")
        .env_remove("STEADFAST_WORLD")
        .env_remove("STEADFAST_METRICS_LISTEN")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(steadfast_testkit::service_log::stderr(env!(
            "CARGO_TARGET_TMPDIR"
        )))
        .kill_on_drop(true);
}

/// [`service`] for a site in `dir` (its home `dir/home`, run from `dir`, where a test's
/// `steadfast.toml` is), its wrapped CLIs under `agents`, both providers' calls going
/// to `fake`.
pub fn site_command(
    dir: &Path,
    agents: &Path,
    fake: &steadfast_testkit::FakeProvider,
    args: &[&str],
) -> tokio::process::Command {
    let mut cmd = service(&dir.join("home"), fake, args);
    cmd.current_dir(dir)
        .env("STEADFAST_AGENTS_DIR", agents)
        .env("OPENAI_API_KEY", "sk-openai-the-harness-real-key")
        .env("OPENAI_BASE_URL", format!("{}/v1", fake.base_url()));
    cmd
}

/// The site in `dir` as a platform runs it: an API server with no workers of its own
/// and one worker process beside it (see [`site_command`]); both are killed when
/// dropped. Returns them and the API's URL.
pub async fn site_api(
    dir: &Path,
    agents: &Path,
    fake: &steadfast_testkit::FakeProvider,
) -> (tokio::process::Child, tokio::process::Child, String) {
    let mut api = site_command(
        dir,
        agents,
        fake,
        &["serve", "--listen", "127.0.0.1:0", "--workers", "0"],
    )
    .spawn()
    .unwrap();
    let url = printed_url(&mut api).await;
    let worker = site_command(dir, agents, fake, &["worker", "--workers", "1"])
        .spawn()
        .unwrap();
    (api, worker, url)
}

/// A session's log as `steadfast log --json` prints it, run as `log` (a
/// [`site_command`] of `log <id> --json`).
pub async fn log_lines(mut log: tokio::process::Command) -> Vec<Value> {
    let out = log.output().await.unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The log of session `id` of the site in `dir` (see [`site_api`]).
#[allow(dead_code)]
pub async fn site_log(dir: &Path, fake: &steadfast_testkit::FakeProvider, id: &str) -> Vec<Value> {
    log_lines(site_command(
        dir,
        &agents_dir(),
        fake,
        &["log", id, "--json"],
    ))
    .await
}

/// A fake provider playing `steps`, the script's steps as JSON.
#[allow(dead_code)]
pub async fn fake_playing(steps: Value) -> steadfast_testkit::FakeProvider {
    let script =
        steadfast_testkit::Script::from_json(&serde_json::json!({ "steps": steps }).to_string())
            .unwrap();
    steadfast_testkit::FakeProvider::start(script)
        .await
        .unwrap()
}

/// Queues `text` as a message to session `id` without reading its turn's stream (202).
#[allow(dead_code)]
pub async fn queue_message(url: &str, id: &str, text: &str) {
    let sent = reqwest::Client::new()
        .post(format!("{url}/v1/sessions/{id}/messages"))
        .header("accept", "application/json")
        .json(&serde_json::json!({ "text": text }))
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), 202, "{id}");
}

/// Polls `check` every 50 ms for up to 30 s.
pub async fn wait_for(what: &str, mut check: impl AsyncFnMut() -> bool) {
    for _ in 0..600 {
        if check().await {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

/// The SQLite world of `home`, read only: the kind of the last record appended (to any
/// session), and the pid of the process holding the (first) session's lease (0: none).
pub fn last_kind_and_holder(home: &Path) -> (String, i32) {
    let conn = rusqlite::Connection::open_with_flags(
        home.join("world.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let last: String = conn
        .query_row(
            "SELECT kind FROM events ORDER BY seq DESC LIMIT 1",
            [],
            |r| r.get(0),
        )
        .unwrap_or_default();
    let holder = conn
        .query_row("SELECT coalesce(lease_pid, 0) FROM sessions", [], |r| {
            r.get(0)
        })
        .unwrap_or(0);
    (last, holder)
}

/// The kind of a `steadfast log --json` record (events are externally tagged).
pub fn kind(record: &Value) -> String {
    record["event"]
        .as_object()
        .and_then(|o| o.keys().next().cloned())
        .unwrap_or_default()
}

/// The first line a started `steadfast serve` prints on stdout: its base URL.
pub async fn printed_url(child: &mut tokio::process::Child) -> String {
    use tokio::io::AsyncBufReadExt;
    let stdout = child.stdout.take().unwrap();
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    tokio::time::timeout(std::time::Duration::from_secs(30), lines.next_line())
        .await
        .expect("serve printed its URL")
        .unwrap()
        .unwrap()
}

/// A JSON request to the API: its status and JSON body (`null` when it has none).
pub async fn call(
    method: reqwest::Method,
    url: &str,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let mut req = reqwest::Client::new().request(method, url);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(serde_json::Value::Null))
}

/// A session's status as `GET /v1/sessions/{id}` shows it.
pub async fn status(url: &str, id: &str) -> String {
    let (_, body) = call(
        reqwest::Method::GET,
        &format!("{url}/v1/sessions/{id}"),
        None,
    )
    .await;
    body["status"].as_str().unwrap_or_default().to_string()
}

/// The events of `kind` in `log` (as [`log_lines`] reads it), each the event's own
/// fields.
pub fn events_of<'a>(log: &'a [serde_json::Value], kind_: &str) -> Vec<&'a serde_json::Value> {
    log.iter()
        .filter(|r| kind(r) == kind_)
        .map(|r| &r["event"][kind_])
        .collect()
}

/// Another worker of the site in `dir` (see [`site_command`]), the next one of a fleet,
/// is started and takes the session `id` over: the session as it shows once its first
/// turn is over (see [`idle_after`]), and the worker (killed when dropped).
pub async fn next_worker_ends_turn(
    dir: &Path,
    fake: &steadfast_testkit::FakeProvider,
    url: &str,
    id: &str,
) -> (tokio::process::Child, serde_json::Value) {
    let worker = site_command(dir, &agents_dir(), fake, &["worker", "--workers", "1"])
        .spawn()
        .unwrap();
    (worker, idle_after(url, id, 1).await)
}

/// The session as `GET /v1/sessions/{id}` shows it once it is idle after `turns`
/// turns; panics if it ends or escalates instead, or takes over two minutes.
pub async fn idle_after(url: &str, id: &str, turns: u64) -> serde_json::Value {
    for _ in 0..1200 {
        let (_, shown) = call(
            reqwest::Method::GET,
            &format!("{url}/v1/sessions/{id}"),
            None,
        )
        .await;
        if shown["status"] == "idle" && shown["turn"].as_u64() >= Some(turns) {
            return shown;
        }
        let status = shown["status"].as_str().unwrap_or_default();
        assert!(
            !["failed", "escalated", "closed", "completed"].contains(&status),
            "{shown}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("session {id} never went idle after {turns} turn(s)");
}

/// The newest version of `package` the npm registry serves.
pub async fn newest(package: &str) -> String {
    let out = tokio::process::Command::new("npm")
        .args(["view", package, "version"])
        .output()
        .await
        .expect("npm runs");
    assert!(out.status.success(), "npm view {package}: {}", stderr(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The newest version of `adapter`'s CLI (npm package `package`) as a named agent,
/// `<adapter>-newest`, installed in the test's agents directory: its name, its version
/// and the `steadfast.toml` that names it.
pub async fn newest_agent(adapter: &str, package: &str) -> (String, String, String) {
    let version = newest(package).await;
    let name = format!("{adapter}-newest");
    let config = format!(
        "[[agents.named]]\nname = \"{name}\"\nadapter = \"{adapter}\"\nversion = \"{version}\"\n"
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("steadfast.toml"), &config).unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_steadfast"))
        .args(["install-agent", &name])
        .current_dir(dir.path())
        .env("STEADFAST_AGENTS_DIR", agents_dir())
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "install {name} ({version}): {}",
        stderr(&out)
    );
    (name, version, config)
}

/// Answers a session's wait for approval with `answer` (accepted: 202).
pub async fn answer_approval(url: &str, id: &str, answer: serde_json::Value) {
    let (code, body) = call(
        reqwest::Method::POST,
        &format!("{url}/v1/sessions/{id}/signals/approval"),
        Some(answer),
    )
    .await;
    assert_eq!(code, 202, "{body}");
}

/// A session's events as one JSON page (`GET .../events` with `Accept: application/json`).
pub async fn event_page(url: &str) -> Vec<serde_json::Value> {
    let page: serde_json::Value = reqwest::Client::new()
        .get(url)
        .header("accept", "application/json")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    page["events"].as_array().unwrap().clone()
}

/// Every file under `dir` that holds `needle` (a secret that must be nowhere).
pub fn holding(dir: &Path, needle: &str) -> Vec<PathBuf> {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .filter(|e| {
            std::fs::read(e.path())
                .is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes()))
        })
        .map(|e| e.path().to_path_buf())
        .collect()
}

/// A home whose processes run bwrap sandboxes (with `config` as their configuration)
/// and hold a vault key: where the tests of credentials a sandbox must never see run.
pub struct VaultSite {
    /// The home.
    pub home: PathBuf,
    config: PathBuf,
    key: String,
}

impl VaultSite {
    /// A site under `dir` with `config` as its `steadfast.toml`.
    pub fn new(dir: &Path, config: &str) -> Self {
        use base64::Engine as _;
        let path = dir.join("steadfast.toml");
        std::fs::write(&path, config).unwrap();
        VaultSite {
            home: dir.join("home"),
            config: path,
            key: base64::engine::general_purpose::STANDARD.encode([7u8; 32]),
        }
    }

    /// `steadfast` with `args` on this site (see [`service`]).
    pub fn command(
        &self,
        fake: &steadfast_testkit::FakeProvider,
        args: &[&str],
    ) -> tokio::process::Command {
        let mut cmd = service(&self.home, fake, args);
        cmd.env("STEADFAST_CONFIG", &self.config)
            .env("STEADFAST_VAULT_KEY", &self.key)
            .env("STEADFAST_AGENTS_DIR", agents_dir());
        cmd
    }

    /// `steadfast serve` with `workers` workers, and its URL.
    pub async fn serve(
        &self,
        fake: &steadfast_testkit::FakeProvider,
        workers: &str,
    ) -> (tokio::process::Child, String) {
        let mut api = self
            .command(
                fake,
                &["serve", "--listen", "127.0.0.1:0", "--workers", workers],
            )
            .spawn()
            .unwrap();
        let url = printed_url(&mut api).await;
        (api, url)
    }
}

/// Stores credential `name` in the caller's vault through the API.
pub async fn put_credential(url: &str, name: &str, value: &str) {
    let (status, body) = call(
        reqwest::Method::PUT,
        &format!("{url}/v1/vaults/{name}"),
        Some(serde_json::json!({ "value": value })),
    )
    .await;
    assert_eq!(status, 204, "{body}");
}

/// moto's S3 server (`.ci/run` installs it) on a free port, killed when dropped.
pub struct Moto {
    child: std::process::Child,
    /// Its endpoint (`AWS_ENDPOINT`).
    pub endpoint: String,
}

impl Moto {
    /// Starts moto with the empty bucket `bucket`.
    pub fn start(bucket: &str) -> Self {
        use std::process::{Command, Stdio};
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("moto_server must be installed (see .ci/run)");
        let endpoint = format!("http://127.0.0.1:{port}");
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        assert!(Command::new("curl")
            .args(["-sf", "-X", "PUT", &format!("{endpoint}/{bucket}")])
            .status()
            .unwrap()
            .success());
        Moto { child, endpoint }
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback HTTP server that counts the requests it gets (an external effect whose
/// every occurrence can be counted), and its port.
pub fn counter() -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = hits.clone();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf);
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
            );
        }
    });
    (port, hits)
}

/// `git` with `args` in `dir`, as a developer with an identity and fixed dates (so
/// commits are the same every run), no system or user configuration; it must succeed.
/// Its output, trimmed.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .current_dir(dir)
        .args(["-c", "user.name=Dev", "-c", "user.email=dev@example.com"])
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_DATE", "2026-01-02T03:04:05Z")
        .env("GIT_COMMITTER_DATE", "2026-01-02T03:04:05Z")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A bare repository `dir/remote.git` (branch `main`) that counts the pushes it
/// receives (see [`pushes`]).
pub fn counting_remote(dir: &Path) -> PathBuf {
    let remote = dir.join("remote.git");
    git(
        dir,
        &[
            "init",
            "-q",
            "--bare",
            "-b",
            "main",
            remote.to_str().unwrap(),
        ],
    );
    let hook = remote.join("hooks/post-receive");
    std::fs::write(
        &hook,
        "#!/bin/sh\necho pushed >> \"$(dirname \"$0\")/../pushes.log\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    remote
}

/// How many pushes a [`counting_remote`] has received.
pub fn pushes(remote: &Path) -> usize {
    std::fs::read_to_string(remote.join("pushes.log")).map_or(0, |s| s.lines().count())
}

/// Kills every bubblewrap sandbox on this host that works for `session` (as the
/// note beside each run directory says), as if the machine under them had died.
/// Returns how many it killed.
#[allow(dead_code)]
pub fn kill_sandboxes_of(session: &str) -> usize {
    let root = steadfast_sandbox::paths::socket_root();
    let mut killed = 0;
    for entry in std::fs::read_dir(root).unwrap().filter_map(Result::ok) {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("steadfast-sbx-") || !name.ends_with(".holds") {
            continue;
        }
        let ours =
            std::fs::read_to_string(&path).is_ok_and(|holds| holds.lines().next() == Some(session));
        let pid = std::fs::read_to_string(path.with_extension("pid"))
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok());
        if let (true, Some(pid)) = (ours, pid) {
            // bubblewrap and the first process of its PID namespace, its child.
            let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .unwrap_or_default();
            let inner = children
                .split_whitespace()
                .filter_map(|c| c.parse::<i32>().ok());
            for pid in std::iter::once(pid).chain(inner) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            killed += 1;
        }
    }
    killed
}

/// Whether a process runs exactly `command`.
#[allow(dead_code)]
pub fn running(command: &str) -> bool {
    std::process::Command::new("pgrep")
        .args(["-f", &format!("^{command}$")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A free TCP port on loopback (for a listener a test names in advance).
#[allow(dead_code)]
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A GET of `url` as `token`'s owner, as JSON: its status and body (`null` if none).
#[allow(dead_code)]
pub async fn get_json_as(http: &reqwest::Client, url: &str, token: &str) -> (u16, Value) {
    let answer = http
        .get(url)
        .bearer_auth(token)
        .header("accept", "application/json")
        .send()
        .await
        .unwrap();
    let code = answer.status().as_u16();
    (code, answer.json().await.unwrap_or(Value::Null))
}

/// A session made by `token`'s owner at the server at `url` from `body`, once its
/// first turn has ended: its id.
#[allow(dead_code)]
pub async fn idle_session_as(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    body: Value,
) -> String {
    let created: Value = http
        .post(format!("{url}/v1/sessions"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_string();
    wait_for("the first turn to end", async || {
        let (_, shown) = get_json_as(http, &format!("{url}/v1/sessions/{id}"), token).await;
        shown["status"] == "idle"
    })
    .await;
    id
}
