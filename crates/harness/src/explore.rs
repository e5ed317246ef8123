//! Fork as a tool: the native agent's `explore` call forks the session into explorers,
//! one per task, each from this very point (the conversation and the workspace as they
//! are), and waits, durably, for their answers, which come back together as the call's
//! result. A planner tries approaches in parallel this way; a crash of any process
//! while the explorers run loses nothing (each is a session of its own, the parent a
//! session waiting on a signal).
//!
//! - The explorers are made first, each with an id derived from the call and its task,
//!   so a crash before the parent records its wait makes the same ones again.
//! - The parent's call and its wait go into the log together; each explorer's answer
//!   is a signal to the parent, sent before the explorer's turn is recorded as ended
//!   (a crash between the two sends it again; the parent counts each task once).
//! - In an explorer, the `explore` call it was forked at answers with its task; an
//!   explorer forks no explorers of its own.

use serde_json::{json, Value};
use steadfast_log::{explored_signal, Event, Explorer, Output, ToolClass, ToolUse};
use steadfast_model::ToolDef;

/// The tool's name.
pub const EXPLORE_TOOL: &str = "explore";

/// The most explorers a session may let one call fork.
pub const MAX_EXPLORERS: u32 = 8;

/// The longest task an explorer is given.
const MAX_TASK: usize = 8 * 1024;

/// The tool as the model is offered it, for a session that allows `max` explorers.
pub(crate) fn explore_tool(max: u32) -> ToolDef {
    ToolDef {
        name: EXPLORE_TOOL.to_string(),
        description: format!(
            "Fork yourself into explorers, one per task (at most {max}): each starts from \
             this exact point, with this conversation and the workspace as it is now (in \
             a copy of its own), and works on its task alone. You wait until every one \
             has finished; their final answers come back as this tool's result, each with \
             its session id. Use it to try approaches in parallel; your own workspace is \
             not changed by theirs."
        ),
        input_schema: json!({
            "type": "object",
            "properties": {
                "tasks": {
                    "type": "array",
                    "items": {"type": "string"},
                    "minItems": 1,
                    "maxItems": max,
                    "description": "What each explorer should try, one task each."
                }
            },
            "required": ["tasks"]
        }),
    }
}

/// Checks a session's explorer bound: the native agent only, at most
/// [`MAX_EXPLORERS`].
pub fn check(agent: &str, explorers: u32) -> Result<(), String> {
    if explorers == 0 {
        return Ok(());
    }
    if agent != "native" {
        return Err(format!(
            "explorers: the explore tool is offered to the native agent only, not to `{agent}`"
        ));
    }
    if explorers > MAX_EXPLORERS {
        return Err(format!(
            "explorers: at most {MAX_EXPLORERS} per call, not {explorers}"
        ));
    }
    Ok(())
}

/// The tasks of an `explore` call, or why the call is refused.
pub(crate) fn tasks(input: &Value, max: u32) -> Result<Vec<String>, String> {
    let Some(tasks) = input.get("tasks").and_then(Value::as_array) else {
        return Err("explore: `tasks` must be a list of strings".into());
    };
    if tasks.is_empty() || tasks.len() > max as usize {
        return Err(format!(
            "explore: between 1 and {max} tasks, not {}",
            tasks.len()
        ));
    }
    tasks
        .iter()
        .map(|t| match t.as_str().map(str::trim) {
            Some(t) if !t.is_empty() && t.len() <= MAX_TASK => Ok(t.to_string()),
            _ => Err(format!(
                "explore: each task is a non-empty string of at most {MAX_TASK} bytes"
            )),
        })
        .collect()
}

/// The id of the explorer of task `index` of call `call_id` in `parent`: the same
/// every time the call is made again after a crash.
pub(crate) fn explorer_id(parent: &str, call_id: &str, index: u32) -> String {
    let hash = blake3::hash(format!("{parent}\0{call_id}\0{index}").as_bytes());
    format!("ses_{}", &hash.to_hex()[..32])
}

/// What the `explore` call answers in the explorer forked at it.
pub(crate) fn brief(explorer: &Explorer) -> String {
    format!(
        "You are explorer {} forked at this call, in a copy of the workspace of your own. \
         Your task: {}\n\nWork on it alone; when you are done, your final answer goes back \
         to the agent that forked you as its share of this call's result.",
        explorer.index + 1,
        explorer.task
    )
}

/// An explore call answered at once (in an explorer, or refused): its intent and
/// outcome.
pub(crate) fn answered(call: &ToolUse, text: String, is_error: bool) -> Vec<Event> {
    vec![
        Event::ToolCallIntent {
            call_id: call.id.clone(),
            tool: call.name.clone(),
            input: call.input.clone(),
            class: ToolClass::Read,
            snapshot_before: None,
        },
        Event::ToolCallOutcome {
            call_id: call.id.clone(),
            is_error,
            exit_code: None,
            output: Output::Inline { text },
            snapshot_after: None,
        },
    ]
}

/// The parent's call and its wait for the explorers `ids`, appended together.
pub(crate) fn waiting(call: &ToolUse, ids: &[String]) -> Vec<Event> {
    vec![
        Event::ToolCallIntent {
            call_id: call.id.clone(),
            tool: call.name.clone(),
            input: call.input.clone(),
            class: ToolClass::Read,
            snapshot_before: None,
        },
        Event::WaitStarted {
            name: explored_signal(&call.id),
            reason: format!("waiting for {} explorer(s): {}", ids.len(), ids.join(", ")),
            call_id: Some(call.id.clone()),
            before_call: None,
        },
    ]
}

/// The signal that carries an explorer's answer to its parent.
pub(crate) fn answer(explorer: &Explorer, session: &str, text: &str) -> (String, Value) {
    (
        explored_signal(&explorer.call_id),
        json!({"index": explorer.index, "session": session, "answer": text}),
    )
}

impl<W: steadfast_world::World + Clone, S: steadfast_sandbox::Sandbox> crate::Harness<W, S> {
    /// Drives, here, the explorers that `parent`'s `explore` call waits for and that
    /// have not answered (one a worker holds is left to it), each to the end of its
    /// task's turn. Returns how many answered: the parent goes on once all have (a
    /// process without workers, such as `steadfast run`, drives them this way).
    pub async fn run_explorers(&self, parent: &str) -> crate::Result<usize> {
        let state = self.state(parent).await?;
        let Some(call) = state
            .waiting
            .as_ref()
            .and_then(|w| w.call_id.clone())
            .filter(|c| state.waiting.as_ref().map(|w| &w.name) == Some(&explored_signal(c)))
        else {
            return Ok(0);
        };
        let tasks = state
            .pending_tool
            .as_ref()
            .and_then(|p| p.input["tasks"].as_array().map(Vec::len))
            .unwrap_or(0) as u32;
        let mut answered = 0;
        for index in 0..tasks {
            if state.explored.iter().any(|a| a.0 == index) {
                continue;
            }
            let id = explorer_id(parent, &call, index);
            let mut awake = match self.wake(&id).await {
                Ok(awake) => awake,
                Err(crate::Error::World(steadfast_world::Error::LeaseHeld { .. })) => continue,
                Err(e) => return Err(e),
            };
            let ran = awake.run().await;
            let released = awake.release().await;
            if ran? == crate::Stop::Idle {
                answered += 1;
            }
            released?;
        }
        Ok(answered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_are_checked_and_ids_are_stable() {
        assert_eq!(
            tasks(&json!({"tasks": ["a", " b "]}), 3).unwrap(),
            vec!["a", "b"]
        );
        for bad in [
            json!({}),
            json!({"tasks": []}),
            json!({"tasks": ["a", "b", "c", "d"]}),
            json!({"tasks": [""]}),
            json!({"tasks": [1]}),
        ] {
            assert!(tasks(&bad, 3).is_err(), "{bad}");
        }
        assert_eq!(explorer_id("s", "c", 1), explorer_id("s", "c", 1));
        assert_ne!(explorer_id("s", "c", 1), explorer_id("s", "c", 2));
        assert!(check("claude-code", 2).is_err());
        assert!(check("native", MAX_EXPLORERS + 1).is_err());
        assert!(check("native", 2).is_ok() && check("pi", 0).is_ok());
    }
}
