//! Fault injection: abort the process at the N-th time a named point is reached.
//!
//! Crash tests need real crashes at precise places (after an intent is committed,
//! mid-stream, mid-snapshot, ...). Code under test calls [`point`] at each such place.
//! With `STEADFAST_FAULT=<name>:<n>` in the environment, the process calls
//! [`std::process::abort`] the n-th time `<name>` is reached (1-based). With
//! `STEADFAST_FAULT_TRACE=<file>`, every point reached is appended to that file as one
//! line, so a test can first learn which points a crash-free run passes through.
//! With neither variable set, [`point`] costs one relaxed atomic load.

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

/// The environment variable naming the point to abort at, as `<name>:<n>`.
pub const FAULT_ENV: &str = "STEADFAST_FAULT";
/// The environment variable naming a file to which every reached point is appended.
pub const TRACE_ENV: &str = "STEADFAST_FAULT_TRACE";

const UNKNOWN: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;

static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);

struct Config {
    target: Option<(String, u64)>,
    trace: Option<String>,
    hits: Mutex<HashMap<String, u64>>,
}

fn config() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(|| {
        let target = std::env::var(FAULT_ENV).ok().and_then(|spec| {
            let (name, n) = spec.rsplit_once(':')?;
            Some((name.to_string(), n.parse().ok()?))
        });
        let trace = std::env::var(TRACE_ENV).ok();
        Config {
            target,
            trace,
            hits: Mutex::new(HashMap::new()),
        }
    })
}

/// Marks a named fault point. Aborts the process if this is the configured hit.
pub fn point(name: &str) {
    match STATE.load(Ordering::Relaxed) {
        OFF => return,
        UNKNOWN => {
            let cfg = config();
            let on = cfg.target.is_some() || cfg.trace.is_some();
            STATE.store(if on { ON } else { OFF }, Ordering::Relaxed);
            if !on {
                return;
            }
        }
        _ => {}
    }
    let cfg = config();
    let count = {
        let mut hits = cfg.hits.lock().unwrap_or_else(|e| e.into_inner());
        let count = hits.entry(name.to_string()).or_insert(0);
        *count += 1;
        *count
    };
    if let Some(trace) = &cfg.trace {
        if let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(trace)
        {
            let _ = writeln!(file, "{name}");
        }
    }
    if let Some((target, n)) = &cfg.target {
        if target == name && *n == count {
            eprintln!("steadfast: fault injection: aborting at {name} #{count}");
            std::process::abort();
        }
    }
}

/// The fault points the runtime defines, for tests that walk all of them.
pub mod points {
    /// A model-call intent is durably in the log; the request is not yet sent.
    pub const MODEL_INTENT: &str = "model.intent_committed";
    /// The first streamed delta of a model reply has arrived.
    pub const MODEL_MID_STREAM: &str = "model.mid_stream";
    /// The whole model reply has arrived; its outcome is not yet in the log.
    pub const MODEL_EFFECT: &str = "model.effect";
    /// A model-call outcome is durably in the log.
    pub const MODEL_OUTCOME: &str = "model.outcome_committed";
    /// A tool-call intent is durably in the log; the tool has not run.
    pub const TOOL_INTENT: &str = "tool.intent_committed";
    /// The tool has run (its effect applied); the outcome is not yet in the log.
    pub const TOOL_EFFECT: &str = "tool.effect";
    /// A tool-call outcome is durably in the log.
    pub const TOOL_OUTCOME: &str = "tool.outcome_committed";
    /// A workspace snapshot has written some objects but not its manifest.
    pub const MID_SNAPSHOT: &str = "drive.mid_snapshot";
    /// A compaction's intent is durably in the log; the summary is not yet asked.
    pub const COMPACTION_INTENT: &str = "compaction.intent_committed";
    /// The summary has arrived; the compaction is not yet in the log.
    pub const COMPACTION_EFFECT: &str = "compaction.effect";
    /// A fork's row, segments and first record are written; the transaction is not
    /// yet committed.
    pub const FORK_WRITTEN: &str = "fork.written";
    /// A fork is committed; the next of a request for several is not yet made.
    pub const FORK_MADE: &str = "fork.made";
    /// A rewind is recorded; this host's copy of the workspace is not yet put back.
    pub const REWIND_RECORDED: &str = "rewind.recorded";

    /// Every point above that every session passes (compaction's come only when a
    /// conversation nears its model's context window).
    pub const ALL: &[&str] = &[
        MODEL_INTENT,
        MODEL_MID_STREAM,
        MODEL_EFFECT,
        MODEL_OUTCOME,
        TOOL_INTENT,
        TOOL_EFFECT,
        TOOL_OUTCOME,
        MID_SNAPSHOT,
    ];
}
