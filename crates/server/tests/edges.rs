//! The server's own edges against a hostile client: stalled and idle connections,
//! a connection flood, and inputs that must get a JSON 4xx and leave nothing behind.
//! (A thousand event streams are in `streams.rs`, alone, since they count threads.)

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::{assert_error, call, dev, server, server_with};
use serde_json::{json, Value};
use steadfast_server::ServeOptions;

fn host_port(url: &str) -> String {
    url.trim_start_matches("http://").to_string()
}

/// Whether the server closed `stream` (a read sees the end, or a reset).
fn closed(stream: &mut std::net::TcpStream) -> bool {
    let mut buf = [0u8; 256];
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return true,
            Ok(_) => continue, // a response (408 or the like) before the close
        }
    }
}

async fn healthz(url: &str) -> bool {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    client
        .get(format!("{url}/healthz"))
        .send()
        .await
        .is_ok_and(|r| r.status() == 200)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_connections_are_closed_within_the_timeout_while_the_server_answers() {
    let edges = ServeOptions {
        header_timeout: Duration::from_secs(1),
        ..ServeOptions::default()
    };
    let srv = server_with(json!([]), dev(), 0, |_| {}, edges).await;
    let addr = host_port(&srv.url);
    // Slow loris: half a request head each, then nothing; and as many idle ones.
    let mut stalled: Vec<std::net::TcpStream> = (0..400)
        .map(|i| {
            let mut s = std::net::TcpStream::connect(&addr).unwrap();
            if i % 2 == 0 {
                s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                    .unwrap();
            }
            s
        })
        .collect();
    assert!(healthz(&srv.url).await, "the server answers meanwhile");
    let started = Instant::now();
    let mut all = tokio::task::spawn_blocking(move || {
        for s in &mut stalled {
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            assert!(closed(s), "a stalled connection was closed");
        }
    });
    tokio::time::timeout(Duration::from_secs(15), &mut all)
        .await
        .expect("every stalled connection closed")
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    assert!(healthz(&srv.url).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_are_closed_at_once() {
    let edges = ServeOptions {
        max_connections: 20,
        header_timeout: Duration::from_secs(2),
        ..ServeOptions::default()
    };
    let srv = server_with(json!([]), dev(), 0, |_| {}, edges).await;
    let addr = host_port(&srv.url);
    let held: Vec<_> = (0..20)
        .map(|_| std::net::TcpStream::connect(&addr).unwrap())
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let extra = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let start = Instant::now();
        (closed(&mut s), start.elapsed())
    })
    .await
    .unwrap();
    assert!(extra.0 && extra.1 < Duration::from_millis(900), "{extra:?}");
    // Once the held ones time out, there is room again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(healthz(&srv.url).await);
    drop(held);
}

#[tokio::test]
async fn every_error_is_json_and_a_refused_create_leaves_nothing_behind() {
    let srv = server(json!([{"text": "hi"}]), dev(), 0, |_| {}).await;
    let sessions = format!("{}/v1/sessions", srv.url);
    let workspaces = srv._dir.path().join("home/workspaces");
    let count = || {
        std::fs::read_dir(&workspaces)
            .map(|d| d.count())
            .unwrap_or(0)
    };
    let before = count();
    let long = "n".repeat(5000);
    for files in [
        json!({"bad\u{0}name": "x"}),
        json!({"a": "file", "a/b": "inside a file"}),
        json!({ long.as_str(): "x" }),
        json!({"../escape": "x"}),
    ] {
        let got = call(
            reqwest::Method::POST,
            &sessions,
            None,
            Some(json!({"workspace": {"kind": "empty", "files": files}})),
        )
        .await;
        assert_error(&got, 422, "invalid_body");
        assert!(
            got.1["error"]["message"]
                .as_str()
                .unwrap()
                .contains("workspace.files"),
            "{got:?}"
        );
    }
    assert_eq!(count(), before, "no orphan workspace directory");

    // Statuses the framework answers itself are JSON too.
    let client = reqwest::Client::new();
    let resp = client.put(&sessions).send().await.unwrap();
    assert_eq!(resp.status(), 405);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "method_not_allowed", "{body}");
    let (_, created) = call(reqwest::Method::POST, &sessions, None, Some(json!({}))).await;
    let id = created["id"].as_str().unwrap();
    let resp = client
        .post(format!("{sessions}/{id}/signals/note"))
        .header("content-type", "application/json")
        .body(format!("\"{}\"", "x".repeat(300 * 1024)))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "body_too_large", "{body}");

    // A body that is not an object fills no struct by position.
    let sessions_before = call(reqwest::Method::GET, &sessions, None, None).await.1;
    for body in [json!([null, null]), json!([]), json!("x"), json!(7)] {
        let got = call(reqwest::Method::POST, &sessions, None, Some(body.clone())).await;
        assert_error(&got, 422, "invalid_body");
    }
    let got = call(
        reqwest::Method::POST,
        &format!("{sessions}/{id}/messages"),
        None,
        Some(json!(["hello"])),
    )
    .await;
    assert_error(&got, 422, "invalid_body");
    assert_eq!(
        call(reqwest::Method::GET, &sessions, None, None).await.1,
        sessions_before,
        "no session was made"
    );

    // A position past what the stores can hold is a bad query, not an outage.
    for query in ["after=18446744073709551615", "cursor=9223372036854775808"] {
        let resp = client
            .get(format!("{sessions}/{id}/events?{query}"))
            .header("accept", "application/json")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 400, "{query}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["code"], "invalid_query", "{query}: {body}");
    }
    let resp = client
        .get(format!("{sessions}/{id}/events"))
        .header("last-event-id", "9223372036854775808")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
}

/// Sends `head` and a few bytes of a body it declares far larger, holding the
/// connection open, and returns the status line the server answers with (within 10 s:
/// a server waiting for the rest of the body never answers).
fn answer_before_the_body(url: &str, head: &str) -> String {
    let mut stream = std::net::TcpStream::connect(url.trim_start_matches("http://")).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(b"\r\nustar").unwrap();
    let mut buf = [0u8; 512];
    let n = stream
        .read(&mut buf)
        .expect("the server answers without waiting for the body");
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// An upload's body is not read before its caller is known: an anonymous request
/// declaring 50 MB (under the upload limit) is refused at once, with nothing of it held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_is_refused_before_its_body_is_read() {
    let srv = server(json!([]), common::tokens(), 0, |_| {}).await;
    let url = srv.url.clone();
    let head = |auth: &str, length: u64| {
        format!(
            "POST /v1/uploads HTTP/1.1\r\nHost: test\r\nContent-Type: application/x-tar\r\n{auth}Content-Length: {length}\r\n"
        )
    };
    let anonymous = head("", 50 << 20);
    let line = tokio::task::spawn_blocking(move || answer_before_the_body(&url, &anonymous))
        .await
        .unwrap();
    assert!(line.contains(" 401 "), "{line}");
}

/// Sessions and uploads are limited per caller and minute: past the limit a caller
/// gets 429 naming it, and nothing is made; another caller is not held back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creations_are_limited_per_caller() {
    let srv = server(json!([]), common::tokens(), 0, |state| {
        state.creations_per_minute = 2
    })
    .await;
    let create = async |token: &str| {
        let response = reqwest::Client::new()
            .post(format!("{}/v1/sessions", srv.url))
            .bearer_auth(token)
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json::<Value>().await.unwrap_or_default())
    };
    assert_eq!(create("alice-secret").await.0, 201);
    let upload = reqwest::Client::new()
        .post(format!("{}/v1/uploads", srv.url))
        .bearer_auth("alice-secret")
        .header("content-type", "application/x-tar")
        .body(vec![0u8; 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(upload.status().as_u16(), 201);
    let refused = create("alice-secret").await;
    assert_error(&refused, 429, "rate_limited");
    assert!(
        refused.1["error"]["message"]
            .as_str()
            .unwrap()
            .contains("a minute from one caller"),
        "{}",
        refused.1
    );
    assert_eq!(create("bob-secret").await.0, 201, "another caller");
    let listed: Value = reqwest::Client::new()
        .get(format!("{}/v1/sessions", srv.url))
        .bearer_auth("alice-secret")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        listed["sessions"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
}

/// Uploads are bounded by the bytes a caller may store an hour, not only by how many
/// it makes: past the quota an upload is refused before it is stored (429), the
/// blob store keeps nothing of it, and another caller's quota is its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_past_a_caller_s_hourly_bytes_are_refused_unstored() {
    let srv = server(json!([]), common::tokens(), 0, |state| {
        state.upload_bytes_per_hour = Some(3 << 20);
    })
    .await;
    let upload = async |token: &str, fill: u8| {
        let response = reqwest::Client::new()
            .post(format!("{}/v1/uploads", srv.url))
            .bearer_auth(token)
            .header("content-type", "application/x-tar")
            .body(vec![fill; 1 << 20])
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json::<Value>().await.unwrap_or_default())
    };
    for fill in 1..=3 {
        let (status, body) = upload("alice-secret", fill).await;
        assert_eq!(status, 201, "{body}");
    }
    let refused = upload("alice-secret", 4).await;
    assert_error(&refused, 429, "rate_limited");
    assert!(
        refused.1["error"]["message"]
            .as_str()
            .unwrap()
            .contains("3 MiB of uploads an hour"),
        "{}",
        refused.1
    );
    let stored = |fill: u8| {
        srv._dir
            .path()
            .join("home/blobs")
            .join(blake3::hash(&vec![fill; 1 << 20]).to_hex().as_str())
            .exists()
    };
    assert!(stored(3), "the uploads within the quota are stored");
    assert!(!stored(4), "the refused one is not");
    assert_eq!(upload("bob-secret", 5).await.0, 201, "another caller");
}

/// One address cannot take every connection slot: past its cap its new connections
/// are closed at once, while another address is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_take_every_connection() {
    let edges = ServeOptions {
        max_connections_per_ip: Some(10),
        header_timeout: Duration::from_secs(30),
        ..ServeOptions::default()
    };
    let srv = server_with(json!([]), dev(), 0, |_| {}, edges).await;
    let addr = host_port(&srv.url);
    let held: Vec<_> = (0..10)
        .map(|_| std::net::TcpStream::connect(&addr).unwrap())
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let probe = addr.clone();
    let extra = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(&probe).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let start = Instant::now();
        (closed(&mut s), start.elapsed())
    })
    .await
    .unwrap();
    assert!(
        extra.0 && extra.1 < Duration::from_millis(1500),
        "{extra:?}"
    );

    // Another address (all of 127/8 is loopback) is served meanwhile.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    let mut other = socket.connect(addr.parse().unwrap()).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    other
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(5), other.read_to_string(&mut answer))
        .await
        .expect("another address is answered")
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    refusals_counted(&from("127.0.0.2"), &srv.url, "connections_per_ip").await;
    drop(held);
}

/// One address past its request rate is answered 429 (JSON, counted), before its
/// request is looked at, while another address and every address's health probes
/// are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_past_its_request_rate_is_told_to_slow_down() {
    let edges = ServeOptions {
        requests_per_minute_per_ip: Some(20),
        ..ServeOptions::default()
    };
    let srv = server_with(json!([]), dev(), 0, |_| {}, edges).await;
    let (one, two) = (from("127.0.0.1"), from("127.0.0.3"));
    let sessions = format!("{}/v1/sessions", srv.url);
    let mut statuses = Vec::new();
    for _ in 0..30 {
        statuses.push(one.get(&sessions).send().await.unwrap().status().as_u16());
    }
    let served = statuses.iter().filter(|s| **s == 200).count();
    assert!((20..=21).contains(&served), "{statuses:?}");
    let refused = one.get(&sessions).send().await.unwrap();
    assert_eq!(refused.status(), 429);
    let body: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "rate_limited", "{body}");
    // Probes pass however many; another address is served.
    for _ in 0..30 {
        let probe = one
            .get(format!("{}/healthz", srv.url))
            .send()
            .await
            .unwrap();
        assert_eq!(probe.status(), 200);
    }
    assert_eq!(two.get(&sessions).send().await.unwrap().status(), 200);
    refusals_counted(&two, &srv.url, "rate_limited").await;
}

/// A client whose connections come from `ip` (all of 127/8 is loopback).
fn from(ip: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(ip.parse::<std::net::IpAddr>().unwrap())
        .build()
        .unwrap()
}

/// The server at `url` counts refusals for `reason` in its metrics.
async fn refusals_counted(client: &reqwest::Client, url: &str, reason: &str) {
    let metrics = client
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.contains("http_refused") && l.contains(reason)),
        "{metrics}"
    );
}

/// A body trickled a byte at a time, never idle long enough for the idle timeout,
/// still has to arrive by the body deadline: the request is ended then, not when the
/// client pleases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_body_is_cut_off_at_its_deadline() {
    let edges = ServeOptions {
        body_deadline: Duration::from_secs(2),
        body_timeout: Duration::from_secs(30),
        ..ServeOptions::default()
    };
    let srv = server_with(json!([]), dev(), 0, |_| {}, edges).await;
    let addr = host_port(&srv.url);
    let cut = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.write_all(
            b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
              Content-Length: 100\r\n\r\n",
        )
        .unwrap();
        let start = Instant::now();
        // A byte every 300 ms: 30 s for the whole body, never idle for long.
        for _ in 0..100 {
            if s.write_all(b" ").is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(300));
            s.set_nonblocking(true).unwrap();
            let mut buf = [0u8; 512];
            let answered =
                matches!(s.read(&mut buf), Ok(n) if n > 0) || matches!(s.read(&mut buf), Ok(0));
            s.set_nonblocking(false).unwrap();
            if answered {
                return Some((start.elapsed(), String::from_utf8_lossy(&buf).to_string()));
            }
        }
        None
    })
    .await
    .unwrap();
    let (after, answer) = cut.expect("the request was never cut off");
    assert!(after < Duration::from_secs(8), "{after:?}");
    assert!(answer.starts_with("HTTP/1.1 4"), "{answer}");
    assert!(healthz(&srv.url).await);
}
