//! The agent that runs inside an isolating sandbox and serves its commands.
//!
//! The harness starts it as the sandbox's one long-lived process (via the `steadfast
//! sandbox-agent` subcommand, or the `steadfast-sandbox-agent` binary) and talks to it
//! over a Unix socket in a directory shared with the host: one connection per command,
//! a JSON request line in and a [`ToolOutput`] JSON line back. Because the agent lives
//! inside the sandbox's namespaces, it can also do what must happen in there: apply
//! resource limits, count the sandbox's processes, kill whatever a command left
//! behind, and (under an allow-list network policy) carry the sandbox's proxy
//! connections out to the harness's egress proxy over the shared socket directory.
//!
//! **A sandbox that outlives its holder.** Started with a [`Tenure`], the agent belongs
//! to a session's lease, not to the process that started it: it serves only requests
//! that name its session and the newest lease epoch it has been told of (a holder that
//! lost the lease is refused, as a stale append is), and it lives only as long as its
//! holder says the lease is surely held — a line on the holder's open `hold`
//! connection renews that, and when the deadline passes unrenewed (the holder died,
//! hung or was cut off) the agent kills everything in the sandbox and exits, before
//! anyone else can take the lease. Until then the next holder on this machine may
//! `adopt` it under its newer epoch: every command started for a tool call is kept by
//! the call's id, runs on whatever happens to the connection that asked for it, and
//! can be `attach`ed to, so a command that was running when its harness died finishes
//! once and its outcome is recorded whole by the next.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, UnixListener, UnixStream};

use crate::tools::Context;
use crate::{ResourceLimits, SandboxOptions, ToolOutput};

/// What the agent is told at start (its one argument, as JSON).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AgentConfig {
    /// The socket it serves commands on.
    pub listen: PathBuf,
    /// The workspace (commands' working directory).
    pub workspace: PathBuf,
    /// The harness's egress proxy socket, under an allow-list policy.
    pub proxy_socket: Option<PathBuf>,
    /// The loopback port inside the sandbox that leads to the egress proxy.
    pub proxy_port: u16,
    /// More loopback ports leading to host sockets (as seen inside): `(port, path)`.
    #[serde(default)]
    pub forwards: Vec<(u16, PathBuf)>,
    /// Limits of each command.
    pub limits: ResourceLimits,
    /// Most output bytes kept per command.
    pub max_output_bytes: usize,
    /// Timeout of a command that names none, ms.
    pub default_timeout_ms: u64,
    /// Longest timeout a command may ask for, ms.
    pub max_timeout_ms: u64,
    /// Standard input is a pipe whose other end only the harness holds: when it closes
    /// (the harness is gone, however it died), the agent exits, and the sandbox with it.
    /// Kernel parent-death signals miss a harness that dies while bubblewrap is still
    /// starting; the pipe does not.
    #[serde(default)]
    pub lifeline: bool,
    /// The lease the sandbox belongs to, when it outlives its holder (see the module's
    /// doc); then there is no lifeline.
    #[serde(default)]
    pub tenure: Option<Tenure>,
    /// The sandbox has a network namespace of its own, so its loopback ports are its
    /// own: only then does the agent list them and connect the host to them
    /// ([`PORTS`], [`CONNECT`]); in the host's network they would be the host's.
    #[serde(default)]
    pub private_network: bool,
}

/// The lease a sandbox that outlives its holder belongs to.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Tenure {
    /// The session.
    pub session: String,
    /// The epoch of the lease it was started under.
    pub epoch: u64,
    /// How long it may live before its holder first renews its hold, ms.
    pub hold_ms: u64,
}

/// One command for the agent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Request {
    /// The tool (only `bash` runs in the agent; file tools run on the shared drive).
    pub tool: String,
    /// Its input.
    pub input: serde_json::Value,
    /// The tool call it runs for: the command is kept by this id (see the module's doc).
    #[serde(default)]
    pub call_id: Option<String>,
    /// Wait for the command already kept for `call_id` rather than start one.
    #[serde(default)]
    pub attach: bool,
    /// The session and lease epoch the request is made under (a sandbox with a
    /// [`Tenure`] refuses any other session, and any epoch but its newest).
    #[serde(default)]
    pub lease: Option<(String, u64)>,
}

impl Request {
    /// A request with no call behind it.
    pub fn new(tool: &str, input: serde_json::Value, lease: Option<(String, u64)>) -> Self {
        Request {
            tool: tool.to_string(),
            input,
            call_id: None,
            attach: false,
            lease,
        }
    }
}

pub(crate) use crate::inside::{kill_strays, INSIDE_RUN_DIR};

/// The request that kills the command running now (it is served at once, not after
/// the command it stops).
pub(crate) const CANCEL: &str = "steadfast.cancel";
/// Makes the request's epoch the sandbox's newest (refused for an older one); the
/// reply lists the calls it keeps, as a JSON array of ids. Input: `{"hold_ms": N}`,
/// how long it may now live before its new holder renews the hold.
pub(crate) const ADOPT: &str = "steadfast.adopt";
/// Keeps the connection open; each line on it (a number of ms) renews how long the
/// sandbox may live.
pub(crate) const HOLD: &str = "steadfast.hold";
/// Ends the sandbox (its holder is done with it).
pub(crate) const RELEASE: &str = "steadfast.release";
/// The TCP ports something in the sandbox listens on, as a JSON array (the agent's
/// own forwards left out): what a preview URL may lead to.
pub(crate) const PORTS: &str = "steadfast.ports";
/// Connects to a port listening inside the sandbox (input `{"port": N}`): after an
/// `ok` reply line, the request's connection carries that TCP connection's bytes both
/// ways, so the host reaches a dev server without opening the sandbox's network.
pub(crate) const CONNECT: &str = "steadfast.connect";
/// Starts a person's shell (input a [`crate::shell::ShellRequest`]): after an `ok`
/// reply line, the request's connection carries the shell's frames both ways (see
/// [`crate::shell`]).
pub(crate) const SHELL: &str = "steadfast.shell";
/// How long a connection waits for the host socket it leads to (see [`forward`]).
const PROXY_WAIT: Duration = Duration::from_secs(15);
/// How many finished calls' outputs are kept for a holder that has yet to attach.
const KEPT_CALLS: usize = 32;

/// Points the agent's output at `log`, its log as the sandbox sees it. The harness
/// opened it on the host, and an open file shows its path to the sandbox's processes
/// (`/proc/<agent>/fd`): the host's run directory, which they have no business
/// knowing.
fn log_from_inside(log: &Path) {
    let Ok(file) = std::fs::OpenOptions::new().append(true).open(log) else {
        return;
    };
    let _ = nix::unistd::dup2_stdout(&file);
    let _ = nix::unistd::dup2_stderr(&file);
}

/// Runs the agent with `args` (after the program name): one JSON [`AgentConfig`].
/// Returns the process exit code.
pub fn main(args: impl IntoIterator<Item = String>) -> i32 {
    let mut args = args.into_iter();
    let Some(config) = args.next() else {
        eprintln!("steadfast sandbox agent: expected one JSON argument");
        return 2;
    };
    if config == crate::shell::READ_ONLY_SHELL {
        // Started by this agent for a person (see `crate::shell`): it never returns
        // but on failure.
        let program = args.next().unwrap_or_else(|| "/bin/sh".into());
        let args: Vec<String> = args.collect();
        return crate::shell::confine_and_exec(&program, &args);
    }
    let config: AgentConfig = match serde_json::from_str(&config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("steadfast sandbox agent: bad configuration: {e}");
            return 2;
        }
    };
    crate::inside::enter();
    log_from_inside(&config.listen.with_file_name("agent.log"));
    if config.lifeline {
        std::thread::spawn(|| {
            let mut buf = [0u8; 64];
            loop {
                match std::io::Read::read(&mut std::io::stdin(), &mut buf) {
                    Ok(0) | Err(_) => std::process::exit(0),
                    Ok(_) => {}
                }
            }
        });
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("steadfast sandbox agent: {e}");
            return 1;
        }
    };
    match runtime.block_on(serve(config)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("steadfast sandbox agent: {e}");
            1
        }
    }
}

/// The running agent: its settings and what it keeps.
struct Agent {
    config: AgentConfig,
    env: Vec<(String, String)>,
    options: SandboxOptions,
    /// Commands run one at a time.
    one_at_a_time: tokio::sync::Mutex<()>,
    /// With a [`Tenure`]: the newest epoch and until when the sandbox may live.
    tenure: Option<std::sync::Mutex<(u64, std::time::Instant)>>,
    /// The agent's program and its arguments before its configuration: what starts a
    /// read-only shell (see [`crate::shell`]).
    relaunch: Vec<String>,
    /// The commands kept by call id: `None` while running, then the output (oldest
    /// first, for pruning).
    calls: std::sync::Mutex<Vec<(String, tokio::sync::watch::Receiver<Option<ToolOutput>>)>>,
}

async fn serve(config: AgentConfig) -> std::io::Result<()> {
    if let Some(proxy) = &config.proxy_socket {
        let listener = TcpListener::bind(("127.0.0.1", config.proxy_port)).await?;
        tokio::spawn(forward(listener, proxy.clone()));
    }
    for (port, socket) in &config.forwards {
        let listener = TcpListener::bind(("127.0.0.1", *port)).await?;
        tokio::spawn(forward(listener, socket.clone()));
    }
    let _ = std::fs::remove_file(&config.listen);
    let listener = UnixListener::bind(&config.listen)?;
    let env: Vec<(String, String)> = std::env::vars().collect();
    let options = SandboxOptions {
        default_timeout: Duration::from_millis(config.default_timeout_ms),
        max_timeout: Duration::from_millis(config.max_timeout_ms),
        max_output_bytes: config.max_output_bytes,
        ..SandboxOptions::default()
    };
    let tenure = config.tenure.as_ref().map(|t| {
        std::sync::Mutex::new((
            t.epoch,
            std::time::Instant::now() + Duration::from_millis(t.hold_ms),
        ))
    });
    let agent = std::sync::Arc::new(Agent {
        config,
        env,
        options,
        one_at_a_time: tokio::sync::Mutex::new(()),
        tenure,
        relaunch: relaunch(),
        calls: std::sync::Mutex::new(Vec::new()),
    });
    if agent.tenure.is_some() {
        tokio::spawn(outlive(agent.clone()));
    }
    loop {
        let (stream, _) = listener.accept().await?;
        let agent = agent.clone();
        tokio::spawn(async move {
            let _ = handle(stream, agent).await;
        });
    }
}

/// This program and the arguments it was started with, its configuration (the last)
/// left out.
fn relaunch() -> Vec<String> {
    let Ok(exe) = std::env::current_exe() else {
        return Vec::new();
    };
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    args.pop();
    std::iter::once(exe.to_string_lossy().into_owned())
        .chain(args)
        .collect()
}

/// Ends the sandbox once its hold runs out: everything in it is killed before the
/// lease it belongs to can have passed to anyone else.
async fn outlive(agent: std::sync::Arc<Agent>) {
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if std::time::Instant::now() >= agent.deadline() {
            eprintln!("steadfast sandbox agent: no holder renewed the hold; ending the sandbox");
            kill_strays();
            std::process::exit(0);
        }
    }
}

impl Agent {
    fn tenure(&self) -> Option<std::sync::MutexGuard<'_, (u64, std::time::Instant)>> {
        self.tenure
            .as_ref()
            .map(|t| t.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn deadline(&self) -> std::time::Instant {
        self.tenure().map_or_else(std::time::Instant::now, |t| t.1)
    }

    /// Why `request` is refused, if it is: a sandbox with a tenure serves its own
    /// session only, under its newest epoch (`adopt` may name a newer one).
    fn refusal(&self, request: &Request) -> Option<String> {
        let tenure = self.config.tenure.as_ref()?;
        let newest = self.tenure()?.0;
        match &request.lease {
            Some((session, _)) if *session != tenure.session => {
                Some("this sandbox belongs to another session".into())
            }
            Some((_, epoch)) if *epoch < newest || (*epoch > newest && request.tool != ADOPT) => {
                Some(format!(
                    "lease epoch {epoch} is not this sandbox's holder's ({newest})"
                ))
            }
            Some(_) => None,
            None => Some("the request names no lease".into()),
        }
    }

    /// The ids of the calls kept.
    fn kept(&self) -> Vec<String> {
        let calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        calls.iter().map(|(id, _)| id.clone()).collect()
    }

    fn find(&self, id: &str) -> Option<tokio::sync::watch::Receiver<Option<ToolOutput>>> {
        let calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        calls
            .iter()
            .find(|(c, _)| c == id)
            .map(|(_, rx)| rx.clone())
    }

    /// Starts `input` for call `id` (or, with no id, just runs it) and waits for its
    /// output. A kept command runs to its end whatever happens to the connection.
    async fn run(
        self: &std::sync::Arc<Self>,
        id: Option<String>,
        input: serde_json::Value,
    ) -> ToolOutput {
        let Some(id) = id else {
            let _turn = self.one_at_a_time.lock().await;
            return self.bash(&input).await;
        };
        let (tx, mut rx) = tokio::sync::watch::channel(None);
        {
            let mut calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
            calls.retain(|(c, _)| *c != id);
            calls.push((id, rx.clone()));
            while calls.len() > KEPT_CALLS {
                match calls.iter().position(|(_, rx)| rx.borrow().is_some()) {
                    Some(done) => drop(calls.remove(done)),
                    None => break,
                }
            }
        }
        let agent = self.clone();
        tokio::spawn(async move {
            let _turn = agent.one_at_a_time.lock().await;
            let out = agent.bash(&input).await;
            tx.send_replace(Some(out));
        });
        wait_for(&mut rx).await
    }

    /// The agent's own loopback ports (its forwards out), which lead to the host.
    fn own_ports(&self) -> Vec<u16> {
        let forwards = self.config.forwards.iter().map(|(port, _)| *port);
        let proxy = self
            .config
            .proxy_socket
            .as_ref()
            .map(|_| self.config.proxy_port);
        forwards.chain(proxy).collect()
    }

    /// The ports something in the sandbox listens on, from the kernel's socket tables
    /// of the sandbox's network namespace.
    fn ports(&self) -> Result<Vec<u16>, String> {
        if !self.config.private_network {
            return Err(SHARED_NETWORK.into());
        }
        let own = self.own_ports();
        let mut ports = std::collections::BTreeSet::new();
        for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
            let Ok(text) = std::fs::read_to_string(table) else {
                continue;
            };
            ports.extend(
                listening(&text)
                    .into_iter()
                    .filter(|port| !own.contains(port)),
            );
        }
        Ok(ports.into_iter().collect())
    }

    /// A connection to `port` on the sandbox's loopback, IPv4 or IPv6.
    async fn connect(&self, port: u16) -> Result<tokio::net::TcpStream, String> {
        if !self.config.private_network {
            return Err(SHARED_NETWORK.into());
        }
        if port == 0 || self.own_ports().contains(&port) {
            return Err(format!(
                "port {port} is not one a program in the sandbox listens on"
            ));
        }
        let v4 = tokio::net::TcpStream::connect(("127.0.0.1", port)).await;
        match v4 {
            Ok(tcp) => Ok(tcp),
            Err(_) => tokio::net::TcpStream::connect(("::1", port))
                .await
                .map_err(|e| format!("nothing listens on port {port} in the sandbox ({e})")),
        }
    }

    async fn bash(&self, input: &serde_json::Value) -> ToolOutput {
        let ctx = Context {
            root: &self.config.workspace,
            env: &self.env,
            options: &self.options,
            registry: None,
            limits: Some(&self.config.limits),
        };
        let out = crate::tools::run(&ctx, "bash", input).await;
        kill_strays();
        out
    }
}

/// Why a sandbox in the host's network shows no ports.
const SHARED_NETWORK: &str =
    "this sandbox shares the host's network (network: open): its ports are the host's, not its own";

/// The local ports in LISTEN state in a `/proc/net/tcp` or `tcp6` table.
fn listening(table: &str) -> Vec<u16> {
    const LISTEN: &str = "0A";
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let local = fields.nth(1)?;
            let state = fields.nth(1)?;
            if state != LISTEN {
                return None;
            }
            let (_, port) = local.rsplit_once(':')?;
            u16::from_str_radix(port, 16).ok()
        })
        .collect()
}

/// The output a kept command ends with.
async fn wait_for(rx: &mut tokio::sync::watch::Receiver<Option<ToolOutput>>) -> ToolOutput {
    match rx.wait_for(Option::is_some).await {
        Ok(out) => out.clone().unwrap_or_else(|| ToolOutput::error("lost")),
        Err(_) => ToolOutput::error("[steadfast] the command's runner went away"),
    }
}

/// Whether the peer of `stream` runs outside the sandbox. Its socket is in the run
/// directory, which the sandbox's own processes see too; a request from one of them
/// (a command that would renew its sandbox's hold past its lease, adopt it under an
/// epoch of its own making, or run commands behind the journal's back) is refused.
/// The kernel gives a peer's PID as this process sees it, and one in no namespace it
/// can see, as the host's processes are, as 0.
fn from_outside(stream: &UnixStream) -> bool {
    stream
        .peer_cred()
        .is_ok_and(|cred| cred.pid().is_none_or(|pid| pid == 0))
}

async fn handle(stream: UnixStream, agent: std::sync::Arc<Agent>) -> std::io::Result<()> {
    let outside = from_outside(&stream);
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    let mut line = String::new();
    read.read_line(&mut line).await?;
    let request = serde_json::from_str::<Request>(&line);
    let refused = match outside {
        true => request.as_ref().ok().and_then(|r| agent.refusal(r)),
        false => Some("requests come from outside the sandbox only".to_string()),
    };
    let out = match request {
        Err(e) => ToolOutput::error(format!("bad request to the sandbox agent: {e}")),
        Ok(_) if refused.is_some() => ToolOutput::error(format!(
            "[steadfast] refused: {}",
            refused.unwrap_or_default()
        )),
        Ok(req) if req.tool == CANCEL => {
            // A command stopped on purpose is not one to attach to later.
            let running: Vec<String> = {
                let calls = agent.calls.lock().unwrap_or_else(|e| e.into_inner());
                calls
                    .iter()
                    .filter(|(_, rx)| rx.borrow().is_none())
                    .map(|(id, _)| id.clone())
                    .collect()
            };
            agent
                .calls
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|(id, _)| !running.contains(id));
            kill_strays();
            ToolOutput::ok("stopped")
        }
        Ok(req) if req.tool == ADOPT => {
            let epoch = req.lease.as_ref().map_or(0, |l| l.1);
            let hold = req
                .input
                .get("hold_ms")
                .and_then(|v| v.as_u64())
                .unwrap_or(0);
            if let Some(mut tenure) = agent.tenure() {
                tenure.0 = epoch;
                tenure.1 = tenure
                    .1
                    .max(std::time::Instant::now() + Duration::from_millis(hold));
            }
            ToolOutput::ok(serde_json::to_string(&agent.kept()).unwrap_or_default())
        }
        Ok(req) if req.tool == HOLD => {
            let epoch = req.lease.as_ref().map_or(0, |l| l.1);
            let mut renewal = String::new();
            while read.read_line(&mut renewal).await? > 0 {
                let Ok(ms) = renewal.trim().parse::<u64>() else {
                    break;
                };
                renewal.clear();
                match agent.tenure() {
                    Some(mut t) if t.0 == epoch => {
                        t.1 = std::time::Instant::now() + Duration::from_millis(ms)
                    }
                    // Adopted by a newer holder: this one's word no longer counts.
                    _ => break,
                }
            }
            return Ok(());
        }
        Ok(req) if req.tool == CONNECT => {
            let port = req.input.get("port").and_then(|p| p.as_u64());
            let inside = match port.and_then(|p| u16::try_from(p).ok()) {
                Some(port) => agent.connect(port).await,
                None => Err("`port`: a TCP port number".to_string()),
            };
            let mut tcp = match inside {
                Ok(tcp) => tcp,
                Err(why) => {
                    let mut reply = serde_json::to_vec(&ToolOutput::error(why))
                        .map_err(std::io::Error::other)?;
                    reply.push(b'\n');
                    write.write_all(&reply).await?;
                    return write.shutdown().await;
                }
            };
            let mut reply =
                serde_json::to_vec(&ToolOutput::ok("connected")).map_err(std::io::Error::other)?;
            reply.push(b'\n');
            write.write_all(&reply).await?;
            // Bytes the host sent right after its request line are the connection's.
            tcp.write_all(read.buffer()).await?;
            let mut host = read
                .into_inner()
                .reunite(write)
                .map_err(std::io::Error::other)?;
            let _ = tokio::io::copy_bidirectional(&mut host, &mut tcp).await;
            return Ok(());
        }
        Ok(req) if req.tool == SHELL => {
            match serde_json::from_value::<crate::shell::ShellRequest>(req.input) {
                Err(e) => ToolOutput::error(format!("a shell request: {e}")),
                Ok(request) => {
                    let mut reply = serde_json::to_vec(&ToolOutput::ok("shell"))
                        .map_err(std::io::Error::other)?;
                    reply.push(b'\n');
                    write.write_all(&reply).await?;
                    let host = read
                        .into_inner()
                        .reunite(write)
                        .map_err(std::io::Error::other)?;
                    return crate::shell::serve(
                        host,
                        request,
                        &agent.config.workspace,
                        &agent.env,
                        &agent.relaunch,
                        &agent.config.limits,
                    )
                    .await;
                }
            }
        }
        Ok(req) if req.tool == PORTS => match agent.ports() {
            Ok(ports) => ToolOutput::ok(serde_json::to_string(&ports).unwrap_or_default()),
            Err(why) => ToolOutput::error(why),
        },
        Ok(req) if req.tool == RELEASE => {
            let mut reply =
                serde_json::to_vec(&ToolOutput::ok("released")).map_err(std::io::Error::other)?;
            reply.push(b'\n');
            write.write_all(&reply).await?;
            let _ = write.shutdown().await;
            kill_strays();
            std::process::exit(0);
        }
        Ok(req) if req.tool == "bash" && req.attach => {
            match req.call_id.as_deref().and_then(|id| agent.find(id)) {
                Some(mut rx) => wait_for(&mut rx).await,
                None => ToolOutput::error("[steadfast] this sandbox keeps no such call"),
            }
        }
        Ok(req) if req.tool == "bash" => agent.run(req.call_id, req.input).await,
        Ok(req) if req.tool == "service" => {
            let _turn = agent.one_at_a_time.lock().await;
            let ctx = Context {
                root: &agent.config.workspace,
                env: &agent.env,
                options: &agent.options,
                registry: None,
                limits: Some(&agent.config.limits),
            };
            crate::tools::run(&ctx, "service", &req.input).await
        }
        Ok(req) => ToolOutput::error(format!(
            "the sandbox agent runs bash and service only, not {}",
            req.tool
        )),
    };
    let mut reply = serde_json::to_vec(&out).map_err(std::io::Error::other)?;
    reply.push(b'\n');
    write.write_all(&reply).await?;
    write.shutdown().await
}

/// Carries connections to an in-sandbox loopback port out to a host socket.
async fn forward(listener: TcpListener, proxy: PathBuf) {
    while let Ok((mut inside, _)) = listener.accept().await {
        let proxy = proxy.clone();
        tokio::spawn(async move {
            // A sandbox that outlives its holder has no proxy between its holder's
            // death and its adoption: a connection made then waits for the next
            // holder's proxy rather than fail.
            let deadline = tokio::time::Instant::now() + PROXY_WAIT;
            let mut outside = loop {
                match UnixStream::connect(&proxy).await {
                    Ok(outside) => break outside,
                    Err(_) if tokio::time::Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(50)).await
                    }
                    Err(_) => return,
                }
            };
            let _ = tokio::io::copy_bidirectional(&mut inside, &mut outside).await;
        });
    }
}

/// Sends one request to the agent listening on `socket` and reads its reply. `None`
/// means the connection broke before a reply: the agent (or its sandbox) is gone.
pub(crate) async fn call(socket: &Path, request: &Request) -> std::io::Result<Option<ToolOutput>> {
    let stream = UnixStream::connect(socket).await?;
    let (read, mut write) = stream.into_split();
    let mut body = serde_json::to_vec(request).map_err(std::io::Error::other)?;
    body.push(b'\n');
    write.write_all(&body).await?;
    let mut line = String::new();
    BufReader::new(read).read_line(&mut line).await?;
    if line.is_empty() {
        return Ok(None);
    }
    serde_json::from_str(&line)
        .map(Some)
        .map_err(std::io::Error::other)
}

#[cfg(test)]
mod tests {
    #[test]
    fn listening_ports_are_read_from_the_kernels_table() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1 1 0 100 0 0 10 0
   1: 00000000:0BB8 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 2 1 0 100 0 0 10 0
   2: 0100007F:1F90 0100007F:A2C4 01 00000000:00000000 00:00000000 00000000  1000        0 3 1 0 20 4 30 10 -1
";
        assert_eq!(
            super::listening(table),
            [8080, 3000],
            "established ones are not listed"
        );
        assert!(super::listening("").is_empty());
    }
}
