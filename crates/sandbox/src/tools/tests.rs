//! What only the `local` backend does; the tool contract every backend keeps is
//! [`crate::conformance`], run for each in `tests/conformance.rs`.

use serde_json::json;

use crate::{LocalSandbox, Sandbox, SandboxOptions, ToolOutput};

async fn call(sb: &LocalSandbox, tool: &str, input: serde_json::Value) -> ToolOutput {
    sb.execute(tool, &input).await.unwrap()
}

#[tokio::test]
async fn commands_see_no_credentials() {
    std::env::set_var("ANTHROPIC_API_KEY", "sk-ant-must-not-leak");
    std::env::set_var("OPENAI_API_KEY", "sk-must-not-leak");
    let dir = tempfile::tempdir().unwrap();
    let mut options = SandboxOptions::default();
    options
        .env
        .insert("GITHUB_TOKEN".into(), "ghp-must-not-leak".into());
    options.env.insert("PROJECT_MODE".into(), "test".into());
    let sb = LocalSandbox::new(dir.path(), options).unwrap();
    let out = call(&sb, "bash", json!({"command": "env"})).await;
    assert!(!out.text.contains("must-not-leak"), "{}", out.text);
    assert!(out.text.contains("PROJECT_MODE=test"));
    assert!(!out.text.contains("ANTHROPIC") && !out.text.contains("OPENAI"));
}

#[tokio::test]
async fn a_local_home_has_the_same_path_every_run_and_abandoned_ones_are_reaped() {
    let dir = tempfile::tempdir().unwrap();
    let home_of = |sandbox: &LocalSandbox| {
        sandbox
            .env
            .iter()
            .find(|(k, _)| k == "HOME")
            .map(|(_, v)| v.clone())
            .unwrap()
    };
    let (first, second) = {
        let a = LocalSandbox::new(dir.path(), SandboxOptions::default()).unwrap();
        let b = LocalSandbox::new(dir.path(), SandboxOptions::default()).unwrap();
        (home_of(&a), home_of(&b))
    };
    assert_ne!(first, second, "two live sandboxes never share a home");
    let again = LocalSandbox::new(dir.path(), SandboxOptions::default()).unwrap();
    assert_eq!(home_of(&again), first, "the same path as the last run's");
    drop(again);
    // A home whose process died without removing it.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let stale = std::env::temp_dir().join(format!("steadfast-home-abandoned{dead}-0"));
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(stale.with_extension("owner"), dead.to_string()).unwrap();
    let _sandbox = LocalSandbox::new(dir.path(), SandboxOptions::default()).unwrap();
    assert!(!stale.exists(), "the abandoned home was reaped");
}
