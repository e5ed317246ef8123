//! Choosing the model and building the harness from the environment.

use std::path::{Path, PathBuf};

use anyhow::Context;
use steadfast_harness::{Harness, HarnessOptions};
use steadfast_sandbox::AnySandbox;
use steadfast_world::AnyWorld;

use crate::config::Config;
use steadfast_testkit::{demo, FakeProvider, Script};

/// How long the bundled demo's replies pause between streamed chunks, so a person
/// watching it has time to interrupt it mid-run (a few seconds end to end).
pub const DEMO_PACE_MS: u64 = 25;

/// A harness for sessions of `provider`, plus the fake provider it talks to if
/// `provider` is `fake` (kept alive as long as the harness is used).
pub async fn harness(
    home: &Path,
    config: &Config,
    world: AnyWorld,
    provider: &str,
) -> anyhow::Result<(Harness<AnyWorld, AnySandbox>, Option<FakeProvider>)> {
    harness_paced(home, config, world, provider, None).await
}

/// [`harness`], with the fake provider's replies paced at `pace` ms per streamed
/// chunk (`None`: as the script says).
pub async fn harness_paced(
    home: &Path,
    config: &Config,
    world: AnyWorld,
    provider: &str,
    pace: Option<u64>,
) -> anyhow::Result<(Harness<AnyWorld, AnySandbox>, Option<FakeProvider>)> {
    if provider == "fake" {
        let mut script = match std::env::var("STEADFAST_FAKE_SCRIPT") {
            Ok(path) => Script::from_json(
                &std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?,
            )
            .with_context(|| format!("parsing {path}"))?,
            Err(_) => demo::script(),
        };
        if let Some(ms) = pace {
            for step in &mut script.steps {
                step.chunk_delay_ms = ms;
            }
        }
        let fake = FakeProvider::start(script)
            .await
            .context("starting the fake provider")?;
        eprintln!(
            "steadfast: using the bundled FAKE model provider at {} (no ANTHROPIC_API_KEY or OPENAI_API_KEY set): it plays a scripted demo, not a real model",
            fake.base_url()
        );
        let mut options = config.apply(HarnessOptions::fake_provider(&fake.base_url()));
        options.agents.upstreams = fake_upstreams(&fake.base_url());
        let harness = Harness::with_world_and_blobs(home, world, blobs(home, config)?, options)?;
        Ok((harness, Some(fake)))
    } else {
        let blobs = blobs(home, config)?;
        Ok((
            Harness::with_world_and_blobs(home, world, blobs, config.harness_options())?,
            None,
        ))
    }
}

/// The fake provider as the gateway's upstream for both APIs.
fn fake_upstreams(base_url: &str) -> steadfast_gateway::Upstreams {
    let up = |url: String| steadfast_gateway::Upstream {
        base_url: url,
        api_key: "fake-provider-key".into(),
    };
    steadfast_gateway::Upstreams {
        anthropic: Some(up(base_url.to_string())),
        openai: Some(up(format!("{base_url}/v1"))),
    }
}

/// A fresh directory for the demo project: `steadfast-demo`, or `steadfast-demo-N`
/// if that is taken.
pub fn demo_workspace() -> anyhow::Result<PathBuf> {
    let mut n = 1;
    loop {
        let name = if n == 1 {
            "steadfast-demo".to_string()
        } else {
            format!("steadfast-demo-{n}")
        };
        let path = PathBuf::from(&name);
        if !path.exists() {
            demo::write_project(&path)
                .with_context(|| format!("writing the demo project to {name}"))?;
            return Ok(path);
        }
        n += 1;
    }
}

/// Diagnostics on stderr, as text or JSON, filtered by `RUST_LOG`; without it, warnings,
/// and for a `service` (a server or worker: what operators collect) also Steadfast's
/// own info lines (turns, sessions stopping, the access log). Each line inside a
/// session's work carries its span (`drive{session=.. epoch=..}`; in JSON, `span` and
/// `spans`). Colour only on a terminal (and never with `NO_COLOR`).
///
/// With an OTLP endpoint configured (`OTEL_EXPORTER_OTLP_ENDPOINT`), traces are
/// exported too; the provider returned must be shut down as the process ends, so what
/// is batched is sent.
pub fn init_tracing(
    format: &str,
    service: bool,
) -> Option<opentelemetry_sdk::trace::SdkTracerProvider> {
    use std::io::IsTerminal;
    use tracing_subscriber::prelude::*;
    let default = if service {
        "warn,steadfast=info"
    } else {
        "warn"
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    let fmt = if format == "json" {
        fmt.json().with_filter(filter).boxed()
    } else {
        fmt.with_filter(filter).boxed()
    };
    let (provider, problem) = match crate::telemetry::provider() {
        Ok(provider) => (provider, None),
        Err(problem) => (None, Some(problem)),
    };
    let traces = provider.as_ref().map(crate::telemetry::layer);
    tracing_subscriber::registry().with(fmt).with(traces).init();
    if let Some(problem) = problem {
        tracing::warn!("traces are not exported: {problem}");
    }
    provider
}

/// The world named by `--world` / `STEADFAST_WORLD` / the config file, or the
/// embedded SQLite world under `home`.
pub async fn world(home: &Path, config: &Config, migrate: bool) -> anyhow::Result<AnyWorld> {
    let spec = config.world.as_deref();
    let world = AnyWorld::open(spec, home, migrate || config.migrate_on_open)
        .await
        .with_context(|| {
            format!(
                "opening the world {}",
                spec.map_or("(embedded SQLite)".into(), steadfast_world::redacted)
            )
        })?;
    Ok(world.with_spill(blobs(home, config)?))
}

/// What a server or worker checks before it takes any work: the world answers and the
/// blob store can be written and read back. A store it cannot use is named now, with
/// its cause, not found by the first session that needs it.
pub async fn check_stores(home: &Path, config: &Config, world: &AnyWorld) -> anyhow::Result<()> {
    use steadfast_world::World;
    world.ping().await.with_context(|| {
        format!(
            "the world {} does not answer",
            config
                .world
                .as_deref()
                .map_or("(embedded SQLite)".into(), steadfast_world::redacted)
        )
    })?;
    let where_ = config
        .blobs
        .clone()
        .unwrap_or_else(|| home.join("blobs").display().to_string());
    blobs(home, config)?
        .check_writable()
        .await
        .with_context(|| format!("the blob store {where_} cannot be written and read back"))?;
    Ok(())
}

/// Makes the configured blob store's bucket if it is missing (`migrate
/// --create-bucket`), saying what it found.
pub async fn create_bucket(home: &Path, config: &Config) -> anyhow::Result<()> {
    use steadfast_world::bucket::{create_bucket, BucketMade};
    let Some(url) = config.blobs.as_deref() else {
        eprintln!(
            "steadfast: the blob store is {} (a directory): no bucket to make",
            home.join("blobs").display()
        );
        return Ok(());
    };
    let made = create_bucket(url)
        .await
        .with_context(|| format!("making the bucket of {url}"))?;
    eprintln!(
        "steadfast: {}",
        match made {
            BucketMade::Created => format!("made the bucket of {url}"),
            BucketMade::AlreadyThere => format!("the bucket of {url} is there"),
            BucketMade::NotABucket =>
                format!("the blob store {url} is a directory: no bucket to make"),
        }
    );
    Ok(())
}

/// A harness for a server or worker process: sessions of the `fake` provider use a
/// fake provider started here (when one is needed), the rest use configured keys.
pub async fn shared_harness(
    home: &Path,
    config: &Config,
    world: AnyWorld,
) -> anyhow::Result<(
    std::sync::Arc<Harness<AnyWorld, AnySandbox>>,
    Option<FakeProvider>,
)> {
    let needs_fake = config.default_model().starts_with("fake/");
    let fake = if needs_fake {
        let (_, fake) = harness(home, config, world.clone(), "fake").await?;
        fake
    } else {
        None
    };
    let fake_url = fake.as_ref().map(|f| f.base_url());
    let real = config.harness_options();
    let real_models = real.models.clone();
    let models: steadfast_harness::ModelResolver =
        std::sync::Arc::new(move |spec| match (&fake_url, spec.provider.as_str()) {
            (Some(url), "fake") => (HarnessOptions::fake_provider(url).models)(spec),
            _ => real_models(spec),
        });
    let mut options = real;
    options.models = models;
    // Wrapped agents of a server whose default is the fake provider reach it for any
    // API that has no configured provider.
    if let Some(fake) = &fake {
        let up = fake_upstreams(&fake.base_url());
        let ups = &mut options.agents.upstreams;
        ups.anthropic = ups.anthropic.take().or(up.anthropic);
        ups.openai = ups.openai.take().or(up.openai);
    }
    // Workers renew often so a dead one's turn moves on quickly.
    options.lease_ttl = options.lease_ttl.min(std::time::Duration::from_secs(6));
    let harness = Harness::with_world_and_blobs(home, world, blobs(home, config)?, options)?;
    Ok((std::sync::Arc::new(harness), fake))
}

/// The blob store named by `STEADFAST_BLOBS` / the config file, or `blobs/` under
/// `home`.
pub fn blobs(home: &Path, config: &Config) -> anyhow::Result<steadfast_world::Blobs> {
    Ok(match &config.blobs {
        Some(url) => steadfast_world::Blobs::open(url)
            .with_context(|| format!("opening the blob store {url}"))?,
        None => steadfast_world::Blobs::local(&home.join("blobs"))?,
    })
}
