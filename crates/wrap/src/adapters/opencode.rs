//! OpenCode (`opencode-ai`): the gateway as its `anthropic` or `openai` provider (by the
//! session's provider), every built-in tool off — its own `bash`, `edit`, `write` and
//! the rest would change the workspace outside the journal — and the journaled tools
//! from the MCP server, all in an inline configuration (`OPENCODE_CONFIG_CONTENT`) so
//! nothing in the workspace or its home is read or written to configure it. No title
//! request (`--title`), no model catalogue fetched, no update check, no sharing, no
//! snapshots of its own; the final answer is the last text of its JSON event stream.

use super::{quote, Cli, Launch};

/// Every built-in tool OpenCode has, turned off.
const BUILTINS: &[&str] = &[
    "bash",
    "edit",
    "write",
    "read",
    "glob",
    "grep",
    "list",
    "patch",
    "multiedit",
    "apply_patch",
    "webfetch",
    "websearch",
    "codesearch",
    "todowrite",
    "todoread",
    "task",
    "skill",
    "lsp",
    "question",
];

/// Prints the last text part of OpenCode's JSON events (`--format json`), or its last
/// error with a non-zero exit.
const LAST_TEXT: &str = r#"let text = "", error = "";
for (const line of require("fs").readFileSync(process.argv[1], "utf8").split("\n")) {
  try {
    const e = JSON.parse(line);
    if (e.type === "text" && e.part && typeof e.part.text === "string") text = e.part.text;
    if (e.type === "error") error = JSON.stringify(e.error || e);
  } catch (_) {}
}
if (!text && error) { process.stderr.write(error + "\n"); process.exit(1); }
process.stdout.write(text);"#;

/// Where the session's instructions are written, as OpenCode's configuration names it
/// and as the shell does.
const INSTRUCTIONS: &str = "{env:HOME}/.opencode-run/instructions.md";
const INSTRUCTIONS_SH: &str = "\"$HOME/.opencode-run/instructions.md\"";

/// The `opencode` adapter.
pub struct OpenCode;

impl Cli for OpenCode {
    fn name(&self) -> &'static str {
        "opencode"
    }

    fn package(&self) -> &'static str {
        "opencode-ai"
    }

    fn pinned(&self) -> &'static str {
        "1.18.33"
    }

    fn tested(&self) -> &'static str {
        "1.18.33"
    }

    fn bin(&self) -> &'static str {
        "node_modules/.bin/opencode"
    }

    fn providers(&self) -> &'static [&'static str] {
        &["anthropic", "openai"]
    }

    fn command(&self, bin: &str, launch: &Launch<'_>) -> String {
        let provider = match launch.provider {
            "openai" => "openai",
            _ => "anthropic",
        };
        let tools: serde_json::Map<String, serde_json::Value> = BUILTINS
            .iter()
            .map(|t| (t.to_string(), serde_json::Value::Bool(false)))
            .collect();
        let mut config = serde_json::json!({
            "model": format!("{provider}/{}", launch.model),
            "autoupdate": false,
            "share": "disabled",
            "snapshot": false,
            "provider": {provider: {
                "options": {"baseURL": format!("{}/v1", launch.gateway), "apiKey": launch.token},
                "models": {launch.model: {}},
            }},
            "mcp": {crate::mcp::SERVER_NAME: {"type": "remote", "url": launch.mcp, "enabled": true}},
            "tools": tools,
            "permission": {"bash": "deny", "edit": "deny", "webfetch": "deny"},
        });
        // OpenCode takes instructions as files: the session's are written to one of
        // their own, named through its `{env:...}` substitution.
        let write_instructions = match launch.instructions {
            Some(text) => {
                config["instructions"] = serde_json::json!([INSTRUCTIONS]);
                format!("printf '%s' {} > {INSTRUCTIONS_SH} && ", quote(text))
            }
            None => String::new(),
        };
        format!(
            "export OPENCODE_CONFIG_CONTENT={config} OPENCODE_DISABLE_MODELS_FETCH=1 \
             OPENCODE_DISABLE_AUTOUPDATE=1 OPENCODE_DISABLE_LSP_DOWNLOAD=1 \
             OPENCODE_DISABLE_DEFAULT_PLUGINS=1 OPENCODE_DISABLE_CLAUDE_CODE=1; \
             mkdir -p \"$HOME/.opencode-run\" && {write_instructions}\
             {bin} run --pure --auto --title steadfast --format json -m {model} {task} \
             > \"$HOME/.opencode-run/events.jsonl\" 2> \"$HOME/.opencode-run/stderr.log\"; \
             rc=$?; if [ $rc != 0 ]; then tail -c 4000 \"$HOME/.opencode-run/stderr.log\"; exit $rc; fi; \
             node -e {last} \"$HOME/.opencode-run/events.jsonl\"",
            config = quote(&config.to_string()),
            model = quote(&format!("{provider}/{}", launch.model)),
            task = quote(launch.task),
            last = quote(LAST_TEXT),
        )
    }
}
