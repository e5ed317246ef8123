//! `steadfast bench gateway`: what the gateway adds to a model call, against calling the
//! fake provider directly, in the same run: the round trip of a whole (non-streamed)
//! call, and the time to the first byte of a streamed one (which must pass through as
//! it arrives, not after the reply is buffered).

use std::time::{Duration, Instant};

use serde_json::json;
use steadfast_drive::Drive;
use steadfast_gateway::{Gateway, GatewayConfig, Upstream, Upstreams};
use steadfast_journal::exchange::{Exchanges, ExchangesConfig};
use steadfast_log::{Event, ModelSpec};
use steadfast_testkit::{FakeProvider, Script};
use steadfast_world::{Holder, SqliteWorld, World};

use super::bench::Rounds;

const TOKEN: &str = "bench-session-token";

async fn call(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    n: usize,
    stream: bool,
) -> anyhow::Result<(Duration, Duration)> {
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 256, "stream": stream,
        "messages": [{"role": "user", "content": format!("request {n}")}]});
    let start = Instant::now();
    let resp = client
        .post(format!("{base}/v1/messages"))
        .header("x-api-key", key)
        .header("anthropic-version", "2023-06-01")
        .json(&body)
        .send()
        .await?;
    anyhow::ensure!(resp.status().is_success(), "HTTP {}", resp.status());
    let mut stream = resp.bytes_stream();
    let mut first = None;
    use futures_util::StreamExt;
    while let Some(chunk) = stream.next().await {
        chunk?;
        first.get_or_insert_with(|| start.elapsed());
    }
    Ok((first.unwrap_or_default(), start.elapsed()))
}

/// A gateway over a fresh session of `world`, relaying to `fake`, served on loopback.
async fn serve_gateway(
    dir: &std::path::Path,
    world: &SqliteWorld,
    session: &str,
    fake: &FakeProvider,
) -> anyhow::Result<(String, tokio::task::JoinHandle<()>)> {
    world.create_session(session, "bench").await?;
    let lease = world
        .acquire_lease(session, &Holder::new("bench"), Duration::from_secs(600))
        .await?;
    world
        .append(
            &lease,
            &[Event::bare_start(
                "claude-code",
                ModelSpec {
                    provider: "anthropic".into(),
                    model: "claude-sonnet-4-5".into(),
                },
                &dir.display().to_string(),
            )],
        )
        .await?;
    let exchanges = Exchanges::new(ExchangesConfig {
        live: std::sync::Arc::new(steadfast_world::LiveSession::open(world.clone(), lease).await?),
        drive: Drive::open(dir.join("drive"))?,
        workspace: dir.to_path_buf(),
        last_snapshot: Default::default(),
        blobs: steadfast_world::Blobs::local(&dir.join("blobs"))?,
        max_exchanges: None,
        extra_bound: None,
        prices: Default::default(),
        mismatch: Default::default(),
    });
    let gateway = Gateway::open(GatewayConfig {
        http: steadfast_model::provider_http(),
        exchanges: std::sync::Arc::new(exchanges),
        token: TOKEN.into(),
        upstreams: Upstreams {
            anthropic: Some(Upstream {
                base_url: fake.base_url(),
                api_key: "fake-key".into(),
            }),
            openai: None,
        },
        models: vec![],
        continuing: Default::default(),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let app = gateway.router();
    // As the wrapped CLI's gateway is served over TCP: no reply waits for Nagle.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((url, server))
}

pub(crate) async fn run(rounds: usize) -> anyhow::Result<()> {
    // The whole call is timed on a reply that comes at once, so what the gateway adds
    // is not lost in the provider's own time; the first byte on one that streams in
    // chunks 5 ms apart, so buffering would show.
    let fast: Script = serde_json::from_value(json!({"steps": [
        {"text": "A reply of some length, as a model would write it. ".repeat(4)}
    ]}))?;
    let slow: Script = serde_json::from_value(json!({"steps": [
        {"text": "A reply of some length, streamed in pieces as a model would. ".repeat(4), "chunk_delay_ms": 5}
    ]}))?;
    let (fast, slow) = (
        FakeProvider::start(fast).await?,
        FakeProvider::start(slow).await?,
    );
    let dir = tempfile::tempdir()?;
    let world = SqliteWorld::open(dir.path().join("world.db"))?;
    let (fast_gw, fast_server) = serve_gateway(dir.path(), &world, "bench-whole", &fast).await?;
    let (slow_gw, slow_server) = serve_gateway(dir.path(), &world, "bench-ttfb", &slow).await?;
    // One client, so every call after the first goes over a kept-alive connection.
    let client = reqwest::Client::new();
    for (base, key) in [
        (&fast.base_url(), "fake-key"),
        (&fast_gw, TOKEN),
        (&slow.base_url(), "fake-key"),
        (&slow_gw, TOKEN),
    ] {
        call(&client, base, key, 0, true).await?;
    }
    // The disk's floor, in the same run: one durable commit (WAL, synchronous=FULL) of
    // a small insert in the same directory. The gateway's first byte waits for one
    // (the exchange's intent), so no relay can add less than this. It is timed as the
    // intent's commit is made: after a streamed call and no commit just before it (on
    // a virtual machine a commit after a pause can cost twice one made right after
    // another, so a floor timed back to back would understate it).
    let floor_db = rusqlite::Connection::open(dir.path().join("floor.db"))?;
    floor_db.pragma_update(None, "journal_mode", "WAL")?;
    floor_db.pragma_update(None, "synchronous", "FULL")?;
    floor_db.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")?;
    let mut floor = Vec::with_capacity(rounds);
    let (mut whole, mut ttfb) = (Rounds::default(), Rounds::default());
    for n in 0..rounds {
        let direct = call(&client, &fast.base_url(), "fake-key", n, false)
            .await?
            .1;
        let gateway = call(&client, &fast_gw, TOKEN, n, false).await?.1;
        whole.push(direct, gateway);
        let direct = call(&client, &slow.base_url(), "fake-key", n, true)
            .await?
            .0;
        let gateway = call(&client, &slow_gw, TOKEN, n, true).await?.0;
        ttfb.push(direct, gateway);
        call(&client, &slow.base_url(), "fake-key", n, true).await?;
        let start = Instant::now();
        floor_db.execute("INSERT INTO t (body) VALUES (?1)", [vec![b'x'; 400]])?;
        floor.push(start.elapsed());
    }
    fast_server.abort();
    slow_server.abort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!("gateway: Anthropic Messages calls to the fake provider on kept-alive connections, direct vs through the gateway (each recorded durably), {rounds} alternating rounds");
    println!(
        "  whole call (not streamed):  direct {:>6.2} ms   gateway {:>6.2} ms   added {:+.2} ms (target < 2 ms)   ratio {:.2}x",
        ms(whole.base()), ms(whole.ours()), whole.added_ms(), whole.ratio()
    );
    println!(
        "  time to first byte (SSE):   direct {:>6.2} ms   gateway {:>6.2} ms   added {:+.2} ms (target < 1 ms)   ratio {:.2}x",
        ms(ttfb.base()), ms(ttfb.ours()), ttfb.added_ms(), ttfb.ratio()
    );
    let floor = super::bench_rounds::median(floor);
    println!(
        "  the disk's floor: one durable SQLite commit made as the intent's is (after a streamed call) takes {:.2} ms here (median); the first byte waits for one, so {:.2} ms of the added time is the rest of the path",
        ms(floor),
        ttfb.added_ms() - ms(floor)
    );
    println!("  (added: the median of per-round differences)");
    Ok(())
}
