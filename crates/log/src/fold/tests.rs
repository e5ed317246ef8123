use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::event::{
    Output, ToolResolution, INTERRUPTED_ROLLED_BACK, INTERRUPTED_ROLLED_BACK_BESIDE,
};

struct Log(Vec<Record>);

impl Log {
    fn new() -> Self {
        let mut log = Log(Vec::new());
        log.push(Event::SessionStarted {
            agent: "native".into(),
            agent_cli: None,
            model: ModelSpec {
                provider: "fake".into(),
                model: "m".into(),
            },
            workspace: "/w".into(),
            host: None,
            system: "sys".into(),
            instructions: None,
            initial_snapshot: Some("s0".into()),
            created_at_ms: 0,
            budget_micro_usd: None,
            approve_external: false,
            approval: Vec::new(),
            limits: Default::default(),
            network: None,
            client_tools: Vec::new(),
            egress_credentials: Vec::new(),
            git: None,
            mcp_servers: Vec::new(),
            explorers: 0,
        });
        log
    }
    fn push(&mut self, event: Event) {
        let seq = self.0.len() as u64 + 1;
        self.0.push(Record {
            seq,
            epoch: 1,
            at_ms: seq,
            event,
        });
    }
    fn model(&mut self, id: &str, step: u32, tools: &[&str]) {
        self.push(Event::ModelCallIntent {
            call_id: id.into(),
            step,
            fingerprint: "f".into(),
        });
        let mut content = vec![Block::Text { text: "ok".into() }];
        for t in tools {
            content.push(Block::ToolUse(ToolUse {
                id: (*t).into(),
                name: "bash".into(),
                input: json!({"command": "true"}),
            }));
        }
        self.push(Event::ModelCallOutcome {
            call_id: id.into(),
            content,
            stop_reason: "end_turn".into(),
            usage: Usage {
                input_tokens: 10,
                output_tokens: 2,
                ..Usage::default()
            },
            cost_micro_usd: 5,
        });
    }
    fn user(&mut self, turn: u32, text: &str) {
        self.push(Event::UserMessage {
            turn,
            text: text.into(),
            inbox_id: None,
        });
    }
    fn tool_intent(&mut self, id: &str, class: ToolClass) {
        self.push(Event::ToolCallIntent {
            call_id: id.into(),
            tool: "bash".into(),
            input: json!({"command": "true"}),
            class,
            snapshot_before: Some(format!("before-{id}")),
        });
    }
    fn tool_outcome(&mut self, id: &str) {
        self.push(Event::ToolCallOutcome {
            call_id: id.into(),
            is_error: false,
            exit_code: Some(0),
            output: Output::Inline { text: "out".into() },
            snapshot_after: Some(format!("after-{id}")),
            stored_bytes: 0,
        });
    }
}

#[test]
fn a_full_turn_folds_to_idle_with_conversation_and_spend() {
    let mut log = Log::new();
    log.push(Event::UserMessage {
        turn: 1,
        text: "fix it".into(),
        inbox_id: None,
    });
    log.model("m1", 1, &["t1", "t2"]);
    log.tool_intent("t1", ToolClass::Mutate);
    log.tool_outcome("t1");
    log.tool_intent("t2", ToolClass::Read);
    log.tool_outcome("t2");
    log.model("m2", 2, &[]);
    log.push(Event::TurnEnded {
        turn: 1,
        reply: None,
    });
    let state = fold(&log.0).unwrap();
    assert_eq!(state.status(), Status::Idle);
    assert_eq!(state.conversation.len(), 4);
    assert_eq!(
        state.conversation[2].content.len(),
        2,
        "both results in one message"
    );
    assert_eq!(state.model_calls, 2);
    assert_eq!(state.usage.input_tokens, 20);
    assert_eq!(state.cost_micro_usd, 10);
    assert_eq!(state.last_snapshot.as_deref(), Some("after-t2"));
    assert_eq!(state.next(), Next::WaitForMessage);
}

#[test]
fn frontier_names_pending_calls() {
    let mut log = Log::new();
    log.push(Event::UserMessage {
        turn: 1,
        text: "x".into(),
        inbox_id: None,
    });
    log.push(Event::ModelCallIntent {
        call_id: "m1".into(),
        step: 1,
        fingerprint: "f".into(),
    });
    let state = fold(&log.0).unwrap();
    assert!(matches!(state.next(), Next::ResolveModel(p) if p.call_id == "m1"));

    log.push(Event::ModelCallInterrupted {
        call_id: "m1".into(),
    });
    let state = fold(&log.0).unwrap();
    assert_eq!(
        state.next(),
        Next::CallModel { step: 1 },
        "a re-issue keeps its step"
    );

    log.model("m1b", 1, &["t1"]);
    log.tool_intent("t1", ToolClass::Mutate);
    let state = fold(&log.0).unwrap();
    assert!(
        matches!(state.next(), Next::ResolveTool(p) if p.snapshot_before.as_deref() == Some("before-t1"))
    );

    log.push(Event::ToolCallInterrupted {
        call_id: "t1".into(),
        resolution: ToolResolution::RolledBack {
            snapshot: Some("before-t1".into()),
        },
    });
    let state = fold(&log.0).unwrap();
    assert_eq!(state.next(), Next::CallModel { step: 2 });
    let last = state.conversation.last().unwrap();
    assert!(
        matches!(&last.content[0], Block::ToolResult { content, is_error: true, .. } if content == INTERRUPTED_ROLLED_BACK)
    );
}

#[test]
fn rerun_puts_the_call_back_in_the_queue() {
    let mut log = Log::new();
    log.push(Event::UserMessage {
        turn: 1,
        text: "x".into(),
        inbox_id: None,
    });
    log.model("m1", 1, &["t1"]);
    log.tool_intent("t1", ToolClass::Read);
    log.push(Event::ToolCallInterrupted {
        call_id: "t1".into(),
        resolution: ToolResolution::Rerun,
    });
    let state = fold(&log.0).unwrap();
    assert!(matches!(state.next(), Next::RunTool(t) if t.id == "t1"));
}

#[test]
fn gaps_and_out_of_order_events_are_rejected() {
    let mut log = Log::new();
    log.push(Event::UserMessage {
        turn: 1,
        text: "x".into(),
        inbox_id: None,
    });
    let mut gapped = log.0.clone();
    gapped[1].seq = 3;
    assert_eq!(
        fold(&gapped).unwrap_err(),
        FoldError::Gap {
            expected: 2,
            found: 3
        }
    );
    log.tool_outcome("nope");
    assert!(matches!(
        fold(&log.0).unwrap_err(),
        FoldError::Inconsistent { seq: 3, .. }
    ));
    assert_eq!(fold(&[]).unwrap_err(), FoldError::NotStarted);
}

#[derive(Debug, Clone)]
enum Step {
    Model {
        tools: Vec<ToolClass>,
        interrupted: bool,
    },
    Nothing,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let class = prop_oneof![
        Just(ToolClass::Read),
        Just(ToolClass::Mutate),
        Just(ToolClass::External)
    ];
    let step = prop_oneof![
        (prop::collection::vec(class, 0..3), any::<bool>())
            .prop_map(|(tools, interrupted)| Step::Model { tools, interrupted }),
        Just(Step::Nothing),
    ];
    prop::collection::vec(step, 1..12)
}

proptest! {
    /// Any log a harness can write (including every kind of interruption) folds at
    /// every prefix, and folding record by record equals folding the whole.
    #[test]
    fn every_prefix_of_a_valid_log_folds(steps in steps()) {
        let mut log = Log::new();
        log.push(Event::UserMessage { turn: 1, text: "go".into(), inbox_id: None });
        let mut n = 0;
        let mut step_no = 1;
        for s in steps {
            let state = fold(&log.0).unwrap();
            if state.next() == Next::EndTurn { break; }
            match s {
                Step::Model { tools, interrupted } => {
                    if !matches!(state.next(), Next::CallModel { .. }) { continue; }
                    n += 1;
                    if interrupted {
                        let id = format!("m{n}x");
                        log.push(Event::ModelCallIntent { call_id: id.clone(), step: step_no, fingerprint: "f".into() });
                        log.push(Event::ModelCallInterrupted { call_id: id });
                    }
                    let ids: Vec<String> = (0..tools.len()).map(|i| format!("t{n}_{i}")).collect();
                    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
                    log.model(&format!("m{n}"), step_no, &refs);
                    step_no += 1;
                    for (id, class) in ids.iter().zip(tools) {
                        log.tool_intent(id, class);
                        match class {
                            ToolClass::Read | ToolClass::Idempotent => {
                                log.push(Event::ToolCallInterrupted { call_id: id.clone(), resolution: ToolResolution::Rerun });
                                log.tool_intent(id, class);
                                log.tool_outcome(id);
                            }
                            ToolClass::Mutate => log.push(Event::ToolCallInterrupted {
                                call_id: id.clone(),
                                resolution: ToolResolution::RolledBack { snapshot: Some("s".into()) },
                            }),
                            ToolClass::External => log.tool_outcome(id),
                        }
                    }
                }
                Step::Nothing => {}
            }
        }
        let whole = fold(&log.0).unwrap();
        let mut incremental = SessionState::start(&log.0[0]).unwrap();
        for (i, r) in log.0.iter().enumerate().skip(1) {
            prop_assert!(fold(&log.0[..=i]).is_ok());
            incremental.apply(r).unwrap();
        }
        prop_assert_eq!(whole, incremental);
    }
}

fn exchange(call_id: &str, index: u32) -> Event {
    Event::ExchangeIntent {
        call_id: call_id.into(),
        index,
        api: crate::Api::AnthropicMessages,
        fingerprint: format!("f{index}"),
        stream: true,
        snapshot: Some(format!("s{index}")),
        request: None,
    }
}

fn reply(call_id: &str) -> Event {
    Event::ExchangeOutcome {
        call_id: call_id.into(),
        status: 200,
        content_type: "text/event-stream".into(),
        body: format!("reply of {call_id}"),
        usage: Some(Usage {
            input_tokens: 10,
            output_tokens: 1,
            ..Usage::default()
        }),
        cost_micro_usd: 5,
    }
}

#[test]
fn a_late_reply_of_a_request_asked_again_is_kept_but_not_used() {
    let mut log = Log::new();
    if let Event::SessionStarted { agent, .. } = &mut log.0[0].event {
        *agent = "claude-code".into();
    }
    log.push(exchange("a", 0));
    log.push(reply("a"));
    log.push(exchange("b1", 1)); // cut off (its client died)...
    log.push(exchange("b2", 1)); // ...so the restarted client asked again
    log.push(reply("b2"));
    log.push(reply("b1")); // the first attempt's reply finished streaming late
    let state = fold(&log.0).unwrap();
    assert_eq!(state.exchanges.len(), 2);
    assert_eq!(state.exchanges[1].call_id, "b2");
    assert_eq!(state.exchanges[1].reply.as_ref().unwrap().2, "reply of b2");
    assert_eq!(
        state.cost_micro_usd, 15,
        "every reply paid for counts, used or not"
    );
    assert_eq!(state.usage.input_tokens, 30);
    // A reply for a request never made is still an inconsistency.
    log.push(reply("nobody"));
    assert!(fold(&log.0).is_err());
    // A recorded exchange cannot be replaced.
    let mut log2 = Log::new();
    if let Event::SessionStarted { agent, .. } = &mut log2.0[0].event {
        *agent = "codex".into();
    }
    log2.push(exchange("a", 0));
    log2.push(reply("a"));
    log2.push(exchange("a2", 0));
    assert!(fold(&log2.0).is_err());
}

#[test]
fn a_divergence_supersedes_later_exchanges_and_their_tool_calls() {
    let mut log = Log::new();
    if let Event::SessionStarted { agent, .. } = &mut log.0[0].event {
        *agent = "pi".into();
    }
    log.push(exchange("a", 0));
    log.push(reply("a"));
    log.push(Event::ToolCallIntent {
        call_id: "t1".into(),
        tool: "bash".into(),
        input: json!({"command": "make"}),
        class: ToolClass::Mutate,
        snapshot_before: Some("s1".into()),
    });
    log.push(exchange("b", 1));
    log.push(Event::ReplayDiverged {
        index: 1,
        snapshot: Some("s1".into()),
    });
    log.push(reply("b")); // the superseded request's reply, late
    let state = fold(&log.0).unwrap();
    assert_eq!(state.exchanges.len(), 1);
    assert_eq!(state.wrapped_tools.len(), 1, "the tool call came before #1");
    assert_eq!(state.last_snapshot.as_deref(), Some("s1"));
}

/// A session of the wrapped `agent` whose first turn has one exchange recorded.
fn wrapped_turn(agent: &str) -> Log {
    let mut log = Log::new();
    if let Event::SessionStarted { agent: a, .. } = &mut log.0[0].event {
        *a = agent.into();
    }
    log.push(Event::UserMessage {
        turn: 1,
        text: "one".into(),
        inbox_id: None,
    });
    log.push(exchange("a", 0));
    log.push(reply("a"));
    log
}

fn wrapped_tool(log: &mut Log, id: &str, class: ToolClass, before: &str, after: &str) {
    intent(log, id, class, before);
    outcome(log, id, after);
}

#[test]
fn a_wrapped_turn_knows_where_it_began_and_keeps_its_external_facts() {
    // Turn 1: one exchange and one edit, then the turn ends.
    let mut log = wrapped_turn("claude-code");
    wrapped_tool(&mut log, "edit", ToolClass::Mutate, "s0", "s1");
    log.push(Event::TurnEnded {
        turn: 1,
        reply: Some("ok".into()),
    });
    // Turn 2 starts where turn 1 left the workspace and the record.
    log.push(Event::UserMessage {
        turn: 2,
        text: "two".into(),
        inbox_id: None,
    });
    let state = fold(&log.0).unwrap();
    assert_eq!(
        state.turn_start,
        TurnStart {
            exchanges: 1,
            tools: 1,
            snapshot: Some("s1".into()),
            task: "two".into(),
            history: None,
        }
    );
    assert_eq!(state.wrapped_tools[0].snapshot_after.as_deref(), Some("s1"));
    // A steer is not part of the task a restarted CLI is given.
    log.push(exchange("b", 1));
    log.push(reply("b"));
    wrapped_tool(&mut log, "curl -X POST x", ToolClass::External, "s1", "s1");
    wrapped_tool(&mut log, "touch y", ToolClass::Mutate, "s1", "s2");
    log.push(Event::ReplayDiverged {
        index: 1,
        snapshot: Some("s1".into()),
    });
    let state = fold(&log.0).unwrap();
    assert_eq!(state.turn_start.task, "two");
    assert_eq!(
        state.wrapped_tools.len(),
        1,
        "turn 1's edit stays; turn 2's calls are superseded"
    );
    let facts: Vec<&str> = state
        .external_facts
        .iter()
        .map(|t| t.call_id.as_str())
        .collect();
    assert_eq!(
        facts,
        ["curl -X POST x"],
        "the completed external effect is still a fact"
    );
    // A new turn has no superseded facts of its own.
    log.push(exchange("c", 1));
    log.push(reply("c"));
    log.push(Event::TurnEnded {
        turn: 2,
        reply: None,
    });
    log.push(Event::UserMessage {
        turn: 3,
        text: "three".into(),
        inbox_id: None,
    });
    assert!(fold(&log.0).unwrap().external_facts.is_empty());
}

#[test]
fn a_client_tools_result_is_the_clients_content_for_its_own_call_only() {
    let mut log = Log::new();
    log.push(Event::UserMessage {
        turn: 1,
        text: "look it up".into(),
        inbox_id: None,
    });
    log.model("m1", 1, &["t1"]);
    log.tool_intent("t1", ToolClass::External);
    log.push(Event::WaitStarted {
        name: crate::tool_result_signal("t1"),
        reason: "waiting for the client".into(),
        call_id: Some("t1".into()),
        before_call: None,
    });
    let waiting = fold(&log.0).unwrap();
    assert_eq!(waiting.status(), Status::Waiting);
    // A result named for another call is no answer to this wait.
    let mut wrong = Log(log.0.clone());
    wrong.push(Event::SignalReceived {
        name: crate::tool_result_signal("t0"),
        payload: json!({"call_id": "t0", "content": "stale"}),
        inbox_id: 1,
    });
    assert!(fold(&wrong.0).is_err());
    log.push(Event::SignalReceived {
        name: crate::tool_result_signal("t1"),
        payload: json!({"call_id": "t1", "content": "ticket not found", "is_error": true}),
        inbox_id: 1,
    });
    let state = fold(&log.0).unwrap();
    assert_eq!(state.status(), Status::Running);
    assert_eq!(
        state.conversation.last().unwrap().content,
        [Block::ToolResult {
            tool_use_id: "t1".into(),
            content: "ticket not found".into(),
            is_error: true,
        }]
    );
    assert_eq!(state.next(), Next::CallModel { step: 2 });
}

#[test]
fn a_move_must_start_where_the_session_is_and_at_its_last_snapshot() {
    let moved = |from: &str, snapshot: &str| Event::WorkspaceMoved {
        workspace: "/elsewhere/w".into(),
        host: "b".into(),
        from_workspace: from.into(),
        from_host: None,
        snapshot: Some(snapshot.into()),
    };
    let mut log = Log::new();
    if let Event::SessionStarted { system, .. } = &mut log.0[0].event {
        *system = "Your workspace is /w.".into();
    }
    log.push(moved("/w", "s0"));
    let state = fold(&log.0).unwrap();
    assert_eq!(state.workspace, "/elsewhere/w");
    assert_eq!(state.workspace_host.as_deref(), Some("b"));
    assert_eq!(state.former_workspaces, ["/w"]);
    assert_eq!(state.system, "Your workspace is /elsewhere/w.");

    for wrong in [moved("/other", "s0"), moved("/w", "s9")] {
        let mut log = Log::new();
        log.push(wrong);
        assert!(
            matches!(fold(&log.0), Err(FoldError::Inconsistent { .. })),
            "a move from where the session is not, or to another snapshot, is refused"
        );
    }
    let mut log = Log::new();
    if let Event::SessionStarted { workspace, .. } = &mut log.0[0].event {
        *workspace = "ws_0123".into();
    }
    log.push(moved("ws_0123", "s0"));
    assert!(matches!(fold(&log.0), Err(FoldError::Inconsistent { .. })));
}

fn intent(log: &mut Log, id: &str, class: ToolClass, before: &str) {
    log.push(Event::ToolCallIntent {
        call_id: id.into(),
        tool: "bash".into(),
        input: json!({"command": id}),
        class,
        snapshot_before: Some(before.into()),
    });
}

fn outcome(log: &mut Log, id: &str, after: &str) {
    log.push(Event::ToolCallOutcome {
        call_id: id.into(),
        is_error: false,
        exit_code: Some(0),
        output: Output::Inline {
            text: format!("{id} done"),
        },
        snapshot_after: Some(after.into()),
        stored_bytes: 0,
    });
}

#[test]
fn parallel_wrapped_calls_keep_the_order_their_results_came_in() {
    let mut log = wrapped_turn("pi");
    // Three calls of one reply run at once; they finish c, a, and b is cut off.
    intent(&mut log, "a", ToolClass::Mutate, "s0");
    intent(&mut log, "b", ToolClass::Mutate, "s0");
    intent(&mut log, "c", ToolClass::Mutate, "s0");
    outcome(&mut log, "c", "s1");
    outcome(&mut log, "a", "s2");
    let state = fold(&log.0).unwrap();
    let order: Vec<(&str, u32)> = state
        .wrapped_tools
        .iter()
        .map(|t| (t.call_id.as_str(), t.result_order))
        .collect();
    assert_eq!(order, [("a", 2), ("b", 0), ("c", 1)]);
    assert_eq!(state.last_snapshot.as_deref(), Some("s2"));

    // b rolled back to the last recorded snapshot (a's and c's work kept) is told that
    // what it changed while they ran may remain.
    let mut beside = Log(log.0.clone());
    beside.push(Event::ToolCallInterrupted {
        call_id: "b".into(),
        resolution: ToolResolution::RolledBack {
            snapshot: Some("s2".into()),
        },
    });
    let state = fold(&beside.0).unwrap();
    let b = &state.wrapped_tools[1];
    assert_eq!(b.result.as_ref().unwrap().0, INTERRUPTED_ROLLED_BACK_BESIDE);
    assert_eq!(b.snapshot_after.as_deref(), Some("s2"));
    assert_eq!(b.result_order, 3);
    assert_eq!(state.last_snapshot.as_deref(), Some("s2"));

    // Rolled back to its own start (nothing recorded beside it), the usual words.
    let mut alone = Log(log.0.clone());
    alone.push(Event::ToolCallInterrupted {
        call_id: "b".into(),
        resolution: ToolResolution::RolledBack {
            snapshot: Some("s0".into()),
        },
    });
    let state = fold(&alone.0).unwrap();
    assert_eq!(
        state.wrapped_tools[1].result.as_ref().unwrap().0,
        INTERRUPTED_ROLLED_BACK
    );
}

#[test]
fn a_connection_seen_at_the_proxy_makes_its_calls_external_from_then_on() {
    let mut log = wrapped_turn("pi");
    intent(&mut log, "a", ToolClass::Mutate, "s0");
    intent(&mut log, "b", ToolClass::Read, "s0");
    outcome(&mut log, "b", "s0");
    // b's outcome came a moment before: only a, still running, is charged with it.
    log.push(Event::Egress {
        call_ids: vec!["a".into(), "b".into()],
        destination: "example.com:443".into(),
        admitted: true,
        denied: false,
    });
    let state = fold(&log.0).unwrap();
    let (a, b) = (&state.wrapped_tools[0], &state.wrapped_tools[1]);
    assert_eq!(a.egress, ["example.com:443"]);
    assert_eq!(a.effective_class(), ToolClass::External);
    assert!(b.egress.is_empty());
    assert_eq!(b.effective_class(), ToolClass::Read);
    assert!(state.seen_reaching_out("bash", &json!({"command": "a"})));
    assert!(!state.seen_reaching_out("bash", &json!({"command": "b"})));
    // Its outcome recorded, it is a fact no replay may bring about again.
    outcome(&mut log, "a", "s1");
    assert!(fold(&log.0).unwrap().wrapped_tools[0].is_external_fact());

    // Held back by the approval policy: nothing went out, but the same call is
    // external the next time it is made.
    let mut native = Log::new();
    native.push(Event::UserMessage {
        turn: 1,
        text: "one".into(),
        inbox_id: None,
    });
    native.model("m1", 1, &["c"]);
    native.tool_intent("c", ToolClass::Mutate);
    native.push(Event::Egress {
        call_ids: vec!["c".into()],
        destination: "hooks.example.com:443".into(),
        admitted: false,
        denied: false,
    });
    let state = fold(&native.0).unwrap();
    let pending = state.pending_tool("c").unwrap();
    assert!(pending.egress.is_empty());
    assert_eq!(pending.effective_class(), ToolClass::Mutate);
    assert!(state.seen_reaching_out("bash", &json!({"command": "true"})));
    assert_eq!(
        state.held_for_approval("bash", &json!({"command": "true"})),
        Some("hooks.example.com:443")
    );
    // Denied outright: external from then on, but nothing to ask a person about.
    let mut denied = Log::new();
    denied.push(Event::UserMessage {
        turn: 1,
        text: "one".into(),
        inbox_id: None,
    });
    denied.model("m1", 1, &["c"]);
    denied.tool_intent("c", ToolClass::Mutate);
    denied.push(Event::Egress {
        call_ids: vec!["c".into()],
        destination: "evil.example.com:443".into(),
        admitted: false,
        denied: true,
    });
    let state = fold(&denied.0).unwrap();
    assert!(state.seen_reaching_out("bash", &json!({"command": "true"})));
    assert!(state.held_for_approval.is_empty());
}

fn forked(agent: Option<(&str, &str)>) -> Event {
    Event::Forked {
        parent: "ses_parent".into(),
        at: 1,
        workspace: "ws_0123456789abcdef0123456789abcdef".into(),
        model: None,
        limits: None,
        agent: agent.map(|(a, c)| (a.into(), c.into())),
        instructions: None,
        explorer: None,
    }
}

/// A fork replaying against another CLI runs that CLI from its fork on; a native
/// session has no CLI to change.
#[test]
fn a_fork_may_change_a_wrapped_sessions_cli_and_only_its() {
    let mut log = Log::new();
    if let Event::SessionStarted {
        agent, agent_cli, ..
    } = &mut log.0[0].event
    {
        *agent = "claude-code".into();
        *agent_cli = Some("@anthropic-ai/claude-code@2.1.197".into());
    }
    log.push(forked(Some((
        "claude-code",
        "@anthropic-ai/claude-code@2.1.332",
    ))));
    let state = fold(&log.0).unwrap();
    assert_eq!(
        state.agent_cli.as_deref(),
        Some("@anthropic-ai/claude-code@2.1.332")
    );

    let mut native = Log::new();
    native.push(forked(Some((
        "claude-code",
        "@anthropic-ai/claude-code@2.1.332",
    ))));
    assert!(matches!(
        fold(&native.0),
        Err(FoldError::Inconsistent { .. })
    ));
    let mut plain = Log::new();
    plain.push(forked(None));
    assert_eq!(fold(&plain.0).unwrap().agent, "native");
}

#[test]
fn calls_of_one_reply_run_at_once_and_their_results_keep_the_replys_order() {
    let mut log = Log::new();
    log.user(1, "fix it");
    log.model("m1", 1, &["t1", "t2", "t3"]);
    log.tool_intent("t1", ToolClass::Read);
    log.tool_intent("t3", ToolClass::Mutate);
    log.tool_intent("t2", ToolClass::Read);
    let state = fold(&log.0).unwrap();
    assert_eq!(state.pending_tools.len(), 3);
    assert!(!state.may_begin("t2"), "a call begins once");
    // A crash here: each begun call is resolved, the first begun first.
    assert!(matches!(state.next(), Next::ResolveTool(p) if p.call_id == "t1"));
    // An interrupt that ends the turn waits for every outcome.
    let mut early = Log(log.0.clone());
    early.tool_outcome("t1");
    early.push(Event::TurnInterrupted {
        turn: 1,
        by: "u".into(),
        inbox_id: 1,
        call_id: None,
        stopped: true,
        not_begun: Vec::new(),
    });
    assert!(fold(&early.0).is_err());
    log.tool_outcome("t1");
    log.tool_outcome("t3");
    log.push(Event::ToolCallInterrupted {
        call_id: "t2".into(),
        resolution: ToolResolution::Rerun,
    });
    let state = fold(&log.0).unwrap();
    assert_eq!(state.last_snapshot.as_deref(), Some("after-t3"));
    // The read cut off runs again, alone: it is the one call left.
    assert_eq!(state.ready_tools().len(), 1);
    assert!(matches!(state.next(), Next::RunTool(t) if t.id == "t2"));
    log.tool_intent("t2", ToolClass::Read);
    log.tool_outcome("t2");
    let state = fold(&log.0).unwrap();
    let order: Vec<&str> = state.conversation[2]
        .content
        .iter()
        .map(|b| match b {
            Block::ToolResult { tool_use_id, .. } => tool_use_id.as_str(),
            _ => "",
        })
        .collect();
    assert_eq!(
        order,
        ["t1", "t2", "t3"],
        "results stand in the reply's order"
    );
    assert_eq!(state.next(), Next::CallModel { step: 2 });
}

#[test]
fn a_call_not_of_the_running_reply_cannot_begin() {
    let mut log = Log::new();
    log.user(1, "fix it");
    log.model("m1", 1, &["t1"]);
    log.tool_intent("t9", ToolClass::Read);
    assert!(fold(&log.0).is_err());
}

#[test]
fn calls_an_interrupt_kept_from_beginning_are_answered_and_never_run_later() {
    let interrupted = |not_begun: Vec<String>| {
        let mut log = Log::new();
        log.user(1, "fix it");
        log.model("m1", 1, &["t1", "t2", "t3"]);
        log.tool_intent("t1", ToolClass::Mutate);
        log.tool_outcome("t1");
        log.push(Event::TurnInterrupted {
            turn: 1,
            by: "u".into(),
            inbox_id: 1,
            call_id: Some("t1".into()),
            stopped: true,
            not_begun,
        });
        log.user(2, "go on");
        log
    };
    let state = fold(&interrupted(vec!["t2".into(), "t3".into()]).0).unwrap();
    assert_eq!(state.next(), Next::CallModel { step: 1 });
    // Every tool use has its result, in order, before the turn's interrupted note.
    let results: Vec<(&str, bool)> = state.conversation[2]
        .content
        .iter()
        .filter_map(|b| match b {
            Block::ToolResult {
                tool_use_id,
                is_error,
                ..
            } => Some((tool_use_id.as_str(), *is_error)),
            _ => None,
        })
        .collect();
    assert_eq!(results, [("t1", false), ("t2", true), ("t3", true)]);
    assert_eq!(state.conversation[3].role, Role::Assistant);
    // A log written before interrupts named them still folds as it did.
    let old = fold(&interrupted(Vec::new()).0).unwrap();
    assert!(matches!(old.next(), Next::RunTool(t) if t.id == "t2"));
    // An interrupt cannot name a call that began, or one of no reply.
    for wrong in ["t1", "t9"] {
        assert!(fold(&interrupted(vec![wrong.into()]).0).is_err(), "{wrong}");
    }
}

/// Where a session stands reads the same from its events alone (what a store's summary
/// and a stream keep) as from the fold's phase, after every record of a log that
/// waits, is answered, is escalated and resumed, is interrupted, fails to be driven
/// and ends; and a scheduled retry reads as `retrying` until the next record.
#[test]
fn the_status_from_events_alone_is_the_folds() {
    let mut log = Log::new();
    log.user(1, "go");
    log.model("m1", 1, &["t1"]);
    log.push(Event::WaitStarted {
        name: "approval".into(),
        reason: "may I?".into(),
        call_id: None,
        before_call: Some("t1".into()),
    });
    log.push(Event::SignalReceived {
        name: "approval".into(),
        payload: json!({"approved": true}),
        inbox_id: 1,
    });
    log.tool_intent("t1", ToolClass::Read);
    log.tool_outcome("t1");
    log.push(Event::Escalated {
        breaker: Breaker::Steps,
        reason: "too many steps".into(),
        diff: Vec::new(),
    });
    log.push(Event::SignalReceived {
        name: crate::RESUME_SIGNAL.into(),
        payload: json!({}),
        inbox_id: 2,
    });
    log.push(Event::DriveFailed {
        reason: "the provider is down".into(),
        attempt: 1,
        retry_at_ms: Some(10),
    });
    log.model("m2", 2, &[]);
    log.push(Event::TurnEnded {
        turn: 1,
        reply: None,
    });
    log.user(2, "more");
    log.push(Event::TurnInterrupted {
        turn: 2,
        by: "alice".into(),
        inbox_id: 3,
        call_id: None,
        stopped: true,
        not_begun: Vec::new(),
    });
    log.push(Event::SessionEnded {
        state: EndState::Closed,
        reason: "closed by alice".into(),
        diff: Vec::new(),
    });
    let mut from_events = None;
    let mut seen = Vec::new();
    for end in 1..=log.0.len() {
        let state = fold(&log.0[..end]).unwrap();
        let event = &log.0[end - 1].event;
        from_events = Status::after(event).or(from_events);
        let retrying = matches!(event, Event::DriveFailed { .. });
        let expected = if retrying {
            Status::Retrying
        } else {
            from_events.unwrap()
        };
        assert_eq!(state.status(), expected, "after #{end} ({})", event.kind());
        seen.push(state.status());
    }
    for status in [
        Status::Idle,
        Status::Running,
        Status::Waiting,
        Status::Escalated,
        Status::Retrying,
        Status::Closed,
    ] {
        assert!(seen.contains(&status), "{status} was never reached");
    }
    let ended = fold(&log.0).unwrap();
    assert_eq!(ended.end_reason(), Some("closed by alice"));
    assert!(ended.is_ended() && ended.waiting().is_none());
}
