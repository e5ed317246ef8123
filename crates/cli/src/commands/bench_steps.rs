//! `steadfast bench steps`: what a step of one long native session costs beyond the
//! model's and the tool's own time, at steps 100, 1,000 and 10,000.
//!
//! One session runs the fake provider's script (a 900-character reply and a `read` of
//! a 1 KB file per step, the context window 64k tokens, so the conversation compacts
//! as a long one does). Around each mark, the harness's time per step (the model call,
//! the tool call and everything durable between: intents, outcomes, snapshots,
//! compaction) is timed, and after each of those steps the call the harness is about to
//! make is made straight to the provider and the same tool run straight in a local
//! sandbox (harness, direct, harness, direct, ...). The overhead is the median, over
//! the steps around the mark, of each step's time less the direct call and tool run
//! made just before it.
//!
//! Steps 1,000 and 10,000 come minutes after step 100, and a virtual machine or a
//! database server under a minute of writes runs faster or slower from one minute to
//! the next. So around each later mark a fresh session runs alongside the long one,
//! step for step (long, direct, fresh, direct, ...), from its own step 50 to 150: its
//! overhead is step 100's in the same spell, and the verdict compares the two.

use std::time::{Duration, Instant};

use serde_json::json;
use steadfast_harness::{Driver, Harness, HarnessOptions, NewSession, Stop};
use steadfast_model::{Endpoint, ModelClient, ModelRequest, RequestBuilder, RetryPolicy, ToolDef};
use steadfast_sandbox::{AnySandbox, LocalSandbox, Sandbox, SandboxOptions};
use steadfast_testkit::{FakeProvider, Script};
use steadfast_world::AnyWorld;

use super::bench::median;

/// Steps timed around each mark.
const WINDOW: u32 = 100;

/// The request the session would send now (what the harness builds from its state).
fn request_now(state: &steadfast_log::SessionState) -> ModelRequest {
    ModelRequest {
        model: state.model.model.clone(),
        system: state.system.clone(),
        messages: state.conversation.clone(),
        tools: steadfast_sandbox::tool_specs()
            .into_iter()
            .map(|t| ToolDef {
                name: t.name.to_string(),
                description: t.description.to_string(),
                input_schema: t.input_schema,
            })
            .collect(),
        max_tokens: 8192,
    }
}

/// The same work as a harness step, done directly: the model call and the tool run.
struct Direct {
    client: ModelClient,
    tool: LocalSandbox,
}

impl Direct {
    /// The call the session is about to make, made straight to the model (its body
    /// built beforehand, from scratch: only the call is timed), and the step's tool run
    /// straight in a local sandbox.
    async fn after(
        &self,
        state: &steadfast_log::SessionState,
    ) -> anyhow::Result<(Duration, Duration)> {
        let request = request_now(state);
        let prepared =
            RequestBuilder::default().prepare(&self.client, request.head(), &request.messages);
        let started = Instant::now();
        self.client.send(&prepared, &mut |_| {}).await?;
        let model = started.elapsed();
        let started = Instant::now();
        self.tool
            .execute(
                "read",
                &json!({"file_path": format!("notes{}.txt", state.step % 2)}),
            )
            .await?;
        Ok((model, started.elapsed()))
    }
}

/// One session as the bench drives it: the harness's time for each step, and the
/// same work done directly after the steps it was asked to pair.
struct Timed<'h> {
    driver: Driver<'h, AnyWorld, AnySandbox>,
    per_step: Vec<(u32, Duration)>,
    /// (step, direct model call, direct tool run): the work of `step`, done directly
    /// just before the harness did it.
    direct: Vec<(u32, Duration, Duration)>,
}

/// What a session's steps around a mark cost (medians).
struct Row {
    harness: Duration,
    model: Duration,
    tool: Duration,
    overhead: Duration,
}

impl<'h> Timed<'h> {
    async fn start(
        harness: &'h Harness<AnyWorld, AnySandbox>,
        ws: &std::path::Path,
    ) -> anyhow::Result<Timed<'h>> {
        let id = harness
            .start_session(NewSession::native("anthropic/claude-sonnet-4-5", ws))
            .await?;
        let mut driver = harness.wake_native(&id).await?;
        driver.send("work through the notes").await?;
        Ok(Timed {
            driver,
            per_step: Vec::new(),
            direct: Vec::new(),
        })
    }

    fn step_now(&self) -> u32 {
        self.driver.state().step
    }

    /// Drives the session a step, timed; when `pair` says so of the step it reached,
    /// the next step's work is then done directly. `true` once the session is idle.
    async fn step(&mut self, direct: &Direct, pair: impl Fn(u32) -> bool) -> anyhow::Result<bool> {
        let before = self.step_now();
        let started = Instant::now();
        let stop = self.driver.step().await?;
        let took = started.elapsed();
        let step = self.step_now();
        match self.per_step.last_mut() {
            Some((s, d)) if *s == step => *d += took,
            _ => self.per_step.push((step, took)),
        }
        match stop {
            Some(Stop::Idle) | Some(Stop::Ended(_)) => return Ok(true),
            Some(other) => anyhow::bail!("the session stopped early: {other:?}"),
            None => {}
        }
        if step != before && pair(step) {
            let state = self.driver.state().clone();
            let (model, tool) = direct.after(&state).await?;
            self.direct.push((step + 1, model, tool));
        }
        Ok(false)
    }

    /// The paired steps for which `within` holds: the harness's time, the direct
    /// work's, and the median of each step's time less the direct work made just
    /// before it (so a slow spell of the machine moves both sides alike).
    fn row(&self, within: impl Fn(u32) -> bool) -> Row {
        let paired: Vec<(Duration, Duration, Duration)> = self
            .direct
            .iter()
            .filter(|(s, _, _)| within(*s))
            .filter_map(|(s, m, t)| {
                let harness = self.per_step.iter().find(|(p, _)| p == s)?.1;
                Some((harness, *m, *t))
            })
            .collect();
        let mut differences: Vec<f64> = paired
            .iter()
            .map(|(h, m, t)| h.as_secs_f64() - (*m + *t).as_secs_f64())
            .collect();
        differences.sort_by(f64::total_cmp);
        Row {
            harness: median(paired.iter().map(|p| p.0).collect()),
            model: median(paired.iter().map(|p| p.1).collect()),
            tool: median(paired.iter().map(|p| p.2).collect()),
            overhead: differences
                .get(differences.len() / 2)
                .map_or(Duration::ZERO, |d| Duration::from_secs_f64(d.max(0.0))),
        }
    }

    /// Lets the session go and deletes it, so a shared database does not grow by a
    /// whole session per run (a larger events table would slow the next run's appends).
    async fn delete(self, harness: &Harness<AnyWorld, AnySandbox>) -> anyhow::Result<()> {
        let id = self.driver.session().to_string();
        self.driver.release().await?;
        steadfast_world::World::delete_session(harness.world(), &id).await?;
        Ok(())
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Runs the bench on `world` (the embedded SQLite world when `None`).
pub async fn run(world: Option<&str>, total: u32) -> anyhow::Result<()> {
    let marks: Vec<u32> = [100, 1_000, 10_000]
        .into_iter()
        .filter(|m| m + WINDOW / 2 <= total)
        .collect();
    let filler = "I compare what the notes say with what the code does, line by line. ".repeat(13);
    let steps: Vec<serde_json::Value> = (0..total)
        .map(|i| {
            json!({"text": format!("step {i}: {filler}"),
                   "tool_calls": [{"name": "read", "input": {"file_path": format!("notes{}.txt", i % 2)}}]})
        })
        .chain(std::iter::once(json!({"text": "done"})))
        .collect();
    let script: Script = serde_json::from_value(json!({ "steps": steps }))?;
    let fake = FakeProvider::start(script).await?;
    let dir = tempfile::tempdir()?;
    let home = dir.path().join("home");
    // The long session's workspace, and the fresh sessions' (the same files).
    let (ws, fresh_ws) = (dir.path().join("ws"), dir.path().join("fresh-ws"));
    for ws in [&ws, &fresh_ws] {
        std::fs::create_dir_all(ws)?;
        for i in 0..2 {
            std::fs::write(
                ws.join(format!("notes{i}.txt")),
                format!("notes {i}: the parser drops trailing commas\n").repeat(24),
            )?;
        }
    }
    std::fs::create_dir_all(&home)?;
    let blobs = steadfast_world::Blobs::local(&home.join("blobs"))?;
    let any = AnyWorld::open(world, &home, true)
        .await?
        .with_spill(blobs.clone());
    let mut options = HarnessOptions::fake_provider(&fake.base_url());
    options.compaction.window = Some(64_000);
    options.max_steps_per_turn = total + 10;
    let harness = Harness::with_world_and_blobs(&home, any, blobs, options)?;
    let direct = Direct {
        client: ModelClient::new(
            "anthropic",
            Endpoint {
                base_url: fake.base_url(),
                api_key: "fake-provider-key".into(),
            },
            RetryPolicy::default(),
        )?,
        tool: LocalSandbox::new(&ws, SandboxOptions::default())?,
    };
    let label = if world.is_some() {
        "PostgreSQL"
    } else {
        "SQLite"
    };
    println!("steps: one native session of {total} steps on {label}, per step around each mark (medians); after step 100, a fresh session's steps 50-150 alongside");
    println!(
        "  {:>6}  {:>10}  {:>10}  {:>10}  {:>10}  {:>22}",
        "step", "harness", "model", "tool", "overhead", "fresh session alongside"
    );
    let mut long = Timed::start(&harness, &ws).await?;
    let mut fresh: Option<Timed> = None;
    // (mark, the long session's overhead there, a fresh session's alongside it)
    let mut overheads: Vec<(u32, Duration, Option<Duration>)> = Vec::new();
    let mut next_mark = marks.iter().copied().peekable();
    let in_window = |step: u32, mark: u32| step + WINDOW / 2 > mark && step < mark + WINDOW / 2;
    loop {
        let mark = next_mark.peek().copied();
        // A later mark's window is about to open: a fresh session is brought to its
        // step 50 (not timed), to run alongside through the window.
        if let Some(mark) = mark.filter(|m| Some(m) != marks.first()) {
            if fresh.is_none() && long.step_now() + 1 + WINDOW / 2 >= mark {
                let mut session = Timed::start(&harness, &fresh_ws).await?;
                while session.step_now() < WINDOW / 2 {
                    if session.step(&direct, |_| false).await? {
                        anyhow::bail!("the fresh session stopped early");
                    }
                }
                fresh = Some(session);
            }
        }
        let ended = long
            .step(&direct, |step| mark.is_some_and(|m| in_window(step, m)))
            .await?;
        if ended {
            break;
        }
        let Some(mark) = mark else { continue };
        let step = long.step_now();
        if in_window(step, mark) {
            if let Some(fresh) = fresh.as_mut() {
                if fresh.step(&direct, |_| true).await? {
                    anyhow::bail!("the fresh session stopped early");
                }
            }
        }
        if step < mark + WINDOW / 2 {
            continue;
        }
        next_mark.next();
        let row = long.row(|s| in_window(s, mark));
        let alongside = match fresh.take() {
            Some(session) => {
                let row = session.row(|_| true);
                session.delete(&harness).await?;
                Some(row.overhead)
            }
            None => None,
        };
        overheads.push((mark, row.overhead, alongside));
        println!(
            "  {mark:>6}  {:>8.2}ms  {:>8.2}ms  {:>8.2}ms  {:>8.2}ms  {:>22}",
            ms(row.harness),
            ms(row.model),
            ms(row.tool),
            ms(row.overhead),
            alongside.map_or(String::new(), |d| format!("{:.2}ms", ms(d)))
        );
    }
    long.delete(&harness).await?;
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-9);
    if let (Some((first_mark, first, _)), Some((last_mark, last, alongside))) =
        (overheads.first(), overheads.last())
    {
        if overheads.len() > 1 {
            println!(
                "  overhead at step {last_mark}: {:.2}x step {first_mark}'s measured earlier in the run",
                ratio(*last, *first)
            );
            if let Some(alongside) = alongside {
                println!(
                    "  overhead at step {last_mark}: {:.2}x a fresh session's step 100 measured alongside it (target ≤ 1.3x, and under 2 ms)",
                    ratio(*last, *alongside)
                );
            }
        }
    }
    Ok(())
}
