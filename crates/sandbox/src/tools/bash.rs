//! `bash`: run a command in its own process group, with a timeout and an output cap.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde_json::Value;

use super::{opt_u64, str_arg, Context};
use crate::ToolOutput;

/// Kills the whole process group when dropped: on timeout, on cancellation (the
/// future dropped) and after the command exits, so no background job outlives its call.
struct GroupGuard(Option<Pid>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            let _ = killpg(pid, Signal::SIGKILL);
        }
    }
}

pub(crate) async fn run(ctx: &Context<'_>, input: &Value) -> ToolOutput {
    let command = match str_arg(input, &["command"]) {
        Ok(c) => c.to_string(),
        Err(e) => return ToolOutput::error(e),
    };
    let timeout = opt_u64(input, "timeout")
        .map(Duration::from_millis)
        .unwrap_or(ctx.options.default_timeout)
        .min(ctx.options.max_timeout);

    let (mut reader, writer) = match std::io::pipe() {
        Ok(p) => p,
        Err(e) => return ToolOutput::error(format!("bash: cannot create pipe: {e}")),
    };
    let writer2 = match writer.try_clone() {
        Ok(w) => w,
        Err(e) => return ToolOutput::error(format!("bash: cannot create pipe: {e}")),
    };
    let mut cmd = std::process::Command::new("bash");
    cmd.arg("-c")
        .arg(&command)
        .current_dir(ctx.root)
        .env_clear()
        .envs(ctx.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(writer2)
        .process_group(0);
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return ToolOutput::error(format!("bash: cannot start: {e}")),
    };
    drop(cmd); // closes our copies of the pipe's write end
    let guard = GroupGuard(child.id().map(|p| Pid::from_raw(p as i32)));
    let recorded = child
        .id()
        .and_then(|p| crate::orphans::record(ctx.registry, p));

    let cap = ctx.options.max_output_bytes;
    let collector = tokio::task::spawn_blocking(move || {
        let mut kept = Vec::new();
        let mut total = 0usize;
        let mut buf = [0u8; 64 * 1024];
        loop {
            match reader.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    total += n;
                    let room = cap.saturating_sub(kept.len());
                    kept.extend_from_slice(&buf[..n.min(room)]);
                }
            }
        }
        (kept, total)
    });

    let status = tokio::time::timeout(timeout, child.wait()).await;
    drop(guard); // the group goes, so the pipe closes even if a background job held it
    if let Some(file) = recorded {
        let _ = std::fs::remove_file(file);
    }
    let (kept, total) = collector.await.unwrap_or_default();
    let mut text = String::from_utf8_lossy(&kept).into_owned();
    if total > kept.len() {
        text.push_str(&format!(
            "\n[steadfast] output truncated: {total} bytes written, first {} kept",
            kept.len()
        ));
    }
    match status {
        Err(_) => {
            text.push_str(&format!(
                "\n[steadfast] command timed out after {} ms; its process group was killed",
                timeout.as_millis()
            ));
            ToolOutput {
                text,
                is_error: true,
                exit_code: None,
            }
        }
        Ok(Err(e)) => ToolOutput::error(format!("bash: waiting for the command failed: {e}")),
        Ok(Ok(status)) => {
            let code = status.code();
            let is_error = code != Some(0);
            if let Some(c) = code.filter(|c| *c != 0) {
                text.push_str(&format!("\nExit code {c}"));
            } else if code.is_none() {
                text.push_str("\n[steadfast] command was killed by a signal");
            }
            ToolOutput {
                text,
                is_error,
                exit_code: code,
            }
        }
    }
}
