//! The `explore` tool's parts every agent shares (see the harness's `explore` module
//! for the whole design): its definition, its input, the explorers' ids, the brief an
//! explorer's call answers with and the answer it sends back. For a wrapped agent the
//! call comes through the journal ([`Journal::explore`]): the explorers are made by
//! the harness's hook, the call's wait is recorded and the agent is stopped; started
//! again once every explorer has answered, it makes the call again and gets their
//! answers.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde_json::{json, Value};
use steadfast_log::{approval_key, explored_signal, Event, Explorer, ToolClass};
use steadfast_model::ToolDef;
use steadfast_sandbox::Sandbox;
use steadfast_world::World;

use crate::{Journal, Result};

/// The tool's name.
pub const EXPLORE_TOOL: &str = "explore";

/// The most explorers a session may let one call fork.
pub const MAX_EXPLORERS: u32 = 8;

/// The longest task an explorer is given.
const MAX_TASK: usize = 8 * 1024;

/// The tool as the model is offered it, for a session that allows `max` explorers.
pub fn explore_tool(max: u32) -> ToolDef {
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

/// The tasks of an `explore` call, or why the call is refused.
pub fn tasks(input: &Value, max: u32) -> Result<Vec<String>, String> {
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
pub fn explorer_id(parent: &str, call_id: &str, index: u32) -> String {
    let hash = blake3::hash(format!("{parent}\0{call_id}\0{index}").as_bytes());
    format!("ses_{}", &hash.to_hex()[..32])
}

/// What the `explore` call answers in the explorer forked at it.
pub fn brief(explorer: &Explorer) -> String {
    format!(
        "You are explorer {} forked at this call, in a copy of the workspace of your own. \
         Your task: {}\n\nWork on it alone; when you are done, your final answer goes back \
         to the agent that forked you as its share of this call's result.",
        explorer.index + 1,
        explorer.task
    )
}

/// The signal that carries an explorer's answer to its parent.
pub fn answer(
    explorer: &Explorer,
    session: &str,
    text: &str,
    spent: (u64, u64),
) -> (String, Value) {
    (
        explored_signal(&explorer.call_id),
        json!({"index": explorer.index, "of": explorer.of, "session": session,
               "task": explorer.task, "answer": text,
               "cost_micro_usd": spent.0.saturating_sub(explorer.spent_before.0),
               "tokens": spent.1.saturating_sub(explorer.spent_before.1)}),
    )
}

/// In an explorer (its `state`) whose turn ends before it has answered (its task's
/// turn, or the next one after a person stopped that): sends its answer `text`, with
/// what it spent, to its parent, before the turn's end is recorded (a crash between
/// sends it again; the parent counts it once). A parent that is gone is not waited
/// for.
pub async fn send_answer<W: World>(
    world: &W,
    session: &str,
    state: &steadfast_log::SessionState,
    text: &str,
) -> std::result::Result<(), steadfast_world::Error> {
    let Some(explorer) = state.explorer.as_ref().filter(|_| !state.explorer_answered) else {
        return Ok(());
    };
    let spent = (state.cost_micro_usd, state.tokens_used());
    let (name, payload) = answer(explorer, session, text, spent);
    match world
        .post(
            &explorer.parent,
            steadfast_world::InboundKind::Signal,
            &name,
            &payload,
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(steadfast_world::Error::NotFound(_) | steadfast_world::Error::Ended(_)) => {
            tracing::warn!(parent = %explorer.parent, "an explorer's parent is gone; its answer stays in its own log");
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// In an explorer (its `state`) about to end (failed, closed, deleted) before it has
/// answered: its parent is told why, as that task's answer, so the
/// parent's wait never outlives its explorers. Sent before the end is recorded, as an
/// answer is; a parent counts each task once, so an answer that comes after all the
/// same (the end was not recorded, the explorer went on) changes nothing.
pub async fn ending<W: World>(
    world: &W,
    session: &str,
    state: &steadfast_log::SessionState,
    why: &str,
) -> std::result::Result<(), steadfast_world::Error> {
    match (&state.explorer, state.is_ended()) {
        (Some(explorer), false) if !state.explorer_answered => {
            let text = format!(
                "(explorer {} ended without an answer: {why})",
                explorer.index + 1
            );
            send_answer(world, session, state, &text).await
        }
        _ => Ok(()),
    }
}

/// Makes the explorers of a wrapped agent's `explore` call: given the call's id, its
/// tasks and the log position to fork at, their session ids (the harness forks the
/// session; the same ones again after a crash).
pub type MakeExplorers = Arc<
    dyn Fn(String, Vec<String>, u64) -> BoxFuture<'static, std::result::Result<Vec<String>, String>>
        + Send
        + Sync,
>;

/// The hook that makes a wrapped agent's explorers, as the journal holds it.
#[derive(Clone)]
pub struct Explorers(pub MakeExplorers);

impl std::fmt::Debug for Explorers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Explorers")
    }
}

impl<W: World + Clone, S: Sandbox> Journal<W, S> {
    /// A wrapped agent's `explore` call (not answered from the record): in an
    /// explorer, the first one of its task's turn answers with its task and any other
    /// is refused; in a session whose explorers have all answered, it answers with
    /// their answers; otherwise its explorers are made, its wait recorded and the
    /// agent stopped (the turn goes on from the log once they have answered).
    pub(crate) async fn explore(
        &self,
        input: &Value,
        make: &MakeExplorers,
    ) -> Result<(String, bool)> {
        let key = approval_key(EXPLORE_TOOL, input);
        let (explorer, done, max, turn, at, briefed) = self.live.with(|s| {
            let from = s.turn_start.tools.min(s.wrapped_tools.len());
            (
                s.explorer.clone(),
                s.explored_done
                    .iter()
                    .find(|(k, _)| *k == key)
                    .map(|(_, r)| r.clone()),
                s.explorers,
                s.turn,
                s.last_seq,
                s.wrapped_tools[from..]
                    .iter()
                    .any(|t| t.tool == EXPLORE_TOOL),
            )
        });
        let call_id = format!("wt_{}", uuid::Uuid::now_v7().simple());
        self.consumed.lock().await.insert(call_id.clone());
        if let Some(explorer) = explorer {
            let (text, is_error) = match explorer.turn == turn && !briefed {
                true => (brief(&explorer), false),
                false => (
                    "explore: an explorer forks no explorers of its own; work on your task"
                        .to_string(),
                    true,
                ),
            };
            return self
                .record_answered(
                    call_id,
                    EXPLORE_TOOL,
                    input,
                    ToolClass::Read,
                    text,
                    is_error,
                )
                .await;
        }
        if let Some(result) = done {
            return self
                .record_answered(call_id, EXPLORE_TOOL, input, ToolClass::Read, result, false)
                .await;
        }
        let tasks = match tasks(input, max) {
            Ok(tasks) => tasks,
            Err(why) => {
                return self
                    .record_answered(call_id, EXPLORE_TOOL, input, ToolClass::Read, why, true)
                    .await
            }
        };
        let ids = match make(key.clone(), tasks, at).await {
            Ok(ids) => ids,
            Err(why) => {
                return Ok((
                    format!("explore: the explorers could not be made: {why}"),
                    true,
                ))
            }
        };
        let wait = Event::WaitStarted {
            name: explored_signal(&key),
            reason: format!("waiting for {} explorer(s): {}", ids.len(), ids.join(", ")),
            call_id: None,
            before_call: Some(key),
        };
        self.stop_waiting(wait, "[steadfast] this call waits for its explorers; the turn goes on once they have answered")
            .await
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
    }
}
