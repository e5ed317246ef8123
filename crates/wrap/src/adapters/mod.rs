//! How each wrapped CLI is installed, pointed at the gateway and the MCP tools, and
//! started for a turn.
//!
//! Every adapter resumes the same way after a crash: the CLI is started again for the
//! turn from its beginning and walks back through the log (the gateway answers its
//! recorded model requests, the journal its recorded tool calls) to where it was. We
//! chose this over each CLI's own resume mechanism (Claude Code's `--resume`, Codex's
//! `resume`, Pi's sessions) because it is one mechanism for all of them, needs no
//! knowledge of their transcript formats, and cannot disagree with the log: the CLI's
//! own transcript is rebuilt from the log every time, so there is never a transcript
//! with a tool call and no result to repair. A tool call a crash cut off is resolved
//! before the restart (invariant 4) and the CLI, replaying, gets that resolution as the
//! tool's result — the model is told the call was interrupted.
//!
//! Turns continue the same way for every CLI: each turn's CLI is a new process given
//! only the turn's message, and the gateway puts the conversation the last turn's run
//! kept (in the log, its items in the blob store) in front of that message in each
//! conversation request (`steadfast_gateway::history`). The model sees every earlier
//! message, tool call and result, as the CLI run interactively would send them.
//!
//! | adapter | API | built-in tools | tools |
//! |---|---|---|---|
//! | `claude-code` | Anthropic Messages | off (`--tools ""`) | MCP (`--mcp-config`, `--strict-mcp-config`) |
//! | `codex` | OpenAI Responses | off where Codex allows | MCP (`[mcp_servers]` in `config.toml`) |
//! | `pi` | Anthropic Messages or OpenAI Chat (by the session's provider) | off (`--no-builtin-tools`) | an extension (`-e`) calling the MCP server |
//! | `opencode` | Anthropic Messages or OpenAI Responses (by the session's provider) | off (`"tools": {...: false}`) | MCP (`"mcp"` in its inline config) |
//!
//! **Adding a CLI** is one file here implementing [`Cli`] (its npm package, the version
//! it is pinned to and the range it is tested with, its executable, and the shell
//! command that runs one turn pointed at the gateway and the MCP server with every
//! built-in tool that would bypass the journal turned off) and one line in
//! [`CLIS`]. Nothing else in Steadfast knows which CLIs exist.

use std::path::{Path, PathBuf};

mod claude_code;
mod codex;
mod opencode;
mod pi;

/// One wrapped CLI: how it is installed and how it runs a turn. Implementations are
/// stateless; the command they build is the whole contract with the CLI:
///
/// - it must send every model request to `launch.gateway` with `launch.token` as its
///   key (the provider's real key never reaches it);
/// - it must get its tools only from the MCP server at `launch.mcp` (any built-in that
///   runs commands, edits files or reaches the network is turned off, or its effects
///   would bypass the journal);
/// - it must be deterministic given the same replies and tool results (no state kept
///   between runs: a turn is replayed by starting it again);
/// - it prints the turn's final answer on stdout and exits 0, or exits non-zero.
pub trait Cli: Send + Sync + 'static {
    /// The adapter's name (`--agent <name>`, `"agent": "<name>"`).
    fn name(&self) -> &'static str;
    /// The npm package that installs it.
    fn package(&self) -> &'static str;
    /// The version installed by default (what the tests pin).
    fn pinned(&self) -> &'static str;
    /// The versions it is tested with.
    fn tested(&self) -> &'static str;
    /// Its executable, relative to the install prefix.
    fn bin(&self) -> &'static str;
    /// The model providers whose APIs it speaks (`anthropic`, `openai`): a session
    /// of it with a model of another is refused.
    fn providers(&self) -> &'static [&'static str];
    /// The shell command (run with `bash -c` in the CLI's sandbox) for one turn;
    /// `bin` is the executable, shell-quoted.
    fn command(&self, bin: &str, launch: &Launch<'_>) -> String;
}

/// Every CLI Steadfast can wrap.
pub const CLIS: &[&dyn Cli] = &[
    &claude_code::ClaudeCode,
    &codex::Codex,
    &pi::Pi,
    &opencode::OpenCode,
];

/// A wrapped CLI as a session's agent runs it: which CLI, at which version, under
/// which name.
#[derive(Clone)]
pub struct Adapter {
    /// Its name (`--agent <name>`): the adapter's, or a named agent's.
    pub name: String,
    /// The npm package that installs it.
    pub package: &'static str,
    /// The version sessions of this agent run: the pinned one unless chosen
    /// (`install-agent claude-code@2.1.332`, `version = ...` of a named agent).
    pub version: String,
    /// The version the tests pin (the default).
    pub pinned: &'static str,
    /// The versions the adapter is tested with.
    pub tested: &'static str,
    cli: &'static dyn Cli,
}

impl std::fmt::Debug for Adapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Adapter")
            .field("name", &self.name)
            .field("cli", &self.cli.name())
            .field("version", &self.version)
            .finish()
    }
}

impl PartialEq for Adapter {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
            && self.cli.name() == other.cli.name()
            && self.version == other.version
    }
}

impl Eq for Adapter {}

/// What a turn's launch needs to know.
#[derive(Debug, Clone)]
pub struct Launch<'a> {
    /// The gateway's base URL as the CLI reaches it (`http://127.0.0.1:PORT`).
    pub gateway: &'a str,
    /// The MCP server's URL as the CLI reaches it (`http://127.0.0.1:PORT/mcp`).
    pub mcp: &'a str,
    /// The session-scoped token the gateway accepts.
    pub token: &'a str,
    /// The user's message for the turn.
    pub task: &'a str,
    /// Instructions to give the CLI on top of its own system prompt, if any.
    pub instructions: Option<&'a str>,
    /// The provider (`anthropic` or `openai`): which of the gateway's APIs a CLI that
    /// speaks several uses.
    pub provider: &'a str,
    /// The provider's model name.
    pub model: &'a str,
    /// Where the npm packages are installed (`<dir>/node_modules/.bin/...`).
    pub install_dir: &'a Path,
}

/// Single-quotes a word for the shell.
pub fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

impl Adapter {
    /// The adapter named `name`, if there is one, at its pinned version.
    pub fn named(name: &str) -> Option<Adapter> {
        let cli = *CLIS.iter().find(|c| c.name() == name)?;
        Some(Adapter {
            name: name.to_string(),
            package: cli.package(),
            version: cli.pinned().to_string(),
            pinned: cli.pinned(),
            tested: cli.tested(),
            cli,
        })
    }

    /// The adapter's own name (a named agent's adapter).
    pub fn cli_name(&self) -> &'static str {
        self.cli.name()
    }

    /// Which provider's API its CLI calls for models of `provider` (`anthropic` or
    /// `openai`), or why it cannot run them. The bundled fake provider speaks every
    /// API: a CLI calls it with its own.
    pub fn api_for(&self, provider: &str) -> Result<&'static str, String> {
        let speaks = self.cli.providers();
        if provider == "fake" {
            return Ok(speaks[0]);
        }
        if let Some(api) = speaks.iter().find(|p| **p == provider) {
            Ok(api)
        } else {
            Err(format!(
                "{} speaks only {}'s API; `{provider}` models cannot run in it",
                self.cli.name(),
                speaks.join(" and ")
            ))
        }
    }

    /// The same adapter at `version` (`None`: the pinned one). A version must look
    /// like one (digits, dots, a pre-release tag); anything else is refused.
    pub fn at_version(mut self, version: Option<&str>) -> Result<Adapter, String> {
        let Some(version) = version.filter(|v| !v.is_empty()) else {
            return Ok(self);
        };
        let ok = version.chars().next().is_some_and(|c| c.is_ascii_digit())
            && version
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+'));
        if !ok {
            return Err(format!(
                "version `{version}` of {} is not a version (e.g. {})",
                self.package, self.pinned
            ));
        }
        self.version = version.to_string();
        Ok(self)
    }

    /// Where this version is installed under `dir`: the pinned version at `dir`
    /// itself, any other in a directory of its own.
    pub fn prefix(&self, dir: &Path) -> PathBuf {
        if self.version == self.pinned {
            dir.to_path_buf()
        } else {
            dir.join(format!(
                "{}@{}",
                self.package.replace('/', "+"),
                self.version
            ))
        }
    }

    /// The names of every adapter.
    pub fn names() -> Vec<&'static str> {
        CLIS.iter().map(|c| c.name()).collect()
    }

    /// The command that installs the CLI into `dir` (run once, outside any session;
    /// nothing is fetched while a session runs).
    pub fn install_command(&self, dir: &Path) -> String {
        let prefix = quote(&self.prefix(dir).display().to_string());
        format!(
            "mkdir -p {prefix} && cd {prefix} && {{ [ -f package.json ] || printf '{{\"private\": true}}\\n' > package.json; }} && npm install --no-audit --no-fund --save-exact {}@{}",
            self.package, self.version
        )
    }

    /// Installs this version of the CLI under `dir` with npm (the registry must be
    /// reachable), and checks that it is there. npm and what it runs keep their
    /// temporary files in the install directory, and they go when it ends (OpenCode's
    /// package left `/tmp/opencode` behind). Blocks until npm is done; the error says
    /// what failed.
    pub fn install(&self, dir: &Path) -> Result<(), String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let scratch = tempfile::Builder::new()
            .prefix(".install-tmp")
            .tempdir_in(dir)
            .map_err(|e| format!("a scratch directory in {}: {e}", dir.display()))?;
        let command = self.install_command(dir);
        let status = std::process::Command::new("bash")
            .args(["-c", &command])
            .env("TMPDIR", scratch.path())
            .stdin(std::process::Stdio::null())
            .status()
            .map_err(|e| format!("{command}: {e}"))?;
        drop(scratch);
        if !status.success() {
            return Err(format!("npm install failed ({status}): {command}"));
        }
        if !self.is_installed(dir) {
            return Err(format!(
                "npm ran, but {}@{} is not at {}",
                self.package,
                self.version,
                self.executable(dir).display()
            ));
        }
        Ok(())
    }

    /// The version of the CLI installed under `dir`, if one is (read from its
    /// package's `package.json`).
    pub fn installed_version(&self, dir: &Path) -> Option<String> {
        let manifest = self
            .prefix(dir)
            .join("node_modules")
            .join(self.package)
            .join("package.json");
        let text = std::fs::read_to_string(manifest).ok()?;
        let json: serde_json::Value = serde_json::from_str(&text).ok()?;
        json["version"].as_str().map(str::to_string)
    }

    /// Whether this version of the CLI is installed under `dir`.
    pub fn is_installed(&self, dir: &Path) -> bool {
        self.executable(dir).exists()
            && self.installed_version(dir).as_deref() == Some(self.version.as_str())
    }

    /// The CLI's executable under `dir`.
    pub fn executable(&self, dir: &Path) -> PathBuf {
        self.prefix(dir).join(self.cli.bin())
    }

    /// The shell command that runs one turn of the CLI inside its sandbox.
    pub fn command(&self, launch: &Launch<'_>) -> String {
        let bin = quote(&self.executable(launch.install_dir).display().to_string());
        self.cli.command(&bin, launch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_is_a_version_and_nothing_a_shell_would_run() {
        let claude = Adapter::named("claude-code").unwrap();
        for bad in ["1.0;rm -rf /", "$(id)", "latest", "2.1 .3", "../x", "`x`"] {
            assert!(claude.clone().at_version(Some(bad)).is_err(), "{bad}");
        }
        let newer = claude.clone().at_version(Some("2.1.332")).unwrap();
        assert_eq!(newer.version, "2.1.332");
        // Each version has a prefix of its own; the pinned one is the directory itself.
        let dir = Path::new("/agents");
        assert_eq!(claude.prefix(dir), dir);
        assert_ne!(newer.prefix(dir), dir);
        assert!(newer
            .install_command(dir)
            .contains("@anthropic-ai/claude-code@2.1.332"));
        assert!(Adapter::named("aider").is_none());
        assert_eq!(Adapter::names(), ["claude-code", "codex", "pi", "opencode"]);
    }
}
