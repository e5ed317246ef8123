//! Claude Code (`@anthropic-ai/claude-code`): the Anthropic Messages API through the gateway, its
//! built-in tools off (`--tools ""`), the journaled tools over MCP (`--mcp-config`,
//! `--strict-mcp-config`).

use super::{quote, Cli, Launch};

/// The `claude-code` adapter.
pub struct ClaudeCode;

impl Cli for ClaudeCode {
    fn name(&self) -> &'static str {
        "claude-code"
    }

    fn package(&self) -> &'static str {
        "@anthropic-ai/claude-code"
    }

    fn pinned(&self) -> &'static str {
        "2.1.197"
    }

    fn tested(&self) -> &'static str {
        "2.1.197 to 2.1.332"
    }

    fn bin(&self) -> &'static str {
        "node_modules/.bin/claude"
    }

    fn providers(&self) -> &'static [&'static str] {
        &["anthropic"]
    }

    fn command(&self, bin: &str, launch: &Launch<'_>) -> String {
        let mcp = serde_json::json!({"mcpServers": {crate::mcp::SERVER_NAME: {"type": "http", "url": launch.mcp}}});
        format!(
            "export IS_SANDBOX=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_AUTOUPDATER=1 \
             DISABLE_TELEMETRY=1 DISABLE_ERROR_REPORTING=1 \
             ANTHROPIC_BASE_URL={gw} ANTHROPIC_API_KEY={token}; \
             exec {bin} -p {task} --tools '' --mcp-config {mcp} --strict-mcp-config \
             --dangerously-skip-permissions --model {model} --output-format text{extra}",
            extra = launch
                .instructions
                .map(|i| format!(" --append-system-prompt {}", quote(i)))
                .unwrap_or_default(),
            gw = quote(launch.gateway),
            token = quote(launch.token),
            task = quote(launch.task),
            mcp = quote(&mcp.to_string()),
            model = quote(launch.model),
        )
    }
}
