//! The built-in tools and the schemas the model is shown.

mod bash;
mod files;
mod open;
mod search;
mod service;

use std::path::Path;

use serde::Serialize;
use serde_json::{json, Value};

use crate::{ResourceLimits, SandboxOptions, ToolOutput};

/// What a tool needs to run.
pub(crate) struct Context<'a> {
    pub root: &'a Path,
    pub env: &'a [(String, String)],
    pub options: &'a SandboxOptions,
    /// Where running commands are recorded (see `orphans`), when they can outlive us.
    pub registry: Option<&'a Path>,
    /// Resource limits for commands (enforced inside an isolating sandbox).
    pub limits: Option<&'a ResourceLimits>,
}

/// A tool as offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolSpec {
    /// Its name.
    pub name: &'static str,
    /// What it does, for the model.
    pub description: &'static str,
    /// JSON Schema of its input.
    pub input_schema: Value,
}

/// The built-in tools, as offered to the model.
pub fn tool_specs() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "bash",
            description: "Run a bash command in the workspace directory and return its combined stdout and stderr. Optional timeout in milliseconds (default 120000, max 600000).",
            input_schema: json!({"type": "object", "properties": {
                "command": {"type": "string"},
                "timeout": {"type": "integer"}
            }, "required": ["command"]}),
        },
        ToolSpec {
            name: "service",
            description: "Long-lived processes (dev server, database, watcher) that outlive the call: start (name, command, port to wait for), stop, logs, status.",
            input_schema: service::spec_schema(),
        },
        ToolSpec {
            name: "read",
            description: "Read a file of the workspace. Returns lines numbered from 1, like cat -n. Use offset (first line, 1-based) and limit (number of lines) for large files.",
            input_schema: json!({"type": "object", "properties": {
                "file_path": {"type": "string"},
                "offset": {"type": "integer"},
                "limit": {"type": "integer"}
            }, "required": ["file_path"]}),
        },
        ToolSpec {
            name: "write",
            description: "Write a file of the workspace, replacing it if it exists and creating parent directories.",
            input_schema: json!({"type": "object", "properties": {
                "file_path": {"type": "string"},
                "content": {"type": "string"}
            }, "required": ["file_path", "content"]}),
        },
        ToolSpec {
            name: "edit",
            description: "Replace an exact string in a file. old_string must occur exactly once unless replace_all is true; it must differ from new_string. An empty old_string creates a new file containing new_string.",
            input_schema: json!({"type": "object", "properties": {
                "file_path": {"type": "string"},
                "old_string": {"type": "string"},
                "new_string": {"type": "string"},
                "replace_all": {"type": "boolean"}
            }, "required": ["file_path", "old_string", "new_string"]}),
        },
        ToolSpec {
            name: "glob",
            description: "List workspace files matching a glob pattern such as **/*.rs, newest first.",
            input_schema: json!({"type": "object", "properties": {
                "pattern": {"type": "string"},
                "path": {"type": "string"}
            }, "required": ["pattern"]}),
        },
        ToolSpec {
            name: "grep",
            description: "Search workspace files with a regular expression. output_mode: files_with_matches (default), content (path:line:text) or count. Optional glob filter and -i for case-insensitive.",
            input_schema: json!({"type": "object", "properties": {
                "pattern": {"type": "string"},
                "path": {"type": "string"},
                "glob": {"type": "string"},
                "output_mode": {"type": "string", "enum": ["files_with_matches", "content", "count"]},
                "-i": {"type": "boolean"},
                "head_limit": {"type": "integer"}
            }, "required": ["pattern"]}),
        },
    ]
}

pub(crate) fn str_arg<'v>(input: &'v Value, names: &[&str]) -> Result<&'v str, String> {
    names
        .iter()
        .find_map(|n| input.get(*n).and_then(Value::as_str))
        .ok_or_else(|| format!("missing required string parameter `{}`", names[0]))
}

pub(crate) fn opt_u64(input: &Value, name: &str) -> Option<u64> {
    input.get(name).and_then(Value::as_u64)
}

/// Runs a tool by name.
pub(crate) async fn run(ctx: &Context<'_>, tool: &str, input: &Value) -> ToolOutput {
    if !input.is_object() {
        return ToolOutput::error(format!("{tool}: input must be a JSON object"));
    }
    let file_tool: fn(&Path, &Value) -> Result<String, String> = match tool {
        "bash" => return bash::run(ctx, input).await,
        "service" => return service::run(ctx, input).await,
        "read" => files::read,
        "write" => files::write,
        "edit" => files::edit,
        "glob" => search::glob,
        "grep" => search::grep,
        other => {
            return ToolOutput::error(format!(
                "unknown tool `{other}`; available: bash, service, read, write, edit, glob, grep"
            ))
        }
    };
    // Inline, never on a pool thread: a tool call whose future is dropped (an
    // interrupt, a stop) must not go on writing after its outcome's snapshot. Nothing
    // here waits: opens are non-blocking and reads bounded (see `open`).
    match file_tool(ctx.root, input) {
        Ok(text) => ToolOutput::ok(text),
        Err(e) => ToolOutput::error(e),
    }
}

#[cfg(test)]
mod tests;
