//! Rotating the vault's key: a credential written under the old key is sealed again
//! under the new one by `steadfast rekey-vault`, while the old key is still given;
//! without it, the credential cannot be opened and the command says which.

use base64::Engine as _;
use serde_json::json;
use steadfast_testkit::{FakeProvider, Script};

mod common;

use common::service;

fn key(byte: u8) -> (String, String) {
    let bytes = [byte; 32];
    (
        base64::engine::general_purpose::STANDARD.encode(bytes),
        blake3::hash(&bytes).to_hex()[..16].to_string(),
    )
}

fn key_ids(home: &std::path::Path) -> Vec<String> {
    sealed_by(home, "vault")
}

fn hook_key_ids(home: &std::path::Path) -> Vec<String> {
    sealed_by(home, "hooks")
}

/// The ids of the keys that sealed the credentials (`vault`) or hook keys (`hooks`).
fn sealed_by(home: &std::path::Path, table: &str) -> Vec<String> {
    let conn = rusqlite::Connection::open(home.join("world.db")).unwrap();
    let mut stmt = conn
        .prepare(&format!("SELECT key_id FROM {table} ORDER BY name"))
        .unwrap();
    stmt.query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<Vec<String>>>()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rekeying_seals_every_credential_under_the_new_key() {
    let fake = FakeProvider::start(Script::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let ((old, old_id), (new, new_id), (other, _)) = (key(1), key(2), key(3));

    let mut api = service(
        &home,
        &fake,
        &["serve", "--listen", "127.0.0.1:0", "--workers", "0"],
    );
    api.env("STEADFAST_VAULT_KEY", &old);
    let mut api = api.spawn().unwrap();
    let url = common::printed_url(&mut api).await;
    for name in ["github", "tracker"] {
        let resp = reqwest::Client::new()
            .put(format!("{url}/v1/vaults/{name}"))
            .json(&json!({"value": format!("{name}-token")}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 204);
    }
    // A signed hook's key is sealed by the same key.
    let session: serde_json::Value = reqwest::Client::new()
        .post(format!("{url}/v1/sessions"))
        .json(&json!({"task": "wait for CI"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = session["id"].as_str().unwrap().to_string();
    let hook: serde_json::Value = reqwest::Client::new()
        .post(format!("{url}/v1/sessions/{id}/hooks"))
        .json(&json!({"name": "ci", "check": "github", "then": "message"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let secret = hook["secret"].as_str().unwrap().to_string();
    api.start_kill().unwrap();
    api.wait().await.unwrap();
    assert_eq!(key_ids(&home), [old_id.clone(), old_id]);
    assert_eq!(hook_key_ids(&home), [key(1).1]);

    let rekey = |current: &str, retired: Option<&str>| {
        let mut cmd = service(&home, &fake, &["rekey-vault"]);
        cmd.env("STEADFAST_VAULT_KEY", current)
            .env_remove("STEADFAST_VAULT_OLD_KEYS")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        if let Some(k) = retired {
            cmd.env("STEADFAST_VAULT_OLD_KEYS", k);
        }
        cmd.output()
    };
    // Without the old key, nothing opens: the command fails naming the credential.
    let out = rekey(&new, None).await.unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("github"), "{said}");

    let out = rekey(&new, Some(&format!("{other},{old}"))).await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("3 credentials sealed again"));
    assert_eq!(key_ids(&home), [new_id.clone(), new_id.clone()]);
    assert_eq!(hook_key_ids(&home), [new_id]);
    let out = rekey(&new, None).await.unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("(3 already were"));

    // A server whose keys do not open the hook's says so (503, the operator's to fix);
    // one with the new key checks the delivery.
    let deliver = |url: String, n: u32| {
        let body = br#"{"conclusion": "success"}"#.to_vec();
        let secret = secret.clone();
        async move {
            let mut mac =
                <hmac::Hmac<sha2::Sha256> as hmac::KeyInit>::new_from_slice(secret.as_bytes())
                    .unwrap();
            hmac::Mac::update(&mut mac, &body);
            let signature = hex::encode(hmac::Mac::finalize(mac).into_bytes());
            reqwest::Client::new()
                .post(url)
                .header("content-type", "application/json")
                .header("x-hub-signature-256", format!("sha256={signature}"))
                .header("x-github-delivery", format!("d-{n}"))
                .body(body)
                .send()
                .await
                .unwrap()
        }
    };
    for (current, status) in [(other, 503u16), (new, 202)] {
        let mut api = service(
            &home,
            &fake,
            &["serve", "--listen", "127.0.0.1:0", "--workers", "0"],
        );
        api.env("STEADFAST_VAULT_KEY", &current)
            .env_remove("STEADFAST_VAULT_OLD_KEYS");
        let mut api = api.spawn().unwrap();
        let url = common::printed_url(&mut api).await;
        let resp = deliver(format!("{url}/v1/hooks/{id}/ci"), u32::from(status)).await;
        assert_eq!(resp.status(), status);
        if status == 503 {
            let said: serde_json::Value = resp.json().await.unwrap();
            assert_eq!(said["error"]["code"], "vault_unavailable", "{said}");
        }
        api.start_kill().unwrap();
        api.wait().await.unwrap();
    }
}
