//! `steadfast bench gateway`: what the gateway adds to a model call, against calling the
//! fake provider directly, in the same run: the round trip of a whole (non-streamed)
//! call, and the time to the first byte of a streamed one (which must pass through as
//! it arrives, not after the reply is buffered).

use std::time::{Duration, Instant};

use serde_json::json;
use steadfast_drive::Drive;
use steadfast_gateway::{Gateway, GatewayConfig, Upstream, Upstreams};
use steadfast_log::{Event, ModelSpec};
use steadfast_testkit::{FakeProvider, Script};
use steadfast_world::{Holder, SqliteWorld, World};

use super::bench::median;

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

pub(crate) async fn run(rounds: usize) -> anyhow::Result<()> {
    // Each reply streams in chunks 5 ms apart, so buffering would show in the TTFB.
    let script: Script = serde_json::from_value(json!({"steps": [
        {"text": "A reply of some length, streamed in pieces as a model would. ".repeat(4), "chunk_delay_ms": 5}
    ]}))?;
    let fake = FakeProvider::start(script).await?;
    let dir = tempfile::tempdir()?;
    let world = SqliteWorld::open(dir.path().join("world.db"))?;
    let drive = Drive::open(dir.path().join("drive"))?;
    world.create_session("bench", "bench").await?;
    let lease = world
        .acquire_lease("bench", &Holder::new("bench"), Duration::from_secs(600))
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
                &dir.path().display().to_string(),
            )],
        )
        .await?;
    let gateway = Gateway::open(GatewayConfig {
        live: std::sync::Arc::new(steadfast_world::LiveSession::open(world, lease).await?),
        drive,
        workspace: dir.path().to_path_buf(),
        token: TOKEN.into(),
        upstreams: Upstreams {
            anthropic: Some(Upstream {
                base_url: fake.base_url(),
                api_key: "fake-key".into(),
            }),
            openai: None,
        },
        models: vec![],
        last_snapshot: Default::default(),
        max_exchanges: None,
        prices: Default::default(),
        extra_bound: None,
    })
    .await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let app = gateway.router();
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let client = reqwest::Client::new();
    let (mut direct_rt, mut gw_rt, mut direct_ttfb, mut gw_ttfb) = (vec![], vec![], vec![], vec![]);
    for n in 0..rounds {
        direct_rt.push(
            call(&client, &fake.base_url(), "fake-key", n, false)
                .await?
                .1,
        );
        gw_rt.push(call(&client, &url, TOKEN, n, false).await?.1);
        direct_ttfb.push(
            call(&client, &fake.base_url(), "fake-key", n, true)
                .await?
                .0,
        );
        gw_ttfb.push(call(&client, &url, TOKEN, n, true).await?.0);
    }
    server.abort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let (drt, grt) = (median(direct_rt), median(gw_rt));
    let (dtf, gtf) = (median(direct_ttfb), median(gw_ttfb));
    println!("gateway: Anthropic Messages calls to the fake provider, direct vs through the gateway (each recorded durably), median of {rounds}");
    println!(
        "  whole call (not streamed):  direct {:>6.2} ms   gateway {:>6.2} ms   added {:+.2} ms   ratio {:.2}x",
        ms(drt), ms(grt), ms(grt) - ms(drt), ms(grt) / ms(drt)
    );
    println!(
        "  time to first byte (SSE):   direct {:>6.2} ms   gateway {:>6.2} ms   added {:+.2} ms   ratio {:.2}x",
        ms(dtf), ms(gtf), ms(gtf) - ms(dtf), ms(gtf) / ms(dtf)
    );
    Ok(())
}
