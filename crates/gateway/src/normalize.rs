//! Request fingerprints that ignore what legitimately changes between two runs of the
//! same client over the same conversation.
//!
//! The fingerprint is BLAKE3 over the API name and the request's JSON (keys sorted)
//! after normalization:
//!
//! - top-level fields that identify a run rather than a conversation are dropped:
//!   `metadata` (Claude Code puts its per-run session id in `metadata.user_id`), `user`,
//!   `prompt_cache_key` and `safety_identifier` (Codex), and every `cache_control`
//!   (cache breakpoints move as a conversation grows);
//! - inside every string, UUIDs become `<uuid>`, ISO dates and times become `<date>` /
//!   `<time>` (Claude Code's system prompt carries today's date), and runs of ten or
//!   more digits become `<n>` (Unix timestamps, and the time-based ids Codex puts in
//!   many fields), and Codex's `Wall time: N seconds` note on each tool output loses its
//!   number (a replayed tool result is the same result, however long the first run
//!   took);
//! - the workspace's directory becomes `<workspace>`: a session's workspace is
//!   materialized under each host's own root, so a turn replayed on another host
//!   names another directory (the CLIs put their working directory in every request,
//!   and recorded tool outputs replayed to them name the first host's). For a logical
//!   workspace (`.../ws_<id>`) any absolute path ending in its id is its directory on
//!   some host; a directory given by path is matched as itself. So is each of these
//!   as a CLI spells it in names of its own (Claude Code's `~/.claude/projects/-tmp-repo`:
//!   every character but ASCII letters and digits made `-`).
//!
//! Headers (request ids, per-run session ids, user agents) are never part of it. Ids the
//! provider assigned (message, tool-call ids) are kept: on replay the client gets the
//! same ones back, so a faithful client sends them again unchanged.

use std::sync::OnceLock;

use regex::Regex;
use serde_json::Value;

/// Top-level request fields that name a run, not a conversation.
const RUN_FIELDS: &[&str] = &["metadata", "user", "prompt_cache_key", "safety_identifier"];

fn patterns() -> &'static [(Regex, &'static str)] {
    static P: OnceLock<Vec<(Regex, &'static str)>> = OnceLock::new();
    P.get_or_init(|| {
        [
            (
                r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
                "<uuid>",
            ),
            (r"\d{4}-\d{2}-\d{2}", "<date>"),
            (r"\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:?\d{2})?", "<time>"),
            (r"\d{10,}", "<n>"),
            // Codex prefixes every tool output it sends back with how long it took.
            (r"Wall time: [0-9.]+ seconds", "Wall time: <t> seconds"),
        ]
        .into_iter()
        .map(|(re, with)| (Regex::new(re).expect("valid pattern"), with))
        .collect()
    })
}

/// What names a session's workspace in its requests: its directory on any host (for a
/// logical workspace, any absolute path ending in its id, and the fixed path an
/// isolating sandbox shows it at, so a fleet of mixed backends names it alike), and
/// the directories it worked in before its user moved it (recorded tool outputs
/// replayed to the CLI name those). Compiled once per gateway, not per request.
pub struct WorkspaceNames(Option<Regex>);

impl WorkspaceNames {
    /// The names of `workspace`, which was at each of `former` before.
    pub fn new(workspace: &std::path::Path, former: &[String]) -> Self {
        let logical = workspace
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(steadfast_log::is_workspace_id);
        let mount = logical.then(|| steadfast_log::WORKSPACE_MOUNT.into());
        let paths: Vec<String> = std::iter::once(workspace.to_string_lossy().into_owned())
            .chain(mount)
            .chain(former.iter().cloned())
            .collect();
        let mut alternatives: Vec<String> = paths
            .iter()
            .filter_map(|path| directory_pattern(path))
            .chain(paths.iter().filter_map(|path| encoded_pattern(path)))
            .collect();
        // The longest first, so no directory is taken for a prefix of itself.
        alternatives.sort_by_key(|p| std::cmp::Reverse(p.len()));
        alternatives.dedup();
        if alternatives.is_empty() {
            return WorkspaceNames(None);
        }
        WorkspaceNames(Regex::new(&format!("(?:{})", alternatives.join("|"))).ok())
    }
}

/// The pattern of a directory as a CLI spells it in a name of its own: Claude Code
/// keeps a directory's memory under `~/.claude/projects/<path, every character but
/// ASCII letters and digits made `-`>/`, and says so in every request, so a session
/// forked or moved to another directory would otherwise never match its record.
fn encoded_pattern(path: &str) -> Option<String> {
    let encode = |s: &str| -> String {
        s.chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect()
    };
    let path = path.trim_end_matches('/');
    let name = path.rsplit('/').next().unwrap_or("");
    if steadfast_log::is_workspace_id(name) {
        return Some(format!(r"[A-Za-z0-9-]*-{}\b", regex::escape(&encode(name))));
    }
    let encoded = encode(path);
    // Too short to name a directory rather than a word (`-w`).
    if encoded.chars().filter(char::is_ascii_alphanumeric).count() < 3 {
        return None;
    }
    Some(format!(r"{}\b", regex::escape(&encoded)))
}

/// The pattern of one directory's name in a request.
fn directory_pattern(path: &str) -> Option<String> {
    let path = path.trim_end_matches('/');
    let name = path.rsplit('/').next().unwrap_or("");
    if path.is_empty() {
        return None;
    }
    Some(match steadfast_log::is_workspace_id(name) {
        true => format!(r#"(?:/[^/\s"'`:;,()<>]+)*/{}\b"#, regex::escape(name)),
        // `/home/me/repo` is not in `/home/me/repo2`.
        false if path.ends_with(|c: char| c.is_alphanumeric() || c == '_') => {
            format!(r"{}\b", regex::escape(path))
        }
        false => regex::escape(path),
    })
}

fn normalize_string(s: &str, workspace: Option<&Regex>) -> String {
    let mut out = match workspace {
        Some(re) if re.is_match(s) => re.replace_all(s, "<workspace>").into_owned(),
        _ => s.to_string(),
    };
    for (re, with) in patterns() {
        if re.is_match(&out) {
            out = re.replace_all(&out, *with).into_owned();
        }
    }
    out
}

fn normalize(value: &mut Value, workspace: Option<&Regex>) {
    match value {
        Value::String(s) => *s = normalize_string(s, workspace),
        Value::Array(items) => items.iter_mut().for_each(|v| normalize(v, workspace)),
        Value::Object(map) => {
            map.remove("cache_control");
            map.values_mut().for_each(|v| normalize(v, workspace));
        }
        _ => {}
    }
}

/// A request as its fingerprint sees it: run fields dropped, what changes between runs
/// replaced by placeholders. What a replay's divergence report compares.
pub fn normalized(request: &Value, workspace: &WorkspaceNames) -> Value {
    let mut value = request.clone();
    if let Value::Object(map) = &mut value {
        for field in RUN_FIELDS {
            map.remove(*field);
        }
    }
    normalize(&mut value, workspace.0.as_ref());
    value
}

/// The fingerprint of a request to `api` already [`normalized`].
pub fn fingerprint_of(api: &str, normalized: &Value) -> String {
    let mut hasher = blake3::Hasher::new();
    hasher.update(api.as_bytes());
    hasher.update(b"\0");
    hasher.update(normalized.to_string().as_bytes());
    hasher.finalize().to_hex().to_string()
}

/// The fingerprint of a request to `api` from a client working in `workspace`.
pub fn fingerprint(api: &str, request: &Value, workspace: &WorkspaceNames) -> String {
    fingerprint_of(api, &normalized(request, workspace))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn names(workspace: &str, former: &[&str]) -> WorkspaceNames {
        let former: Vec<String> = former.iter().map(|f| f.to_string()).collect();
        WorkspaceNames::new(std::path::Path::new(workspace), &former)
    }

    fn fp(api: &str, request: &Value) -> String {
        fingerprint(api, request, &names("/hosts/a/workspaces/ws_1", &[]))
    }

    #[test]
    fn the_workspace_directory_of_each_host_is_the_same_workspace() {
        // The CLI's working directory on this host, and a recorded tool output that
        // names the directory on the host that first ran the call.
        let request = |dir: &str, recorded: &str| {
            json!({"input": [
                {"type": "message", "content": format!("<cwd>{dir}</cwd> see {dir}/src/lib.rs")},
                {"type": "function_call_output", "output": format!("File \"{recorded}/stats.py\", line 3")},
            ]})
        };
        let on = |host: &str, first: &str| {
            let dir = format!("/hosts/{host}/workspaces/ws_1");
            let recorded = format!("/hosts/{first}/workspaces/ws_1");
            fingerprint(
                "openai.responses",
                &request(&dir, &recorded),
                &names(&dir, &[]),
            )
        };
        assert_eq!(on("a", "a"), on("b", "a"), "one workspace on two hosts");
        assert_eq!(on("a", "a"), on("b", "b"));
        let other = |dir: &str, ws: &str| {
            fingerprint("openai.responses", &request(dir, dir), &names(ws, &[]))
        };
        assert_ne!(
            other("/hosts/a/workspaces/ws_12", "/hosts/a/workspaces/ws_1"),
            on("a", "a"),
            "another workspace is not this one"
        );
        assert_ne!(
            other("/hosts/a/elsewhere", "/hosts/a/workspaces/ws_1"),
            on("a", "a"),
            "another directory is another request"
        );
        // A directory given by path is itself only.
        assert_ne!(
            other("/home/me/repo", "/home/me/repo"),
            other("/home/you/repo", "/home/me/repo")
        );
    }

    #[test]
    fn a_directory_as_claude_code_spells_it_in_its_memory_path_is_the_workspace_too() {
        let request = |memory: &str, cwd: &str| {
            json!({"system": [{"type": "text", "text": format!(
                "memory at `/home/agent/.claude/projects/{memory}/memory/`\n - Primary working directory: {cwd}"
            )}]})
        };
        // Recorded in the user's directory; asked again by a fork, whose logical
        // workspace the sandbox shows at the fixed mount.
        let recorded = fingerprint(
            "anthropic.messages",
            &request("-tmp--tmpyx0nN4-repo", "/tmp/.tmpyx0nN4/repo"),
            &names("/tmp/.tmpyx0nN4/repo", &[]),
        );
        let forked = fingerprint(
            "anthropic.messages",
            &request("-workspace", "/workspace"),
            &names("/hosts/b/workspaces/ws_2", &["/tmp/.tmpyx0nN4/repo"]),
        );
        assert_eq!(recorded, forked);
        // Another directory's memory is another request.
        let elsewhere = fingerprint(
            "anthropic.messages",
            &request("-tmp-other", "/tmp/.tmpyx0nN4/repo"),
            &names("/tmp/.tmpyx0nN4/repo", &[]),
        );
        assert_ne!(recorded, elsewhere);
    }

    #[test]
    fn a_logical_workspace_in_a_sandbox_and_on_a_host_is_the_same_workspace() {
        // Recorded on a bwrap host, where the CLI worked in the sandbox's fixed
        // path; asked again on a host whose backend has no mounts.
        let request = |cwd: &str| {
            json!({"messages": [
                {"role": "user", "content": format!("cwd: {cwd}")},
                {"role": "user", "content": format!("{cwd}/src/main.rs:3: error")},
            ]})
        };
        let logical = names("/hosts/b/workspaces/ws_1", &[]);
        assert_eq!(
            fingerprint("anthropic.messages", &request("/workspace"), &logical),
            fingerprint(
                "anthropic.messages",
                &request("/hosts/b/workspaces/ws_1"),
                &logical
            )
        );
        assert_ne!(
            fingerprint("anthropic.messages", &request("/workspace2"), &logical),
            fingerprint("anthropic.messages", &request("/workspace"), &logical),
            "another directory is another request"
        );
        // A directory given by path is never in a sandbox's fixed path.
        let bound = names("/home/me/repo", &[]);
        assert_ne!(
            fingerprint("anthropic.messages", &request("/workspace"), &bound),
            fingerprint("anthropic.messages", &request("/home/me/repo"), &bound)
        );
    }

    #[test]
    fn a_moved_directory_is_the_workspace_under_each_of_its_names() {
        // Recorded on host a in /home/me/repo; the user moved the session to
        // /srv/repo on host b, where the CLI's cwd is the new directory and the
        // replayed tool outputs name the old one.
        let request = |cwd: &str, recorded: &str| {
            json!({"messages": [
                {"role": "user", "content": format!("cwd: {cwd}")},
                {"role": "user", "content": format!("{recorded}/src/main.rs:3: error")},
            ]})
        };
        let first = fingerprint(
            "anthropic.messages",
            &request("/home/me/repo", "/home/me/repo"),
            &names("/home/me/repo", &[]),
        );
        let moved = names("/srv/repo", &["/home/me/repo"]);
        assert_eq!(
            first,
            fingerprint(
                "anthropic.messages",
                &request("/srv/repo", "/home/me/repo"),
                &moved
            )
        );
        assert_ne!(
            first,
            fingerprint(
                "anthropic.messages",
                &request("/srv/repo", "/srv/repo2"),
                &moved
            ),
            "a directory beside it is not it"
        );
        assert_ne!(
            first,
            fingerprint(
                "anthropic.messages",
                &request("/srv/repo", "/home/me/repo"),
                &names("/srv/repo", &[])
            ),
            "without the record of the move, the old directory is another one"
        );
    }

    #[test]
    fn what_changes_between_runs_is_ignored_and_the_conversation_is_not() {
        let run = |session: &str, date: &str, ts: &str| {
            json!({
                "model": "claude-sonnet-4-5",
                "metadata": {"user_id": format!("user_abc_account__session_{session}")},
                "system": [{"type": "text", "text": format!("Today's date is {date}. cwd: /work/ws"),
                            "cache_control": {"type": "ephemeral"}}],
                "messages": [{"role": "user", "content": format!("go (started {ts})")}],
                "prompt_cache_key": session,
            })
        };
        let a = fp(
            "anthropic.messages",
            &run(
                "6f1c2a9e-1111-4a4a-8b8b-0123456789ab",
                "2026-11-30",
                "1764500000123",
            ),
        );
        let b = fp(
            "anthropic.messages",
            &run(
                "0a0b0c0d-2222-4c4c-9d9d-ba9876543210",
                "2026-12-01",
                "1764586400456",
            ),
        );
        assert_eq!(a, b);
        let mut other = run("6f1c2a9e-1111-4a4a-8b8b-0123456789ab", "2026-11-30", "1");
        other["messages"][0]["content"] = json!("something else");
        assert_ne!(a, fp("anthropic.messages", &other));
        assert_ne!(
            fp("anthropic.messages", &json!({})),
            fp("openai.chat", &json!({}))
        );
        let codex = |t: &str| json!({"input": [{"type": "function_call_output", "output": format!("Wall time: {t} seconds\nOutput:\nok")}]});
        assert_eq!(
            fp("openai.responses", &codex("0.0146")),
            fp("openai.responses", &codex("0.0469"))
        );
        // Provider-assigned ids are kept.
        let with_id = |id: &str| json!({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": id}]}]});
        assert_ne!(
            fp("anthropic.messages", &with_id("toolu_01A")),
            fp("anthropic.messages", &with_id("toolu_01B"))
        );
    }
}
