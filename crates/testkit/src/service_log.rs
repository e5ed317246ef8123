//! Where the services a test starts (`steadfast serve`, workers) write their logs: a
//! file per test instead of the terminal, so the suite's output shows results and the
//! logs stay on disk for a failure to be read.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Mutex;

/// Tests of this process whose log file was already started (so a test's later
/// services append to what its first one wrote, while a new run starts it afresh).
static STARTED: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// The log file of the running test under `dir` (a test binary passes its
/// `CARGO_TARGET_TMPDIR`): `<dir>/service-logs/<test name>.log`. The test is named by
/// its thread, which the test harness names after it.
pub fn path(dir: &str) -> PathBuf {
    let thread = std::thread::current();
    let name: String = thread
        .name()
        .unwrap_or("unnamed")
        .chars()
        .map(|c| {
            if c.is_alphanumeric() || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    PathBuf::from(dir)
        .join("service-logs")
        .join(format!("{name}.log"))
}

/// A standard error for a service the running test starts: the test's log file (see
/// [`path`]), emptied by the test's first service of this run. Falls back to the
/// terminal if the file cannot be opened.
pub fn stderr(dir: &str) -> std::process::Stdio {
    let path = path(dir);
    let key = path.display().to_string();
    let first = STARTED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert_with(HashSet::new)
        .insert(key);
    let file = path
        .parent()
        .map(std::fs::create_dir_all)
        .transpose()
        .and_then(|_| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(!first)
                .write(true)
                .truncate(first)
                .open(&path)
        });
    match file {
        Ok(f) => f.into(),
        Err(_) => std::process::Stdio::inherit(),
    }
}
