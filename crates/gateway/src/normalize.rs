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
//!   took).
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

fn normalize_string(s: &str) -> String {
    let mut out = s.to_string();
    for (re, with) in patterns() {
        if re.is_match(&out) {
            out = re.replace_all(&out, *with).into_owned();
        }
    }
    out
}

fn normalize(value: &mut Value) {
    match value {
        Value::String(s) => *s = normalize_string(s),
        Value::Array(items) => items.iter_mut().for_each(normalize),
        Value::Object(map) => {
            map.remove("cache_control");
            map.values_mut().for_each(normalize);
        }
        _ => {}
    }
}

/// The fingerprint of a request to `api`.
pub fn fingerprint(api: &str, request: &Value) -> String {
    let mut value = request.clone();
    if let Value::Object(map) = &mut value {
        for field in RUN_FIELDS {
            map.remove(*field);
        }
    }
    normalize(&mut value);
    let mut hasher = blake3::Hasher::new();
    hasher.update(api.as_bytes());
    hasher.update(b"\0");
    hasher.update(value.to_string().as_bytes());
    hasher.finalize().to_hex().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
        let a = fingerprint(
            "anthropic.messages",
            &run(
                "6f1c2a9e-1111-4a4a-8b8b-0123456789ab",
                "2026-11-30",
                "1764500000123",
            ),
        );
        let b = fingerprint(
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
        assert_ne!(a, fingerprint("anthropic.messages", &other));
        assert_ne!(
            fingerprint("anthropic.messages", &json!({})),
            fingerprint("openai.chat", &json!({}))
        );
        let codex = |t: &str| json!({"input": [{"type": "function_call_output", "output": format!("Wall time: {t} seconds\nOutput:\nok")}]});
        assert_eq!(
            fingerprint("openai.responses", &codex("0.0146")),
            fingerprint("openai.responses", &codex("0.0469"))
        );
        // Provider-assigned ids are kept.
        let with_id = |id: &str| json!({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": id}]}]});
        assert_ne!(
            fingerprint("anthropic.messages", &with_id("toolu_01A")),
            fingerprint("anthropic.messages", &with_id("toolu_01B"))
        );
    }
}
