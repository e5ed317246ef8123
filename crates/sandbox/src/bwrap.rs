//! The `bwrap` backend: each sandbox is a bubblewrap container with its own mount,
//! PID, IPC, UTS, user and network namespaces, holding the in-sandbox agent.
//!
//! Inside, the system directories are read-only, the workspace (at the same path as on
//! the host, so paths agree between file tools and commands) is the only writable tree
//! besides a private `/tmp` and home, `/proc` shows only the sandbox's processes, and
//! the environment is the fixed allow-list of [`crate::env`]. Nothing else of the host
//! is mounted: not the world's database, not the harness's configuration, not other
//! workspaces. File tools run in the harness on the shared workspace (confined to it);
//! commands go to the agent. A sandbox that dies is noticed on its next (or current)
//! command and reported as [`Error::Died`].

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::agent::{self, AgentConfig, Request};
use crate::cgroup::Cgroup;
use crate::proxy::{EgressProxy, EgressRules};
use crate::tenure::{self, Holding, Holds};
use crate::tools::{self, Context};
use crate::{Error, NetworkPolicy, Result, Sandbox, SandboxOptions, ToolOutput};

/// Where the shared directory appears inside the sandbox.
const INSIDE_RUN: &str = agent::INSIDE_RUN_DIR;
/// Where the agent program appears inside the sandbox.
const INSIDE_AGENT: &str = "/run/steadfast-agent";
/// The commands' home inside the sandbox.
const INSIDE_HOME: &str = "/home/agent";
/// The loopback port inside the sandbox that leads to the egress proxy.
const PROXY_PORT: u16 = 3128;
/// How long a sandbox that outlives its holder may live before the holder first
/// renews its hold (counted from when its agent starts).
const FIRST_HOLD: Duration = Duration::from_secs(5);
/// How long the agent may take to come up.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// System directories shown read-only (symlinks are recreated as symlinks).
const SYSTEM: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt",
];

/// The uid and gid commands run as inside the sandbox.
const SANDBOX_UID: &str = "1000";

/// Every namespace, a user namespace included even when the harness runs as root,
/// where the commands are an unprivileged user (with no capabilities).
const NAMESPACES: [&str; 6] = [
    "--unshare-all",
    "--unshare-user",
    "--uid",
    SANDBOX_UID,
    "--gid",
    SANDBOX_UID,
];

/// A file or directory of the host's `/etc` that its owner keeps from other users.
struct Secret {
    path: PathBuf,
    is_dir: bool,
}

/// What of the host's `/etc` other users may not read (`/etc/shadow`, private keys
/// under `/etc/ssl/private`, ...): hidden in every sandbox, since the sandbox's user
/// maps to the harness's, which may own them. Found once per process.
fn host_secrets() -> &'static [Secret] {
    use std::os::unix::fs::PermissionsExt;
    static FOUND: OnceLock<Vec<Secret>> = OnceLock::new();
    FOUND.get_or_init(|| {
        let mut found = Vec::new();
        let mut walk = walkdir::WalkDir::new("/etc").max_depth(6).into_iter();
        while let Some(Ok(entry)) = walk.next() {
            if entry.path_is_symlink() {
                continue;
            }
            let Ok(meta) = entry.metadata() else { continue };
            let mode = meta.permissions().mode();
            if meta.is_dir() && mode & 0o005 != 0o005 {
                found.push(Secret {
                    path: entry.path().to_path_buf(),
                    is_dir: true,
                });
                walk.skip_current_dir();
            } else if meta.is_file() && mode & 0o004 == 0 {
                found.push(Secret {
                    path: entry.path().to_path_buf(),
                    is_dir: false,
                });
            }
        }
        found
    })
}

/// Whether bubblewrap can create its namespaces here and mount what every sandbox
/// mounts (checked once per process). A new `/proc` is the part a container most
/// often forbids (its runtime masks paths under the host's `/proc`, and the kernel
/// then refuses a fresh one), so the probe mounts it as the sandbox does: a host
/// that cannot is refused at start, not at its first command.
pub fn bwrap_available() -> std::result::Result<(), String> {
    probed().as_ref().map(|_| ()).map_err(String::clone)
}

/// Whether sandboxes name their host `sandbox`. A container's default seccomp
/// profile forbids `sethostname` (podman's, docker's): there the sandbox keeps its
/// own UTS namespace under the container's name, rather than the worker dropping the
/// container's syscall filter, which guards the sandboxed commands too.
fn sets_hostname() -> bool {
    matches!(probed(), Ok(true))
}

/// The probe's finding: `Ok(sets_hostname)`, or why bubblewrap cannot run here.
fn probed() -> &'static std::result::Result<bool, String> {
    static CHECK: OnceLock<std::result::Result<bool, String>> = OnceLock::new();
    CHECK.get_or_init(|| {
        let probe = |hostname: bool| {
            let mut cmd = std::process::Command::new("bwrap");
            cmd.args(NAMESPACES)
                .args(["--die-with-parent", "--new-session", "--cap-drop", "ALL"]);
            if hostname {
                cmd.args(["--hostname", "sandbox"]);
            }
            cmd.args([
                "--ro-bind",
                "/",
                "/",
                "--proc",
                "/proc",
                "--dev",
                "/dev",
                "true",
            ])
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("bwrap not found ({e}); install bubblewrap"))
        };
        let out = probe(true)?;
        if out.status.success() {
            return Ok(true);
        }
        let mut said = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if said.contains("hostname") {
            let without = probe(false)?;
            if without.status.success() {
                tracing::warn!(
                    "sandboxes keep this host's name: setting their own is forbidden here \
                     ({said}), as a container's seccomp profile does"
                );
                return Ok(false);
            }
            said = String::from_utf8_lossy(&without.stderr).trim().to_string();
        }
        let hint = if said.contains("proc") {
            " (in a container, unmask /proc: podman --security-opt unmask=/proc/*, \
             docker --security-opt systempaths=unconfined; see docs/deploy.md)"
        } else {
            ""
        };
        Err(format!("bwrap cannot create namespaces here: {said}{hint}"))
    })
}

/// Spawns `cmd` from one thread that lives as long as the process. bubblewrap's
/// `--die-with-parent` ties the sandbox to the thread that started it, so starting it
/// from a pool thread (which exits when idle) would kill it after a few seconds.
fn spawn_from_a_lasting_thread(cmd: std::process::Command) -> std::io::Result<std::process::Child> {
    type Job = (
        std::process::Command,
        std::sync::mpsc::Sender<std::io::Result<std::process::Child>>,
    );
    static SPAWNER: OnceLock<Mutex<std::sync::mpsc::Sender<Job>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("steadfast-sandbox-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("the sandbox spawner thread starts");
        Mutex::new(tx)
    });
    let (reply, result) = std::sync::mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((cmd, reply))
        .map_err(|_| std::io::Error::other("the sandbox spawner thread is gone"))?;
    result
        .recv()
        .map_err(|_| std::io::Error::other("the sandbox spawner thread is gone"))?
}

/// Kills sandboxes left behind by harness processes that died (where the kernel did not
/// take them down with their parent): each run directory names its owner's PID, and the
/// file beside it (see [`pid_file`]) holds the sandbox's.
fn reap_abandoned() {
    /// Whether the harness that named a run directory `name` still runs.
    fn owner_alive(name: &str) -> bool {
        let Some(owner) = name
            .strip_prefix("steadfast-sbx-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<i32>().ok())
        else {
            return true;
        };
        owner == std::process::id() as i32
            || nix::sys::signal::kill(nix::unistd::Pid::from_raw(owner), None).is_ok()
    }
    let Ok(dir) = std::fs::read_dir(crate::paths::socket_root()) else {
        return;
    };
    for entry in dir.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("steadfast-sbx-") || owner_alive(&name) {
            continue;
        }
        // One that outlives its holder ends itself when its hold runs out; while it
        // runs, it is the next holder's to adopt.
        let outliving = Holds::read(&entry.path()).is_some_and(|h| h.outlives);
        if outliving && sandbox_pid(&entry.path()).is_some() {
            continue;
        }
        let beside = [".pid", ".holds", ".holds-new", ".args"];
        if beside.iter().any(|suffix| name.ends_with(suffix)) {
            // Its run directory is gone already.
            if !entry.path().with_extension("").exists() {
                let _ = std::fs::remove_file(entry.path());
            }
            continue;
        }
        let pid_path = pid_file(&entry.path());
        let pid = std::fs::read_to_string(&pid_path)
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok());
        let _ = std::fs::remove_file(&pid_path);
        if let Some(pid) = pid.filter(|&pid| is_sandbox(pid)) {
            kill_sandbox(pid);
        }
        let _ = std::fs::remove_dir_all(entry.path());
    }
    // After the processes above are gone, so their groups are empty.
    crate::cgroup::reap(owner_alive);
}

/// A private directory on the host, shared with one sandbox, removed on drop.
#[derive(Debug)]
struct RunDir(PathBuf);

impl Drop for RunDir {
    fn drop(&mut self) {
        if self.0.as_os_str().is_empty() {
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
        let _ = std::fs::remove_file(pid_file(&self.0));
        let _ = std::fs::remove_file(tenure::holds_file(&self.0));
        let _ = std::fs::remove_file(args_file(&self.0));
    }
}

/// Where bubblewrap's options for run directory `run` are written (beside it, where
/// the sandbox cannot see them).
fn args_file(run: &Path) -> PathBuf {
    run.with_extension("args")
}

/// The PID of run directory `run`'s sandbox, if it still runs.
fn sandbox_pid(run: &Path) -> Option<i32> {
    let pid = std::fs::read_to_string(pid_file(run))
        .ok()?
        .trim()
        .parse::<i32>()
        .ok()?;
    is_sandbox(pid).then_some(pid)
}

/// Whether `pid` is a sandbox's outermost process — bubblewrap, or the keeper shell
/// of one that outlives its holder — and not a PID reused by something else.
fn is_sandbox(pid: i32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| c.starts_with(b"bwrap") || is_keeper(&c))
}

/// Whether a process's command line is a keeper shell's.
fn is_keeper(cmdline: &[u8]) -> bool {
    cmdline.starts_with(b"sh\0-c\0")
        && cmdline
            .windows(KEEPER.len())
            .any(|w| w == KEEPER.as_bytes())
}

/// Where bubblewrap's output goes (its errors at start, and the agent's before the agent
/// takes over its log): a file in memory, not on the host. The sandbox's first process
/// keeps it open for the sandbox's whole life, and a file on the host would show its
/// host path in that process's `/proc/1/fd` and take writes past the workspace quota.
/// Sealed once the agent answers, so nothing in the sandbox can grow it.
#[derive(Debug)]
struct StartOutput(std::fs::File);

impl StartOutput {
    fn new() -> Result<Self> {
        use nix::sys::memfd::{memfd_create, MFdFlags};
        memfd_create(
            c"steadfast-sandbox-start",
            MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
        )
        .map(|fd| StartOutput(fd.into()))
        .map_err(|e| Error::Unavailable(format!("sandbox start output: {e}")))
    }

    /// Another descriptor of it, for a child's standard output or error.
    fn writer(&self) -> Result<std::fs::File> {
        self.0
            .try_clone()
            .map_err(|e| Error::Unavailable(format!("sandbox start output: {e}")))
    }

    /// No more writes, and no growth: what was said while starting is kept as it is.
    fn seal(&self) {
        use nix::fcntl::{fcntl, FcntlArg, SealFlag};
        let seals = SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_WRITE | SealFlag::F_SEAL_SEAL;
        if let Err(e) = fcntl(&self.0, FcntlArg::F_ADD_SEALS(seals)) {
            tracing::warn!("sealing the sandbox's start output: {e}");
        }
    }

    /// What it holds (at most its last 64 KiB).
    fn text(&self) -> String {
        use std::os::unix::fs::FileExt as _;
        let len = self.0.metadata().map_or(0, |m| m.len());
        let from = len.saturating_sub(64 << 10);
        let mut buf = vec![0; (len - from) as usize];
        let read = self.0.read_at(&mut buf, from).unwrap_or(0);
        buf.truncate(read);
        String::from_utf8_lossy(&buf).into_owned()
    }
}

/// The name the keeper shell of a sandbox that outlives its holder runs under.
const KEEPER: &str = "steadfast-sandbox-keeper";

/// Kills every sandbox over the workspace `root` that runs for `session` under a lease
/// epoch before `epoch`, in whichever process, alive or not (its holder lost the
/// lease), and waits until every process in them is gone — except one made to
/// outlive its holder, which is adopted under `epoch` instead (see
/// [`crate::take_over`]).
pub(crate) fn take_over(
    root: &Path,
    session: &str,
    epoch: u64,
    grace: Duration,
) -> crate::TakenOver {
    let mut taken = crate::TakenOver::default();
    let Ok(dir) = std::fs::read_dir(crate::paths::socket_root()) else {
        return taken;
    };
    let mut doomed = Vec::new();
    for entry in dir.filter_map(Result::ok) {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("steadfast-sbx-") || !name.ends_with(".holds") {
            continue;
        }
        let run = entry.path().with_extension("");
        let Some(holds) = Holds::read(&run) else {
            continue;
        };
        let stale = holds.session == session
            && holds.epoch < epoch
            && holds.root == *root.to_string_lossy();
        if !stale {
            continue;
        }
        let Some(pid) = sandbox_pid(&run) else {
            continue;
        };
        let lease = (session.to_string(), epoch);
        let adopting = holds.outlives && !grace.is_zero();
        if adopting && tenure::adopt(&run.join("agent.sock"), &lease, grace).is_some() {
            Holds { epoch, ..holds }.write(&run);
            taken.adopted += 1;
            continue;
        }
        doomed.extend(kill_sandbox(pid));
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while doomed
        .iter()
        .any(|&pid| std::path::Path::new(&format!("/proc/{pid}")).exists())
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    if !doomed.is_empty() {
        tracing::warn!(workspace = %root.display(), session, "killed the sandboxes of a holder that lost the session's lease");
    }
    if taken.adopted > 0 {
        tracing::info!(workspace = %root.display(), session, epoch, "adopted the sandbox of the session's last holder, with what it runs");
    }
    taken.killed = doomed.len();
    taken
}

/// An outliving sandbox over `root` for `lease`'s session, adopted (or to adopt) under
/// its epoch, whose agent answers: its run directory, bubblewrap's PID and the calls it
/// keeps.
fn adoptable(
    root: &Path,
    lease: &(String, u64),
    grace: Duration,
) -> Option<(PathBuf, i32, Vec<String>)> {
    let dir = std::fs::read_dir(crate::paths::socket_root()).ok()?;
    dir.filter_map(Result::ok).find_map(|entry| {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("steadfast-sbx-") || !name.ends_with(".holds") {
            return None;
        }
        let run = entry.path().with_extension("");
        let holds = Holds::read(&run)?;
        let ours = holds.outlives
            && holds.session == lease.0
            && holds.epoch <= lease.1
            && holds.root == *root.to_string_lossy();
        if !ours {
            return None;
        }
        let pid = sandbox_pid(&run)?;
        let kept = tenure::adopt(&run.join("agent.sock"), lease, grace)?;
        Holds {
            epoch: lease.1,
            ..holds
        }
        .write(&run);
        Some((run, pid, kept))
    })
}

/// Kills the sandbox whose outermost process is `pid`, and returns the processes
/// killed. For bubblewrap: it and the first process of its PID namespace (its
/// child), so every process in the namespace goes too (the kernel kills them with it).
/// For a keeper shell: the bubblewrap it waits for, and that one's child; the keeper
/// then removes the sandbox's run directory and groups.
fn kill_sandbox(pid: i32) -> Vec<i32> {
    let keeper = std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| is_keeper(&c));
    let outer = match keeper {
        true => children_of(pid),
        false => vec![pid],
    };
    let mut doomed = Vec::new();
    for bwrap in outer {
        doomed.extend(children_of(bwrap));
        doomed.push(bwrap);
    }
    for &pid in &doomed {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    doomed
}

/// The processes whose parent is `pid`.
fn children_of(pid: i32) -> Vec<i32> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|child| {
            std::fs::read_to_string(format!("/proc/{child}/stat")).is_ok_and(|stat| {
                stat[stat.rfind(')').map_or(0, |i| i + 1)..]
                    .split_whitespace()
                    .nth(1)
                    .and_then(|p| p.parse::<i32>().ok())
                    == Some(pid)
            })
        })
        .collect()
}

/// Where the PID of a run directory's sandbox is kept: beside the directory, not in it.
/// The directory is the sandbox's `/run/steadfast`, which its commands can write; a PID
/// there could be changed to another sandbox's, for the reaper to kill.
fn pid_file(run: &Path) -> PathBuf {
    run.with_extension("pid")
}

/// One running bubblewrap sandbox over a workspace. Dropping it kills everything in it
/// (one that outlives its holder is released, unless a newer holder adopted it).
#[derive(Debug)]
pub struct BwrapSandbox {
    root: PathBuf,
    socket: PathBuf,
    /// bubblewrap, when this process started it (an adopted sandbox is not its child).
    child: Mutex<Option<std::process::Child>>,
    pid: u32,
    options: SandboxOptions,
    /// The lease it belongs to, when it outlives its holder.
    tenure: Option<(String, u64)>,
    /// The calls whose commands it kept from before this holder adopted it.
    kept: Vec<String>,
    /// What bubblewrap said while starting it, when this holder started it.
    said: Option<StartOutput>,
    /// Renews the hold on a sandbox that outlives its holder.
    _holding: Option<Holding>,
    _proxy: Option<EgressProxy>,
    /// Closing it (dropping the sandbox, or this process dying) ends a sandbox that
    /// does not outlive its holder.
    _lifeline: Option<std::io::PipeWriter>,
    /// The kernel's bounds on the sandbox's memory and processes, where the host has
    /// control groups; dropped after the processes.
    cgroup: Option<Cgroup>,
    // Last, so the directory goes after the processes using it.
    run: RunDir,
}

impl BwrapSandbox {
    /// Starts a sandbox over `workspace` and waits until its agent answers — or, for a
    /// session's lease with a hold ([`SandboxOptions::hold`]), adopts the one its last
    /// holder on this machine left running, with the commands it runs. Must be called
    /// within a Tokio runtime (it may block briefly while the agent starts).
    pub fn new(workspace: &Path, options: &SandboxOptions) -> Result<Self> {
        bwrap_available().map_err(Error::Unavailable)?;
        let (program, leading) = options
            .agent
            .split_first()
            .ok_or_else(|| Error::Unavailable("no sandbox agent program configured".into()))?;
        let program = std::fs::canonicalize(program)
            .map_err(|e| Error::Unavailable(format!("sandbox agent {program}: {e}")))?;
        std::fs::create_dir_all(workspace)
            .map_err(|e| Error::Unavailable(format!("{}: {e}", workspace.display())))?;
        let root = workspace
            .canonicalize()
            .map_err(|e| Error::Unavailable(format!("{}: {e}", workspace.display())))?;
        let inside = inside_path(&root, options)?;

        static REAPED: std::sync::Once = std::sync::Once::new();
        REAPED.call_once(reap_abandoned);
        let tenure = options.lease.clone().zip(options.hold.clone());
        if let Some((lease, hold)) = &tenure {
            if let Some((run, pid, kept)) = adoptable(&root, lease, hold.remaining()) {
                return Self::adopted(root, RunDir(run), pid, kept, options);
            }
        }
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let run = RunDir(crate::paths::socket_root().join(format!(
            "steadfast-sbx-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        )));
        std::fs::create_dir_all(&run.0)
            .map_err(|e| Error::Unavailable(format!("{}: {e}", run.0.display())))?;
        let proxy = start_proxy(&run.0, options)?;
        let config = AgentConfig {
            listen: Path::new(INSIDE_RUN).join("agent.sock"),
            workspace: inside.clone(),
            proxy_socket: proxy
                .as_ref()
                .map(|_| Path::new(INSIDE_RUN).join("proxy.sock")),
            proxy_port: PROXY_PORT,
            forwards: options
                .forwards
                .iter()
                .map(|(port, socket)| (*port, forward_path(*port, socket)))
                .collect(),
            limits: options.limits,
            max_output_bytes: options.max_output_bytes,
            default_timeout_ms: options.default_timeout.as_millis() as u64,
            max_timeout_ms: options.max_timeout.as_millis() as u64,
            lifeline: tenure.is_none(),
            private_network: options.network != NetworkPolicy::Open,
            tenure: tenure
                .as_ref()
                .map(|((session, epoch), hold)| agent::Tenure {
                    session: session.clone(),
                    epoch: *epoch,
                    // Enough to start in: its holder renews the hold as soon as it
                    // answers. One whose holder died while it started ends soon after.
                    hold_ms: hold.remaining().min(FIRST_HOLD).as_millis() as u64,
                }),
        };
        let config = serde_json::to_string(&config)
            .map_err(|e| Error::Unavailable(format!("agent configuration: {e}")))?;

        let mut env = crate::env::command_env(INSIDE_HOME, "/tmp", options);
        if proxy.is_some() {
            let url = format!("http://127.0.0.1:{PROXY_PORT}");
            for name in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
                env.push((name.to_string(), url.clone()));
            }
            node_through_proxy(&run.0, &mut env)?;
        }
        if proxy.as_ref().and_then(EgressProxy::trust).is_some() {
            trust_the_proxy(&mut env);
        }
        // The agent's log, which it takes over from inside once it starts.
        std::fs::File::create(run.0.join("agent.log"))
            .map_err(|e| Error::Unavailable(format!("agent log: {e}")))?;
        let said = StartOutput::new()?;
        // bubblewrap starts inside the sandbox's control groups (through a shell that
        // joins them and then becomes bubblewrap), so everything it starts is in them.
        let cgroup = sandbox_cgroup(&run.0, &options.limits);
        let mut cmd = std::process::Command::new("sh");
        if tenure.is_some() {
            // A keeper shell outside the sandbox waits for it and then removes its
            // run directory and control groups: one that ends itself, with its
            // holder long gone, leaves nothing behind.
            cmd.args([
                "-c",
                r#"run=$1; n=$2; shift 2; groups=""; while [ "$n" -gt 0 ]; do groups="$groups $1"; shift; n=$((n-1)); done; "$@"; rm -rf "$run" "$run.pid" "$run.holds" "$run.holds-new" "$run.args"; for g in $groups; do rmdir "$g" 2>/dev/null; done"#,
                KEEPER,
            ]);
            cmd.arg(&run.0);
            let groups = cgroup.as_ref().map(Cgroup::dirs).unwrap_or_default();
            cmd.arg(groups.len().to_string()).args(groups);
            cmd.arg("sh");
        }
        // bubblewrap reads its options from a file beside the run directory (on fd
        // 3), not from its command line: the sandbox's first process is a copy of
        // bubblewrap, and its `/proc/1/cmdline` would show the sandbox every host path
        // the options name (the run directory, the workspace's host path, the agent
        // program, mounted toolchains). The file goes once the agent answers.
        let options_file = args_file(&run.0);
        let mut listed = Vec::new();
        for arg in bwrap_args(&root, &inside, &run.0, &program, options, &env) {
            listed.extend_from_slice(arg.as_bytes());
            listed.push(0);
        }
        std::fs::write(&options_file, listed)
            .map_err(|e| Error::Unavailable(format!("bubblewrap's options: {e}")))?;
        cmd.args(["-c", r#"exec 3<"$0"; exec "$@""#])
            .arg(&options_file);
        match &cgroup {
            Some(group) => cmd.arg("sh").args(group.joining_shell()).arg("bwrap"),
            None => cmd.arg("bwrap"),
        };
        cmd.args(["--args", "3", "--"])
            .arg(INSIDE_AGENT)
            .args(leading)
            .arg(config)
            .env_clear()
            .envs(std::env::var_os("PATH").map(|p| ("PATH", p)))
            // Not the harness's own directory: the shells would hand it to bubblewrap
            // as `PWD`, which its first process, in the sandbox, keeps.
            .current_dir("/")
            .stdout(said.writer()?)
            .stderr(said.writer()?);
        // The sandbox lives while this end of its lifeline is open (see
        // `AgentConfig::lifeline`); both ends are close-on-exec, so no other child
        // holds it. One that outlives its holder has none, and a process group of its
        // own, so a signal to its holder's group does not reach it either.
        let lifeline = match &tenure {
            None => {
                let (lifeline_in, lifeline) = std::io::pipe()
                    .map_err(|e| Error::Unavailable(format!("lifeline pipe: {e}")))?;
                cmd.stdin(std::process::Stdio::from(lifeline_in));
                Some(lifeline)
            }
            Some(_) => {
                std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
                cmd.stdin(std::process::Stdio::null());
                None
            }
        };
        // Whose it is, noted before it starts: a holder that dies while it starts
        // leaves one the next holder finds.
        if let Some((session, epoch)) = &options.lease {
            Holds {
                session: session.clone(),
                epoch: *epoch,
                root: root.to_string_lossy().into_owned(),
                outlives: tenure.is_some(),
            }
            .write(&run.0);
        }
        let child = spawn_from_a_lasting_thread(cmd)
            .map_err(|e| Error::Unavailable(format!("starting bwrap: {e}")))?;
        // bubblewrap, or the keeper shell waiting for it.
        let pid = child.id();
        let _ = std::fs::write(pid_file(&run.0), pid.to_string());
        let mut sandbox = BwrapSandbox {
            root,
            socket: run.0.join("agent.sock"),
            child: Mutex::new(Some(child)),
            pid,
            options: options.clone(),
            tenure: tenure.as_ref().map(|(lease, _)| lease.clone()),
            kept: Vec::new(),
            said: Some(said),
            _holding: None,
            _proxy: proxy,
            cgroup,
            _lifeline: lifeline,
            run,
        };
        let ready = sandbox.wait_ready();
        let _ = std::fs::remove_file(args_file(&sandbox.run.0));
        ready?;
        if let Some(said) = &sandbox.said {
            said.seal();
        }
        if let Some((lease, hold)) = tenure {
            sandbox._holding = Some(
                Holding::start(&sandbox.socket, lease, hold)
                    .map_err(|e| Error::Unavailable(format!("holding the sandbox: {e}")))?,
            );
        }
        Ok(sandbox)
    }

    /// The sandbox in `run`, left running by the session's last holder on this
    /// machine, made this holder's: its egress proxy served again from here, its
    /// control groups found again, its hold renewed from now on.
    fn adopted(
        root: PathBuf,
        run: RunDir,
        pid: i32,
        kept: Vec<String>,
        options: &SandboxOptions,
    ) -> Result<Self> {
        let proxy = start_proxy(&run.0, options)?;
        let cgroup = sandbox_cgroup(&run.0, &options.limits);
        let socket = run.0.join("agent.sock");
        let lease = options.lease.clone().unwrap_or_default();
        let holding = options
            .hold
            .clone()
            .map(|hold| Holding::start(&socket, lease.clone(), hold))
            .transpose()
            .map_err(|e| Error::Unavailable(format!("holding the adopted sandbox: {e}")))?;
        tracing::info!(session = %lease.0, epoch = lease.1, kept = kept.len(), "adopted a sandbox its last holder left running");
        Ok(BwrapSandbox {
            root,
            socket,
            child: Mutex::new(None),
            pid: pid as u32,
            options: options.clone(),
            tenure: Some(lease),
            kept,
            said: None,
            _holding: holding,
            _proxy: proxy,
            _lifeline: None,
            cgroup,
            run,
        })
    }

    /// The host PID of the sandbox's outermost process: bubblewrap, or for one that
    /// outlives its holder, the keeper shell waiting for it. Killing it ends the
    /// sandbox.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the sandbox is still running.
    pub fn is_alive(&self) -> bool {
        self.exit_status().is_none()
    }

    fn exit_status(&self) -> Option<String> {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        match child.as_mut().map(std::process::Child::try_wait) {
            Some(Ok(Some(status))) => Some(status.to_string()),
            Some(Ok(None)) => None,
            Some(Err(e)) => Some(e.to_string()),
            None if is_sandbox(self.pid as i32) => None,
            None => Some("exited".into()),
        }
    }

    /// Kills bubblewrap, and with it everything in the sandbox.
    fn kill(&self) {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        if child.is_some() || is_sandbox(self.pid as i32) {
            kill_sandbox(self.pid as i32);
        }
        if let Some(child) = child.as_mut() {
            let _ = child.wait();
        }
    }

    /// What the sandbox said: bubblewrap's output while starting, then its agent's log.
    fn said_while_starting(&self) -> String {
        let started = self
            .said
            .as_ref()
            .map(StartOutput::text)
            .unwrap_or_default();
        let log = std::fs::read_to_string(self.run.0.join("agent.log")).unwrap_or_default();
        format!("{}\n{}", started.trim(), log.trim())
    }

    fn wait_ready(&self) -> Result<()> {
        let start = Instant::now();
        loop {
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                return Ok(());
            }
            if let Some(status) = self.exit_status() {
                let log = self.said_while_starting();
                return Err(Error::Unavailable(format!(
                    "the sandbox exited while starting ({status}): {}",
                    log.trim()
                )));
            }
            if start.elapsed() > START_TIMEOUT {
                return Err(Error::Unavailable(
                    "the sandbox agent did not start in time".into(),
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// The sandbox's control groups, named like its run directory. Where the host has none
/// that can be used, says so once and returns `None`: the rlimits and the process
/// watchdog then are the only bounds (a sandbox's total resident memory is unbounded).
fn sandbox_cgroup(run: &Path, limits: &crate::ResourceLimits) -> Option<Cgroup> {
    let name = run.file_name()?.to_string_lossy().into_owned();
    match Cgroup::create(&name, limits) {
        Ok(group) => group,
        Err(why) => {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                tracing::warn!(
                    %why,
                    "no control group for bwrap sandboxes: memory is bounded per process \
                     (address space) only, processes by the agent's watchdog"
                )
            });
            None
        }
    }
}

/// Where the host socket of forwarded port `port` appears inside the sandbox. (Its
/// directory is what is mounted: a socket file mounted on its own cannot be connected
/// to everywhere, e.g. under gVisor.)
fn forward_path(port: u16, socket: &Path) -> PathBuf {
    let name = socket.file_name().unwrap_or_default();
    Path::new("/run/steadfast-forward")
        .join(port.to_string())
        .join(name)
}

/// Where the workspace `root` appears inside the sandbox: [`SandboxOptions::mount_at`]
/// when set (refused unless it is an absolute path of its own, clear of the system
/// directories and the sandbox's own), else `root` itself.
fn inside_path(root: &Path, options: &SandboxOptions) -> Result<PathBuf> {
    let Some(at) = &options.mount_at else {
        return Ok(root.to_path_buf());
    };
    let normal = at.is_absolute()
        && at.components().count() > 1
        && at.components().all(|c| {
            matches!(
                c,
                std::path::Component::RootDir | std::path::Component::Normal(_)
            )
        });
    let taken = SYSTEM
        .iter()
        .chain(&[
            "/proc",
            "/dev",
            "/tmp",
            INSIDE_HOME,
            INSIDE_RUN,
            INSIDE_AGENT,
        ])
        .any(|dir| at.starts_with(dir) || Path::new(dir).starts_with(at));
    if !normal || taken {
        return Err(Error::Unavailable(format!(
            "the workspace cannot be shown at {} inside the sandbox",
            at.display()
        )));
    }
    Ok(at.clone())
}

/// bubblewrap's arguments for a sandbox over `root` (shown at `inside`) sharing `run`.
fn bwrap_args(
    root: &Path,
    inside: &Path,
    run: &Path,
    agent: &Path,
    options: &SandboxOptions,
    env: &[(String, String)],
) -> Vec<String> {
    let mut a: Vec<String> = Vec::new();
    let mut push = |items: &[&str]| a.extend(items.iter().map(|s| s.to_string()));
    push(&NAMESPACES);
    if options.network == NetworkPolicy::Open {
        push(&["--share-net"]);
    }
    // Its parent is the harness's spawning thread, or for a sandbox that outlives its
    // holder, the keeper shell (which the harness's death does not touch): killing
    // bubblewrap ends the whole sandbox either way.
    push(&["--die-with-parent", "--new-session", "--cap-drop", "ALL"]);
    if sets_hostname() {
        push(&["--hostname", "sandbox"]);
    }
    push(&["--clearenv"]);
    for (k, v) in env {
        push(&["--setenv", k, v]);
    }
    for dir in SYSTEM {
        let path = Path::new(dir);
        match std::fs::read_link(path) {
            Ok(target) => push(&["--symlink", &target.to_string_lossy(), dir]),
            Err(_) if path.is_dir() => push(&["--ro-bind", dir, dir]),
            Err(_) => {}
        }
    }
    for secret in host_secrets() {
        let p = secret.path.to_string_lossy();
        match secret.is_dir {
            true => push(&["--tmpfs", &p, "--remount-ro", &p]),
            false => push(&["--ro-bind", "/dev/null", &p]),
        }
    }
    push(&["--proc", "/proc", "--dev", "/dev"]);
    let size = options
        .limits
        .tmp_mb
        .map(|mb| (mb * 1024 * 1024).to_string());
    for dir in ["/tmp", INSIDE_HOME] {
        if let Some(size) = &size {
            push(&["--size", size]);
        }
        push(&["--tmpfs", dir]);
    }
    for extra in &options.read_only_paths {
        let p = extra.to_string_lossy();
        push(&["--ro-bind-try", &p, &p]);
    }
    for (host, inside) in &options.read_only_mounts {
        push(&[
            "--ro-bind",
            &host.to_string_lossy(),
            &inside.to_string_lossy(),
        ]);
    }
    let (run, agent, root) = (
        run.to_string_lossy(),
        agent.to_string_lossy(),
        root.to_string_lossy(),
    );
    let trust = Path::new(run.as_ref()).join(TRUST);
    if trust.exists() && Path::new(SYSTEM_TRUST).exists() {
        push(&["--ro-bind", &trust.to_string_lossy(), SYSTEM_TRUST]);
    }
    push(&[
        "--bind",
        &run,
        INSIDE_RUN,
        "--ro-bind",
        &agent,
        INSIDE_AGENT,
    ]);
    for (port, socket) in &options.forwards {
        let inside = forward_path(*port, socket);
        let (Some(host_dir), Some(inside_dir)) = (socket.parent(), inside.parent()) else {
            continue;
        };
        push(&[
            "--bind",
            &host_dir.to_string_lossy(),
            &inside_dir.to_string_lossy(),
        ]);
    }
    let inside = inside.to_string_lossy();
    push(&["--bind", &root, &inside, "--chdir", &inside]);
    a
}

/// Set when this process stops with steps in hand (a rolling deploy): sandboxes that
/// outlive their holder are left running as they are when dropped, for the next
/// holder on this machine to adopt with their commands (see [`leave_running`]).
static LEAVING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes every sandbox that outlives its holder, dropped from now on, stay as it is
/// rather than end: this process is stopping with commands in flight, and the next
/// holder of each session on this machine adopts its sandbox and waits for them. One
/// no one adopts ends itself when its hold runs out, before its lease can lapse.
pub fn leave_running() {
    LEAVING.store(true, Ordering::SeqCst);
}

impl Drop for BwrapSandbox {
    fn drop(&mut self) {
        let Some(lease) = self.tenure.clone() else {
            self.kill();
            return;
        };
        self._holding = None;
        if LEAVING.load(Ordering::SeqCst) {
            self.left_to_the_next_holder();
            return;
        }
        let release = Request::new(agent::RELEASE, serde_json::Value::Null, Some(lease));
        match tenure::control(&self.socket, &release) {
            // A newer holder adopted it: it is that one's now, with its directory.
            Some(reply) if reply.is_error => self.left_to_the_next_holder(),
            _ => self.kill(),
        }
    }
}

impl BwrapSandbox {
    /// Lets go of the sandbox without ending it: its process, control groups and run
    /// directory are the next holder's.
    fn left_to_the_next_holder(&mut self) {
        if let Some(mut child) = self.child.lock().unwrap_or_else(|e| e.into_inner()).take() {
            std::thread::spawn(move || child.wait());
        }
        std::mem::forget(self.cgroup.take());
        self.run.0 = PathBuf::new();
    }
}

/// Whether `tool` runs inside the sandbox, by its agent (commands and services); the
/// file tools run here, on the shared workspace.
fn runs_in_the_agent(tool: &str) -> bool {
    matches!(tool, "bash" | "service")
}

/// The egress proxy of a sandbox under an allow-list, serving `run/proxy.sock`.
fn start_proxy(run: &Path, options: &SandboxOptions) -> Result<Option<EgressProxy>> {
    let NetworkPolicy::AllowList(rules) = &options.network else {
        return Ok(None);
    };
    EgressProxy::start(
        &run.join("proxy.sock"),
        EgressRules {
            allow: rules.clone(),
            internal: options.internal_hosts.clone(),
            inject: options.inject.clone(),
            watch: options.egress_watch.clone(),
        },
    )
    .map_err(|e| Error::Unavailable(format!("egress proxy: {e}")))
    .and_then(|proxy| {
        if let Some(trust) = proxy.trust() {
            // Written in place, not replaced: an adopted sandbox (whose proxy, and so
            // authority, is new) sees the new file through its bind mounts.
            std::fs::write(run.join(TRUST), trust)
                .map_err(|e| Error::Unavailable(format!("the sandbox's roots: {e}")))?;
        }
        Ok(Some(proxy))
    })
}

/// The roots a sandbox with bound credentials trusts, in its run directory: the
/// host's and its own egress authority's (see [`EgressProxy::trust`]).
const TRUST: &str = "trust.pem";

/// Where Debian-like systems keep the bundle of trusted roots: a sandbox with bound
/// credentials sees its own there, for programs that read no variable (GnuTLS's git).
const SYSTEM_TRUST: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Points the TLS clients a sandbox is likely to run at its roots (OpenSSL, curl,
/// Python's `requests`, Node, git).
fn trust_the_proxy(env: &mut Vec<(String, String)>) {
    let path = format!("{INSIDE_RUN}/{TRUST}");
    for name in [
        "SSL_CERT_FILE",
        "CURL_CA_BUNDLE",
        "REQUESTS_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
        "GIT_SSL_CAINFO",
    ] {
        env.retain(|(k, _)| k != name);
        env.push((name.to_string(), path.clone()));
    }
}

impl BwrapSandbox {
    /// Sends `request` (a command) to the agent and reads its output.
    async fn command(&self, request: Request) -> Result<ToolOutput> {
        let oom_before = self.cgroup.as_ref().map_or(0, Cgroup::oom_kills);
        match agent::call(&self.socket, &request).await {
            Ok(Some(mut out)) => {
                if self
                    .cgroup
                    .as_ref()
                    .is_some_and(|g| g.oom_kills() > oom_before)
                {
                    out.is_error = true;
                    out.text.push_str(&format!(
                        "\n[steadfast] the command ran out of memory: the sandbox's memory \
                         limit is {} MiB resident, and the kernel killed it",
                        self.options.limits.resident_mb.unwrap_or_default()
                    ));
                }
                Ok(out)
            }
            broken => {
                let why = match broken {
                    Err(e) => format!("lost the sandbox agent: {e}"),
                    _ => "the sandbox agent went away mid-command".to_string(),
                };
                // Make sure it is gone: a half-dead sandbox is never used again.
                self.kill();
                let status = self.exit_status();
                let log = self.said_while_starting();
                let log = log.trim();
                let log = &log[log.len().saturating_sub(400)..];
                Err(Error::Died(match status {
                    Some(s) if !log.is_empty() => {
                        format!("{why} (sandbox exited: {s}; it said: {log})")
                    }
                    Some(s) => format!("{why} (sandbox exited: {s})"),
                    None => why,
                }))
            }
        }
    }

    /// A file tool, run here on the shared workspace.
    async fn file_tool(&self, tool: &str, input: &serde_json::Value) -> ToolOutput {
        let ctx = Context {
            root: &self.root,
            env: &[],
            options: &self.options,
            registry: None,
            limits: None,
        };
        tools::run(&ctx, tool, input).await
    }
}

impl BwrapSandbox {
    /// A connection to the sandbox's agent for a `tool` whose connection goes on
    /// carrying bytes after the agent's `ok` (a port's, a shell's).
    async fn open_pipe(
        &self,
        tool: &str,
        input: serde_json::Value,
    ) -> Result<tokio::net::UnixStream> {
        use tokio::io::AsyncWriteExt;
        let unavailable =
            |e: std::io::Error| Error::Unavailable(format!("the sandbox's agent: {e}"));
        let request = Request::new(tool, input, self.tenure.clone());
        let mut stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .map_err(unavailable)?;
        let mut line =
            serde_json::to_vec(&request).map_err(|e| unavailable(std::io::Error::other(e)))?;
        line.push(b'\n');
        stream.write_all(&line).await.map_err(unavailable)?;
        // The reply is read a byte at a time: what follows it is the connection's own.
        let mut reply = Vec::new();
        loop {
            let mut byte = [0u8; 1];
            match tokio::io::AsyncReadExt::read(&mut stream, &mut byte).await {
                Ok(0) => break,
                Ok(_) if byte[0] == b'\n' => break,
                Ok(_) => reply.push(byte[0]),
                Err(e) => return Err(unavailable(e)),
            }
        }
        let out: Option<ToolOutput> = match reply.is_empty() {
            true => None,
            false => Some(
                serde_json::from_slice(&reply)
                    .map_err(|e| unavailable(std::io::Error::other(e)))?,
            ),
        };
        self.reply(Ok(out))?;
        Ok(stream)
    }

    /// The output of an agent request that is not a command, or why there is none.
    fn reply(&self, got: std::io::Result<Option<ToolOutput>>) -> Result<ToolOutput> {
        match got {
            Ok(Some(out)) if !out.is_error => Ok(out),
            Ok(Some(out)) => Err(Error::Refused(out.text)),
            Ok(None) => Err(Error::Died(format!(
                "its agent closed the connection: {}",
                self.said_while_starting().trim()
            ))),
            Err(e) => Err(Error::Unavailable(format!("the sandbox's agent: {e}"))),
        }
    }
}

impl Sandbox for BwrapSandbox {
    fn workspace(&self) -> &Path {
        &self.root
    }

    /// The TCP ports programs in the sandbox listen on (its agent's own left out): what
    /// a preview URL may lead to. A sandbox in the host's network (`open`) has none of
    /// its own, and says so.
    async fn ports(&self) -> Result<Vec<u16>> {
        let request = Request::new(agent::PORTS, serde_json::Value::Null, self.tenure.clone());
        let out = self.reply(agent::call(&self.socket, &request).await)?;
        serde_json::from_str(&out.text)
            .map_err(|e| Error::Unavailable(format!("the sandbox's ports: {e}: {}", out.text)))
    }

    /// A connection to `port` on the sandbox's loopback, through its agent: the
    /// sandbox's network stays closed, and the host still reaches a server in it.
    async fn connect(&self, port: u16) -> Result<tokio::net::UnixStream> {
        self.open_pipe(agent::CONNECT, serde_json::json!({ "port": port }))
            .await
    }

    /// A person's shell, through the agent: see [`crate::shell`].
    async fn shell(&self, request: &crate::shell::ShellRequest) -> Result<tokio::net::UnixStream> {
        let input = serde_json::to_value(request)
            .map_err(|e| Error::Unavailable(format!("a shell request: {e}")))?;
        self.open_pipe(agent::SHELL, input).await
    }

    async fn cancel(&self) {
        if self.tenure.is_some() && LEAVING.load(Ordering::SeqCst) {
            // This process is handing its sandboxes to the next holder on the machine
            // (a rolling deploy): what runs in them is that holder's to wait for. A run
            // that ends as the process stops (a wrapped CLI's journal closing) must not
            // kill it on the way out.
            return;
        }
        let request = Request::new(agent::CANCEL, serde_json::Value::Null, self.tenure.clone());
        if let Err(e) = agent::call(&self.socket, &request).await {
            tracing::warn!(error = %e, "could not reach the sandbox agent to stop a command");
        }
    }

    async fn execute(&self, tool: &str, input: &serde_json::Value) -> Result<ToolOutput> {
        if !runs_in_the_agent(tool) {
            return Ok(self.file_tool(tool, input).await);
        }
        self.command(Request::new(tool, input.clone(), self.tenure.clone()))
            .await
    }

    async fn execute_call(
        &self,
        call_id: &str,
        tool: &str,
        input: &serde_json::Value,
    ) -> Result<ToolOutput> {
        if !runs_in_the_agent(tool) {
            return Ok(self.file_tool(tool, input).await);
        }
        let mut request = Request::new(tool, input.clone(), self.tenure.clone());
        request.call_id = Some(call_id.to_string());
        self.command(request).await
    }

    fn adopted(&self) -> bool {
        self.child
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
    }

    fn kept_calls(&self) -> Vec<String> {
        self.kept.clone()
    }

    async fn attach(&self, call_id: &str) -> Result<ToolOutput> {
        let mut request = Request::new("bash", serde_json::Value::Null, self.tenure.clone());
        request.call_id = Some(call_id.to_string());
        request.attach = true;
        self.command(request).await
    }
}

/// Node's own `fetch` reads `HTTP(S)_PROXY` only from Node 24 (with
/// `NODE_USE_ENV_PROXY=1`); before, it connects directly, which the sandbox's network
/// refuses, so a `fetch` could never be seen by the egress proxy, held for approval or
/// recorded. Every Node process in the sandbox loads a preload (in the sandbox's run
/// directory) that sends `fetch` through the proxy, as `curl` and Python go.
fn node_through_proxy(run: &Path, env: &mut Vec<(String, String)>) -> Result<(), Error> {
    const PRELOAD: &str = include_str!("fetch-proxy.cjs");
    std::fs::write(run.join("fetch-proxy.cjs"), PRELOAD)
        .map_err(|e| Error::Unavailable(format!("node preload: {e}")))?;
    let require = format!("--require {INSIDE_RUN}/fetch-proxy.cjs");
    match env.iter_mut().find(|(k, _)| k == "NODE_OPTIONS") {
        Some((_, options)) => *options = format!("{options} {require}"),
        None => env.push(("NODE_OPTIONS".to_string(), require)),
    }
    env.push(("NODE_USE_ENV_PROXY".to_string(), "1".to_string()));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workspace_is_shown_only_at_a_path_of_its_own() {
        let root = Path::new("/srv/hosts/a/workspaces/ws_1");
        let at = |mount: Option<&str>| {
            let options = SandboxOptions {
                mount_at: mount.map(PathBuf::from),
                ..SandboxOptions::default()
            };
            inside_path(root, &options)
        };
        assert_eq!(at(None).unwrap(), root);
        assert_eq!(at(Some("/workspace")).unwrap(), Path::new("/workspace"));
        for bad in [
            "workspace",
            "/",
            "/usr",
            "/usr/local/ws",
            "/etc/ws",
            "/tmp/ws",
            "/home/agent",
            "/run/steadfast",
            "/workspace/../etc",
        ] {
            assert!(at(Some(bad)).is_err(), "{bad} was accepted");
        }
        // The bind and the working directory are the inside path.
        let args = bwrap_args(
            root,
            Path::new("/workspace"),
            Path::new("/tmp/run"),
            Path::new("/bin/agent"),
            &SandboxOptions::default(),
            &[],
        );
        let tail = &args[args.len() - 5..];
        assert_eq!(
            tail,
            [
                "--bind",
                "/srv/hosts/a/workspaces/ws_1",
                "/workspace",
                "--chdir",
                "/workspace"
            ]
        );
    }
}
