//! Tools a session's client runs: the model calls them like any other tool, and the
//! session waits, durably (no worker, no sandbox held), until the client posts the
//! result (the `tool_result` signal). The intent and the wait are appended together,
//! so a crash cannot separate them, and the call is in the log once: a client asked
//! for a result is never asked again.

use steadfast_log::ClientTool;

/// The longest name a client tool may have (the providers' limit).
const MAX_NAME: usize = 64;
/// The most client tools one session may declare.
const MAX_TOOLS: usize = 64;

/// Checks a session's client tools: only the native agent runs them (a wrapped CLI's
/// tools are its own), each has a name the providers accept and no built-in tool
/// has, names are unique, and each input schema is a JSON Schema object.
pub fn check(agent: &str, tools: &[ClientTool]) -> Result<(), String> {
    if tools.is_empty() {
        return Ok(());
    }
    if !steadfast_log::agent::is_native(agent) {
        return Err(format!(
            "tools: client tools are offered to the native agent only, not to `{agent}`"
        ));
    }
    if tools.len() > MAX_TOOLS {
        return Err(format!("tools: at most {MAX_TOOLS}"));
    }
    let builtin: Vec<&str> = steadfast_sandbox::tool_specs()
        .iter()
        .map(|t| t.name)
        .chain([crate::APPROVAL_TOOL, crate::git::GIT_PUSH_TOOL])
        .collect();
    let mut seen = std::collections::BTreeSet::new();
    for tool in tools {
        let name = &tool.name;
        let valid = !name.is_empty()
            && name.len() <= MAX_NAME
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid {
            return Err(format!(
                "tools: `{}` is not a tool name (letters, digits, _ and -, at most {MAX_NAME})",
                name.escape_debug()
            ));
        }
        if builtin.contains(&name.as_str()) {
            return Err(format!("tools: `{name}` is a built-in tool's name"));
        }
        if !seen.insert(name.as_str()) {
            return Err(format!("tools: two tools are named `{name}`"));
        }
        if tool.input_schema.get("type").and_then(|t| t.as_str()) != Some("object") {
            return Err(format!(
                "tools: `{name}`: input_schema must be a JSON Schema with \"type\": \"object\""
            ));
        }
    }
    Ok(())
}

/// The client tool called `name`, if the session declared one.
pub(crate) fn find<'a>(tools: &'a [ClientTool], name: &str) -> Option<&'a ClientTool> {
    tools.iter().find(|t| t.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(name: &str, schema: serde_json::Value) -> ClientTool {
        ClientTool {
            name: name.into(),
            description: String::new(),
            input_schema: schema,
        }
    }

    #[test]
    fn names_schemas_and_agents_are_checked() {
        let object = json!({"type": "object"});
        assert!(check("native", &[tool("lookup_ticket", object.clone())]).is_ok());
        for (agent, tools, says) in [
            (
                "claude-code",
                vec![tool("t", object.clone())],
                "native agent only",
            ),
            ("native", vec![tool("bash", object.clone())], "built-in"),
            (
                "native",
                vec![tool("request_approval", object.clone())],
                "built-in",
            ),
            (
                "native",
                vec![tool("has space", object.clone())],
                "not a tool name",
            ),
            ("native", vec![tool("", object.clone())], "not a tool name"),
            (
                "native",
                vec![tool("t", object.clone()), tool("t", object.clone())],
                "two tools",
            ),
            (
                "native",
                vec![tool("t", json!({"type": "string"}))],
                "input_schema",
            ),
        ] {
            let err = check(agent, &tools).unwrap_err();
            assert!(err.contains(says), "{err}");
        }
    }
}
