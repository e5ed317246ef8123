//! A test server: the API over real HTTP on loopback (served with the edges of
//! [`steadfast_server::serve`]), a real SQLite world, workers and the fake provider.

#![allow(dead_code)] // each test file uses its own part

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use steadfast_harness::{Harness, HarnessOptions};
use steadfast_server::{app, hash_token, Auth, ServeOptions, ServerState, TokenEntry};
use steadfast_testkit::{FakeProvider, Script};

pub struct Server {
    pub _dir: tempfile::TempDir,
    pub url: String,
    /// The model provider the server calls (tests count its calls).
    pub fake: FakeProvider,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Server {
    /// Where the session `created` (a `POST /v1/sessions` answer) has its workspace on
    /// this server's host: its logical id under the home's workspace root.
    pub fn workspace(&self, created: &Value) -> std::path::PathBuf {
        let id = created["workspace"].as_str().unwrap();
        assert!(steadfast_log::is_workspace_id(id), "{created}");
        self._dir.path().join("home/workspaces").join(id)
    }
}

impl Server {
    /// Creates a session as the development caller; its `201` answer.
    pub async fn create(&self, body: Value) -> Value {
        let (status, created) = call(
            reqwest::Method::POST,
            &format!("{}/v1/sessions", self.url),
            None,
            Some(body),
        )
        .await;
        assert_eq!(status, 201, "{created}");
        created
    }

    /// The session `id` as `GET /v1/sessions/{id}` shows it to the development caller.
    pub async fn show(&self, id: &str) -> Value {
        call(
            reqwest::Method::GET,
            &format!("{}/v1/sessions/{id}", self.url),
            None,
            None,
        )
        .await
        .1
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

pub async fn server(
    steps: Value,
    auth: Auth,
    workers: usize,
    tweak: impl FnOnce(&mut ServerState<steadfast_world::SqliteWorld>),
) -> Server {
    server_with(steps, auth, workers, tweak, ServeOptions::default()).await
}

/// [`server`] with the given connection limits.
pub async fn server_with(
    steps: Value,
    auth: Auth,
    workers: usize,
    tweak: impl FnOnce(&mut ServerState<steadfast_world::SqliteWorld>),
    edges: ServeOptions,
) -> Server {
    let script: Script = serde_json::from_value(json!({ "steps": steps })).unwrap();
    let fake = FakeProvider::start(script).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let harness = Arc::new(
        Harness::open_local(&home, HarnessOptions::fake_provider(&fake.base_url())).unwrap(),
    );
    let mut state = ServerState::new(
        harness.clone(),
        auth,
        home.join("workspaces"),
        "fake/m".into(),
    );
    tweak(&mut state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let mut tasks = vec![tokio::spawn(async move {
        steadfast_server::serve(listener, app(state), edges, std::future::pending())
            .await
            .unwrap();
    })];
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    std::mem::forget(stop_tx);
    for _ in 0..workers {
        let (h, rx) = (harness.clone(), stop_rx.clone());
        tasks.push(tokio::spawn(async move { h.work(rx).await }));
    }
    Server {
        _dir: dir,
        url,
        fake,
        tasks,
    }
}

pub fn dev() -> Auth {
    Auth::new(&[], false, None).unwrap()
}

/// Static tokens: `(owner, token, scopes)` each (`None`: the default scopes).
pub fn auth_of(entries: &[(&str, &str, Option<Vec<steadfast_world::Scope>>)]) -> Auth {
    let entries: Vec<TokenEntry> = entries
        .iter()
        .map(|(owner, token, scopes)| TokenEntry {
            owner: owner.to_string(),
            token_hash: hash_token(token),
            scopes: scopes.clone(),
        })
        .collect();
    Auth::new(&entries, true, None).unwrap()
}

pub fn tokens() -> Auth {
    let entries =
        [("alice", "alice-secret"), ("bob", "bob-secret")].map(|(owner, token)| TokenEntry {
            owner: owner.into(),
            token_hash: hash_token(token),
            scopes: None,
        });
    Auth::new(&entries, true, None).unwrap()
}

pub async fn call(
    method: reqwest::Method,
    url: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = reqwest::Client::new().request(method, url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

pub fn assert_error(got: &(u16, Value), status: u16, code: &str) {
    assert_eq!(got.0, status, "{got:?}");
    assert_eq!(got.1["error"]["code"], code, "{got:?}");
    assert!(got.1["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
}

/// Polls a session until its status is `want`.
pub async fn wait_status(url: &str, id: &str, token: Option<&str>, want: &str) -> Value {
    for _ in 0..400 {
        let (_, shown) = call(
            reqwest::Method::GET,
            &format!("{url}/v1/sessions/{id}"),
            token,
            None,
        )
        .await;
        if shown["status"] == want {
            return shown;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let (_, shown) = call(
        reqwest::Method::GET,
        &format!("{url}/v1/sessions/{id}"),
        token,
        None,
    )
    .await;
    panic!("session {id} never became {want}: {shown}");
}

/// Runs a generated client's program (off the runtime, which serves the API it
/// calls) and checks it succeeded and printed `ok ses_...`.
pub async fn run_client_program(mut program: std::process::Command) {
    let ran = tokio::task::spawn_blocking(move || program.output().unwrap())
        .await
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&ran.stdout),
        String::from_utf8_lossy(&ran.stderr)
    );
    assert!(ran.status.success(), "{said}");
    assert!(
        String::from_utf8_lossy(&ran.stdout).starts_with("ok ses_"),
        "{said}"
    );
}
