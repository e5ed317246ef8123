//! The documentation's examples, run as written.
//!
//! Every fenced block tagged `sh` in `README.md` and `docs/*.md` is run: a page's
//! blocks, in order, as one bash script (`set -euo pipefail`, so a variable a block
//! sets is there for the next, and any failing command fails the page). A block that
//! cannot run here (it needs a real API key, another machine, or is the test command
//! itself) is tagged `sh no-test: <why>`, and says why.
//!
//! Each page runs in a directory of its own with `steadfast` (this build) first on
//! `PATH`, a home of its own (`STEADFAST_HOME`), no provider key (so servers play the
//! bundled fake provider) and the tests' cache of wrapped CLIs. `curl` is the real one
//! with `--fail-with-body` added, so an example whose request the API now refuses
//! (a route renamed, a field gone) fails its page instead of printing an error body.
//! Whatever a page leaves running (`steadfast serve &`) is stopped with its process
//! group when the page ends.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

mod common;

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// Every page of documentation: the README, then `docs/`, by name.
fn pages() -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    let mut all = vec![root().join("README.md")];
    all.extend(docs);
    all
}

/// A fenced block: its info string, its text, and the line its fence opens on.
struct Block {
    info: String,
    text: String,
    line: usize,
}

/// The fenced blocks of a Markdown page (fences of three backticks at the start of a
/// line, as every page here writes them).
fn blocks(page: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (n, line) in page.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => {
                open = Some(Block {
                    info: info.trim().to_string(),
                    text: String::new(),
                    line: n + 1,
                })
            }
            (Some(_), Some("")) => out.push(open.take().unwrap()),
            (Some(block), _) => {
                block.text.push_str(line);
                block.text.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "a fence is never closed");
    out
}

/// Whether a block is shell, and if so, why it is not run (`None`: it is run).
fn shell_block(block: &Block) -> Option<Option<String>> {
    let mut words = block.info.splitn(2, ' ');
    let lang = words.next().unwrap_or("");
    if !["sh", "bash", "shell", "console", "zsh"].contains(&lang) {
        return None;
    }
    let rest = words.next().unwrap_or("").trim();
    Some(
        rest.strip_prefix("no-test:")
            .map(|why| why.trim().to_string()),
    )
}

#[test]
fn every_shell_example_is_run_or_says_why_not() {
    let mut wrong = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for block in blocks(&text) {
            let Some(skip) = shell_block(&block) else {
                continue;
            };
            let place = format!("{}:{}", page.display(), block.line);
            if !block.info.starts_with("sh") {
                wrong.push(format!("{place}: tag shell examples `sh`"));
            }
            match skip {
                Some(why) if why.is_empty() => {
                    wrong.push(format!("{place}: `no-test:` must say why"))
                }
                None if block.info != "sh" => wrong.push(format!(
                    "{place}: `{}`: only `sh` or `sh no-test: <why>`",
                    block.info
                )),
                _ => {}
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The page's runnable blocks as one script.
fn script_of(page: &Path) -> Option<String> {
    let text = std::fs::read_to_string(page).unwrap();
    let runnable: Vec<String> = blocks(&text)
        .into_iter()
        .filter(|b| shell_block(b) == Some(None))
        .map(|b| format!("# {}:{}\n{}", page.display(), b.line, b.text))
        .collect();
    if runnable.is_empty() {
        return None;
    }
    // The failing command is named, next to the `# page:line` of its block.
    let preamble =
        "set -euo pipefail\ntrap 'echo \"failed: $BASH_COMMAND (script line $LINENO)\" >&2' ERR\n";
    Some(format!("{preamble}{}", runnable.join("\n")))
}

/// Where a program is on `PATH`.
fn which(program: &str) -> PathBuf {
    std::env::split_paths(&std::env::var_os("PATH").unwrap())
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{program} is not on PATH"))
}

/// Runs one page's script; its output on failure.
fn run_page(page: &Path, script: &str) -> Result<Duration, String> {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;

    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    let work = dir.path().join("work");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_steadfast"), bin.join("steadfast")).unwrap();
    let curl = bin.join("curl");
    std::fs::write(
        &curl,
        format!(
            "#!/bin/sh\nexec {} --fail-with-body \"$@\"\n",
            which("curl").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&curl, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = std::env::join_paths(
        std::iter::once(bin.clone())
            .chain(std::env::split_paths(&std::env::var_os("PATH").unwrap())),
    )
    .unwrap();
    let log = dir.path().join("output.log");
    let out = std::fs::File::create(&log).unwrap();

    let mut command = Command::new("bash");
    command
        .args(["-c", script])
        .current_dir(&work)
        .env("PATH", path)
        .env("STEADFAST_HOME", dir.path().join("home"))
        .env("STEADFAST_AGENTS_DIR", common::agents_dir())
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .process_group(0);
    for key in [
        "ANTHROPIC_API_KEY",
        "OPENAI_API_KEY",
        "ANTHROPIC_BASE_URL",
        "OPENAI_BASE_URL",
        "STEADFAST_WORLD",
        "STEADFAST_BLOBS",
        "STEADFAST_VAULT_KEY",
        "RUST_LOG",
    ] {
        command.env_remove(key);
    }
    let started = Instant::now();
    let mut child = command.spawn().unwrap();
    let group = nix::unistd::Pid::from_raw(child.id() as i32);
    let limit = Duration::from_secs(600);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > limit {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let took = started.elapsed();
    stop_group(group);
    let output = std::fs::read_to_string(&log).unwrap_or_default();
    match status {
        Some(s) if s.success() => {
            // Captured by the test harness: shown with `--nocapture`.
            eprintln!("{output}");
            Ok(took)
        }
        Some(s) => Err(format!(
            "{}: {s} after {took:.1?}\n{output}",
            page.display()
        )),
        None => Err(format!(
            "{}: still running after {limit:?}\n{output}",
            page.display()
        )),
    }
}

/// Stops what a page left running: SIGTERM to its process group, then SIGKILL to
/// whatever is still there after a grace.
fn stop_group(group: nix::unistd::Pid) {
    use nix::sys::signal::{killpg, Signal};
    if killpg(group, Signal::SIGTERM).is_err() {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        if killpg(group, None).is_err() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = killpg(group, Signal::SIGKILL);
}

/// Every page's examples, one page at a time (they share the documented port), each
/// failure reported with its page's output.
#[test]
fn docs_examples_run_as_written() {
    let only = std::env::var("STEADFAST_DOCS_PAGE").ok();
    let mut failures = Vec::new();
    let mut ran = 0;
    for page in pages() {
        if only.as_deref().is_some_and(|o| !page.ends_with(o)) {
            continue;
        }
        let Some(script) = script_of(&page) else {
            continue;
        };
        ran += 1;
        match run_page(&page, &script) {
            Ok(took) => eprintln!("{}: ran in {took:.1?}", page.display()),
            Err(failure) => failures.push(failure),
        }
    }
    assert!(ran > 0, "no page has an example to run");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
