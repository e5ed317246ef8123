//! `STEADFAST_BLOBS=s3://...`: big outputs of a real run land in an S3-compatible
//! store (moto's S3 server; `.ci/run` installs it).

mod common;

use std::process::Command;

use serde_json::{json, Value};
use steadfast_testkit::{FakeProvider, Script};

#[tokio::test]
async fn big_outputs_go_to_the_configured_s3_bucket() {
    let moto = common::Moto::start("outputs");
    let endpoint = moto.endpoint.clone();

    let script: Script = serde_json::from_value(json!({"steps": [
        {"text": "lots of output", "tool_calls": [{"name": "bash", "input": {"command": "seq 1 50000"}}]},
        {"text": "done"}
    ]}))
    .unwrap();
    let fake = FakeProvider::start(script).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_steadfast"))
        .args([
            "run",
            "print numbers",
            "--workspace",
            dir.path().join("ws").to_str().unwrap(),
            "--create",
            "--json",
        ])
        .env("STEADFAST_HOME", dir.path().join("home"))
        .env("STEADFAST_BLOBS", "s3://outputs/steadfast")
        .env("STEADFAST_MODEL", "anthropic/claude-sonnet-4-5")
        .env("ANTHROPIC_API_KEY", "test-key")
        .env("ANTHROPIC_BASE_URL", fake.base_url())
        .env("AWS_ENDPOINT", &endpoint)
        .env("AWS_ALLOW_HTTP", "true")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    let log = tokio::process::Command::new(env!("CARGO_BIN_EXE_steadfast"))
        .args(["log", result["session"].as_str().unwrap(), "--json"])
        .env("STEADFAST_HOME", dir.path().join("home"))
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&log.stdout);
    let blob = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find_map(|r| {
            r["event"]["tool_call_outcome"]["output"]
                .as_object()
                .filter(|o| o["kind"] == "blob")
                .cloned()
        })
        .expect("the big output is a blob reference");
    let hash = blob["hash"].as_str().unwrap();
    assert_eq!(blob["uri"], format!("s3://outputs/steadfast/{hash}"));
    // The bucket holds it under the prefix, with the recorded size...
    let listing = Command::new("curl")
        .args([
            "-sf",
            &format!("{endpoint}/outputs?list-type=2&prefix=steadfast/"),
        ])
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&listing.stdout);
    assert!(
        listing.contains(&format!("<Key>steadfast/{hash}</Key>")),
        "{listing}"
    );
    assert!(
        listing.contains(&format!("<Size>{}</Size>", blob["size"])),
        "{listing}"
    );
    // ...and reading it back (hash-verified) gives the whole output.
    for (k, v) in [
        ("AWS_ENDPOINT", endpoint.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_REGION", "us-east-1"),
    ] {
        std::env::set_var(k, v);
    }
    let bytes = steadfast_world::Blobs::open("s3://outputs/steadfast")
        .unwrap()
        .get(hash)
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&bytes).ends_with("49999\n50000\n"));
}

/// A first deployment's store has no bucket: `migrate --create-bucket` makes it with
/// a signed request (the store's own `AWS_*` settings), says so, and a second run
/// finds it there; a server then starts against it.
#[tokio::test]
async fn migrate_makes_the_missing_bucket_once() {
    let moto = common::Moto::start("unrelated");
    let home = tempfile::tempdir().unwrap();
    let migrate = || {
        Command::new(env!("CARGO_BIN_EXE_steadfast"))
            .args(["migrate", "--create-bucket"])
            .env("STEADFAST_HOME", home.path())
            .env("STEADFAST_BLOBS", "s3://made-here/steadfast")
            .env("AWS_ENDPOINT", &moto.endpoint)
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_REGION", "us-east-1")
            .output()
            .unwrap()
    };
    let exists = || {
        Command::new("curl")
            .args(["-sf", "-o", "/dev/null", "-I"])
            .arg(format!("{}/made-here", moto.endpoint))
            .status()
            .unwrap()
            .success()
    };
    assert!(!exists(), "the bucket is missing before migrate");
    let first = migrate();
    let said = String::from_utf8_lossy(&first.stderr);
    assert!(first.status.success(), "{said}");
    assert!(
        said.contains("made the bucket of s3://made-here/steadfast"),
        "{said}"
    );
    assert!(exists(), "migrate made the bucket");
    let second = migrate();
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(second.status.success(), "{said}");
    assert!(
        said.contains("the bucket of s3://made-here/steadfast is there"),
        "{said}"
    );
}
