//! Escape tests for the `bwrap` backend: each probe succeeds with the `local` backend
//! (see `the_same_probes_succeed_without_isolation`) and must fail inside the sandbox.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;
use steadfast_sandbox::{
    AnySandbox, Backend, BwrapSandbox, Error, HostRule, LocalSandbox, NetworkPolicy,
    ResourceLimits, Sandbox, SandboxOptions, ToolOutput,
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
    opts.network = NetworkPolicy::parse(&format!(
        "allow:localhost:{allowed},localhost:{other},127.0.0.1:{allowed}"
    ))
    .unwrap();
    // Loopback is internal: reachable only by the name the operator opened.
    opts.internal_hosts = vec![HostRule::parse(&format!("localhost:{allowed}")).unwrap()];
    let sandbox = BwrapSandbox::new(&f.ws(), &opts).unwrap();

    let out = bash(
        &sandbox,
        &format!("curl -sS -m 5 http://localhost:{allowed}/x"),
    )
    .await;
    assert_eq!(out.text.trim(), "hello-from-allowed", "{}", out.text);

    // Same host, another port: on the session's list, but not opened by the operator.
    let out = bash(
        &sandbox,
        &format!("curl -sS -m 5 http://localhost:{other}/"),
    )
    .await;
    assert!(!out.text.contains("hello-from-other"), "{}", out.text);
    assert!(out.text.contains("may never reach"), "{}", out.text);
    // The allowed port under another name is another destination.
    let out = bash(
        &sandbox,
        &format!("curl -sS -m 5 http://127.0.0.1:{allowed}/"),
    )
    .await;
    assert!(out.text.contains("may never reach"), "{}", out.text);
    let out = bash(&sandbox, "curl -sS -m 5 http://example.com/").await;
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
            ..ResourceLimits::default()
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

    // The report comes from the kernel's own signal (SIGXCPU at the soft limit), not
    // from timing; a command that catches it is killed at the hard limit a second
    // later, and the report is the same.
    let out = bash(&sandbox, "trap '' XCPU; while :; do :; done").await;
    assert!(
        out.is_error && out.text.contains("CPU time limit (1 s)"),
        "{}",
        out.text
    );
    assert!(
        !f.ws().join("core").exists(),
        "no core file in the workspace"
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

/// A loopback HTTP/1.1 server that keeps connections alive and answers `body` to each
/// request on them.
fn keep_alive_server(body: &'static str) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
                let mut stream = stream;
                loop {
                    let mut line = String::new();
                    // The head ends at an empty line; these requests carry no body.
                    loop {
                        line.clear();
                        match std::io::BufRead::read_line(&mut reader, &mut line) {
                            Ok(0) | Err(_) => return,
                            Ok(_) if line == "\r\n" => break,
                            Ok(_) => {}
                        }
                    }
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if stream.write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

#[tokio::test]
async fn an_allow_list_never_reaches_an_internal_address_by_any_spelling() {
    let port = keep_alive_server("internal-service");
    let f = Fixture::new();
    let mut opts = options();
    let spellings = [
        "localhost",
        "127.0.0.1",
        "127.1",
        "0x7f000001",
        "0x7f.1",
        "2130706433",
        "0.0.0.0",
        "10.0.0.1",
        "169.254.169.254",
    ];
    let list: Vec<String> = spellings.iter().map(|h| format!("{h}:{port}")).collect();
    opts.network = NetworkPolicy::parse(&format!("allow:{}", list.join(","))).unwrap();
    let sandbox = BwrapSandbox::new(&f.ws(), &opts).unwrap();
    for host in spellings {
        for how in ["", "-p "] {
            // Plain HTTP through the proxy, and a CONNECT tunnel (`-p`).
            let out = bash(
                &sandbox,
                &format!("curl -sS -m 5 {how}http://{host}:{port}/ 2>&1"),
            )
            .await;
            assert!(
                !out.text.contains("internal-service"),
                "reached {host} {how}: {}",
                out.text
            );
        }
    }
    // IPv6 loopback cannot even be named in an allow-list, and is refused.
    let out = bash(
        &sandbox,
        &format!("curl -sS -m 5 http://[::1]:{port}/ 2>&1"),
    )
    .await;
    assert!(!out.text.contains("internal-service"), "{}", out.text);
    let out = bash(&sandbox, "echo still-fine").await;
    assert_eq!(out.text.trim(), "still-fine");
}

#[tokio::test]
async fn every_request_on_a_kept_alive_proxy_connection_is_checked() {
    let port = keep_alive_server("opened-service");
    let f = Fixture::new();
    let mut opts = options();
    opts.network =
        NetworkPolicy::parse(&format!("allow:localhost:{port},127.0.0.1:{port}")).unwrap();
    opts.internal_hosts = vec![HostRule::parse(&format!("localhost:{port}")).unwrap()];
    let sandbox = BwrapSandbox::new(&f.ws(), &opts).unwrap();
    // One connection to the proxy, three requests: the opened name, then a name the
    // operator did not open, then one the session did not list.
    let script = format!(
        r#"python3 - <<'EOF'
import http.client
c = http.client.HTTPConnection("127.0.0.1", 3128)
for url in ["http://localhost:{port}/a", "http://127.0.0.1:{port}/b", "http://example.com/c"]:
    c.request("GET", url)
    r = c.getresponse()
    print(r.status, r.read().decode().strip())
EOF"#
    );
    let out = bash(&sandbox, &script).await;
    let lines: Vec<&str> = out.text.lines().collect();
    assert_eq!(lines.first(), Some(&"200 opened-service"), "{}", out.text);
    assert!(lines[1].starts_with("403"), "{}", out.text);
    assert!(lines[1].contains("may never reach"), "{}", out.text);
    assert!(
        lines[2].starts_with("403") && lines[2].contains("not allowed"),
        "{}",
        out.text
    );
}

/// A workspace shown at a path of its own keeps the host's paths out of the sandbox:
/// no process there names the host directory, the run directory or the agent program
/// on its command line or in its environment.
#[tokio::test]
async fn no_host_path_shows_in_the_sandboxes_processes() {
    let f = Fixture::new();
    let opts = SandboxOptions {
        mount_at: Some(PathBuf::from("/workspace")),
        ..options()
    };
    let sandbox = BwrapSandbox::new(&f.ws(), &opts).unwrap();
    let out = bash(
        &sandbox,
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; tr '\\0' ' ' < $p/environ; echo; \
         for f in $p/fd/* $p/cwd $p/exe; do readlink $f; done; done",
    )
    .await;
    assert!(
        out.text.contains("/memfd:"),
        "the first process's output: {}",
        out.text
    );
    assert!(out.text.contains("/run/steadfast-agent"), "{}", out.text);
    let host = f.dir.path().to_string_lossy().into_owned();
    let agent = env!("CARGO_BIN_EXE_steadfast-sandbox-agent");
    for hidden in [host.as_str(), "steadfast-sbx-", agent] {
        assert!(!out.text.contains(hidden), "{hidden} shows: {}", out.text);
    }
}

#[tokio::test]
async fn host_secrets_are_hidden_and_commands_are_not_root() {
    let f = Fixture::new();
    let sandbox = BwrapSandbox::new(&f.ws(), &options()).unwrap();
    let out = bash(&sandbox, "id -u; id -g").await;
    assert_eq!(
        out.text.split_whitespace().collect::<Vec<_>>(),
        ["1000", "1000"]
    );
    let out = bash(&sandbox, "cat /etc/shadow; echo; ls -A /etc/ssl/private").await;
    assert!(!out.text.contains("root:"), "{}", out.text);
    assert!(
        !out.text.contains(".key") && !out.text.contains(".pem"),
        "{}",
        out.text
    );
    if std::path::Path::new("/etc/shadow").exists() {
        let on_host = std::fs::read_to_string("/etc/shadow").unwrap_or_default();
        assert!(on_host.is_empty() || !out.text.contains(on_host.lines().next().unwrap()));
    }
    // Ordinary system files are still there.
    let out = bash(&sandbox, "head -1 /etc/passwd").await;
    assert!(out.text.starts_with("root:"), "{}", out.text);
}

#[tokio::test]
async fn disk_files_tmp_and_processes_are_bounded_and_the_session_goes_on() {
    let f = Fixture::new();
    let opts = SandboxOptions {
        limits: ResourceLimits {
            file_mb: Some(2),
            workspace_mb: Some(20),
            tmp_mb: Some(8),
            processes: Some(40),
            ..ResourceLimits::default()
        },
        max_output_bytes: 20_000,
        ..options()
    };
    let sandbox = BwrapSandbox::new(&f.ws(), &opts).unwrap();

    // `file-mb` is exact: 2 MiB fits, a byte more does not.
    let out = bash(&sandbox, "head -c 2097152 /dev/zero > exact.bin && echo ok").await;
    assert_eq!(out.text.trim(), "ok", "{}", out.text);
    let out = bash(&sandbox, "head -c 2097153 /dev/zero > over.bin").await;
    assert!(out.text.contains("file size limit (2 MiB)"), "{}", out.text);
    // A sparse file's length counts too.
    let out = bash(&sandbox, "truncate -s 1G sparse.bin").await;
    assert!(out.is_error, "{}", out.text);
    assert!(std::fs::metadata(f.ws().join("sparse.bin")).map_or(0, |m| m.len()) <= 2 << 20);
    bash(&sandbox, "rm -f exact.bin over.bin sparse.bin").await;

    // The workspace as a whole: many files under the file limit, far past the quota.
    let out = bash(
        &sandbox,
        "for i in $(seq 1 300); do head -c 1048576 /dev/zero > fill-$i.bin; sleep 0.01; done",
    )
    .await;
    assert!(out.text.contains("disk quota (20 MiB)"), "{}", out.text);
    let written: u64 = std::fs::read_dir(f.ws())
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert!(
        written < 60 << 20,
        "stopped near the quota: {written} bytes"
    );
    let out = bash(&sandbox, "rm -f fill-*.bin && echo cleaned").await;
    assert_eq!(out.text.trim(), "cleaned", "{}", out.text);

    // /tmp is small and private.
    let out = bash(
        &sandbox,
        "for i in $(seq 1 20); do head -c 1048576 /dev/zero > /tmp/f$i || break; done",
    )
    .await;
    assert!(out.text.contains("No space left"), "{}", out.text);

    // A fork bomb is stopped and the next command runs.
    let out = bash(&sandbox, "bomb() { bomb | bomb & }; bomb; sleep 5").await;
    assert!(out.is_error, "{}", out.text);
    let out = bash(&sandbox, "echo after-the-bomb").await;
    assert_eq!(out.text.trim(), "after-the-bomb", "{}", out.text);
}

#[tokio::test]
async fn resident_memory_is_bounded_for_the_whole_sandbox_where_cgroups_exist() {
    let f = Fixture::new();
    let opts = SandboxOptions {
        limits: ResourceLimits {
            memory_mb: None,
            resident_mb: Some(128),
            ..ResourceLimits::default()
        },
        ..options()
    };
    let sandbox = BwrapSandbox::new(&f.ws(), &opts).unwrap();
    let writable = std::fs::metadata("/sys/fs/cgroup/memory")
        .or_else(|_| std::fs::metadata("/sys/fs/cgroup/cgroup.controllers"))
        .is_ok()
        && std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap()) == 0;
    if !writable {
        eprintln!("skipped: no control groups this process may create");
        return;
    }
    // Four processes of 64 MiB each: each under any per-process bound, together over.
    let out = bash(
        &sandbox,
        "for i in 1 2 3 4; do python3 -c 'import time; b = bytearray(64 << 20); time.sleep(3)' & done; wait; echo done",
    )
    .await;
    assert!(
        out.text.contains("memory limit is 128 MiB resident"),
        "{}",
        out.text
    );
    let out = bash(&sandbox, "echo alive").await;
    assert_eq!(out.text.trim(), "alive", "{}", out.text);
}

/// What the harness keeps of a sandbox (its bubblewrap's PID, which a reaper kills
/// after a crash) is not where the sandbox can write: a command that plants another
/// sandbox's PID in its own `/run/steadfast` changes nothing the harness reads.
#[tokio::test]
async fn a_sandbox_cannot_name_another_for_the_reaper_to_kill() {
    let f = Fixture::new();
    let sandbox = BwrapSandbox::new(&f.ws(), &options()).unwrap();
    let out = bash(
        &sandbox,
        "ls /run/steadfast; echo 1 > /run/steadfast/bwrap.pid; echo 1 > /run/steadfast/x.pid; echo planted",
    )
    .await;
    assert!(out.text.contains("planted"), "{}", out.text);
    assert!(
        !out.text.lines().any(|l| l.ends_with(".pid")),
        "no PID file in the sandbox's run directory: {}",
        out.text
    );
    // The harness's own record of this sandbox is beside its run directory, intact.
    let mine = std::fs::read_dir(steadfast_sandbox::paths::socket_root())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with(&format!("steadfast-sbx-{}-", std::process::id()))
                && name.ends_with(".pid")
        })
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .collect::<Vec<_>>();
    assert!(!mine.is_empty(), "the PID is kept beside the run directory");
    assert!(
        mine.iter().all(|pid| pid.trim() != "1"),
        "and the sandbox could not change it: {mine:?}"
    );
}

#[tokio::test]
async fn a_server_in_a_closed_sandbox_is_reached_through_its_agent() {
    let f = Fixture::new();
    std::fs::write(f.ws().join("index.html"), "hello from inside").unwrap();
    let sandbox = BwrapSandbox::new(&f.ws(), &options()).unwrap();
    assert_eq!(sandbox.ports().await.unwrap(), Vec::<u16>::new());
    let started = sandbox
        .execute(
            "service",
            &json!({"action": "start", "name": "web", "command": "python3 -m http.server 8123 --bind 127.0.0.1", "port": 8123}),
        )
        .await
        .unwrap();
    assert!(!started.is_error, "{started:?}");
    assert_eq!(sandbox.ports().await.unwrap(), [8123]);
    // Plain HTTP over the agent's connection, as a preview URL's proxy would send it.
    for _ in 0..2 {
        let mut conn = sandbox.connect(8123).await.unwrap();
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        conn.write_all(b"GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        conn.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
        assert!(answer.ends_with("hello from inside"), "{answer}");
    }
    // The sandbox's network is still closed to everything else.
    let out = bash(
        &sandbox,
        "curl -sS -m 3 http://1.1.1.1/ || echo unreachable",
    )
    .await;
    assert!(out.text.contains("unreachable"), "{}", out.text);
    match sandbox.connect(8124).await {
        Err(Error::Refused(why)) => assert!(why.contains("nothing listens on port 8124"), "{why}"),
        other => panic!("{:?}", other.map(|_| ())),
    }

    // In the host's network, its ports are the host's: none are listed or reached.
    let mut opts = options();
    opts.network = NetworkPolicy::Open;
    let open = BwrapSandbox::new(&f.ws(), &opts).unwrap();
    match open.ports().await {
        Err(Error::Refused(why)) => assert!(why.contains("host's network"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(open.connect(5432).await, Err(Error::Refused(_))));
}
