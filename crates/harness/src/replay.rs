//! Replaying a wrapped agent's recorded session against something new: another version
//! of its CLI, another named agent or another model. Each recorded turn is forked at
//! its last record before its end (so the fork holds the whole turn's record and the
//! workspace as the turn left it) with the new agent, and the new CLI runs the turn
//! there as it would after a crash: its model requests are answered from the record,
//! its tool calls from the journal. The first request the record does not have is the
//! answer: where, and what changed. Nothing is asked of a provider, unless the caller
//! goes on live from there.

use steadfast_journal::exchange::Mismatch;
use steadfast_log::{Event, Record};
use steadfast_world::World;

use crate::fork::ForkRequest;
use crate::harness::Harness;
use crate::{Awake, Error, Result};

/// What to replay, against what.
#[derive(Debug, Clone, Default)]
pub struct ReplayRequest {
    /// The recorded session.
    pub session: String,
    /// The agent to replay with: an adapter or a named agent, with an optional
    /// `@version` (`claude-code@2.1.3`); `None` for the session's own agent at the
    /// version configured now.
    pub agent: Option<String>,
    /// The model to ask (`provider/model`); `None` for the session's.
    pub model: Option<String>,
    /// The instructions to give the CLI on top of its own system prompt (`""`:
    /// none); `None` for the named agent's as configured now when the agent replayed
    /// with is one, else the session's.
    pub instructions: Option<String>,
    /// Go on live from the first divergence, as a fork the caller keeps.
    pub go_on: bool,
    /// Who owns the forks made.
    pub owner: String,
}

/// How one recorded turn replayed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TurnReplay {
    /// The turn.
    pub turn: u32,
    /// Its recorded model requests.
    pub recorded: usize,
    /// Of those, answered from the record.
    pub replayed: u64,
    /// The new CLI's final answer differs from the recorded one (its model requests
    /// matched; it reads the same replies another way).
    pub answer_differs: Option<String>,
}

/// The first request the new agent made that the record did not have.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ReplayDivergence {
    /// The turn.
    pub turn: u32,
    /// The recorded request it should have been: its position in the session's log
    /// (`None`: the record had no more requests in the turn).
    pub position: Option<u64>,
    /// What differs, in words.
    pub summary: String,
    /// A unified diff of the recorded request and the new one (normalized as
    /// fingerprints see them), when the recorded one was kept.
    pub diff: Option<String>,
}

/// What a replay found.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ReplayReport {
    /// The CLI replayed with (`package@version`).
    pub cli: String,
    /// The instructions it was given on top of its own system prompt.
    pub instructions: Option<String>,
    /// The turns replayed, in order (the last is where it diverged, if it did).
    pub turns: Vec<TurnReplay>,
    /// The first divergence; `None`: every recorded request was made as recorded.
    pub divergence: Option<ReplayDivergence>,
    /// Model requests sent to a provider (only going on live after a divergence).
    pub provider_calls: u64,
    /// The fork kept going on live from the divergence.
    pub continued: Option<String>,
}

/// One recorded turn: where it ended, its answer and its model requests.
struct RecordedTurn {
    turn: u32,
    end: u64,
    reply: Option<String>,
    requests: usize,
}

/// The turns of `records` that ended with an answer, in order; a turn that did not
/// (interrupted, escalated, still running) ends the list.
fn recorded_turns(records: &[Record]) -> Vec<RecordedTurn> {
    let mut turns = Vec::new();
    let mut requests = 0;
    for record in records {
        match &record.event {
            Event::UserMessage { .. } => requests = 0,
            Event::ExchangeIntent { .. } => requests += 1,
            Event::ReplayDiverged { .. } => requests = 0,
            Event::TurnEnded { turn, reply } => turns.push(RecordedTurn {
                turn: *turn,
                end: record.seq,
                reply: reply.clone(),
                requests,
            }),
            Event::TurnInterrupted { stopped: true, .. } | Event::Escalated { .. } => break,
            _ => {}
        }
    }
    turns
}

/// The position of the exchange `call_id`'s intent in `records`.
fn intent_position(records: &[Record], call_id: &str) -> Option<u64> {
    records.iter().find_map(|r| match &r.event {
        Event::ExchangeIntent { call_id: id, .. } if id == call_id => Some(r.seq),
        _ => None,
    })
}

/// The longest line a diff shows whole.
const DIFF_LINE: usize = 400;

/// A request pretty-printed for a line diff: each string broken after its newlines
/// (a system prompt is one string of many paragraphs), each line cut at
/// [`DIFF_LINE`] characters.
fn diffable(request: &serde_json::Value) -> String {
    let pretty = serde_json::to_string_pretty(request).unwrap_or_default();
    let mut out = String::with_capacity(pretty.len());
    for line in pretty.replace("\\n", "\\n\n").lines() {
        match line.char_indices().nth(DIFF_LINE) {
            Some((cut, _)) => out.push_str(&format!("{}…", &line[..cut])),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// A unified diff of two requests, as [`diffable`] prints them.
fn request_diff(recorded: &serde_json::Value, new: &serde_json::Value) -> String {
    let (a, b) = (diffable(recorded), diffable(new));
    similar::TextDiff::from_lines(&a, &b)
        .unified_diff()
        .context_radius(3)
        .header("recorded", "replayed")
        .to_string()
}

/// The first line of a unified diff's changes, for a one-line summary.
fn first_change(diff: &str) -> Option<String> {
    diff.lines()
        .filter(|l| !l.starts_with("---") && !l.starts_with("+++"))
        .find(|l| l.starts_with('-') || l.starts_with('+'))
        .map(|l| l.chars().take(160).collect())
}

impl<W: World + Clone, S: steadfast_sandbox::Sandbox> Harness<W, S> {
    /// Replays `request.session`'s recorded turns against `request.agent` (see the
    /// module's docs) and reports the first divergence. The forks made are deleted,
    /// but for the one that goes on live when `request.go_on` is set.
    pub async fn replay(&self, request: &ReplayRequest) -> Result<ReplayReport> {
        let records = self.world.read(&request.session, 1).await?;
        let state = steadfast_log::fold(&records)?;
        if !state.is_wrapped() {
            return Err(Error::Invalid(format!(
                "session {} runs the native loop; replay runs a wrapped CLI's recorded turns",
                request.session
            )));
        }
        let (agent, adapter) = self.replay_adapter(request.agent.as_deref(), &state.agent)?;
        let cli = format!("{}@{}", adapter.package, adapter.version);
        // A named agent replays with its instructions as configured now, an adapter
        // with the session's; what the caller gives stands over both.
        let instructions = match &request.instructions {
            Some(given) => Some(given.clone()).filter(|i| !i.trim().is_empty()),
            None if self.options.agents.named_agent(&agent).is_some() => {
                self.options.agents.instructions_for(&agent)
            }
            None => state.instructions.clone(),
        };
        if let Some(model) = &request.model {
            self.check_agent_model(&agent, model)?;
        }
        let turns = recorded_turns(&records);
        if turns.is_empty() {
            return Err(Error::Invalid(format!(
                "session {} has no finished turn to replay",
                request.session
            )));
        }
        let changed =
            (instructions != state.instructions).then(|| instructions.clone().unwrap_or_default());
        let mut report = ReplayReport {
            cli: cli.clone(),
            instructions,
            turns: Vec::new(),
            divergence: None,
            provider_calls: 0,
            continued: None,
        };
        let mismatch = match request.go_on {
            true => Mismatch::NoteAndDiverge,
            false => Mismatch::Stop,
        };
        for recorded in turns {
            let fork = self
                .fork(&ForkRequest {
                    parent: request.session.clone(),
                    at: Some(recorded.end - 1),
                    count: 1,
                    owner: request.owner.clone(),
                    title: Some(format!(
                        "replay of {} turn {} with {cli}",
                        request.session, recorded.turn
                    )),
                    model: request.model.clone(),
                    limits: None,
                    agent: Some((agent.clone().into(), cli.clone())),
                    instructions: changed.clone(),
                    held: true,
                    explorer: None,
                })
                .await?
                .remove(0);
            let ran = self.replay_turn(&fork.id, mismatch).await;
            let turn = match ran {
                Ok(turn) => turn,
                Err(e) => {
                    self.discard(&fork.id).await;
                    return Err(e);
                }
            };
            report.provider_calls += turn.exchanges.live;
            let mut replayed = TurnReplay {
                turn: recorded.turn,
                recorded: recorded.requests,
                replayed: turn.exchanges.replayed,
                answer_differs: None,
            };
            let divergence = match (&turn.divergence, turn.unanswered) {
                (Some(d), _) => Some(self.divergence(&records, recorded.turn, d).await?),
                (None, n) if n > 0 => Some(ReplayDivergence {
                    turn: recorded.turn,
                    position: None,
                    summary: format!(
                        "the turn ended after {} of its {} recorded model requests",
                        recorded.requests.saturating_sub(n),
                        recorded.requests
                    ),
                    diff: None,
                }),
                _ => None,
            };
            if divergence.is_none()
                && turn.reply.trim() != recorded.reply.as_deref().unwrap_or("").trim()
            {
                replayed.answer_differs = Some(turn.reply.clone());
            }
            report.turns.push(replayed);
            if divergence.is_some() && request.go_on {
                report.continued = Some(fork.id.clone());
            } else {
                self.discard(&fork.id).await;
            }
            if divergence.is_some() {
                report.divergence = divergence;
                break;
            }
        }
        Ok(report)
    }

    /// The agent a replay runs and its adapter: `spec` (`name` or `name@version`), or
    /// the session's agent as configured now.
    fn replay_adapter(
        &self,
        spec: Option<&str>,
        session_agent: &str,
    ) -> Result<(String, steadfast_wrap::Adapter)> {
        let spec = spec.unwrap_or(session_agent);
        let (name, version) = match spec.split_once('@') {
            Some((name, version)) => (name, Some(version)),
            None => (spec, None),
        };
        if steadfast_log::agent::is_native(name) {
            return Err(Error::Invalid(
                "agent: a replay runs a wrapped CLI, not the native loop".into(),
            ));
        }
        let mut adapter = self.adapter(name)?;
        if version.is_some() {
            adapter = adapter.at_version(version).map_err(Error::Invalid)?;
        }
        let adapter = self.installed(adapter, "replays with")?;
        Ok((name.to_string(), adapter))
    }

    /// Drives the fork's open turn once with the replay's gateway.
    async fn replay_turn(
        &self,
        fork: &str,
        mismatch: Mismatch,
    ) -> Result<steadfast_wrap::TurnReport> {
        let Awake::Wrapped(mut driver) = self.wake(fork).await? else {
            return Err(Error::Invalid(format!(
                "fork {fork} is not a wrapped session"
            )));
        };
        let turn = driver.replay_turn(mismatch).await;
        let released = driver.release().await;
        let turn = turn?;
        released?;
        Ok(turn)
    }

    /// The report of a divergence noted by the gateway.
    async fn divergence(
        &self,
        records: &[Record],
        turn: u32,
        noted: &steadfast_journal::exchange::Divergence,
    ) -> Result<ReplayDivergence> {
        let Some(expected) = &noted.expected else {
            return Ok(ReplayDivergence {
                turn,
                position: None,
                summary: format!(
                    "a model request ({}) after the turn's {} recorded ones",
                    noted.api, noted.index
                ),
                diff: None,
            });
        };
        let position = intent_position(records, expected);
        let recorded = steadfast_journal::kept::load(&self.blobs, records, expected)
            .await
            .map_err(|e| Error::DataLost(e.to_string()))?;
        let (summary, diff) = match recorded {
            Some(recorded) => {
                let diff = request_diff(&recorded, &noted.request);
                let first = first_change(&diff).unwrap_or_else(|| "the request".into());
                (format!("the request differs: {first}"), Some(diff))
            }
            None => (
                "the request differs (this session's log predates kept requests, so there is no diff)"
                    .to_string(),
                None,
            ),
        };
        Ok(ReplayDivergence {
            turn,
            position,
            summary,
            diff,
        })
    }

    /// Removes a fork a replay made, with this host's copy of its workspace.
    async fn discard(&self, fork: &str) {
        let dir = self
            .state(fork)
            .await
            .ok()
            .and_then(|s| self.workspace_dir(&s).ok());
        if let Err(e) = self.world.delete_session(fork).await {
            tracing::warn!(%fork, error = %e, "a replay's fork was not removed");
            return;
        }
        if let Some(dir) = dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
