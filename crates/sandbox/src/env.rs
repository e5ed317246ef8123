//! The environment commands get: a fixed allow-list, never the harness's own.

use std::collections::BTreeMap;

use crate::local::looks_secret;
use crate::SandboxOptions;

/// The environment of a command whose home and temporary directory is `home`: a
/// fixed set of harmless variables plus the configured extras whose names do not look
/// like credentials.
pub(crate) fn command_env(
    home: &str,
    tmp: &str,
    options: &SandboxOptions,
) -> Vec<(String, String)> {
    let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
    let mut env: BTreeMap<String, String> = [
        ("PATH", path),
        ("HOME", home.to_string()),
        ("TMPDIR", tmp.to_string()),
        ("LANG", "C.UTF-8".to_string()),
        ("TERM", "dumb".to_string()),
        ("NO_COLOR", "1".to_string()),
        ("SHELL", "/bin/bash".to_string()),
        ("USER", "agent".to_string()),
        // Bytecode caches embed source mtimes, which restores change: noise in
        // every snapshot and never what the agent meant to write.
        ("PYTHONDONTWRITEBYTECODE", "1".to_string()),
        ("GIT_TERMINAL_PROMPT", "0".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    for (k, v) in &options.env {
        if !looks_secret(k) {
            env.insert(k.clone(), v.clone());
        }
    }
    env.into_iter().collect()
}
