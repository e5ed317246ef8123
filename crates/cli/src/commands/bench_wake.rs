//! `steadfast bench wake`: what a worker pays to take a session up, at 1k, 10k and
//! 100k events: folding the whole log against reading the latest checkpoint and the
//! records after it, with the raw rows fetched unverified as the floor.
//!
//! The session is written as the harness writes a long one: turns of 50 tool-calling
//! steps, the conversation compacted when it grows past 120 messages, and a checkpoint
//! at a turn's end once 256 records have been appended since the last.

use std::time::{Duration, Instant};

use serde_json::json;
use steadfast_harness::{Harness, HarnessOptions};
use steadfast_log::fold::{Checkpoint, CHECKPOINT_VERSION};
use steadfast_log::{fold, Block, Event, ModelSpec, Next, Record, SessionState, ToolUse, Usage};
use steadfast_world::{Holder, World};

use super::bench::{median, tool_pair};

const STEPS_PER_TURN: usize = 50;
const COMPACT_OVER: usize = 120;
const CHECKPOINT_EVERY: u64 = 256;

/// Builds a session of about `events` records the way the harness would.
struct Writer<'a> {
    harness: &'a Harness,
    state: Option<SessionState>,
    log: Vec<Event>,
}

impl Writer<'_> {
    fn push(&mut self, event: Event) -> anyhow::Result<()> {
        let seq = self.log.len() as u64 + 1;
        let record = Record {
            seq,
            epoch: 1,
            at_ms: 0,
            event: event.clone(),
        };
        match &mut self.state {
            None => self.state = Some(SessionState::start(&record)?),
            Some(state) => state.apply(&record)?,
        }
        self.log.push(event);
        Ok(())
    }

    fn state(&self) -> &SessionState {
        self.state.as_ref().expect("started")
    }

    async fn turn(&mut self, turn: u32) -> anyhow::Result<()> {
        self.push(Event::UserMessage {
            turn,
            text: format!("turn {turn}: keep going"),
            inbox_id: None,
        })?;
        for i in 0..=STEPS_PER_TURN {
            if self.state().conversation.len() > COMPACT_OVER {
                self.compact()?;
            }
            let Next::CallModel { step } = self.state().next() else {
                anyhow::bail!("the bench log is out of step");
            };
            let id = format!("{turn}_{i}");
            self.push(Event::ModelCallIntent {
                call_id: format!("mc_{id}"),
                step,
                fingerprint: "f".repeat(64),
            })?;
            let mut content = vec![Block::Text {
                text: "Running the tests again.".into(),
            }];
            if i < STEPS_PER_TURN {
                content.push(Block::ToolUse(ToolUse {
                    id: format!("toolu_{id}"),
                    name: "bash".into(),
                    input: json!({"command": "cargo test"}),
                }));
            }
            self.push(Event::ModelCallOutcome {
                call_id: format!("mc_{id}"),
                content,
                stop_reason: "tool_use".into(),
                usage: Usage {
                    input_tokens: 1200,
                    output_tokens: 40,
                    ..Usage::default()
                },
                cost_micro_usd: 4200,
            })?;
            if i < STEPS_PER_TURN {
                let [mut intent, mut outcome] = tool_pair(0);
                if let Event::ToolCallIntent { call_id, .. } = &mut intent {
                    *call_id = format!("toolu_{id}");
                }
                if let Event::ToolCallOutcome { call_id, .. } = &mut outcome {
                    *call_id = format!("toolu_{id}");
                }
                self.push(intent)?;
                self.push(outcome)?;
            }
        }
        self.push(Event::TurnEnded { turn, reply: None })?;
        let state = self.state();
        if state.last_seq >= state.last_checkpoint + CHECKPOINT_EVERY {
            let bytes = serde_json::to_vec(&Checkpoint {
                version: CHECKPOINT_VERSION,
                state: state.clone(),
            })?;
            let blob = self.harness.blobs().put(&bytes).await?;
            self.push(Event::Checkpoint {
                blob,
                version: CHECKPOINT_VERSION,
            })?;
        }
        Ok(())
    }

    fn compact(&mut self) -> anyhow::Result<()> {
        let conversation = &self.state().conversation;
        let upto = (conversation.len() - 40..conversation.len())
            .find(|&i| conversation[i].role == steadfast_log::Role::Assistant)
            .unwrap_or(conversation.len() - 1);
        let call_id = format!("mc_compact_{}", self.log.len());
        self.push(Event::CompactionIntent {
            call_id: call_id.clone(),
            upto: upto as u32,
            tokens_before: 100_000,
            inbox_id: None,
        })?;
        self.push(Event::Compacted {
            call_id,
            summary: "The tests were run again and again; all pass. ".repeat(20),
            tokens_after: 30_000,
            usage: Usage::default(),
            cost_micro_usd: 0,
        })
    }
}

/// Writes session `bench` of about `events` records into `harness`'s world, as the
/// harness would have (checkpoints and compactions included); returns its length.
pub(super) async fn write_session(harness: &Harness, events: usize) -> anyhow::Result<usize> {
    write_session_of(harness, events, "bench").await
}

/// [`write_session`], the session owned by `owner`.
pub(super) async fn write_session_of(
    harness: &Harness,
    events: usize,
    owner: &str,
) -> anyhow::Result<usize> {
    let mut writer = Writer {
        harness,
        state: None,
        log: Vec::new(),
    };
    writer.push(Event::bare_start(
        "native",
        ModelSpec {
            provider: "fake".into(),
            model: "m".into(),
        },
        "/w",
    ))?;
    let mut turn = 1;
    while writer.log.len() < events {
        writer.turn(turn).await?;
        turn += 1;
    }
    let world = harness.world();
    world.create_session("bench", owner).await?;
    let lease = world
        .acquire_lease("bench", &Holder::new("bench"), Duration::from_secs(3600))
        .await?;
    for chunk in writer.log.chunks(500) {
        world.append(&lease, chunk).await?;
    }
    world.release_lease(&lease).await?;
    Ok(writer.log.len())
}

/// Wake times of one session of about `events` records: raw rows, a full fold, and
/// the checkpointed load.
async fn measure(events: usize) -> anyhow::Result<(usize, [Duration; 3])> {
    let dir = tempfile::tempdir()?;
    let home = dir.path().join("home");
    let harness = Harness::open_local(&home, HarnessOptions::fake_provider("http://127.0.0.1:9"))?;
    let n = write_session(&harness, events).await?;
    let world = harness.world();
    let (mut raw, mut full, mut checkpointed) = (Vec::new(), Vec::new(), Vec::new());
    let conn = rusqlite::Connection::open(home.join("world.db"))?;
    for _ in 0..7 {
        let start = Instant::now();
        let rows = raw_rows(&conn)?;
        anyhow::ensure!(rows.len() == n);
        raw.push(start.elapsed());

        let start = Instant::now();
        let whole = fold(&world.read("bench", 1).await?)?;
        full.push(start.elapsed());

        let start = Instant::now();
        let (loaded, _) = harness.load("bench").await?;
        checkpointed.push(start.elapsed());
        anyhow::ensure!(loaded == whole, "the checkpointed state differs");
    }
    Ok((n, [median(raw), median(full), median(checkpointed)]))
}

/// Every row of the bench session, read straight from the file (the baseline). A
/// function of its own so no statement is held across an await (the bench runs on
/// the runtime's workers, which need a `Send` future).
fn raw_rows(conn: &rusqlite::Connection) -> anyhow::Result<Vec<(u64, Vec<u8>)>> {
    let mut stmt = conn.prepare_cached(
        "SELECT seq, epoch, at_ms, schema, body, checksum FROM events WHERE session_id = ?1 AND seq >= 1 ORDER BY seq",
    )?;
    let rows = stmt
        .query_map(["bench"], |r| Ok((r.get(0)?, r.get(4)?)))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(rows)
}

/// Prints wake times at each size.
pub async fn run(sizes: &[usize]) -> anyhow::Result<()> {
    println!("wake: taking a session up, full fold vs. the latest checkpoint (median of 7)");
    println!(
        "  {:>8}  {:>10}  {:>10}  {:>13}",
        "events", "raw rows", "full fold", "checkpointed"
    );
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    for &size in sizes {
        let (n, [raw, full, checkpointed]) = measure(size).await?;
        println!(
            "  {n:>8}  {:>8.1}ms  {:>8.1}ms  {:>11.1}ms",
            ms(raw),
            ms(full),
            ms(checkpointed)
        );
    }
    println!("  target: checkpointed under 10 ms at every size (flat)");
    Ok(())
}
