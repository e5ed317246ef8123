//! The `local` backend: tools run as plain processes in the workspace directory.
//!
//! For development and trusted workloads. File tools are confined to the workspace and
//! commands get a scrubbed environment, but a command itself is not isolated from the
//! host (that is the `bwrap` backend's job).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::tools::{self, Context};
use crate::{Error, Result, Sandbox, ToolOutput};

/// Settings of a sandbox.
#[derive(Debug, Clone)]
pub struct SandboxOptions {
    /// Extra environment variables for commands. Names that look like credentials
    /// (`*KEY*`, `*TOKEN*`, `*SECRET*`, `*PASSWORD*`, `*CREDENTIAL*`) are dropped.
    pub env: BTreeMap<String, String>,
    /// Timeout of a `bash` call that names none.
    pub default_timeout: Duration,
    /// The longest timeout a call may ask for.
    pub max_timeout: Duration,
    /// Most bytes of command output kept; the rest is counted and dropped.
    pub max_output_bytes: usize,
    /// Which backend runs commands.
    pub backend: crate::Backend,
    /// Production: only an isolating backend may run commands. `auto` then never falls
    /// back to `local`, and `local` is refused.
    pub require_isolation: bool,
    /// Where an isolating backend's commands may connect.
    pub network: crate::NetworkPolicy,
    /// Internal destinations (loopback, private, link-local) the operator lets an
    /// allow-list, and the MCP servers and git remotes sessions name, reach by these
    /// names (see [`crate::outbound`]); nothing a session asks for can add one.
    pub internal_hosts: Vec<crate::HostRule>,
    /// Headers the egress proxy adds to plain-HTTP requests to some destinations of an
    /// allow-list (credentials the sandbox never holds).
    pub inject: Vec<crate::Injection>,
    /// Who the egress proxy asks before each connection it would open (see
    /// [`crate::proxy::EgressRules::watch`]).
    pub egress_watch: Option<crate::proxy::EgressWatch>,
    /// Resource limits of an isolating backend's commands.
    pub limits: crate::ResourceLimits,
    /// Host directories an isolating backend shows read-only besides the system
    /// (a language toolchain under /root, say).
    pub read_only_paths: Vec<std::path::PathBuf>,
    /// Host directories an isolating backend shows read-only at a fixed path of its
    /// own, `(host, inside)`: what a program there sees is the same on every host
    /// (a wrapped CLI's install directory, whose path some CLIs put in their prompts).
    pub read_only_mounts: Vec<(std::path::PathBuf, std::path::PathBuf)>,
    /// Loopback ports inside an isolating sandbox that lead to Unix sockets of the
    /// host (a wrapped agent's gateway and tool server): `(port, socket path)`.
    pub forwards: Vec<(u16, std::path::PathBuf)>,
    /// The in-sandbox agent program and its leading arguments (an isolating backend
    /// runs it inside the sandbox to serve commands): by default this executable with
    /// `sandbox-agent`.
    pub agent: Vec<String>,
    /// Where an isolating backend shows the workspace inside the sandbox (an absolute
    /// path; by default the workspace's own host path). A workspace materialized under
    /// each host's own root is shown at one fixed path ([`WORKSPACE_MOUNT`]), so
    /// whatever its commands print or its symlinks name stays true on every host. The
    /// local backend has no mounts and always shows the host path.
    pub mount_at: Option<std::path::PathBuf>,
    /// The session and the lease epoch the sandbox works under. Its sandboxes and
    /// commands are noted under them on this host, so the next holder of the session's
    /// lease can kill what a holder that lost the lease alive (hung, stopped, cut off
    /// from the store) left running in the workspace before restoring it
    /// ([`crate::take_over`]).
    pub lease: Option<(String, u64)>,
    /// How much longer the lease is surely held (its holder's heartbeat knows). Set,
    /// with `lease`, an isolating sandbox outlives the process that made it: its
    /// commands run on if that process dies, for the next holder on this machine to
    /// adopt, and it ends itself when the hold is not renewed in time (see
    /// [`crate::agent`]).
    pub hold: Option<crate::Hold>,
}

pub use steadfast_log::WORKSPACE_MOUNT;

impl Default for SandboxOptions {
    fn default() -> Self {
        SandboxOptions {
            env: BTreeMap::new(),
            default_timeout: Duration::from_secs(120),
            max_timeout: Duration::from_secs(600),
            max_output_bytes: 8 * 1024 * 1024,
            backend: crate::Backend::default(),
            require_isolation: false,
            network: crate::NetworkPolicy::default(),
            internal_hosts: Vec::new(),
            inject: Vec::new(),
            egress_watch: None,
            limits: crate::ResourceLimits::default(),
            read_only_paths: Vec::new(),
            read_only_mounts: Vec::new(),
            forwards: Vec::new(),
            agent: Vec::new(),
            mount_at: None,
            lease: None,
            hold: None,
        }
    }
}

/// Whether an environment variable name looks like it carries a credential.
pub fn looks_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    ["KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL", "AUTH"]
        .iter()
        .any(|s| upper.contains(s))
}

/// A sandbox that runs tools directly on this machine, in one workspace directory.
#[derive(Debug)]
pub struct LocalSandbox {
    root: PathBuf,
    /// Kept for its `Drop`, which removes the directory.
    _home: tempfile_dir::Home,
    pub(crate) env: Vec<(String, String)>,
    options: SandboxOptions,
    registry: PathBuf,
}

mod tempfile_dir {
    use std::collections::HashSet;
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;

    /// The homes of this process's live local sandboxes.
    static IN_USE: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);

    /// A private home directory for commands, outside the workspace, removed on drop.
    ///
    /// Its path is the same every run: `steadfast-home-<workspace hash>-<n>`, with `n`
    /// the lowest slot no live sandbox of this process over the same workspace holds
    /// (so a wrapped CLI's sandbox and its tools' sandbox get homes of their own, and
    /// a CLI started again to replay a turn sees the home path it saw the first time).
    /// It starts empty every time, as an isolating backend's home does.
    #[derive(Debug)]
    pub struct Home(pub PathBuf);

    impl Home {
        pub fn claim(root: &Path) -> std::io::Result<Home> {
            let key = blake3::hash(root.to_string_lossy().as_bytes()).to_hex();
            let mut guard = IN_USE.lock().unwrap_or_else(|e| e.into_inner());
            let in_use = guard.get_or_insert_with(HashSet::new);
            let home = (0..)
                .map(|n| std::env::temp_dir().join(format!("steadfast-home-{}-{n}", &key[..12])))
                .find(|h| !in_use.contains(h))
                .unwrap_or_default();
            reap_abandoned(in_use);
            let _ = std::fs::remove_dir_all(&home);
            std::fs::create_dir_all(&home)?;
            std::fs::write(owner_file(&home), std::process::id().to_string())?;
            in_use.insert(home.clone());
            Ok(Home(home))
        }
    }

    /// Beside each home: the process that made it.
    fn owner_file(home: &Path) -> PathBuf {
        home.with_extension("owner")
    }

    /// Removes the homes of processes that died without removing them (SIGKILL).
    fn reap_abandoned(in_use: &HashSet<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
            return;
        };
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            let is_owner_file = path.extension().is_some_and(|e| e == "owner")
                && entry
                    .file_name()
                    .to_string_lossy()
                    .starts_with("steadfast-home-");
            if !is_owner_file {
                continue;
            }
            let home = path.with_extension("");
            let owner = std::fs::read_to_string(&path)
                .ok()
                .and_then(|p| p.trim().parse::<i32>().ok());
            let alive = owner.is_some_and(|pid| {
                pid == std::process::id() as i32
                    || nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
            });
            if !alive && !in_use.contains(&home) {
                let _ = std::fs::remove_dir_all(&home);
                let _ = std::fs::remove_file(&path);
            }
        }
    }

    impl Drop for Home {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
            let _ = std::fs::remove_file(owner_file(&self.0));
            let mut guard = IN_USE.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(in_use) = guard.as_mut() {
                in_use.remove(&self.0);
            }
        }
    }
}

impl LocalSandbox {
    /// A sandbox over `workspace` (created if missing).
    pub fn new(workspace: &Path, options: SandboxOptions) -> Result<Self> {
        std::fs::create_dir_all(workspace)
            .map_err(|e| Error::Unavailable(format!("{}: {e}", workspace.display())))?;
        let root = workspace
            .canonicalize()
            .map_err(|e| Error::Unavailable(format!("{}: {e}", workspace.display())))?;
        let registry = crate::orphans::registry(&root);
        crate::orphans::reap(&registry, &root);
        let home = tempfile_dir::Home::claim(&root)
            .map_err(|e| Error::Unavailable(format!("a home for commands: {e}")))?;
        let home_str = home.0.display().to_string();
        let env = crate::env::command_env(&home_str, &home_str, &options);
        Ok(LocalSandbox {
            root,
            _home: home,
            registry,
            env,
            options,
        })
    }
}

impl Sandbox for LocalSandbox {
    fn workspace(&self) -> &Path {
        &self.root
    }

    async fn execute(&self, tool: &str, input: &serde_json::Value) -> Result<ToolOutput> {
        let ctx = Context {
            root: &self.root,
            env: &self.env,
            options: &self.options,
            registry: Some(&self.registry),
            limits: None,
        };
        Ok(tools::run(&ctx, tool, input).await)
    }
}
