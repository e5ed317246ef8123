//! Credentials at the egress proxy, through a real `steadfast serve` with bwrap
//! sandboxes: a session binds a credential from its owner's vault to a destination of
//! its allow-list, and the sandbox's plain-HTTP requests there arrive carrying it —
//! replacing whatever the sandbox sent — while nothing the sandbox can see (its
//! environment, its processes' environments, every file it can read) nor anything
//! Steadfast stores (the log, blobs, snapshots) holds the value.

use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use steadfast_testkit::{FakeProvider, Script};

mod common;

use common::{call, put_credential, VaultSite};

const SECRET: &str = "tracker-token-5f0c2a91";

/// A loopback HTTP server that records each request's head.
fn receiver() -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut buf = [0u8; 8192];
            let n = stream.read(&mut buf).unwrap_or(0);
            seen.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&buf[..n]).to_string());
            let head = String::from_utf8_lossy(&buf[..n]).to_string();
            let _ = stream.write_all(answer(&head).as_bytes());
        }
    });
    (port, heads)
}

/// What the receivers answer: `/echo` sends the request's head back (as a debugging
/// endpoint would), anything else a fixed text.
fn answer(head: &str) -> String {
    let body = match head.starts_with("GET /echo") {
        true => head.to_string(),
        false => "issue 7".to_string(),
    };
    format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// A certificate authority of the test's own, and a loopback HTTPS server with a
/// certificate it signed (for `localhost` and `127.0.0.1`) that records each
/// request's head, as [`receiver`] does.
fn tls_receiver(dir: &std::path::Path) -> (u16, Arc<Mutex<Vec<String>>>, std::path::PathBuf) {
    let mut ca = rcgen::CertificateParams::default();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "test upstream CA");
    ca.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign];
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let roots = dir.join("upstream-ca.pem");
    std::fs::write(&roots, ca_cert.pem()).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let leaf = rcgen::CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![leaf_cert.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
    )
    .unwrap();
    let config = Arc::new(config);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    std::thread::spawn(move || {
        for tcp in listener.incoming().flatten() {
            let (config, seen) = (config.clone(), seen.clone());
            std::thread::spawn(move || {
                let _ = tcp.set_read_timeout(Some(Duration::from_secs(10)));
                let conn = rustls::ServerConnection::new(config).unwrap();
                let mut tls = rustls::StreamOwned::new(conn, tcp);
                let mut head = Vec::new();
                let mut buf = [0u8; 8192];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head).to_string();
                seen.lock().unwrap().push(head.clone());
                let _ = tls.write_all(answer(&head).as_bytes());
                tls.conn.send_close_notify();
                let _ = tls.flush();
            });
        }
    });
    (port, heads, roots)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_credential_is_added_at_the_proxy_and_never_seen_inside() {
    let (port, heads) = receiver();
    let host = format!("localhost:{port}");
    // The command looks for the secret everywhere it can, without ever naming it.
    let command = format!(
        "curl -sS -m 5 -H 'Authorization: Bearer forged' http://{host}/issues/7 > fetched.txt; \
         curl -sS -m 5 -H 'Host: evil.test' http://{host}/issues/8 > hosted.txt; \
         curl -sS -m 5 http://{host}/echo > echoed.txt; \
         curl -sS -m 5 -X TRACE http://{host}/trace > traced.txt; {LOOK_FOR_IT}"
    );
    let script: Script = serde_json::from_value(json!({"steps": [
        {"text": "fetching", "tool_calls": [{"name": "bash", "input": {"command": command}}]},
        {"text": "done"}
    ]}))
    .unwrap();
    let fake = FakeProvider::start(script).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let site = VaultSite::new(
        dir.path(),
        &format!("[sandbox]\nbackend = \"bwrap\"\ninternal-hosts = [\"{host}\"]\n"),
    );
    let home = site.home.clone();
    let (_api, url) = site.serve(&fake, "1").await;
    put_credential(&url, "tracker", SECRET).await;

    // A binding must name a destination of the allow-list and a stored credential.
    let sessions = format!("{url}/v1/sessions");
    for (network, credential) in [
        (format!("allow:{host}"), "nothing-stored"),
        ("allow:example.com".to_string(), "tracker"),
    ] {
        let (status, body) = call(
            reqwest::Method::POST,
            &sessions,
            Some(json!({"network": network,
                   "egress_credentials": [{"host": host, "credential": credential}]})),
        )
        .await;
        assert_eq!(status, 422, "{body}");
        assert!(body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("egress_credentials"));
    }

    let workspace = run_turn(&url, &home, &format!("allow:{host}"), &host).await;

    assert_eq!(
        std::fs::read_to_string(workspace.join("fetched.txt")).unwrap(),
        "issue 7"
    );
    let heads = heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 3, "TRACE never left the proxy: {heads:?}");
    // An upstream that echoes the request hands back the credential masked.
    assert_masked(&std::fs::read_to_string(workspace.join("echoed.txt")).unwrap());
    let traced = std::fs::read_to_string(workspace.join("traced.txt")).unwrap();
    assert!(
        traced.contains("TRACE is not forwarded") && !traced.contains(SECRET),
        "{traced}"
    );
    let hosted = heads[1].to_ascii_lowercase();
    assert!(
        hosted.contains(&format!("host: {host}")) && !hosted.contains("evil.test"),
        "the request goes to the host it names: {}",
        heads[1]
    );
    let lower = heads[0].to_ascii_lowercase();
    assert!(
        lower.contains(&format!("authorization: bearer {SECRET}")),
        "{}",
        heads[0]
    );
    assert!(
        !lower.contains("forged"),
        "the sandbox's own header is replaced"
    );
    assert_nothing_of_the_secret(&workspace, &home);
}

/// Creates a session under `network` with credential `tracker` bound to `host`, waits
/// for its first turn to end, and returns its workspace.
async fn run_turn(
    url: &str,
    home: &std::path::Path,
    network: &str,
    host: &str,
) -> std::path::PathBuf {
    let sessions = format!("{url}/v1/sessions");
    let (status, created) = call(
        reqwest::Method::POST,
        &sessions,
        Some(json!({
            "task": "fetch issue 7",
            "network": network,
            "egress_credentials": [{"host": host, "credential": "tracker"}],
        })),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    common::idle_after(url, created["id"].as_str().unwrap(), 1).await;
    common::workspace_in(home, &created)
}

/// What an upstream that echoes the request (`echoed`) handed back: the credential
/// masked.
fn assert_masked(echoed: &str) {
    assert!(
        echoed
            .to_ascii_lowercase()
            .contains("authorization: bearer ****")
            && !echoed.contains(SECRET),
        "{echoed}"
    );
}

/// Neither what the sandbox could see (`env.txt`, `environ.txt` and `found.txt`, which
/// its command wrote) nor anything Steadfast stored holds the secret.
fn assert_nothing_of_the_secret(workspace: &std::path::Path, home: &std::path::Path) {
    for seen in ["env.txt", "environ.txt"] {
        let text = std::fs::read_to_string(workspace.join(seen)).unwrap();
        assert!(!text.is_empty() && !text.contains(SECRET), "{seen}: {text}");
    }
    let found = std::fs::read_to_string(workspace.join("found.txt")).unwrap();
    assert!(
        found.trim().is_empty(),
        "files the sandbox can read hold it: {found}"
    );
    // Nor does anything Steadfast stored: the log, blobs, snapshots, the vault.
    let stored: Vec<String> = walkdir::WalkDir::new(home)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_file())
        .filter(|e| {
            std::fs::read(e.path())
                .is_ok_and(|b| b.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()))
        })
        .map(|e| e.path().display().to_string())
        .collect();
    assert!(stored.is_empty(), "{stored:?}");
}

/// What a command runs to look for the secret everywhere it can, without naming it.
const LOOK_FOR_IT: &str = "env > env.txt; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' > environ.txt; \
     a=tracker-token; b=5f0c2a91; \
     grep -rsl \"$a-$b\" / --exclude-dir=proc --exclude-dir=sys --exclude-dir=usr > found.txt; true";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_requests_get_the_credential_through_the_sandboxs_own_authority() {
    let dir = tempfile::tempdir().unwrap();
    let (port, heads, upstream_roots) = tls_receiver(dir.path());
    // The same server by two names: the credential is bound to the first only.
    let host = format!("localhost:{port}");
    let other = format!("127.0.0.1:{port}");
    let command = format!(
        "curl -sS -m 10 -H 'Authorization: Bearer forged' https://{host}/issues/7 > fetched.txt 2>&1; \
         curl -sS -m 10 https://{host}/echo > echoed.txt 2>&1; \
         python3 -c 'import urllib.request; print(urllib.request.urlopen(\"https://{host}/issues/9\").read().decode())' > python.txt 2>&1; \
         node -e 'fetch(\"https://{host}/issues/11\").then(r => r.text()).then(t => console.log(t))' > node.txt 2>&1; \
         curl -sS -m 10 -X PROPFIND https://{host}/dav > dav.txt 2>&1; \
         curl -sS -m 10 https://{other}/echo > tunnelled.txt 2>&1; {LOOK_FOR_IT}"
    );
    let script: Script = serde_json::from_value(json!({"steps": [
        {"text": "fetching", "tool_calls": [{"name": "bash", "input": {"command": command}}]},
        {"text": "done"}
    ]}))
    .unwrap();
    let fake = FakeProvider::start(script).await.unwrap();
    let site = VaultSite::new(
        dir.path(),
        &format!("[sandbox]\nbackend = \"bwrap\"\ninternal-hosts = [\"{host}\", \"{other}\"]\n"),
    );
    // The proxy trusts destinations the host trusts: here, the test's own authority.
    let mut api = site
        .command(
            &fake,
            &["serve", "--listen", "127.0.0.1:0", "--workers", "1"],
        )
        .env("SSL_CERT_FILE", &upstream_roots)
        .spawn()
        .unwrap();
    let url = common::printed_url(&mut api).await;
    put_credential(&url, "tracker", SECRET).await;
    let workspace = run_turn(&url, &site.home, &format!("allow:{host},{other}"), &host).await;
    let read = |name: &str| std::fs::read_to_string(workspace.join(name)).unwrap();

    assert_eq!(read("fetched.txt"), "issue 7", "curl");
    assert_eq!(read("python.txt").trim(), "issue 7", "python's urllib");
    assert_eq!(read("node.txt").trim(), "issue 7", "node's fetch");
    assert_masked(&read("echoed.txt"));
    assert!(
        read("dav.txt").contains("PROPFIND is not forwarded"),
        "{}",
        read("dav.txt")
    );
    // The other name is tunnelled untouched: the sandbox checked the server's own
    // certificate, and nothing was added.
    let tunnelled = read("tunnelled.txt").to_ascii_lowercase();
    assert!(
        tunnelled.starts_with("get /echo") && !tunnelled.contains("authorization"),
        "{tunnelled}"
    );
    let heads = heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 5, "PROPFIND never left the proxy: {heads:?}");
    let credentialed: Vec<&String> = heads
        .iter()
        .filter(|h| h.to_ascii_lowercase().contains(&format!("host: {host}")))
        .collect();
    assert_eq!(credentialed.len(), 4, "{heads:?}");
    for head in credentialed {
        let lower = head.to_ascii_lowercase();
        assert!(
            lower.contains(&format!("authorization: bearer {SECRET}")) && !lower.contains("forged"),
            "{head}"
        );
    }
    assert_nothing_of_the_secret(&workspace, &site.home);
}
