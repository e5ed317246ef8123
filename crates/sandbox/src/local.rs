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
}

impl Default for SandboxOptions {
    fn default() -> Self {
        SandboxOptions {
            env: BTreeMap::new(),
            default_timeout: Duration::from_secs(120),
            max_timeout: Duration::from_secs(600),
            max_output_bytes: 8 * 1024 * 1024,
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
    env: Vec<(String, String)>,
    options: SandboxOptions,
    registry: PathBuf,
}

mod tempfile_dir {
    /// A private home directory for commands, outside the workspace, removed on drop.
    #[derive(Debug)]
    pub struct Home(pub std::path::PathBuf);
    impl Drop for Home {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
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
        let home = std::env::temp_dir().join(format!(
            "steadfast-home-{}-{}",
            std::process::id(),
            blake3::hash(root.to_string_lossy().as_bytes())
                .to_hex()
                .get(..12)
                .unwrap_or("x")
        ));
        std::fs::create_dir_all(&home)
            .map_err(|e| Error::Unavailable(format!("{}: {e}", home.display())))?;
        let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
        let mut env: BTreeMap<String, String> = [
            ("PATH", path),
            ("HOME", home.display().to_string()),
            ("TMPDIR", home.display().to_string()),
            ("LANG", "C.UTF-8".to_string()),
            ("TERM", "dumb".to_string()),
            ("NO_COLOR", "1".to_string()),
            ("SHELL", "/bin/bash".to_string()),
            ("USER", "agent".to_string()),
            // Bytecode caches embed source mtimes, which restores change: noise in
            // every snapshot and never what the agent meant to write.
            ("PYTHONDONTWRITEBYTECODE", "1".to_string()),
            ("GIT_TERMINAL_PROMPT", "0".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        for (k, v) in &options.env {
            if !looks_secret(k) {
                env.insert(k.clone(), v.clone());
            }
        }
        Ok(LocalSandbox {
            root,
            _home: tempfile_dir::Home(home),
            registry,
            env: env.into_iter().collect(),
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
            registry: &self.registry,
        };
        Ok(tools::run(&ctx, tool, input).await)
    }
}
