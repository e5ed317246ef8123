//! Test kit: the fake model provider and the bundled demo task.
//!
//! The fake provider speaks the Anthropic Messages, OpenAI Chat Completions and OpenAI
//! Responses wire formats, streaming and not, plays a [`Script`] of replies and tool calls, and counts
//! every call it receives, so tests measure duplicate model calls instead of assuming
//! there are none. It is also what `steadfast run` talks to when no API key is set.

pub mod demo;
mod fake;
pub mod git_server;
pub mod mcp_server;
pub mod postgres;
mod redo;
mod responses;
pub mod service_log;
mod wire;

pub use fake::{router, FakeProvider, FakeState};

use serde::Deserialize;

/// The kind of a session stream frame as a client sees it: a default (`message`)
/// frame carries it in its data's `type`; only `end` is a named event.
pub fn frame_kind(event: &str, data: &str) -> String {
    if event != "message" {
        return event.to_string();
    }
    serde_json::from_str::<serde_json::Value>(data)
        .ok()
        .and_then(|v| v["type"].as_str().map(String::from))
        .unwrap_or_default()
}

/// A scripted conversation: reply `i` answers the request whose conversation holds `i`
/// completed model turns. A model turn whose tool calls were rolled back by a crash
/// does not count, so the script repeats it, as a real model would retry.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Script {
    /// The replies, in order.
    pub steps: Vec<Step>,
    /// The model's context window, tokens (a quarter of the request body's bytes):
    /// a larger request is refused with 400 `prompt is too long`, as providers do.
    #[serde(default)]
    pub context_window: Option<u64>,
}

/// One scripted reply.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Step {
    /// Text of the reply.
    #[serde(default)]
    pub text: String,
    /// Tool calls of the reply.
    #[serde(default)]
    pub tool_calls: Vec<ScriptedCall>,
    /// Answer the first `times` requests for this step with an HTTP error `status`.
    #[serde(default)]
    pub fail: Option<ScriptedFailure>,
    /// Pause between streamed chunks, to make a reply slow.
    #[serde(default)]
    pub chunk_delay_ms: u64,
}

/// A scripted tool call.
#[derive(Debug, Clone, Deserialize)]
pub struct ScriptedCall {
    /// The tool.
    pub name: String,
    /// Its input.
    pub input: serde_json::Value,
}

/// A scripted HTTP failure.
#[derive(Debug, Clone, Deserialize)]
pub struct ScriptedFailure {
    /// The status to answer with.
    pub status: u16,
    /// How many requests get it before the step succeeds.
    pub times: u32,
}

impl Script {
    /// Parses a script from JSON.
    pub fn from_json(json: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(json)
    }
}
