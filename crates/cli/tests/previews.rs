//! Preview URLs: a dev server the agent starts in a bwrap sandbox whose network is
//! closed (`deny-all`) is reached through the API server — plain HTTP with curl, a
//! streamed answer, a large upload and a WebSocket echo — with its owner's token, and
//! not without it or with another owner's. Between turns the sandbox is gone; the
//! first request starts it again, services and all, and a queued message still gets
//! its turn. Nothing of the caller's credentials reaches the program.

mod common;

use std::time::Duration;

use common::agents_dir;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ALICE: &str = "alice-token-0123456789abcdef";
const BOB: &str = "bob-token-0123456789abcdef01";

/// A dev server: its page, `/headers` (what it was sent), `/stream` (an answer in
/// two parts), `/upload` (the size of the body it got) and a WebSocket echo.
const SERVER_JS: &str = r#"
const http = require('http'), crypto = require('crypto');
const seen = [], boot = String(Math.random());
const PAGE = '<h1 id="t">preview page</h1><script>' +
  'const ws = new WebSocket(location.href.replace(/^http/, "ws") + "ws");' +
  'ws.onopen = () => ws.send("from-the-page");' +
  'ws.onclose = () => setTimeout(() => location.reload(), 500);' +
  'ws.onmessage = e => { document.getElementById("t").textContent = "page says " + e.data; };' +
  '</script>';
const server = http.createServer((req, res) => {
  if (req.url.startsWith('/headers')) {
    res.setHeader('content-type', 'application/json');
    res.setHeader('set-cookie', ['theirs=1; Path=/', 'steadfast_forged=1; Path=/']);
    return res.end(JSON.stringify({url: req.url, headers: req.headers}));
  }
  if (req.url === '/stream') {
    res.write('first\n');
    return setTimeout(() => res.end('second\n'), 400);
  }
  if (req.url === '/upload') {
    let n = 0;
    req.on('data', c => n += c.length);
    return req.on('end', () => res.end(String(n)));
  }
  if (req.url === '/seen') return res.end(JSON.stringify(seen));
  if (req.url === '/boot') return res.end(boot);
  if (req.url === '/missing') { res.statusCode = 404; return res.end('not here'); }
  res.setHeader('content-type', 'text/html');
  res.end(PAGE);
});
server.on('upgrade', (req, socket) => {
  const accept = crypto.createHash('sha1')
    .update(req.headers['sec-websocket-key'] + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11')
    .digest('base64');
  socket.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n' +
    'Connection: Upgrade\r\nSec-WebSocket-Accept: ' + accept + '\r\n\r\n');
  socket.on('error', () => {});
  socket.on('data', buf => {
    if ((buf[0] & 0x0f) !== 1) return socket.end();  // only text frames; a close ends it
    const len = buf[1] & 127, mask = buf.subarray(2, 6), data = Buffer.alloc(len);
    for (let i = 0; i < len; i++) data[i] = buf[6 + i] ^ mask[i % 4];
    seen.push(data.toString());
    socket.write(Buffer.concat([Buffer.from([0x81, len + 5]), Buffer.from('echo:'), data]));
  });
});
server.listen(8000, '127.0.0.1');
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dev_server_in_a_closed_sandbox_is_reached_through_its_preview_url() {
    let write = format!("cat > server.js <<'JS'\n{SERVER_JS}\nJS\necho written");
    let fake = common::fake_playing(json!([
        {"text": "Writing it.", "tool_calls": [{"name": "bash", "input": {"command": write}}]},
        {"text": "Serving.", "tool_calls": [{"name": "service", "input": {
            "action": "start", "name": "web", "command": "node server.js", "port": 8000}}]},
        {"text": "Served."},
        {"text": "Second turn."},
    ]))
    .await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("steadfast.toml"),
        format!(
            "[sandbox]\nbackend = \"bwrap\"\n\
             [[server.tokens]]\nowner = \"alice\"\ntoken-hash = \"{}\"\n\
             [[server.tokens]]\nowner = \"bob\"\ntoken-hash = \"{}\"\n",
            steadfast_server::hash_token(ALICE),
            steadfast_server::hash_token(BOB),
        ),
    )
    .unwrap();
    let metrics_at = format!("127.0.0.1:{}", common::free_port());
    let mut server = common::site_command(
        dir.path(),
        &agents_dir(),
        &fake,
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--workers",
            "1",
            "--metrics-listen",
            &metrics_at,
        ],
    )
    .kill_on_drop(true)
    .spawn()
    .unwrap();
    let url = common::printed_url(&mut server).await;
    let http = reqwest::Client::new();
    let id = common::idle_session_as(
        &http,
        &url,
        ALICE,
        json!({
            "model": "anthropic/claude-sonnet-4-5", "network": "deny-all",
            "workspace": {"kind": "empty"}, "task": "serve the page",
        }),
    )
    .await;
    // The turn is over and its sandbox with it: listing the ports starts it again.
    let (code, listed) =
        common::get_json_as(&http, &format!("{url}/v1/sessions/{id}/ports"), ALICE).await;
    assert_eq!(code, 200, "{listed}");
    assert_eq!(listed["ports"][0]["port"], 8000, "{listed}");
    assert_eq!(listed["ports"][0]["service"], "web", "{listed}");
    let base = format!("{url}/v1/sessions/{id}/ports/8000/");
    assert_eq!(
        listed["ports"][0]["url"],
        base.trim_start_matches(&url),
        "{listed}"
    );
    let log = common::log_lines(common::site_command(
        dir.path(),
        &agents_dir(),
        &fake,
        &["log", &id, "--json"],
    ))
    .await;
    assert!(
        log.iter()
            .any(|r| r["event"].get("services_restarted").is_some()),
        "the wake is recorded: {log:?}"
    );

    // The command line lists them too, with whole URLs.
    let listed = tokio::process::Command::new(env!("CARGO_BIN_EXE_steadfast"))
        .args(["ports", &id, "--server", &url])
        .env("STEADFAST_TOKEN", ALICE)
        .output()
        .await
        .unwrap();
    assert!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&listed.stdout),
        format!("8000\tweb\t{base}\n")
    );

    // And shares one: the printed URL opens it without a token.
    let shared = tokio::process::Command::new(env!("CARGO_BIN_EXE_steadfast"))
        .args([
            "ports",
            &id,
            "--server",
            &url,
            "--share",
            "8000",
            "--expires-in",
            "600",
        ])
        .env("STEADFAST_TOKEN", ALICE)
        .output()
        .await
        .unwrap();
    assert!(
        shared.status.success(),
        "{}",
        String::from_utf8_lossy(&shared.stderr)
    );
    let shared_url = String::from_utf8_lossy(&shared.stdout).trim().to_string();
    assert!(
        shared_url.starts_with(&format!("{url}/v1/previews/sfl_")),
        "{shared_url}"
    );
    let opened = reqwest::get(&shared_url).await.unwrap();
    assert_eq!(opened.status(), 200);
    assert!(opened.text().await.unwrap().contains("preview page"));

    // A real client: curl, with the owner's token.
    let page = curl(&[
        "-sS",
        "-i",
        "-H",
        &format!("Authorization: Bearer {ALICE}"),
        &base,
    ])
    .await;
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains("<h1 id=\"t\">preview page</h1>"), "{page}");
    assert!(
        page.to_ascii_lowercase()
            .contains("content-security-policy: sandbox"),
        "{page}"
    );
    // Without the slash, to it (relative links resolve under the prefix).
    let bare = curl(&[
        "-sS",
        "-i",
        "-H",
        &format!("Authorization: Bearer {ALICE}"),
        base.trim_end_matches('/'),
    ])
    .await;
    assert!(bare.starts_with("HTTP/1.1 308"), "{bare}");
    // The program's own errors are its own, not rewritten.
    let missing = http
        .get(format!("{base}missing"))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    assert_eq!(missing.text().await.unwrap(), "not here");

    // Nothing of the caller's credentials reaches the program.
    let answer = http
        .get(format!("{base}headers?x=1"))
        .bearer_auth(ALICE)
        .header("cookie", "steadfast_console=secret; theirs=kept")
        .send()
        .await
        .unwrap();
    let cookies: Vec<String> = answer
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    assert_eq!(
        cookies,
        ["theirs=1; Path=/"],
        "Steadfast's cookie names are not the program's to set"
    );
    let seen: Value = answer.json().await.unwrap();
    assert_eq!(seen["url"], "/headers?x=1", "{seen}");
    let seen = &seen["headers"];
    assert!(seen.get("authorization").is_none(), "{seen}");
    assert_eq!(seen["cookie"], "theirs=kept", "{seen}");
    assert_eq!(seen["host"], "localhost:8000", "{seen}");
    assert!(
        seen["x-forwarded-host"]
            .as_str()
            .unwrap()
            .starts_with("127.0.0.1:"),
        "{seen}"
    );

    // Streamed as it comes, and a big upload whole.
    let mut streamed = http
        .get(format!("{base}stream"))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap();
    let first = streamed.chunk().await.unwrap().unwrap();
    assert_eq!(
        &first[..],
        b"first\n",
        "the first part comes before the second is written"
    );
    let upload = vec![7u8; 8 * 1024 * 1024];
    let got = http
        .post(format!("{base}upload"))
        .bearer_auth(ALICE)
        .body(upload)
        .send()
        .await
        .unwrap();
    assert_eq!(got.status(), 200);
    assert_eq!(got.text().await.unwrap(), (8 * 1024 * 1024).to_string());

    // A WebSocket, end to end.
    let addr = url.trim_start_matches("http://").to_string();
    let path = format!("/v1/sessions/{id}/ports/8000/ws");
    assert_eq!(
        websocket_echo(&addr, &path, Some(ALICE), "ping").await,
        Ok("echo:ping".into())
    );
    assert!(websocket_echo(&addr, &path, None, "ping")
        .await
        .unwrap_err()
        .starts_with("HTTP/1.1 401"));

    // Not without a token, not with another owner's, and not a port nothing listens on.
    for (token, want) in [(None, 401), (Some(BOB), 404)] {
        let mut req = http.get(&base);
        if let Some(token) = token {
            req = req.bearer_auth(token);
        }
        assert_eq!(req.send().await.unwrap().status(), want, "{token:?}");
    }
    let (code, body) =
        common::get_json_as(&http, &format!("{url}/v1/sessions/{id}/ports/8001/"), ALICE).await;
    assert_eq!(
        (code, body["error"]["code"].as_str()),
        (404, Some("port_closed")),
        "{body}"
    );

    // A share link: anyone with it reads the port, and only reads; until revoked.
    let made = http
        .post(format!("{url}/v1/sessions/{id}/links"))
        .bearer_auth(ALICE)
        .json(&json!({"port": 8000}))
        .send()
        .await
        .unwrap();
    assert_eq!(made.status(), 201);
    let made: Value = made.json().await.unwrap();
    let link = format!("{url}{}", made["url"].as_str().unwrap());
    let shared = curl(&["-sS", "-i", &link]).await;
    assert!(shared.starts_with("HTTP/1.1 200"), "{shared}");
    assert!(
        shared.contains("<h1 id=\"t\">preview page</h1>"),
        "{shared}"
    );

    // A browser opens it: the page's script runs, in its sandboxed origin, and talks to
    // the program over a WebSocket through the same link.
    let dom = chromium(&link, "preview-through-link.png", &dir.path().join("shots")).await;
    assert!(dom.contains("<h1 id=\"t\">"), "the page rendered: {dom}");
    let browser_log = dir.path().join("browser.log");
    // Its scratch files go in the test's directory: killed, it cannot clean them up.
    let mut browser = tokio::process::Command::new("chromium")
        .env("TMPDIR", dir.path())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
        ])
        .args(["--enable-logging=stderr", "--remote-debugging-port=0"])
        .arg(format!(
            "--user-data-dir={}",
            dir.path().join("browser").display()
        ))
        .arg(&link)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&browser_log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut seen = Value::Null;
    for _ in 0..300 {
        seen = http
            .get(format!("{link}seen"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if seen
            .as_array()
            .is_some_and(|s| s.iter().any(|m| m == "from-the-page"))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        seen.as_array()
            .is_some_and(|s| s.iter().any(|m| m == "from-the-page")),
        "the page's WebSocket message reached the program: {seen}; the browser said:\n{}",
        std::fs::read_to_string(&browser_log).unwrap_or_default()
    );
    browser.start_kill().unwrap();
    browser.wait().await.unwrap();
    let link_path = link.trim_start_matches(&url).to_string();
    assert_eq!(
        websocket_echo(&addr, &format!("{link_path}ws"), None, "hi").await,
        Ok("echo:hi".into())
    );
    let write = http
        .post(format!("{link}upload"))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(write.status(), 403, "a link only reads");
    let (code, listed) =
        common::get_json_as(&http, &format!("{url}/v1/sessions/{id}/links"), ALICE).await;
    assert_eq!(code, 200);
    assert_eq!(listed["links"][0]["port"], 8000, "{listed}");
    assert!(
        !listed.to_string().contains("sfl_"),
        "secrets are shown once: {listed}"
    );
    // Bad requests name the field and make nothing.
    for (body, field) in [
        (json!({"port": 8000, "expires_in_s": 0}), "expires_in_s"),
        (json!({"port": 0}), "port"),
        (json!({"port": 8000, "forever": true}), "forever"),
    ] {
        let refused = http
            .post(format!("{url}/v1/sessions/{id}/links"))
            .bearer_auth(ALICE)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 422, "{body}");
        let refused: Value = refused.json().await.unwrap();
        assert!(
            refused["error"]["message"]
                .as_str()
                .unwrap()
                .contains(field),
            "{refused}"
        );
    }
    let (_, listed_now) =
        common::get_json_as(&http, &format!("{url}/v1/sessions/{id}/links"), ALICE).await;
    // The one the command line made and the one above, oldest first; no more.
    let made_at: Vec<u64> = listed_now["links"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["created_at_ms"].as_u64().unwrap())
        .collect();
    assert_eq!(made_at.len(), 2, "{listed_now}");
    assert!(made_at[0] <= made_at[1], "{listed_now}");
    // Another owner can neither share nor revoke it.
    let theirs = http
        .post(format!("{url}/v1/sessions/{id}/links"))
        .bearer_auth(BOB)
        .json(&json!({"port": 8000}))
        .send()
        .await
        .unwrap();
    assert_eq!(theirs.status(), 404);
    let link_id = made["link"]["id"].as_str().unwrap();
    let revoke = |token: &'static str| {
        http.delete(format!("{url}/v1/sessions/{id}/links/{link_id}"))
            .bearer_auth(token)
            .send()
    };
    assert_eq!(revoke(BOB).await.unwrap().status(), 404);
    assert_eq!(revoke(ALICE).await.unwrap().status(), 204);
    assert_eq!(
        http.get(&link).send().await.unwrap().status(),
        404,
        "revoked at once"
    );
    // One that expires stops working when it does.
    let brief: Value = http
        .post(format!("{url}/v1/sessions/{id}/links"))
        .bearer_auth(ALICE)
        .json(&json!({"port": 8000, "expires_in_s": 1}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let brief = format!("{url}{}", brief["url"].as_str().unwrap());
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        http.get(&brief).send().await.unwrap().status(),
        404,
        "expired"
    );
    // A link's secret is not an API token.
    let secret = link_path
        .trim_start_matches("/v1/previews/")
        .trim_end_matches('/');
    assert_eq!(
        http.get(format!("{url}/v1/sessions/{id}"))
            .bearer_auth(secret)
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    let (_, audit) =
        common::get_json_as(&http, &format!("{url}/v1/sessions/{id}/audit"), ALICE).await;
    for action in [
        "preview.woke",
        "preview.link_created",
        "preview.link_revoked",
    ] {
        assert!(audit.to_string().contains(action), "{action} in {audit}");
    }

    // A message for the session: the visitors' hold gives way, the worker runs the turn.
    let sent = http
        .post(format!("{url}/v1/sessions/{id}/messages"))
        .bearer_auth(ALICE)
        .header("accept", "application/json")
        .json(&json!({"text": "again"}))
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), 202);
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let (_, shown) =
                common::get_json_as(&http, &format!("{url}/v1/sessions/{id}"), ALICE).await;
            if shown["status"] == "idle" && shown["turn"].as_u64() >= Some(2) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the second turn ran while the preview had the sandbox");
    // A signal queued for a wait not begun is no work for a worker: the first request
    // after the turn wakes the sandbox at once, and the hold keeps it (the same
    // program answers a while later).
    let queued = http
        .post(format!(
            "{url}/v1/sessions/{id}/signals/approval?queue=true"
        ))
        .bearer_auth(ALICE)
        .json(&json!({"approved": true}))
        .send()
        .await
        .unwrap();
    assert!(queued.status().is_success(), "{}", queued.status());
    // Had the queued signal counted as work, the visitor would have waited for a worker
    // that never comes and been refused (503 session_busy).
    let boot = async || {
        let answer = http
            .get(format!("{base}boot"))
            .bearer_auth(ALICE)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
        answer.text().await.unwrap()
    };
    let first = boot().await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(boot().await, first, "the hold kept its sandbox");

    let metrics = http
        .get(format!("http://{metrics_at}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for series in [
        r#"steadfast_preview_requests_total{kind="http",result="forwarded"}"#,
        r#"steadfast_preview_requests_total{kind="websocket",result="forwarded"}"#,
        r#"steadfast_preview_requests_total{kind="http",result="refused"}"#,
        "steadfast_preview_wake_seconds_count",
    ] {
        assert!(metrics.contains(series), "{series} in {metrics}");
    }

    // Closing the session while a visitors' hold has it: the close's interrupt asks for
    // the lease, the hold gives it back, and the session ends (a hold that kept it
    // would have the close refused once its wait ran out).
    assert_eq!(boot().await, first, "the hold still has its sandbox");
    let closed = http
        .post(format!("{url}/v1/sessions/{id}/close"))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(closed.status(), 200, "{}", closed.text().await.unwrap());
    assert_eq!(status(&http, &url, &id).await, "closed");
    let after = http
        .get(format!("{base}boot"))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap();
    assert_ne!(
        after.status(),
        200,
        "a closed session's sandbox is not woken"
    );
}

/// The session's status, as its owner sees it.
async fn status(http: &reqwest::Client, url: &str, id: &str) -> String {
    let (_, shown) = common::get_json_as(http, &format!("{url}/v1/sessions/{id}"), ALICE).await;
    shown["status"].as_str().unwrap_or_default().to_string()
}

/// The page at `url` as headless Chromium leaves it once its scripts have run (a
/// screenshot of it saved as `shot` beside the tests' other artefacts), with a profile
/// of its own in `profile` (a browser already running on another would take the page
/// over and exit).
async fn chromium(url: &str, shot: &str, profile: &std::path::Path) -> String {
    let shots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    std::fs::create_dir_all(profile).unwrap();
    let browser = |extra: String| {
        let mut cmd = tokio::process::Command::new("chromium");
        cmd.env("TMPDIR", profile);
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--virtual-time-budget=5000",
            &format!("--user-data-dir={}", profile.display()),
            &extra,
            url,
        ])
        .kill_on_drop(true);
        cmd
    };
    let screenshot = format!("--screenshot={}", shots.join(shot).display());
    let took = browser(screenshot).output().await.unwrap();
    assert!(
        took.status.success(),
        "{}",
        String::from_utf8_lossy(&took.stderr)
    );
    let dumped = tokio::time::timeout(
        Duration::from_secs(60),
        browser("--dump-dom".into()).output(),
    )
    .await
    .expect("chromium finished")
    .unwrap();
    assert!(
        dumped.status.success(),
        "{}",
        String::from_utf8_lossy(&dumped.stderr)
    );
    String::from_utf8_lossy(&dumped.stdout).to_string()
}

/// What curl prints for `args`.
async fn curl(args: &[&str]) -> String {
    let out = tokio::process::Command::new("curl")
        .args(args)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// Opens a WebSocket to `path` on `addr`, sends `text` in one masked frame and returns
/// the text frame that comes back, or the head of the answer when it is not a 101.
async fn websocket_echo(
    addr: &str,
    path: &str,
    token: Option<&str>,
    text: &str,
) -> Result<String, String> {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let hello = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{auth}\r\n"
    );
    tcp.write_all(hello.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        if tcp.read(&mut byte).await.unwrap() == 0 {
            break;
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_string();
    if !head.starts_with("HTTP/1.1 101") {
        return Err(head);
    }
    let mask = [0x12u8, 0x34, 0x56, 0x78];
    let mut frame = vec![0x81, 0x80 | text.len() as u8];
    frame.extend_from_slice(&mask);
    frame.extend(text.bytes().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    tcp.write_all(&frame).await.unwrap();
    let mut header = [0u8; 2];
    tcp.read_exact(&mut header).await.unwrap();
    assert_eq!(header[0], 0x81, "a final text frame");
    let mut payload = vec![0u8; (header[1] & 127) as usize];
    tcp.read_exact(&mut payload).await.unwrap();
    Ok(String::from_utf8(payload).unwrap())
}
