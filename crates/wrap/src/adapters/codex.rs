//! Codex (`@openai/codex`): the gateway as a Responses-API provider, the journaled tools
//! as an MCP server, every built-in that runs commands or reaches the network off.

use super::{quote, Cli, Launch};

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

/// The `codex` adapter.
pub struct Codex;

impl Cli for Codex {
    fn name(&self) -> &'static str {
        "codex"
    }

    fn package(&self) -> &'static str {
        "@openai/codex"
    }

    fn pinned(&self) -> &'static str {
        "0.171.0"
    }

    fn tested(&self) -> &'static str {
        "0.171.0"
    }

    fn bin(&self) -> &'static str {
        "node_modules/.bin/codex"
    }

    fn providers(&self) -> &'static [&'static str] {
        &["openai"]
    }

    fn command(&self, bin: &str, launch: &Launch<'_>) -> String {
        let mut config = CODEX_CONFIG
            .replace("{model}", launch.model)
            .replace("{gateway}", launch.gateway)
            .replace("{mcp}", launch.mcp);
        // A root key, so it goes before the tables.
        if let Some(instructions) = launch.instructions {
            let value = toml::Value::String(instructions.to_string());
            config = format!("developer_instructions = {value}\n{config}");
        }
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
}
