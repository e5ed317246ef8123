//! Pi (`@mariozechner/pi-coding-agent`): Anthropic Messages or OpenAI Chat by the session's
//! provider, its built-in tools off (`--no-builtin-tools`), the journaled tools through
//! an extension (`-e`) that calls the MCP server (Pi has no MCP client).

use super::{quote, Cli, Launch};

/// Pi's extension that gives it the journaled tools.
const PI_TOOLS: &str = include_str!("pi_tools.js");

/// The `pi` adapter.
pub struct Pi;

impl Cli for Pi {
    fn name(&self) -> &'static str {
        "pi"
    }

    fn package(&self) -> &'static str {
        "@mariozechner/pi-coding-agent"
    }

    fn pinned(&self) -> &'static str {
        "0.73.1"
    }

    fn tested(&self) -> &'static str {
        "0.73.1"
    }

    fn bin(&self) -> &'static str {
        "node_modules/.bin/pi"
    }

    fn providers(&self) -> &'static [&'static str] {
        &["anthropic", "openai"]
    }

    fn command(&self, bin: &str, launch: &Launch<'_>) -> String {
        let (api, base) = match launch.provider {
            "openai" => ("openai-completions", format!("{}/v1", launch.gateway)),
            _ => ("anthropic-messages", launch.gateway.to_string()),
        };
        let models = serde_json::json!({"providers": {"steadfast": {
            "baseUrl": base, "api": api, "apiKey": launch.token,
            "models": [{"id": launch.model}],
        }}});
        // Pi reads a text that names a file as that file: the instructions are given
        // as a file of their own, so no text is ever taken for a path.
        let (write_instructions, append) = match launch.instructions {
            Some(text) => (
                format!(
                    "printf '%s' {} > \"$HOME/.pi/instructions.md\" && ",
                    quote(text)
                ),
                " --append-system-prompt \"$HOME/.pi/instructions.md\"",
            ),
            None => (String::new(), ""),
        };
        format!(
            "export PI_OFFLINE=1 STEADFAST_MCP_URL={mcp}; mkdir -p \"$HOME/.pi/agent\" && \
             printf '%s' {models} > \"$HOME/.pi/agent/models.json\" && \
             printf '%s' {tools} > \"$HOME/.pi/steadfast-tools.js\" && {write_instructions}\
             exec {bin} -p --no-builtin-tools --no-extensions -e \"$HOME/.pi/steadfast-tools.js\" \
             --no-skills --no-prompt-templates --no-context-files --no-session --offline \
             --provider steadfast --model {model}{append} {task}",
            mcp = quote(launch.mcp),
            models = quote(&models.to_string()),
            tools = quote(PI_TOOLS),
            model = quote(launch.model),
            task = quote(launch.task),
        )
    }
}
