//! Exporting traces over OTLP/HTTP, off unless `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set; configured by the standard
//! `OTEL_*` variables (protocol `http/protobuf`, the default, or `http/json`; headers;
//! `OTEL_SERVICE_NAME`; the batch processor's schedule). Spans are batched and sent by
//! the SDK's own thread, so exporting never blocks a turn.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::trace::SdkTracerProvider;

/// Sends the SDK's export requests with a blocking client, on the SDK's export thread
/// (which runs no async runtime). Made there, on first use, and dropped there.
#[derive(Debug, Default)]
struct ExportClient(std::sync::OnceLock<reqwest::blocking::Client>);

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for ExportClient {
    async fn send_bytes(
        &self,
        request: opentelemetry_http::Request<opentelemetry_http::Bytes>,
    ) -> Result<
        opentelemetry_http::Response<opentelemetry_http::Bytes>,
        opentelemetry_http::HttpError,
    > {
        let client = match self.0.get() {
            Some(client) => client,
            None => {
                let made = reqwest::blocking::Client::builder()
                    .timeout(std::time::Duration::from_secs(10))
                    .build()?;
                self.0.get_or_init(|| made)
            }
        };
        let (parts, body) = request.into_parts();
        let response = client
            .request(parts.method, parts.uri.to_string())
            .headers(parts.headers)
            .body(body.to_vec())
            .send()?;
        let status = response.status();
        let headers = response.headers().clone();
        let mut out = opentelemetry_http::Response::new(response.bytes()?);
        *out.status_mut() = status;
        *out.headers_mut() = headers;
        Ok(out)
    }
}

fn set(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// The tracer provider, when an OTLP endpoint is configured (and the SDK not disabled).
pub fn provider() -> Result<Option<SdkTracerProvider>, String> {
    let configured = set("OTEL_EXPORTER_OTLP_ENDPOINT")
        .or_else(|| set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
        .is_some();
    if !configured || set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    let protocol =
        set("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or_else(|| set("OTEL_EXPORTER_OTLP_PROTOCOL"));
    let protocol = match protocol.as_deref() {
        None | Some("http/protobuf") => opentelemetry_otlp::Protocol::HttpBinary,
        Some("http/json") => opentelemetry_otlp::Protocol::HttpJson,
        Some(other) => {
            return Err(format!(
                "OTEL_EXPORTER_OTLP_PROTOCOL={other}: steadfast exports over http/protobuf or http/json"
            ))
        }
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(protocol)
        .with_http_client(ExportClient::default())
        .build()
        .map_err(|e| format!("the OTLP exporter: {e}"))?;
    let instance = format!(
        "{}:{}",
        nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_default(),
        std::process::id()
    );
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(set("OTEL_SERVICE_NAME").unwrap_or_else(|| "steadfast".into()))
        .with_attribute(opentelemetry::KeyValue::new(
            "service.instance.id",
            instance,
        ))
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .with_id_generator(TurnIds::default())
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    Ok(Some(provider))
}

/// Span ids: random, except for a turn's root span, which takes the ids derived from
/// the log ([`steadfast_metrics::trace::pinned_ids`]) that its children name as parent.
#[derive(Debug, Default)]
struct TurnIds(opentelemetry_sdk::trace::RandomIdGenerator);

impl opentelemetry_sdk::trace::IdGenerator for TurnIds {
    fn new_trace_id(&self) -> opentelemetry::trace::TraceId {
        match steadfast_metrics::trace::pinned_ids() {
            Some((trace, _)) => trace,
            None => self.0.new_trace_id(),
        }
    }

    fn new_span_id(&self) -> opentelemetry::trace::SpanId {
        match steadfast_metrics::trace::pinned_ids() {
            Some((_, span)) => span,
            None => self.0.new_span_id(),
        }
    }
}

/// The layer that turns Steadfast's spans into OpenTelemetry spans.
pub fn layer<S>(provider: &SdkTracerProvider) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::Layer as _;
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("steadfast"))
        // The turns' own spans (model and tool calls, gateway exchanges) and sandbox
        // provisioning inside them; not the drive and request spans logs carry.
        .with_filter(
            tracing_subscriber::filter::Targets::new()
                .with_target("steadfast_metrics::trace", tracing::Level::DEBUG)
                .with_target("steadfast_sandbox", tracing::Level::DEBUG),
        )
}
