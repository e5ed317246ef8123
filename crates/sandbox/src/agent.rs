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

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
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
}

/// One command for the agent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Request {
    /// The tool (only `bash` runs in the agent; file tools run on the shared drive).
    pub tool: String,
    /// Its input.
    pub input: serde_json::Value,
}

/// The request that kills the command running now (it is served at once, not after
/// the command it stops).
pub(crate) const CANCEL: &str = "steadfast.cancel";

static IN_SANDBOX: OnceLock<()> = OnceLock::new();

/// Kills every process of the sandbox but the agent and the namespace's init, so a
/// command cannot leave anything running (even in a new session or process group).
/// Does nothing outside the agent.
pub(crate) fn kill_strays() {
    if IN_SANDBOX.get().is_none() {
        return;
    }
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in dir.filter_map(Result::ok) {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if pid != 1 && pid != me {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Runs the agent with `args` (after the program name): one JSON [`AgentConfig`].
/// Returns the process exit code.
pub fn main(args: impl IntoIterator<Item = String>) -> i32 {
    let Some(config) = args.into_iter().next() else {
        eprintln!("steadfast sandbox agent: expected one JSON argument");
        return 2;
    };
    let config: AgentConfig = match serde_json::from_str(&config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("steadfast sandbox agent: bad configuration: {e}");
            return 2;
        }
    };
    let _ = IN_SANDBOX.set(());
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
    let state = std::sync::Arc::new((config, env, options, tokio::sync::Mutex::new(())));
    loop {
        let (stream, _) = listener.accept().await?;
        let state = state.clone();
        tokio::spawn(async move {
            let (config, env, options, one_at_a_time) = &*state;
            let _ = handle(stream, config, env, options, one_at_a_time).await;
        });
    }
}

async fn handle(
    stream: UnixStream,
    config: &AgentConfig,
    env: &[(String, String)],
    options: &SandboxOptions,
    one_at_a_time: &tokio::sync::Mutex<()>,
) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    BufReader::new(read).read_line(&mut line).await?;
    let request = serde_json::from_str::<Request>(&line);
    // Commands run one at a time; a cancel does not wait for the one it stops.
    let _turn = match &request {
        Ok(req) if req.tool == CANCEL => None,
        _ => Some(one_at_a_time.lock().await),
    };
    let out = match request {
        Ok(req) if req.tool == CANCEL => {
            kill_strays();
            ToolOutput::ok("stopped")
        }
        Ok(req) if req.tool == "bash" => {
            let ctx = Context {
                root: &config.workspace,
                env,
                options,
                registry: None,
                limits: Some(&config.limits),
            };
            let out = crate::tools::run(&ctx, "bash", &req.input).await;
            kill_strays();
            out
        }
        Ok(req) => ToolOutput::error(format!(
            "the sandbox agent runs bash only, not {}",
            req.tool
        )),
        Err(e) => ToolOutput::error(format!("bad request to the sandbox agent: {e}")),
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
            if let Ok(mut outside) = UnixStream::connect(&proxy).await {
                let _ = tokio::io::copy_bidirectional(&mut inside, &mut outside).await;
            }
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
