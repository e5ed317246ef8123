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

use std::time::{Duration, Instant};

use serde_json::json;
use steadfast_harness::{Harness, HarnessOptions, NewSession, Stop};
use steadfast_model::{Endpoint, ModelClient, ModelRequest, RequestBuilder, RetryPolicy, ToolDef};
use steadfast_sandbox::{LocalSandbox, Sandbox, SandboxOptions};
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
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws)?;
    for i in 0..2 {
        std::fs::write(
            ws.join(format!("notes{i}.txt")),
            format!("notes {i}: the parser drops trailing commas\n").repeat(24),
        )?;
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
    let id = harness
        .start_session(NewSession::native("anthropic/claude-sonnet-4-5", &ws))
        .await?;
    let client = ModelClient::new(
        "anthropic",
        Endpoint {
            base_url: fake.base_url(),
            api_key: "fake-provider-key".into(),
        },
        RetryPolicy::default(),
    )?;
    let tool = LocalSandbox::new(&ws, SandboxOptions::default())?;
    let label = if world.is_some() {
        "PostgreSQL"
    } else {
        "SQLite"
    };
    println!("steps: one native session of {total} steps on {label}, per step around each mark (medians)");
    println!(
        "  {:>6}  {:>10}  {:>10}  {:>10}  {:>10}",
        "step", "harness", "model", "tool", "overhead"
    );
    let mut driver = harness.wake_native(&id).await?;
    driver.send("work through the notes").await?;
    let mut per_step: Vec<(u32, Duration)> = Vec::new();
    let mut direct: Vec<(u32, Duration, Duration)> = Vec::new();
    let mut overheads = Vec::new();
    let mut next_mark = marks.iter().copied().peekable();
    let in_window = |step: u32, mark: u32| step + WINDOW / 2 > mark && step < mark + WINDOW / 2;
    loop {
        let before = driver.state().step;
        let started = Instant::now();
        let stop = driver.step().await?;
        let took = started.elapsed();
        let step = driver.state().step;
        match per_step.last_mut() {
            Some((s, d)) if *s == step => *d += took,
            _ => per_step.push((step, took)),
        }
        match stop {
            Some(Stop::Idle) | Some(Stop::Ended(_)) => break,
            Some(other) => anyhow::bail!("the session stopped early: {other:?}"),
            None => {}
        }
        let Some(&mark) = next_mark.peek() else {
            continue;
        };
        if step != before && in_window(step, mark) {
            // Alternating with the harness's steps: the call it is about to make, made
            // straight to the model, and the tool straight in a local sandbox.
            // Its body is built beforehand, from scratch: only the call is timed.
            let request = request_now(driver.state());
            let prepared =
                RequestBuilder::default().prepare(&client, request.head(), &request.messages);
            let started = Instant::now();
            client.send(&prepared, &mut |_| {}).await?;
            let model_took = started.elapsed();
            let started = Instant::now();
            tool.execute(
                "read",
                &json!({"file_path": format!("notes{}.txt", step % 2)}),
            )
            .await?;
            // What the harness's next step does, done directly.
            direct.push((step + 1, model_took, started.elapsed()));
        }
        if step < mark + WINDOW / 2 {
            continue;
        }
        next_mark.next();
        let harness_time = median(
            per_step
                .iter()
                .filter(|(s, _)| in_window(*s, mark))
                .map(|(_, d)| *d)
                .collect(),
        );
        let direct = std::mem::take(&mut direct);
        let (model_time, tool_time) = (
            median(direct.iter().map(|d| d.1).collect()),
            median(direct.iter().map(|d| d.2).collect()),
        );
        // Each step against the same work done directly just before it: the median of
        // those differences, so a slow spell of the machine moves both sides alike.
        let mut differences: Vec<f64> = direct
            .iter()
            .filter_map(|(s, m, t)| {
                let harness = per_step.iter().find(|(p, _)| p == s)?.1;
                Some(harness.as_secs_f64() - (*m + *t).as_secs_f64())
            })
            .collect();
        differences.sort_by(f64::total_cmp);
        let overhead = differences
            .get(differences.len() / 2)
            .map_or(Duration::ZERO, |d| Duration::from_secs_f64(d.max(0.0)));
        overheads.push((mark, overhead));
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "  {mark:>6}  {:>8.2}ms  {:>8.2}ms  {:>8.2}ms  {:>8.2}ms",
            ms(harness_time),
            ms(model_time),
            ms(tool_time),
            ms(overhead)
        );
    }
    driver.release().await?;
    // The session goes, so a shared database does not grow by a whole session per run
    // (a larger events table would slow the next run's appends).
    steadfast_world::World::delete_session(harness.world(), &id).await?;
    if let (Some((_, first)), Some((last_mark, last))) = (overheads.first(), overheads.last()) {
        if overheads.len() > 1 {
            println!(
                "  overhead at step {last_mark}: {:.2}x step {}'s (target ≤ 1.3x, and under 2 ms)",
                last.as_secs_f64() / first.as_secs_f64().max(1e-9),
                overheads[0].0
            );
        }
    }
    Ok(())
}
