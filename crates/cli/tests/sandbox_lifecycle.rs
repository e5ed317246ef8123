//! A session's sandbox over time, with real bubblewrap sandboxes (this program is
//! their agent): provisioned without delaying the first model call, stopped when idle
//! and hydrated from the drive when needed again, replaced when killed mid-command.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use steadfast_harness::{Driver, Harness, HarnessOptions, NewSession, Provisioner, Stop};
use steadfast_log::{Event, ToolResolution};
use steadfast_sandbox::{AnySandbox, Backend, Sandbox, SandboxOptions, ToolOutput};
use steadfast_testkit::{FakeProvider, Script};
use steadfast_world::{Blobs, SqliteWorld, World};

/// What the tracking provisioner saw.
#[derive(Default)]
struct Seen {
    provisions: AtomicU64,
    /// Model calls the fake provider had received when each provisioning finished.
    calls_when_ready: Mutex<Vec<u64>>,
    pids: Mutex<Vec<u32>>,
    stopped: AtomicU64,
}

/// A bwrap sandbox that reports to [`Seen`] and, when stopped, wipes the workspace the
/// way a remote sandbox's disk goes with it (so the next one must be hydrated).
struct Tracked {
    inner: AnySandbox,
    seen: Arc<Seen>,
    wipe_on_stop: bool,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.seen.stopped.fetch_add(1, Ordering::SeqCst);
        if self.wipe_on_stop {
            let entries = std::fs::read_dir(self.inner.workspace())
                .into_iter()
                .flatten();
            for path in entries.filter_map(Result::ok).map(|e| e.path()) {
                let _ = if path.is_dir() {
                    std::fs::remove_dir_all(path)
                } else {
                    std::fs::remove_file(path)
                };
            }
        }
    }
}

impl Sandbox for Tracked {
    fn workspace(&self) -> &Path {
        self.inner.workspace()
    }

    async fn execute(
        &self,
        tool: &str,
        input: &serde_json::Value,
    ) -> steadfast_sandbox::Result<ToolOutput> {
        self.inner.execute(tool, input).await
    }
}

struct Setup {
    dir: tempfile::TempDir,
    fake: FakeProvider,
    seen: Arc<Seen>,
}

impl Setup {
    async fn new(steps: serde_json::Value) -> Self {
        let script: Script = serde_json::from_value(json!({ "steps": steps })).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("ws")).unwrap();
        std::fs::write(dir.path().join("ws/hello.txt"), "hello\n").unwrap();
        Setup {
            dir,
            fake: FakeProvider::start(script).await.unwrap(),
            seen: Arc::default(),
        }
    }

    fn ws(&self) -> PathBuf {
        self.dir.path().join("ws")
    }

    /// A harness whose sandboxes are bwrap, provisioned after `delay`.
    fn harness(
        &self,
        delay: Duration,
        wipe_on_stop: bool,
        tune: impl FnOnce(&mut HarnessOptions),
    ) -> Harness<SqliteWorld, Tracked> {
        let home = self.dir.path().join("home");
        let blobs = Blobs::local(&home.join("blobs")).unwrap();
        let world = SqliteWorld::open(home.join("world.db")).unwrap();
        let drive =
            steadfast_harness::open_drive(&home, &blobs, steadfast_harness::DRIVE_CACHE_BYTES)
                .unwrap();
        let mut options = HarnessOptions::fake_provider(&self.fake.base_url());
        options.sandbox = SandboxOptions {
            backend: Backend::Bwrap,
            agent: vec![
                env!("CARGO_BIN_EXE_steadfast").to_string(),
                "sandbox-agent".into(),
            ],
            ..SandboxOptions::default()
        };
        tune(&mut options);
        let (seen, fake_calls) = (self.seen.clone(), self.fake.state().clone());
        let provision: Provisioner<Tracked> = Arc::new(move |ws: &Path, opts: &SandboxOptions| {
            std::thread::sleep(delay);
            let inner = AnySandbox::provision(ws, opts)?;
            let AnySandbox::Bwrap(b) = &inner else {
                panic!("expected a bwrap sandbox")
            };
            seen.pids.lock().unwrap().push(b.pid());
            seen.provisions.fetch_add(1, Ordering::SeqCst);
            seen.calls_when_ready
                .lock()
                .unwrap()
                .push(fake_calls.calls());
            Ok(Tracked {
                inner,
                seen: seen.clone(),
                wipe_on_stop,
            })
        });
        Harness::new(world, blobs, drive, options, provision)
    }
}

fn bash(command: &str) -> serde_json::Value {
    json!({"text": "running", "tool_calls": [{"name": "bash", "input": {"command": command}}]})
}

/// A native session on `ws` with the task "go", and its driver, woken.
async fn started<'h>(
    harness: &'h Harness<SqliteWorld, Tracked>,
    ws: &Path,
) -> (String, Driver<'h, SqliteWorld, Tracked>) {
    let id = harness
        .start_session(NewSession::native("fake/m", ws).with_task("go"))
        .await
        .unwrap();
    let driver = harness.wake_native(&id).await.unwrap();
    (id, driver)
}

#[tokio::test]
async fn the_first_model_call_does_not_wait_for_a_slow_sandbox() {
    let setup = Setup::new(json!([bash("cat hello.txt"), {"text": "done"}])).await;
    let harness = setup.harness(Duration::from_millis(1500), false, |_| {});
    let (_, mut driver) = started(&harness, &setup.ws()).await;
    assert_eq!(driver.run().await.unwrap(), Stop::Idle);
    assert_eq!(setup.seen.provisions.load(Ordering::SeqCst), 1);
    let ready = setup.seen.calls_when_ready.lock().unwrap().clone();
    assert!(
        ready[0] >= 1,
        "the first model request reached the provider before provisioning finished"
    );
    assert_eq!(setup.fake.calls(), 2);
}

#[tokio::test]
async fn an_idle_sandbox_is_stopped_and_the_next_one_hydrated_from_the_drive() {
    // The second reply streams slowly: the sandbox idles meanwhile and is stopped
    // (taking the workspace with it); the next command needs a new, hydrated one.
    let slow = json!({"text": "thinking ".repeat(20), "chunk_delay_ms": 60,
        "tool_calls": [{"name": "bash", "input": {"command": "cat hello.txt first.txt > second.txt"}}]});
    let setup =
        Setup::new(json!([bash("cat hello.txt > first.txt"), slow, {"text": "done"}])).await;
    let harness = setup.harness(Duration::ZERO, true, |o| {
        o.sandbox_idle_stop = Some(Duration::from_millis(200));
        o.prewarm_sandbox = false;
    });
    let (_, mut driver) = started(&harness, &setup.ws()).await;
    assert!(!driver.has_sandbox().await, "nothing provisioned at wake");
    assert_eq!(driver.run().await.unwrap(), Stop::Idle);
    assert_eq!(setup.seen.provisions.load(Ordering::SeqCst), 2);
    assert!(setup.seen.stopped.load(Ordering::SeqCst) >= 1);
    assert_eq!(
        std::fs::read_to_string(setup.ws().join("second.txt")).unwrap(),
        "hello\nhello\n",
        "the new sandbox saw the files of the last recorded step"
    );
}

#[tokio::test]
async fn a_running_service_keeps_its_sandbox_past_the_idle_stop() {
    // As above, the second reply streams slowly and the sandbox idles meanwhile; but
    // the session runs a service, which counts as activity: the sandbox is kept, and
    // the next command finds the server it started still answering.
    let start = json!({"text": "A server.", "tool_calls": [{"name": "service", "input": {
        "action": "start", "name": "web", "command": "python3 -m http.server 8001", "port": 8001}}]});
    let slow = json!({"text": "thinking ".repeat(20), "chunk_delay_ms": 60,
        "tool_calls": [{"name": "bash", "input": {"command": "curl -s localhost:8001/ | grep -o 'Directory listing' | head -n 1"}}]});
    let setup = Setup::new(json!([start, slow, {"text": "done"}])).await;
    let harness = setup.harness(Duration::ZERO, true, |o| {
        o.sandbox_idle_stop = Some(Duration::from_millis(200));
        o.service_idle_stop = Duration::from_secs(120);
        o.prewarm_sandbox = false;
    });
    let (id, mut driver) = started(&harness, &setup.ws()).await;
    assert_eq!(driver.run().await.unwrap(), Stop::Idle);
    assert_eq!(setup.seen.provisions.load(Ordering::SeqCst), 1, "kept");
    let log = harness.world().read(&id, 1).await.unwrap();
    let kinds: Vec<&str> = log.iter().map(|r| r.event.kind()).collect();
    assert!(!kinds.contains(&"services_restarted"), "{kinds:?}");
    let outputs: Vec<String> = log
        .iter()
        .filter_map(|r| match &r.event {
            steadfast_log::Event::ToolCallOutcome { output, .. } => Some(output.for_model()),
            _ => None,
        })
        .collect();
    let answered = outputs.iter().any(|o| o.contains("Directory listing"));
    assert!(answered, "the server answered: {outputs:?}");
}

/// The bwrap process of a sandbox, found by the pid the provisioner saw.
async fn wait_for_sandbox(seen: &Seen, n: usize) -> u32 {
    for _ in 0..500 {
        if let Some(pid) = seen.pids.lock().unwrap().get(n - 1) {
            return *pid;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no sandbox was provisioned")
}

#[tokio::test]
async fn a_sandbox_killed_mid_command_is_replaced_and_the_call_resolved() {
    // The command appends, then sleeps; the sandbox is SIGKILLed while it sleeps.
    // The append is rolled back with the call, and the model (told so) runs it again
    // in a new sandbox: the file ends with one line, not two.
    let setup = Setup::new(json!([bash("echo one >> log.txt; sleep 3"), {"text": "done"}])).await;
    let harness = setup.harness(Duration::ZERO, false, |_| {});
    let (id, mut driver) = started(&harness, &setup.ws()).await;
    let log_file = setup.ws().join("log.txt");
    let killer = async {
        let pid = wait_for_sandbox(&setup.seen, 1).await;
        while !log_file.exists() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
    };
    let (stop, ()) = tokio::join!(driver.run(), killer);
    assert_eq!(stop.unwrap(), Stop::Idle);
    assert_eq!(std::fs::read_to_string(&log_file).unwrap(), "one\n");
    assert_eq!(setup.seen.provisions.load(Ordering::SeqCst), 2);

    let log = harness.world().read(&id, 1).await.unwrap();
    let kinds: Vec<&str> = log.iter().map(|r| r.event.kind()).collect();
    let lost = kinds
        .iter()
        .position(|k| *k == "sandbox_lost")
        .expect("recorded");
    assert_eq!(kinds[lost - 1], "tool_call_intent");
    assert!(matches!(
        &log[lost + 1].event,
        Event::ToolCallInterrupted {
            resolution: ToolResolution::RolledBack { .. },
            ..
        }
    ));
    let outcomes = log
        .iter()
        .filter(|r| {
            matches!(
                &r.event,
                Event::ToolCallOutcome {
                    is_error: false,
                    ..
                }
            )
        })
        .count();
    assert_eq!(
        outcomes, 1,
        "the command ran to the end once, in the new sandbox"
    );
}

#[tokio::test]
async fn a_session_waiting_on_a_human_holds_no_sandbox() {
    let setup = Setup::new(json!([
        bash("echo work > done.txt"),
        {"text": "asking", "tool_calls": [{"name": "request_approval", "input": {"reason": "ship it?"}}]},
        {"text": "done"}
    ]))
    .await;
    let harness = setup.harness(Duration::ZERO, false, |_| {});
    let (_, mut driver) = started(&harness, &setup.ws()).await;
    assert_eq!(
        driver.run().await.unwrap(),
        Stop::Waiting("approval".into())
    );
    assert!(!driver.has_sandbox().await);
    assert_eq!(setup.seen.provisions.load(Ordering::SeqCst), 1);
    assert_eq!(
        setup.seen.stopped.load(Ordering::SeqCst),
        1,
        "stopped while waiting"
    );
}

/// An HTTP server on loopback answering `body`.
fn http_server(body: &'static str) -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf);
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

#[tokio::test]
async fn each_session_has_its_own_network_policy() {
    let port = http_server("registry-ok");
    let fetch = format!("curl -sS -m 5 http://localhost:{port}/pkg > fetched.txt");
    let setup = Setup::new(json!([bash(&fetch), {"text": "done"}])).await;
    // The default is deny-all; the operator opens this loopback service by name.
    let harness = setup.harness(Duration::ZERO, false, |o| {
        o.sandbox.internal_hosts =
            vec![steadfast_sandbox::HostRule::parse(&format!("localhost:{port}")).unwrap()]
    });
    let mut allowed = NewSession::native("fake/m", &setup.ws()).with_task("go");
    allowed.network =
        Some(steadfast_log::NetworkPolicy::parse(&format!("allow:localhost:{port}")).unwrap());
    let id = harness.start_session(allowed).await.unwrap();
    let mut driver = harness.wake_native(&id).await.unwrap();
    assert_eq!(driver.run().await.unwrap(), Stop::Idle);
    drop(driver);
    assert_eq!(
        std::fs::read_to_string(setup.ws().join("fetched.txt")).unwrap(),
        "registry-ok"
    );

    // The same command in a session without the allowance reaches nothing.
    let other = tempfile::tempdir().unwrap();
    let (_, mut driver) = started(&harness, other.path()).await;
    assert_eq!(driver.run().await.unwrap(), Stop::Idle);
    assert_eq!(
        std::fs::read_to_string(other.path().join("fetched.txt")).unwrap(),
        ""
    );

    // A policy that does not parse makes no session: it is refused where it is read.
    assert!("everywhere"
        .parse::<steadfast_log::NetworkPolicy>()
        .is_err());
}
