//! The public event schema (version [`SCHEMA`]): what clients are sent of each log
//! record, in the event stream and the JSON pages alike. Every event is an object with
//! `type` (the record's kind), `seq` (its log position, also the SSE id) and `at_ms`,
//! and the fields of its kind listed here, flat. Storage internals never appear:
//! no lease epochs, request fingerprints, snapshot ids, inbox ids, host paths, system
//! prompts or raw provider replies. Each kind is written out field by field (no
//! internal record is passed through), so a field added to the log stays internal
//! until it is added here. The internal records stay available to operators
//! (`steadfast log --json`).

use serde_json::{json, Map, Value};
use steadfast_log::{Block, Event, Output, Record, ToolResolution, Usage};

/// The schema's version, sent as `schema` in every JSON page.
pub(crate) const SCHEMA: u32 = 1;

/// How much of a tool's output an event carries; the rest is in the workspace's log
/// (`steadfast log`) and, for big outputs, the blob store.
const EXCERPT: usize = 4096;

/// The public event of `record`.
pub(crate) fn event(record: &Record) -> Value {
    let mut data = Map::new();
    data.insert("type".into(), record.event.kind().into());
    data.insert("seq".into(), record.seq.into());
    data.insert("at_ms".into(), record.at_ms.into());
    if let Value::Object(fields) = fields(&record.event) {
        data.extend(fields);
    }
    Value::Object(data)
}

fn cost_usd(micro: u64) -> f64 {
    micro as f64 / 1e6
}

fn usage(usage: &Usage) -> Value {
    json!({
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cache_read_tokens": usage.cache_read_tokens,
        "cache_write_tokens": usage.cache_write_tokens,
    })
}

/// The first `max` bytes of `text` (on a character boundary), and whether it was cut.
fn excerpt(text: &str, max: usize) -> (&str, bool) {
    if text.len() <= max {
        return (text, false);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (&text[..end], true)
}

fn output(output: &Output) -> Value {
    match output {
        Output::Inline { text } => {
            let (shown, truncated) = excerpt(text, EXCERPT);
            json!({"excerpt": shown, "truncated": truncated, "bytes": text.len()})
        }
        Output::Blob(blob) => {
            let (head, _) = excerpt(&blob.head, EXCERPT / 2);
            let (tail, _) = excerpt(&blob.tail, EXCERPT / 2);
            json!({
                "excerpt": head,
                "excerpt_end": tail,
                "truncated": true,
                "bytes": blob.size,
                "blob": {"hash": blob.hash, "bytes": blob.size},
            })
        }
    }
}

fn resolution(resolution: &ToolResolution) -> Value {
    match resolution {
        ToolResolution::Rerun => json!({"kind": "rerun"}),
        ToolResolution::RolledBack { .. } => json!({"kind": "rolled_back"}),
        ToolResolution::OutcomeUnknown => json!({"kind": "outcome_unknown"}),
        ToolResolution::Reconciled { done, evidence } => {
            json!({"kind": "reconciled", "done": done, "evidence": evidence})
        }
    }
}

/// The public fields of each kind of event.
fn fields(event: &Event) -> Value {
    match event {
        Event::SessionStarted {
            agent,
            model,
            approve_external,
            limits,
            network,
            ..
        } => json!({
            "agent": agent,
            "model": format!("{}/{}", model.provider, model.model),
            "approve_external": approve_external,
            "limits": limits,
            "network": network,
        }),
        Event::UserMessage { turn, text, .. } => json!({"turn": turn, "text": text}),
        Event::Steered { text, .. } => json!({"text": text}),
        Event::ModelDelta {
            call_id,
            text,
            restart,
        } => json!({"call_id": call_id, "text": text, "restart": restart}),
        Event::WaitStarted {
            name,
            reason,
            call_id,
            ..
        } => json!({"signal": name, "reason": reason, "call_id": call_id}),
        Event::SignalReceived { name, payload, .. } => {
            json!({"signal": name, "payload": payload})
        }
        Event::ModelCallIntent { call_id, step, .. } => {
            json!({"call_id": call_id, "step": step})
        }
        Event::ModelCallOutcome {
            call_id,
            content,
            stop_reason,
            usage: used,
            cost_micro_usd,
        } => {
            let text: Vec<&str> = content
                .iter()
                .filter_map(|b| match b {
                    Block::Text { text } => Some(text.as_str()),
                    _ => None,
                })
                .collect();
            let tool_uses: Vec<Value> = content
                .iter()
                .filter_map(|b| match b {
                    Block::ToolUse(u) => Some(json!({"id": u.id, "name": u.name})),
                    _ => None,
                })
                .collect();
            json!({
                "call_id": call_id,
                "stop_reason": stop_reason,
                "text": text.join("\n"),
                "tool_uses": tool_uses,
                "usage": usage(used),
                "cost_usd": cost_usd(*cost_micro_usd),
            })
        }
        Event::ModelCallInterrupted { call_id } => json!({"call_id": call_id}),
        Event::ModelCallFailed { call_id, error } => {
            json!({"call_id": call_id, "message": error})
        }
        Event::ToolCallIntent {
            call_id,
            tool,
            input,
            class,
            ..
        } => json!({"call_id": call_id, "tool": tool, "input": input, "class": class}),
        Event::ToolCallOutcome {
            call_id,
            is_error,
            exit_code,
            output: out,
            ..
        } => json!({
            "call_id": call_id,
            "is_error": is_error,
            "exit_code": exit_code,
            "output": output(out),
        }),
        Event::ToolCallInterrupted {
            call_id,
            resolution: r,
        } => json!({"call_id": call_id, "resolution": resolution(r)}),
        Event::TurnEnded { turn, reply } => json!({"turn": turn, "reply": reply}),
        Event::TurnInterrupted {
            turn,
            by,
            call_id,
            stopped,
            ..
        } => json!({"turn": turn, "by": by, "call_id": call_id, "stopped": stopped}),
        Event::Escalated {
            breaker,
            reason,
            diff,
        } => json!({"breaker": breaker, "reason": reason, "diff": diff}),
        Event::DriveFailed {
            reason,
            attempt,
            retry_at_ms,
        } => json!({"reason": reason, "attempt": attempt, "retry_at_ms": retry_at_ms}),
        Event::SandboxLost { call_id, reason } => {
            json!({"call_id": call_id, "reason": reason})
        }
        Event::ExchangeIntent {
            call_id,
            index,
            api,
            stream,
            ..
        } => json!({"call_id": call_id, "index": index, "api": api, "stream": stream}),
        Event::ExchangeOutcome {
            call_id,
            status,
            usage: used,
            cost_micro_usd,
            ..
        } => json!({
            "call_id": call_id,
            "status": status,
            "usage": used.as_ref().map(usage),
            "cost_usd": cost_usd(*cost_micro_usd),
        }),
        Event::ReplayDiverged { index, .. } => json!({"index": index}),
        Event::SessionEnded {
            state,
            reason,
            diff,
        } => json!({"state": state, "reason": reason, "diff": diff}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use steadfast_log::{BlobRef, ModelSpec, ToolClass};

    fn record(event: Event) -> Record {
        Record {
            seq: 7,
            epoch: 3,
            at_ms: 1_000,
            event,
        }
    }

    #[test]
    fn internals_never_reach_clients() {
        let internal = [
            Event::bare_start(
                "native",
                ModelSpec {
                    provider: "anthropic".into(),
                    model: "claude-sonnet-4-5".into(),
                },
                "/srv/steadfast/workspaces/ws_secret_path",
            ),
            Event::ModelCallIntent {
                call_id: "mc_1".into(),
                step: 1,
                fingerprint: "f1ngerpr1nt".into(),
            },
            Event::ToolCallIntent {
                call_id: "t1".into(),
                tool: "bash".into(),
                input: json!({"command": "ls"}),
                class: ToolClass::Read,
                snapshot_before: Some("snap_before_id".into()),
            },
            Event::ExchangeIntent {
                call_id: "gx_1".into(),
                index: 0,
                api: "anthropic_messages".into(),
                fingerprint: "f1ngerpr1nt".into(),
                stream: true,
                snapshot: Some("snap_before_id".into()),
            },
            Event::ExchangeOutcome {
                call_id: "gx_1".into(),
                status: 200,
                content_type: "text/event-stream".into(),
                body: "raw provider reply".into(),
                usage: None,
                cost_micro_usd: 1_500,
            },
            Event::SignalReceived {
                name: "approval".into(),
                payload: json!({"approved": true}),
                inbox_id: 4242,
            },
        ];
        for e in internal {
            let text = event(&record(e)).to_string();
            for secret in [
                "epoch",
                "f1ngerpr1nt",
                "snap_before_id",
                "ws_secret_path",
                "raw provider reply",
                "4242",
                "\"event\"",
            ] {
                assert!(!text.contains(secret), "{secret} in {text}");
            }
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(
                (v["seq"].as_u64(), v["at_ms"].as_u64()),
                (Some(7), Some(1_000))
            );
        }
    }

    #[test]
    fn tool_results_carry_an_excerpt_and_big_ones_their_blob() {
        let long = "é".repeat(EXCERPT);
        let inline = event(&record(Event::ToolCallOutcome {
            call_id: "t1".into(),
            is_error: false,
            exit_code: Some(0),
            output: Output::Inline { text: long.clone() },
            snapshot_after: Some("snap".into()),
        }));
        assert_eq!(inline["output"]["truncated"], true);
        assert_eq!(inline["output"]["bytes"], long.len());
        assert!(inline["output"]["excerpt"].as_str().unwrap().len() <= EXCERPT);
        assert_eq!(inline["exit_code"], 0);
        let blob = event(&record(Event::ToolCallOutcome {
            call_id: "t2".into(),
            is_error: true,
            exit_code: Some(2),
            output: Output::Blob(BlobRef {
                hash: "abc".into(),
                size: 9_000_000,
                uri: "s3://internal-bucket/abc".into(),
                head: "first lines".into(),
                tail: "last lines".into(),
            }),
            snapshot_after: None,
        }));
        assert_eq!(
            blob["output"]["blob"],
            json!({"hash": "abc", "bytes": 9_000_000})
        );
        assert_eq!(blob["output"]["excerpt"], "first lines");
        assert_eq!(blob["output"]["excerpt_end"], "last lines");
        assert!(!blob.to_string().contains("internal-bucket"));
    }
}
