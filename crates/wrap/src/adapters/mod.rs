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
//! | adapter | API | built-in tools | tools |
//! |---|---|---|---|
//! | `claude-code` | Anthropic Messages | off (`--tools ""`) | MCP (`--mcp-config`, `--strict-mcp-config`) |
//! | `codex` | OpenAI Responses | off where Codex allows | MCP (`[mcp_servers]` in `config.toml`) |
//! | `pi` | Anthropic Messages or OpenAI Chat (by the session's provider) | off (`--no-builtin-tools`) | an extension (`-e`) calling the MCP server |

use std::path::{Path, PathBuf};

/// A wrapped CLI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adapter {
    /// Its name (`--agent <name>`).
    pub name: String,
    /// The npm package that installs it.
    pub package: &'static str,
    /// The version sessions of this agent run: the pinned one unless chosen
    /// (`install-agent claude-code@2.1.332`, `version = ...` of a named agent).
    pub version: String,
    /// The version the tests pin (the default).
    pub pinned: &'static str,
    /// The versions the adapter is tested with (the pinned one and the newest the npm
    /// registry served when it was last checked).
    pub tested: &'static str,
    /// Its executable, relative to the install directory.
    pub bin: &'static str,
    kind: Kind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    ClaudeCode,
    Codex,
    Pi,
}

/// Pi's extension that gives it the journaled tools (Pi has no MCP client).
const PI_TOOLS: &str = include_str!("pi_tools.js");

/// Codex's configuration: the gateway as a Responses-API provider, the MCP tools, and
/// everything that would reach the network or run commands outside the journal off.
const CODEX_CONFIG: &str = r#"model = "{model}"
model_provider = "steadfast"
approval_policy = "never"
sandbox_mode = "danger-full-access"
web_search = "disabled"
check_for_update_on_startup = false

[model_providers.steadfast]
name = "steadfast"
base_url = "{gateway}/v1"
env_key = "STEADFAST_GATEWAY_TOKEN"
wire_api = "responses"

[mcp_servers.steadfast]
url = "{mcp}"

[features]
plugins = false
apps = false
shell_tool = false
unified_exec = false
view_image = false
goals = false
multi_agent = false
shell_snapshot = false
"#;

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
    /// The adapter named `name`, if there is one.
    pub fn named(name: &str) -> Option<Adapter> {
        match name {
            "claude-code" => Some(Adapter {
                name: name.into(),
                package: "@anthropic-ai/claude-code",
                version: "2.1.197".into(),
                pinned: "2.1.197",
                tested: ">=2.1.197 <3",
                bin: "node_modules/.bin/claude",
                kind: Kind::ClaudeCode,
            }),
            "codex" => Some(Adapter {
                name: name.into(),
                package: "@openai/codex",
                version: "0.171.0".into(),
                pinned: "0.171.0",
                tested: ">=0.171.0 <0.200",
                bin: "node_modules/.bin/codex",
                kind: Kind::Codex,
            }),
            "pi" => Some(Adapter {
                name: name.into(),
                package: "@mariozechner/pi-coding-agent",
                version: "0.73.1".into(),
                pinned: "0.73.1",
                tested: ">=0.73.1 <0.80",
                bin: "node_modules/.bin/pi",
                kind: Kind::Pi,
            }),
            _ => None,
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
    pub fn names() -> &'static [&'static str] {
        &["claude-code", "codex", "pi"]
    }

    /// The command that installs the CLI into `dir` (run once, outside any session;
    /// nothing is fetched while a session runs).
    pub fn install_command(&self, dir: &Path) -> String {
        let prefix = quote(&self.prefix(dir).display().to_string());
        format!(
            "mkdir -p {prefix} && cd {prefix} && npm install --no-audit --no-fund {}@{}",
            self.package, self.version
        )
    }

    /// The CLI's executable under `dir`.
    pub fn executable(&self, dir: &Path) -> PathBuf {
        self.prefix(dir).join(self.bin)
    }

    /// The shell command that runs one turn of the CLI inside its sandbox.
    pub fn command(&self, launch: &Launch<'_>) -> String {
        let bin = quote(&self.executable(launch.install_dir).display().to_string());
        match self.kind {
            Kind::ClaudeCode => {
                let mcp = serde_json::json!({"mcpServers": {crate::mcp::SERVER_NAME: {"type": "http", "url": launch.mcp}}});
                format!(
                    "export IS_SANDBOX=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_AUTOUPDATER=1 \
                     DISABLE_TELEMETRY=1 DISABLE_ERROR_REPORTING=1 \
                     ANTHROPIC_BASE_URL={gw} ANTHROPIC_API_KEY={token}; \
                     exec {bin} -p {task} --tools '' --mcp-config {mcp} --strict-mcp-config \
                     --dangerously-skip-permissions --model {model} --output-format text",
                    gw = quote(launch.gateway),
                    token = quote(launch.token),
                    task = quote(launch.task),
                    mcp = quote(&mcp.to_string()),
                    model = quote(launch.model),
                )
            }
            Kind::Codex => {
                let config = CODEX_CONFIG
                    .replace("{model}", launch.model)
                    .replace("{gateway}", launch.gateway)
                    .replace("{mcp}", launch.mcp);
                format!(
                    "export CODEX_HOME=\"$HOME/.codex\" STEADFAST_GATEWAY_TOKEN={token}; \
                     mkdir -p \"$CODEX_HOME\" && printf '%s' {config} > \"$CODEX_HOME/config.toml\" && \
                     {bin} exec --skip-git-repo-check --color never -m {model} \
                     -o \"$CODEX_HOME/last-message.txt\" {task} > \"$CODEX_HOME/run.log\" 2>&1; \
                     rc=$?; if [ $rc = 0 ]; then cat \"$CODEX_HOME/last-message.txt\"; \
                     else tail -c 4000 \"$CODEX_HOME/run.log\"; fi; exit $rc",
                    token = quote(launch.token),
                    config = quote(&config),
                    model = quote(launch.model),
                    task = quote(launch.task),
                )
            }
            Kind::Pi => {
                let (api, base) = match launch.provider {
                    "openai" => ("openai-completions", format!("{}/v1", launch.gateway)),
                    _ => ("anthropic-messages", launch.gateway.to_string()),
                };
                let models = serde_json::json!({"providers": {"steadfast": {
                    "baseUrl": base, "api": api, "apiKey": launch.token,
                    "models": [{"id": launch.model}],
                }}});
                format!(
                    "export PI_OFFLINE=1 STEADFAST_MCP_URL={mcp}; mkdir -p \"$HOME/.pi/agent\" && \
                     printf '%s' {models} > \"$HOME/.pi/agent/models.json\" && \
                     printf '%s' {tools} > \"$HOME/.pi/steadfast-tools.js\" && \
                     exec {bin} -p --no-builtin-tools --no-extensions -e \"$HOME/.pi/steadfast-tools.js\" \
                     --no-skills --no-prompt-templates --no-context-files --no-session --offline \
                     --provider steadfast --model {model} {task}",
                    mcp = quote(launch.mcp),
                    models = quote(&models.to_string()),
                    tools = quote(PI_TOOLS),
                    model = quote(launch.model),
                    task = quote(launch.task),
                )
            }
        }
    }
}
