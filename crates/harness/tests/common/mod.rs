//! Helpers shared by the harness's integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

use serde_json::json;
use steadfast_harness::{Harness, HarnessOptions};
use steadfast_testkit::{FakeProvider, Script};

/// A temporary home and workspace (holding `hello.txt`) and a fake provider playing
/// `steps`.
pub struct Setup {
    pub dir: tempfile::TempDir,
    pub fake: FakeProvider,
}

impl Setup {
    pub async fn new(steps: serde_json::Value) -> Self {
        let script: Script = serde_json::from_value(json!({ "steps": steps })).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("ws")).unwrap();
        std::fs::write(dir.path().join("ws/hello.txt"), "hello\n").unwrap();
        let fake = FakeProvider::start(script).await.unwrap();
        Setup { dir, fake }
    }

    pub fn workspace(&self) -> PathBuf {
        self.dir.path().join("ws")
    }

    pub fn harness_with(&self, f: impl FnOnce(&mut HarnessOptions)) -> Harness {
        let mut options = HarnessOptions::fake_provider(&self.fake.base_url());
        f(&mut options);
        Harness::open_local(&self.dir.path().join("home"), options).unwrap()
    }

    pub fn harness(&self) -> Harness {
        self.harness_with(|_| {})
    }
}

/// A scripted model step that runs one bash command.
pub fn bash(command: &str) -> serde_json::Value {
    json!({"text": "running", "tool_calls": [{"name": "bash", "input": {"command": command}}]})
}

/// A scripted reply that reads `file`.
pub fn read(file: &str) -> serde_json::Value {
    json!({"text": "reading", "tool_calls": [{"name": "read", "input": {"file_path": file}}]})
}

/// A scripted reply that writes `content` to `file`.
pub fn write(file: &str, content: &str) -> serde_json::Value {
    json!({"text": "writing", "tool_calls": [{"name": "write", "input": {"file_path": file, "content": content}}]})
}
