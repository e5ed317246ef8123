//! Reconcilers: deciding after a crash whether an external effect took place.
//!
//! An external-effect call cut off between its intent and its outcome is, by default,
//! reported to the model as outcome-unknown and never re-run (docs/ARCHITECTURE.md rule 4).
//! For effects whose result can be observed afterwards, a [`Reconciler`] does better:
//! it runs read-only probe commands in the session's sandbox (the workspace restored
//! to the snapshot taken just before the call) and decides *done* (the call is
//! recorded as having happened, with the evidence as its result) or *not done* (the
//! call runs again, once). Anything it cannot decide stays unknown.
//!
//! To add one (say, for HTTP calls carrying an idempotency key), implement the trait:
//! `matches` picks the calls it knows, `probes` says which commands observe the effect
//! (`curl -s https://api.example.com/orders?idempotency_key=...`), and `decide` reads
//! their outputs. Register it in the harness's options (`HarnessOptions::reconcilers`);
//! the native loop and wrapped agents' journals resolve through the same [`resolve`]. Probes must
//! not change anything; they may run more than once.

use serde_json::Value;
use std::future::Future;
use std::sync::Arc;

use steadfast_log::{ToolClass, ToolResolution};

use crate::ToolOutput;

/// What a probe decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The effect happened; the text is the evidence (shown to the model as the result).
    Done(String),
    /// The effect did not happen; the call runs again. The text says how we know.
    NotDone(String),
    /// The probes could not tell; the call stays outcome-unknown.
    Unknown(String),
}

/// Decides whether a known kind of external effect took place.
pub trait Reconciler: Send + Sync {
    /// A short name, for logs.
    fn name(&self) -> &'static str;
    /// Whether this reconciler knows this call.
    fn matches(&self, tool: &str, input: &Value) -> bool;
    /// Read-only shell commands whose outputs decide (run in the sandbox, in order).
    fn probes(&self, tool: &str, input: &Value) -> Vec<String>;
    /// The verdict, from the probes' outputs (in the same order).
    fn decide(&self, tool: &str, input: &Value, outputs: &[ToolOutput]) -> Verdict;
}

impl std::fmt::Debug for dyn Reconciler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Invariant 4's resolution of a tool call a crash cut off, for the native loop and
/// wrapped agents alike: a read runs again; a mutation is rolled back to the snapshot
/// taken before it (the caller restores the workspace); an external effect is asked of
/// the first reconciler that knows it — `probe` runs each of its read-only commands in
/// the session's sandbox, the workspace at the call's before-snapshot — and is
/// outcome-unknown when none knows it or the probes cannot tell.
pub async fn resolve<F, Fut>(
    reconcilers: &[Arc<dyn Reconciler>],
    class: ToolClass,
    tool: &str,
    input: &Value,
    snapshot_before: Option<String>,
    mut probe: F,
) -> ToolResolution
where
    F: FnMut(String) -> Fut,
    Fut: Future<Output = Result<ToolOutput, String>>,
{
    match class {
        ToolClass::Read | ToolClass::Idempotent => return ToolResolution::Rerun,
        ToolClass::Mutate => {
            return ToolResolution::RolledBack {
                snapshot: snapshot_before,
            }
        }
        ToolClass::External => {}
    }
    let Some(reconciler) = reconcilers.iter().find(|r| r.matches(tool, input)) else {
        return ToolResolution::OutcomeUnknown;
    };
    let mut outputs = Vec::new();
    for command in reconciler.probes(tool, input) {
        match probe(command).await {
            Ok(out) => outputs.push(out),
            Err(e) => {
                tracing::warn!(reconciler = reconciler.name(), error = %e, "probe failed");
                return ToolResolution::OutcomeUnknown;
            }
        }
    }
    resolution(reconciler.decide(tool, input, &outputs))
}

/// The resolution a verdict gives, for reconcilers and the harness's own tools alike.
pub fn resolution(verdict: Verdict) -> ToolResolution {
    match verdict {
        Verdict::Done(evidence) => ToolResolution::Reconciled {
            done: true,
            evidence,
        },
        Verdict::NotDone(evidence) => ToolResolution::Reconciled {
            done: false,
            evidence,
        },
        Verdict::Unknown(why) => {
            tracing::warn!(%why, "could not reconcile");
            ToolResolution::OutcomeUnknown
        }
    }
}

/// `git push [remote] [src[:dst]]`: done if the remote branch now points at the commit
/// that was to be pushed.
#[derive(Debug, Default, Clone, Copy)]
pub struct GitPush;

/// What a `git push` command names.
#[derive(Debug, PartialEq, Eq)]
struct Push {
    remote: Option<String>,
    src: Option<String>,
    dst: Option<String>,
}

/// The `git push` in a command, if it is one plain push (no `--all`, `--tags`,
/// `--delete`, no mirror, at most one refspec).
fn parse_push(command: &str) -> Option<Push> {
    // Only the first pipeline-free part that is a git push counts.
    let part = command
        .split(['&', ';', '|', '\n'])
        .map(str::trim)
        .find(|p| p.starts_with("git push") || p.starts_with("git -C"))?;
    let words: Vec<&str> = part.split_whitespace().collect();
    let push_at = words.iter().position(|w| *w == "push")?;
    if words[..push_at] != ["git"] {
        return None; // `git -C dir push` and other global options: not handled
    }
    let mut args = Vec::new();
    for w in &words[push_at + 1..] {
        match *w {
            "--all" | "--mirror" | "--tags" | "--delete" | "-d" | "--prune" => return None,
            flag if flag.starts_with('-') => {}
            arg => args.push(arg.trim_matches(['\'', '"']).to_string()),
        }
    }
    if args.len() > 2 {
        return None;
    }
    let remote = args.first().cloned();
    let (src, dst) = match args.get(1) {
        Some(spec) => {
            let spec = spec.trim_start_matches('+');
            match spec.split_once(':') {
                Some((s, d)) => (Some(s.to_string()), Some(d.to_string())),
                None => (Some(spec.to_string()), None),
            }
        }
        None => (None, None),
    };
    if src.as_deref() == Some("") {
        return None; // `git push origin :branch` deletes: not a push to observe
    }
    Some(Push { remote, src, dst })
}

/// Single-quotes a word for the shell.
fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

fn command_of(input: &Value) -> &str {
    input.get("command").and_then(Value::as_str).unwrap_or("")
}

impl Reconciler for GitPush {
    fn name(&self) -> &'static str {
        "git-push"
    }

    fn matches(&self, tool: &str, input: &Value) -> bool {
        tool == "bash" && parse_push(command_of(input)).is_some()
    }

    fn probes(&self, _tool: &str, input: &Value) -> Vec<String> {
        let Some(push) = parse_push(command_of(input)) else {
            return Vec::new();
        };
        let src = push.src.as_deref().unwrap_or("HEAD");
        // The branch pushed to: the refspec's destination, or the source branch's name
        // (`HEAD` meaning the current branch).
        let branch = match (&push.dst, push.src.as_deref()) {
            (Some(d), _) => quote(d.trim_start_matches("refs/heads/")),
            (None, Some(s)) if s != "HEAD" => quote(s.trim_start_matches("refs/heads/")),
            _ => "\"$(git symbolic-ref --short HEAD)\"".to_string(),
        };
        let remote = match &push.remote {
            Some(r) => quote(r),
            None => "\"$(git config \"branch.$(git symbolic-ref --short HEAD).remote\" || echo origin)\"".to_string(),
        };
        vec![format!(
            "set -e; branch={branch}; echo \"local=$(git rev-parse --verify {}^{{commit}})\"; \
             echo \"branch=$branch\"; \
             echo \"remote=$(git ls-remote {remote} \"refs/heads/$branch\" | cut -f1)\"",
            quote(src)
        )]
    }

    fn decide(&self, _tool: &str, _input: &Value, outputs: &[ToolOutput]) -> Verdict {
        let Some(out) = outputs.first() else {
            return Verdict::Unknown("no probe ran".into());
        };
        if out.is_error {
            return Verdict::Unknown(format!("the probe failed: {}", out.text.trim()));
        }
        let field = |name: &str| {
            out.text
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name}=")))
                .map(str::trim)
                .unwrap_or("")
        };
        let (local, branch, remote) = (field("local"), field("branch"), field("remote"));
        if local.is_empty() {
            return Verdict::Unknown(format!("no local commit found: {}", out.text.trim()));
        }
        if remote == local {
            Verdict::Done(format!(
                "[steadfast] reconciled after a crash: this push had already landed \
                 (the remote branch {branch} is at {local}, the commit pushed). It was not \
                 run again."
            ))
        } else {
            Verdict::NotDone(format!(
                "remote branch {branch} is at {} and the commit to push is {local}: the push \
                 had not landed",
                if remote.is_empty() { "nothing" } else { remote }
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pushes_are_parsed_and_odd_ones_left_alone() {
        let p = parse_push("git push origin main").unwrap();
        assert_eq!(
            p,
            Push {
                remote: Some("origin".into()),
                src: Some("main".into()),
                dst: None
            }
        );
        let p = parse_push("git add -A && git commit -qm x && git push -u origin HEAD:release")
            .unwrap();
        assert_eq!(
            (p.src.as_deref(), p.dst.as_deref()),
            (Some("HEAD"), Some("release"))
        );
        assert_eq!(parse_push("git push").unwrap().remote, None);
        assert!(parse_push("git push --all origin").is_none());
        assert!(parse_push("git push origin :gone").is_none());
        assert!(parse_push("git -C sub push").is_none());
        assert!(parse_push("echo git pushes").is_none());
        assert!(GitPush.matches("bash", &json!({"command": "git push origin main"})));
        assert!(!GitPush.matches("read", &json!({"command": "git push"})));
    }

    #[test]
    fn the_verdict_compares_the_remote_ref_with_the_local_commit() {
        let out = |text: &str, is_error| ToolOutput {
            text: text.into(),
            is_error,
            exit_code: Some(0),
        };
        let input = json!({"command": "git push origin main"});
        let done = GitPush.decide(
            "bash",
            &input,
            &[out("local=abc\nbranch=main\nremote=abc\n", false)],
        );
        assert!(matches!(done, Verdict::Done(e) if e.contains("already landed")));
        let not = GitPush.decide(
            "bash",
            &input,
            &[out("local=abc\nbranch=main\nremote=old\n", false)],
        );
        assert!(matches!(not, Verdict::NotDone(_)));
        let new_branch = GitPush.decide(
            "bash",
            &input,
            &[out("local=abc\nbranch=main\nremote=\n", false)],
        );
        assert!(matches!(new_branch, Verdict::NotDone(e) if e.contains("nothing")));
        let failed = GitPush.decide("bash", &input, &[out("fatal: no remote", true)]);
        assert!(matches!(failed, Verdict::Unknown(_)));
    }
}
