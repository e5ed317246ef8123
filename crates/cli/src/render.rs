//! Human-readable renderings of log records.

use steadfast_log::{Block, Event, Output, Record, ToolResolution};

/// `YYYY-MM-DD HH:MM:SS` (UTC) for milliseconds since the Unix epoch.
pub fn time(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// `n` things, in the singular for one: "1 worker", "2 workers".
pub fn count(n: u64, thing: &str) -> String {
    if n == 1 {
        format!("1 {thing}")
    } else {
        format!("{n} {thing}s")
    }
}

fn short(s: &str, n: usize) -> String {
    let one_line = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() <= n {
        one_line
    } else {
        format!("{}…", one_line.chars().take(n).collect::<String>())
    }
}

fn snap(id: &Option<String>) -> String {
    id.as_deref()
        .map(|s| s[..12.min(s.len())].to_string())
        .unwrap_or_else(|| "-".into())
}

fn tool_summary(tool: &str, input: &serde_json::Value) -> String {
    let key = match tool {
        "bash" => "command",
        "glob" | "grep" => "pattern",
        _ => "file_path",
    };
    let arg = input.get(key).and_then(|v| v.as_str()).unwrap_or("");
    format!("{tool} {}", short(arg, 70))
}

fn output_summary(output: &Output) -> String {
    match output {
        Output::Inline { text } => format!(
            "{} bytes: {}",
            text.len(),
            short(text.lines().last().unwrap_or(""), 60)
        ),
        Output::Blob(b) => format!("{} bytes in blob {}", b.size, &b.hash[..12]),
    }
}

/// The timeline line(s) of a record, for `steadfast log`.
pub fn timeline(record: &Record) -> Vec<String> {
    let head = format!(
        "#{:<5} {}  e{}",
        record.seq,
        time(record.at_ms),
        record.epoch
    );
    let body = match &record.event {
        Event::SessionStarted { agent, model, workspace, initial_snapshot, .. } => {
            format!("session started: agent {agent}, model {model}, workspace {workspace}, snapshot {}", snap(initial_snapshot))
        }
        Event::UserMessage { turn, text, .. } => format!("turn {turn}: user: {}", short(text, 100)),
        Event::Steered { text, .. } => format!("steer: user: {}", short(text, 100)),
        Event::ModelDelta { text, restart, .. } => {
            if *restart {
                "model reply restarted (connection dropped)".into()
            } else {
                format!("  … {}", short(text, 100))
            }
        }
        Event::WaitStarted { name, reason, .. } => format!("waiting for signal `{name}`: {}", short(reason, 100)),
        Event::SignalReceived { name, payload, .. } => format!("signal `{name}` received: {}", short(&payload.to_string(), 100)),
        Event::ModelCallIntent { step, fingerprint, .. } => format!("model call, step {step} (request {})", &fingerprint[..12]),
        Event::ModelCallOutcome { content, usage, cost_micro_usd, stop_reason, .. } => {
            let text: String = content.iter().filter_map(|b| match b { Block::Text { text } => Some(text.as_str()), _ => None }).collect();
            let tools: Vec<String> = content.iter().filter_map(|b| match b { Block::ToolUse(t) => Some(t.name.clone()), _ => None }).collect();
            format!(
                "model replied ({stop_reason}, {} in / {} out tokens, ${:.4}): {}{}",
                usage.input_tokens,
                usage.output_tokens,
                steadfast_log::money::usd(*cost_micro_usd),
                short(&text, 90),
                if tools.is_empty() { String::new() } else { format!(" -> {}", tools.join(", ")) }
            )
        }
        Event::ModelCallInterrupted { .. } => "model call cut off when its process stopped (a crash, a kill, Ctrl-C); issued again (clients restart the reply)".into(),
        Event::Pruned { was, bytes } => format!("pruned: a {was} of {bytes} bytes, removed by retention"),
        Event::Checkpoint { blob, version } => format!("checkpoint: the state so far stored (blob {}, format {version})", &blob.hash[..12.min(blob.hash.len())]),
        Event::OutputsElided { before, tokens_before, tokens_after } => format!("context: long tool outputs before message {before} elided (~{tokens_before} -> ~{tokens_after} tokens; the log keeps them)"),
        Event::CompactionIntent { upto, tokens_before, .. } => format!("context: compacting messages before {upto} into a summary (~{tokens_before} tokens)"),
        Event::Compacted { summary, tokens_after, cost_micro_usd, .. } => format!("context: compacted to ~{tokens_after} tokens (${:.4}): {}", steadfast_log::money::usd(*cost_micro_usd), short(summary, 80)),
        Event::ModelCallFailed { error, .. } => format!("model call failed: {error}"),
        Event::ToolCallIntent { tool, input, class, snapshot_before, .. } => {
            format!("tool {} [{class:?}] (before {})", tool_summary(tool, input), snap(snapshot_before)).replace("[Read]", "[read]").replace("[Mutate]", "[mutate]").replace("[External]", "[external]").replace("[Idempotent]", "[idempotent]")
        }
        Event::ToolCallOutcome { is_error, exit_code, output, snapshot_after, .. } => format!(
            "tool {} {} (after {}): {}",
            if *is_error { "failed" } else { "ok" },
            exit_code.map(|c| format!("exit {c}")).unwrap_or_default(),
            snap(snapshot_after),
            output_summary(output)
        ),
        Event::ToolCallInterrupted { resolution, .. } => match resolution {
            ToolResolution::Rerun => "tool call cut off when its process stopped: read-only, will run again".into(),
            ToolResolution::RolledBack { snapshot } => format!("tool call cut off when its process stopped: rolled back to snapshot {}; model told", snap(snapshot)),
            ToolResolution::OutcomeUnknown => "tool call cut off when its process stopped: external effect, outcome unknown, NOT re-run; model told".into(),
            ToolResolution::Reconciled { done: true, evidence } => format!("tool call cut off when its process stopped: reconciled, the effect HAD happened; recorded as done ({})", short(evidence, 80)),
            ToolResolution::Reconciled { done: false, evidence } => format!("tool call cut off when its process stopped: reconciled, the effect had NOT happened; will run again ({})", short(evidence, 80)),
        },
        Event::ExchangeIntent { index, api, fingerprint, stream, .. } => format!("gateway request #{index} ({api}{}, request {})", if *stream { ", streaming" } else { "" }, &fingerprint[..12.min(fingerprint.len())]),
        Event::ExchangeOutcome { status, body, .. } => format!("gateway reply: HTTP {status}, {} bytes recorded", body.len()),
        Event::ConversationKept { turn, conversation } => format!("turn {turn}: the CLI's conversation kept ({})", short(conversation, 12)),
        Event::ReplayDiverged { index, snapshot } => format!("replay diverged at request #{index}: later records superseded, workspace restored to {}", snap(snapshot)),
        Event::WorkspaceMoved { workspace, host, from_workspace, from_host, snapshot } => format!(
            "workspace moved by its user from {from_workspace}{} to {workspace} on {host}, at {}",
            from_host.as_ref().map(|h| format!(" on {h}")).unwrap_or_default(),
            snap(snapshot)
        ),
        Event::AgentChanged { agent, cli, .. } => {
            format!("agent changed by its owner to {agent} ({cli}) from the next turn")
        }
        Event::WorkspaceEdited { snapshot, changes } => format!(
            "workspace changed from outside between turns ({} path(s)), now {}",
            changes.len(),
            snap(&Some(snapshot.clone()))
        ),
        Event::HumanShell {
            by,
            detached,
            snapshot,
            changes,
            ..
        } => format!(
            "{by}'s shell {}: {} path(s) changed, now {}",
            if *detached { "ended" } else { "goes on" },
            changes.len(),
            snap(&Some(snapshot.clone()))
        ),
        Event::Rewound { to, branch, facts } => format!(
            "rewound to #{to}{}{}",
            branch.as_ref().map(|b| format!("; what followed is kept as {b}")).unwrap_or_default(),
            if facts.is_empty() { String::new() } else { format!("; still standing: {}", facts.join("; ")) }
        ),
        Event::Forked { parent, at, workspace, model, agent, .. } => format!(
            "forked from {parent} at #{at}, into workspace {workspace}{}{}",
            model.as_ref().map(|m| format!(", speaking to {}/{}", m.provider, m.model)).unwrap_or_default(),
            agent.as_ref().map(|(name, cli)| format!(", run by {name} ({cli})")).unwrap_or_default()
        ),
        Event::DriveFailed { reason, attempt, retry_at_ms: Some(at) } => format!(
            "ERROR (failure {attempt} in a row, retrying in {:.1}s): {}",
            at.saturating_sub(record.at_ms) as f64 / 1000.0,
            short(reason, 160)
        ),
        Event::DriveFailed { reason, .. } => format!("ERROR (not retryable): {}", short(reason, 160)),
        Event::Egress { destination, admitted: true, .. } => format!("egress: connected to {destination} (an external effect)"),
        Event::Egress { destination, denied: true, .. } => format!("egress: denied {destination} (approval policy)"),
        Event::Egress { destination, .. } => format!("egress: held back from {destination} (awaits approval)"),
        Event::ServicesRestarted { services, .. } => format!(
            "services started again with a new sandbox: {}",
            services
                .iter()
                .map(|(name, how)| format!("{name} ({})", short(how, 60)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Event::SandboxLost { reason, .. } => format!("sandbox lost: {}; a new one is provisioned on demand", short(reason, 100)),
        Event::Escalated { breaker, reason, diff } => {
            let mut lines = vec![format!("{head}  session escalated by the {breaker} breaker: {reason}; send signal `resume` (raising the limit) to go on")];
            lines.extend(diff.iter().map(|d| format!("{:>30}{d}", "")));
            return lines;
        }
        Event::TurnInterrupted { turn, by, stopped: true, .. } => format!("turn {turn} interrupted by {by}"),
        Event::TurnInterrupted { by, stopped: false, .. } => format!("interrupt from {by} arrived after the turn ended; nothing to stop"),
        Event::TurnEnded { turn, reply } => match reply { Some(r) => format!("turn {turn} ended: {}", short(r, 100)), None => format!("turn {turn} ended") },
        Event::SessionEnded { state, reason, diff } => {
            let mut lines = vec![format!("{head}  session {state}: {reason}")];
            lines.extend(diff.iter().map(|d| format!("{:>30}{d}", "")));
            return lines;
        }
    };
    vec![format!("{head}  {body}")]
}

/// A short progress line for a record as it is appended during a run.
pub fn progress(record: &Record) -> Option<String> {
    Some(match &record.event {
        Event::SessionStarted { .. } | Event::ModelCallIntent { .. } | Event::ModelDelta { .. } => {
            return None
        }
        Event::UserMessage { text, .. } => format!("> {}", short(text, 100)),
        Event::ModelCallOutcome { usage, .. } => format!(
            "  [model: {} in / {} out tokens]",
            usage.input_tokens, usage.output_tokens
        ),
        Event::ToolCallIntent { tool, input, .. } => format!("  → {}", tool_summary(tool, input)),
        Event::ToolCallOutcome {
            is_error, output, ..
        } => format!(
            "  {} {}",
            if *is_error { "✗" } else { "✓" },
            output_summary(output)
        ),
        _ => timeline(record).join("\n"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_off_call_is_not_called_a_crash_whatever_stopped_it() {
        // Ctrl-C, a kill and a crash leave the same record: the words fit all three.
        let record = Record {
            seq: 7,
            epoch: 1,
            at_ms: 0,
            event: Event::ToolCallInterrupted {
                call_id: "c".into(),
                resolution: ToolResolution::RolledBack { snapshot: None },
            },
        };
        let line = timeline(&record).join("\n");
        assert!(line.contains("cut off when its process stopped"), "{line}");
        assert!(!line.contains("crash"), "{line}");
        assert_eq!(count(1, "worker"), "1 worker");
        assert_eq!(count(2, "worker"), "2 workers");
    }
}
