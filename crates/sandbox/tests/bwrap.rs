//! Escape tests for the `bwrap` backend: each probe succeeds with the `local` backend
//! (see `the_same_probes_succeed_without_isolation`) and must fail inside the sandbox.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;
use steadfast_sandbox::{
    AnySandbox, Backend, BwrapSandbox, Error, LocalSandbox, NetworkPolicy, ResourceLimits, Sandbox,
    SandboxOptions, ToolOutput,
};

fn options() -> SandboxOptions {
    SandboxOptions {
        agent: vec![env!("CARGO_BIN_EXE_steadfast-sandbox-agent").to_string()],
        backend: Backend::Bwrap,
        ..SandboxOptions::default()
    }
}

/// A workspace beside a "harness home" holding a database and a config with a key.
struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("ws")).unwrap();
        std::fs::create_dir_all(dir.path().join("home")).unwrap();
        std::fs::write(
            dir.path().join("home/world.db"),
            "SQLite format 3 session-data",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("home/steadfast.toml"),
            "api_key = \"sk-ant-very-secret\"\n",
        )
        .unwrap();
        Fixture { dir }
    }

    fn ws(&self) -> PathBuf {
        self.dir.path().join("ws")
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }
}

async fn bash(sandbox: &impl Sandbox, command: &str) -> ToolOutput {
    sandbox
        .execute("bash", &json!({ "command": command }))
        .await
        .unwrap()
}

/// The probes an escape test runs, each paired with what proves it escaped.
fn probes(home: &Path, port: u16, victim: u32) -> Vec<(String, &'static str)> {
    vec![
        (format!("cat {}/world.db", home.display()), "session-data"),
        (
            format!("cat {}/steadfast.toml", home.display()),
            "sk-ant-very-secret",
        ),
        (
            format!("(echo ping > /dev/tcp/127.0.0.1/{port}) && echo CONNECTED"),
            "CONNECTED",
        ),
        (format!("kill -0 {victim} && echo SIGNALLED"), "SIGNALLED"),
        (
            "touch /etc/steadfast-escape-probe && echo WROTE".to_string(),
            "WROTE",
        ),
    ]
}

#[tokio::test]
async fn the_same_probes_succeed_without_isolation() {
    // The control: the first four probes escape the local backend, so the bwrap test
    // failing them means the isolation did it. (The fifth would write to the host's
    // /etc, so the control leaves it out.)
    let f = Fixture::new();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut victim = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let local = LocalSandbox::new(&f.ws(), SandboxOptions::default()).unwrap();
    for (probe, proof) in probes(&f.home(), port, victim.id()).into_iter().take(4) {
        let out = bash(&local, &probe).await;
        assert!(out.text.contains(proof), "{probe}: {}", out.text);
    }
    victim.kill().unwrap();
    victim.wait().unwrap();
}

#[tokio::test]
async fn a_command_cannot_read_write_connect_or_signal_outside_its_sandbox() {
    let f = Fixture::new();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut victim = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let sandbox = BwrapSandbox::new(&f.ws(), &options()).unwrap();
    for (probe, proof) in probes(&f.home(), port, victim.id()) {
        let out = bash(&sandbox, &probe).await;
        assert!(
            !out.text.contains(proof),
            "escaped with {probe}: {}",
            out.text
        );
        assert!(out.is_error, "{probe} should fail: {}", out.text);
    }
    assert!(
        listener.accept().is_err(),
        "nothing reached the host's loopback"
    );
    assert!(
        victim.try_wait().unwrap().is_none(),
        "the host process lives"
    );
    victim.kill().unwrap();

    // Only the sandbox's own processes are visible.
    let ps = bash(&sandbox, "ls /proc | grep -c '^[0-9]'").await;
    let count: u32 = ps.text.trim().lines().next().unwrap().parse().unwrap();
    assert!(count <= 6, "{}", ps.text);

    // The workspace is writable and shared with the host; the system is not.
    let out = bash(
        &sandbox,
        "echo made-inside > inside.txt && touch /usr/probe",
    )
    .await;
    assert!(out.is_error);
    assert_eq!(
        std::fs::read_to_string(f.ws().join("inside.txt")).unwrap(),
        "made-inside\n"
    );
}

#[tokio::test]
async fn deny_all_reaches_no_address_at_all() {
    let f = Fixture::new();
    let sandbox = BwrapSandbox::new(&f.ws(), &options()).unwrap();
    for target in ["127.0.0.1/5432", "10.0.0.1/80", "1.1.1.1/53", "8.8.8.8/443"] {
        let out = bash(
            &sandbox,
            &format!("timeout 3 bash -c 'echo > /dev/tcp/{target}' && echo CONNECTED"),
        )
        .await;
        assert!(!out.text.contains("CONNECTED"), "{target}: {}", out.text);
    }
    let out = bash(
        &sandbox,
        "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '",
    )
    .await;
    assert_eq!(out.text.trim(), "lo", "only loopback: {}", out.text);
}

#[tokio::test]
async fn the_harness_environment_never_reaches_a_command() {
    std::env::set_var("STEADFAST_TEST_HOST_ONLY", "host-value-1234");
    let f = Fixture::new();
    let mut opts = options();
    opts.env
        .insert("ANTHROPIC_API_KEY".into(), "sk-ant-leak".into());
    opts.env.insert("PROJECT_MODE".into(), "ci".into());
    let sandbox = BwrapSandbox::new(&f.ws(), &opts).unwrap();
    let out = bash(
        &sandbox,
        "env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'",
    )
    .await;
    assert!(!out.text.contains("host-value-1234"), "{}", out.text);
    assert!(!out.text.contains("sk-ant-leak"), "{}", out.text);
    assert!(
        out.text.contains("PROJECT_MODE=ci"),
        "allowed extras pass: {}",
        out.text
    );
}

/// An HTTP server on loopback that answers `body` to every request.
fn http_server(body: &'static str) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
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
async fn an_allow_list_lets_through_only_the_hosts_it_names() {
    let allowed = http_server("hello-from-allowed");
    let other = http_server("hello-from-other");
    let f = Fixture::new();
    let mut opts = options();
    opts.network = NetworkPolicy::parse(&format!("allow:localhost:{allowed}")).unwrap();
    let sandbox = BwrapSandbox::new(&f.ws(), &opts).unwrap();

    let out = bash(
        &sandbox,
        &format!("curl -sS -m 5 http://localhost:{allowed}/x"),
    )
    .await;
    assert_eq!(out.text.trim(), "hello-from-allowed", "{}", out.text);

    // Same host, another port: refused by the proxy, with the reason.
    let out = bash(
        &sandbox,
        &format!("curl -sS -m 5 http://localhost:{other}/"),
    )
    .await;
    assert!(!out.text.contains("hello-from-other"), "{}", out.text);
    assert!(out.text.contains("not allowed"), "{}", out.text);
    // The allowed port under another name is another host.
    let out = bash(
        &sandbox,
        &format!("curl -sS -m 5 http://127.0.0.1:{allowed}/"),
    )
    .await;
    assert!(out.text.contains("not allowed"), "{}", out.text);
    // Around the proxy there is no network.
    let out = bash(
        &sandbox,
        &format!("curl -sS -m 5 --noproxy '*' http://127.0.0.1:{allowed}/"),
    )
    .await;
    assert!(out.is_error && !out.text.contains("hello"), "{}", out.text);
}

#[tokio::test]
async fn open_network_is_there_when_asked_for() {
    let port = http_server("hello-open");
    let f = Fixture::new();
    let mut opts = options();
    opts.network = NetworkPolicy::Open;
    let sandbox = BwrapSandbox::new(&f.ws(), &opts).unwrap();
    let out = bash(&sandbox, &format!("curl -sS -m 5 http://127.0.0.1:{port}/")).await;
    assert_eq!(out.text.trim(), "hello-open", "{}", out.text);
}

#[tokio::test]
async fn each_resource_limit_gives_a_clear_tool_error() {
    let f = Fixture::new();
    let opts = SandboxOptions {
        limits: ResourceLimits {
            memory_mb: Some(256),
            processes: Some(20),
            cpu_secs: Some(1),
            file_mb: Some(1),
        },
        max_output_bytes: 10_000,
        ..options()
    };
    let sandbox = BwrapSandbox::new(&f.ws(), &opts).unwrap();

    let out = bash(&sandbox, "python3 -c 'x = bytearray(1024 * 1024 * 1024)'").await;
    assert!(
        out.is_error && out.text.contains("memory limit is 256 MiB"),
        "{}",
        out.text
    );

    let out = bash(&sandbox, "while :; do :; done").await;
    assert!(
        out.is_error && out.text.contains("CPU time limit (1 s)"),
        "{}",
        out.text
    );

    let out = bash(&sandbox, "for i in $(seq 1 100); do sleep 30 & done; wait").await;
    assert!(
        out.is_error && out.text.contains("process limit (20"),
        "{}",
        out.text
    );

    let out = bash(&sandbox, "head -c 5000000 /dev/zero > big.bin").await;
    assert!(
        out.is_error && out.text.contains("file size limit (1 MiB)"),
        "{}",
        out.text
    );

    let out = bash(&sandbox, "yes | head -c 100000").await;
    assert!(
        out.text.contains("output truncated: 100000 bytes written"),
        "{}",
        out.text
    );

    // Within the limits, all is normal.
    let out = bash(&sandbox, "echo fine").await;
    assert_eq!((out.text.trim(), out.is_error), ("fine", false));
}

#[tokio::test]
async fn nothing_a_command_starts_outlives_it() {
    let f = Fixture::new();
    let sandbox = BwrapSandbox::new(&f.ws(), &options()).unwrap();
    let out = bash(
        &sandbox,
        "setsid sleep 60 & nohup sleep 61 >/dev/null & echo started",
    )
    .await;
    assert!(out.text.contains("started"), "{}", out.text);
    let out = bash(&sandbox, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '").await;
    assert!(!out.text.contains("sleep 6"), "{}", out.text);
}

#[tokio::test]
async fn a_killed_sandbox_is_reported_dead_mid_command() {
    let f = Fixture::new();
    let sandbox = std::sync::Arc::new(BwrapSandbox::new(&f.ws(), &options()).unwrap());
    let pid = sandbox.pid();
    let running = {
        let sandbox = sandbox.clone();
        tokio::spawn(async move {
            sandbox
                .execute("bash", &json!({"command": "sleep 30"}))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let result = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("noticed at once")
        .unwrap();
    assert!(matches!(result, Err(Error::Died(_))), "{result:?}");
    assert!(!sandbox.is_alive());
    assert!(matches!(
        sandbox.execute("bash", &json!({"command": "true"})).await,
        Err(Error::Died(_))
    ));
}

#[tokio::test]
async fn file_tools_stay_confined_and_backends_are_chosen_by_name() {
    let f = Fixture::new();
    let sandbox = AnySandbox::provision(&f.ws(), &options()).unwrap();
    assert_eq!(sandbox.backend(), "bwrap");
    let outside = format!("{}/world.db", f.home().display());
    let out = sandbox
        .execute("read", &json!({ "file_path": outside }))
        .await
        .unwrap();
    assert!(
        out.is_error && !out.text.contains("session-data"),
        "{}",
        out.text
    );
    let local = AnySandbox::provision(
        &f.ws(),
        &SandboxOptions {
            backend: Backend::Auto,
            ..SandboxOptions::default()
        },
    )
    .unwrap();
    assert_eq!(local.backend(), "local", "no agent configured: local");
}
