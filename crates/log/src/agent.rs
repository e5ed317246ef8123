//! Which agent a session runs: the built-in loop, or a wrapped CLI (Claude Code,
//! Codex, Pi, OpenCode, or a named agent built on one). The log keeps its name.

use serde::{Deserialize, Serialize};

/// The name the built-in loop goes by.
pub const NATIVE: &str = "native";

/// Which agent a session runs, by name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Agent(String);

impl Agent {
    /// The built-in loop.
    pub fn native() -> Self {
        Agent(NATIVE.to_string())
    }

    /// Whether it is the built-in loop, rather than a wrapped CLI.
    pub fn is_native(&self) -> bool {
        is_native(&self.0)
    }

    /// Its name, as the log keeps it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Whether `name` names the built-in loop.
pub fn is_native(name: &str) -> bool {
    name == NATIVE
}

impl std::fmt::Display for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::ops::Deref for Agent {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Agent {
    fn from(name: &str) -> Self {
        Agent(name.to_string())
    }
}

impl From<String> for Agent {
    fn from(name: String) -> Self {
        Agent(name)
    }
}

impl PartialEq<str> for Agent {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for Agent {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}
