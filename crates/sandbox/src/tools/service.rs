//! `service`: long-lived processes of a session — a dev server, a database, a watcher —
//! that outlive the call that starts them (every other command's processes end with
//! it). Run by the sandbox's agent, so they live as long as the sandbox: across turns
//! while it runs, and across a harness crash, since the next holder adopts the sandbox.
//! Each runs in a process group of its own, which the agent spares when it clears what
//! a command left behind; its output goes to a log in the sandbox's run directory.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{opt_u64, str_arg, Context};
use crate::ToolOutput;

/// Most services one sandbox runs at once.
pub const MAX_SERVICES: usize = 8;
/// How long a service must stay up after its start to count as started.
const SETTLE: Duration = Duration::from_millis(300);
/// How long a service named with a port may take to listen on it.
const LISTEN_WITHIN: Duration = Duration::from_secs(15);
/// Most bytes of a service's log shown.
const LOG_TAIL: u64 = 16 * 1024;

/// One running service.
struct Service {
    command: String,
    child: Child,
    log: PathBuf,
    port: Option<u16>,
    started: Instant,
}

/// The agent's services, by name.
static SERVICES: Mutex<BTreeMap<String, Service>> = Mutex::new(BTreeMap::new());

fn services() -> std::sync::MutexGuard<'static, BTreeMap<String, Service>> {
    SERVICES.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where service logs go: the sandbox's run directory, outside the workspace.
fn log_dir() -> PathBuf {
    PathBuf::from(crate::inside::INSIDE_RUN_DIR).join("services")
}

fn valid_name(name: &str) -> bool {
    (1..=40).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Runs the `service` tool: `start` (with `name`, `command`, optional `port`), `stop`,
/// `logs` (of `name`) and `status` (of all).
pub(crate) async fn run(ctx: &Context<'_>, input: &Value) -> ToolOutput {
    if !crate::inside::in_sandbox() {
        // Its registry is the process's: only a sandbox's agent, one per session, keeps one.
        return ToolOutput::error(
            "service: services run only in an isolating sandbox (the bwrap backend); \
             this session's commands run with the local backend",
        );
    }
    let action = input
        .get("action")
        .and_then(Value::as_str)
        .unwrap_or("status");
    let name = input.get("name").and_then(Value::as_str).unwrap_or("");
    let result = match action {
        "start" => start(ctx, name, input).await,
        "stop" => stop(name),
        "logs" => logs(name),
        "status" => Ok(status()),
        other => Err(format!(
            "service: unknown action `{other}`; use start, stop, logs or status"
        )),
    };
    match result {
        Ok(text) => ToolOutput::ok(text),
        Err(e) => ToolOutput::error(e),
    }
}

async fn start(ctx: &Context<'_>, name: &str, input: &Value) -> Result<String, String> {
    if !valid_name(name) {
        return Err("service: `name` must be 1 to 40 letters, digits, `-` or `_`".into());
    }
    let command = str_arg(input, &["command"])?.to_string();
    let port = match opt_u64(input, "port") {
        Some(p) if (1..=65535).contains(&p) => Some(p as u16),
        Some(p) => return Err(format!("service: port {p} is not a TCP port")),
        None => None,
    };
    {
        let mut all = services();
        reap(&mut all);
        if all.contains_key(name) {
            return Err(format!(
                "service `{name}` is running already: stop it first to start it again"
            ));
        }
        if all.len() >= MAX_SERVICES {
            return Err(format!(
                "service: at most {MAX_SERVICES} services run at once; stop one first"
            ));
        }
    }
    std::fs::create_dir_all(log_dir()).map_err(|e| format!("service log: {e}"))?;
    let log = log_dir().join(format!("{name}.log"));
    let out = std::fs::File::create(&log).map_err(|e| format!("service log: {e}"))?;
    let err = out.try_clone().map_err(|e| format!("service log: {e}"))?;
    let mut cmd = std::process::Command::new("bash");
    match ctx.limits {
        Some(limits) => super::bash::limited(limits, &command, &mut cmd),
        None => {
            cmd.arg("-c").arg(&command);
        }
    }
    cmd.current_dir(ctx.root)
        .env_clear()
        .envs(ctx.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    let child = cmd.spawn().map_err(|e| format!("service `{name}`: {e}"))?;
    let pid = child.id();
    crate::inside::spare(pid as i32, true);
    services().insert(
        name.to_string(),
        Service {
            command: command.clone(),
            child,
            log: log.clone(),
            port,
            started: Instant::now(),
        },
    );
    tokio::time::sleep(SETTLE).await;
    if let Some(code) = exited(name) {
        let tail = tail(&log);
        forget(name);
        return Err(format!(
            "service `{name}` exited at once ({code}); its output:\n{tail}"
        ));
    }
    if let Some(port) = port {
        let waited = Instant::now();
        while !listening().contains(&port) {
            if let Some(code) = exited(name) {
                let tail = tail(&log);
                forget(name);
                return Err(format!(
                    "service `{name}` exited ({code}) before listening on {port}; its output:\n{tail}"
                ));
            }
            if waited.elapsed() > LISTEN_WITHIN {
                return Err(format!(
                    "service `{name}` runs (pid {pid}) but did not listen on port {port} within {} s; its output so far:\n{}",
                    LISTEN_WITHIN.as_secs(),
                    tail(&log)
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        return Ok(format!(
            "service `{name}` started (pid {pid}), listening on port {port}"
        ));
    }
    Ok(format!("service `{name}` started (pid {pid})"))
}

fn stop(name: &str) -> Result<String, String> {
    let mut all = services();
    let Some(mut service) = all.remove(name) else {
        return Err(format!("no service `{name}` runs"));
    };
    let group = nix::unistd::Pid::from_raw(service.child.id() as i32);
    crate::inside::spare(group.as_raw(), false);
    let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
    let _ = service.child.wait();
    Ok(format!("service `{name}` stopped"))
}

fn logs(name: &str) -> Result<String, String> {
    let all = services();
    let service = all
        .get(name)
        .ok_or_else(|| format!("no service `{name}` runs"))?;
    Ok(tail(&service.log))
}

/// One line per service, and the ports listening in the sandbox.
fn status() -> String {
    let mut all = services();
    reap(&mut all);
    if all.is_empty() {
        return "no services run".into();
    }
    let listening = listening();
    let mut lines: Vec<String> = all
        .iter()
        .map(|(name, s)| {
            let port = s.port.map_or(String::new(), |p| {
                let up = if listening.contains(&p) {
                    "listening"
                } else {
                    "not listening"
                };
                format!(", port {p} {up}")
            });
            format!(
                "{name}: running for {} s (pid {}){port}: {}",
                s.started.elapsed().as_secs(),
                s.child.id(),
                s.command
            )
        })
        .collect();
    lines.push(format!("listening ports: {listening:?}"));
    lines.join("\n")
}

/// Drops the services that have exited.
fn reap(all: &mut BTreeMap<String, Service>) {
    all.retain(|_, s| {
        let running = matches!(s.child.try_wait(), Ok(None));
        if !running {
            crate::inside::spare(s.child.id() as i32, false);
        }
        running
    });
}

/// Drops service `name`, which has exited.
fn forget(name: &str) {
    if let Some(service) = services().remove(name) {
        crate::inside::spare(service.child.id() as i32, false);
    }
}

/// How service `name` exited, if it has.
fn exited(name: &str) -> Option<String> {
    let mut all = services();
    let service = all.get_mut(name)?;
    match service.child.try_wait() {
        Ok(Some(status)) => Some(status.to_string()),
        _ => None,
    }
}

fn tail(log: &std::path::Path) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut file) = std::fs::File::open(log) else {
        return String::new();
    };
    let len = file.metadata().map_or(0, |m| m.len());
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL)));
    let mut text = String::new();
    let _ = file.take(LOG_TAIL).read_to_string(&mut text);
    text
}

/// The TCP ports listening in this network namespace.
pub(crate) fn listening() -> Vec<u16> {
    let mut ports = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // local_address is `ADDR:PORT` in hex; state 0A is LISTEN.
            if fields.get(3) == Some(&"0A") {
                if let Some(port) = fields
                    .get(1)
                    .and_then(|a| a.rsplit(':').next())
                    .and_then(|p| u16::from_str_radix(p, 16).ok())
                {
                    if !ports.contains(&port) {
                        ports.push(port);
                    }
                }
            }
        }
    }
    ports.sort_unstable();
    ports
}

/// What the model is shown of the tool.
pub(crate) fn spec_schema() -> Value {
    json!({"type": "object", "properties": {
        "action": {"type": "string", "enum": ["start", "stop", "logs", "status"]},
        "name": {"type": "string"},
        "command": {"type": "string"},
        "port": {"type": "integer"}
    }, "required": ["action"]})
}
