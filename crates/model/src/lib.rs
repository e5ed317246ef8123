//! Model clients: the Anthropic Messages API and the OpenAI Chat Completions API,
//! streaming, with tool calls, usage and cost.
//!
//! Both speak the provider-neutral conversation of `steadfast-log` ([`Message`],
//! [`Block`]), so the harness and the log never depend on a wire format. Transient
//! failures (429, 5xx, 529, a dropped connection) are retried with exponential backoff;
//! a 4xx is a clear, terminal [`Error::Rejected`].

mod anthropic;
mod gate;
mod openai;
mod prepared;
pub mod pricing;
mod retry;
mod sse;

use std::time::Duration;

use serde::Serialize;
use steadfast_log::{Block, Message, ModelSpec, Usage};

pub use gate::{gate, while_polling, Gate, GateOpener};
pub use prepared::{Prepared, RequestBuilder, RequestHead};
pub use retry::RetryPolicy;

/// A tool as the model is told of it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolDef {
    /// Its name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// JSON Schema of its input.
    pub input_schema: serde_json::Value,
}

/// One model call, provider-neutral, owning its parts (for one-off calls; a session's
/// calls are built with a [`RequestBuilder`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelRequest {
    /// The provider's model name.
    pub model: String,
    /// The system prompt.
    pub system: String,
    /// The conversation.
    pub messages: Vec<Message>,
    /// The tools on offer.
    pub tools: Vec<ToolDef>,
    /// The most tokens the reply may have.
    pub max_tokens: u32,
}

impl ModelRequest {
    /// Its parts besides the messages.
    pub fn head(&self) -> RequestHead<'_> {
        RequestHead {
            model: &self.model,
            system: &self.system,
            tools: &self.tools,
            max_tokens: self.max_tokens,
        }
    }
}

/// A model's complete reply.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelResponse {
    /// The assistant message's blocks.
    pub content: Vec<Block>,
    /// Why it stopped: `end_turn`, `tool_use`, `max_tokens`, ...
    pub stop_reason: String,
    /// Tokens consumed.
    pub usage: Usage,
}

/// Pieces of a reply as they stream in, for showing progress.
#[derive(Debug, Clone, PartialEq)]
pub enum Delta {
    /// More text.
    Text(String),
    /// The model began a tool call.
    ToolUse {
        /// The tool's name.
        name: String,
    },
    /// A dropped connection is being retried: discard what was shown of this reply.
    Restart,
}

/// Everything that can go wrong calling a model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The provider refused the request (4xx other than 429). Retrying will not help.
    #[error("{provider} rejected the request ({status}): {message}")]
    Rejected {
        /// The provider.
        provider: &'static str,
        /// The HTTP status.
        status: u16,
        /// The provider's message.
        message: String,
    },
    /// The provider stayed unavailable through every retry.
    #[error("{provider} unavailable after {attempts} attempts: {message}")]
    Unavailable {
        /// The provider.
        provider: &'static str,
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        message: String,
    },
    /// The reply did not follow the wire format.
    #[error("{provider} sent a malformed reply: {message}")]
    Protocol {
        /// The provider.
        provider: &'static str,
        /// What was wrong.
        message: String,
    },
    /// The client is not set up correctly (unknown provider, no key).
    #[error("model configuration: {0}")]
    Config(String),
    /// The request's [`Gate`] was refused (its intent was not recorded), so the request
    /// was abandoned before the provider had all of it.
    #[error("the request was withheld: its intent was not recorded")]
    Withheld,
}

impl Error {
    /// Whether a later attempt might succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::Unavailable { .. } | Error::Protocol { .. })
    }
}

/// The model layer's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How to reach one provider.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// Base URL, e.g. `https://api.anthropic.com`.
    pub base_url: String,
    /// The API key.
    pub api_key: String,
}

impl Endpoint {
    /// The endpoint for `provider` from `<PROVIDER>_API_KEY` and `<PROVIDER>_BASE_URL`.
    pub fn from_env(provider: &str) -> Option<Self> {
        let upper = provider.to_ascii_uppercase();
        let api_key = std::env::var(format!("{upper}_API_KEY"))
            .ok()
            .filter(|k| !k.is_empty())?;
        let default = match provider {
            "anthropic" => "https://api.anthropic.com",
            "openai" => "https://api.openai.com/v1",
            _ => return None,
        };
        let base_url = std::env::var(format!("{upper}_BASE_URL"))
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| default.to_string());
        Some(Endpoint { base_url, api_key })
    }
}

/// An HTTP client as provider calls need it. Clients are cheap to clone and share a
/// connection pool; whoever makes many [`ModelClient`]s (a harness, for every wake and
/// every wrapped CLI's gateway) makes one of these and gives it to all of them, so a
/// new wake reuses a warm connection (no new TLS handshake with a real provider).
pub fn provider_http() -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .read_timeout(Duration::from_secs(300))
        .build()
        .unwrap_or_else(|_| reqwest::Client::new())
}

/// A client for one provider.
#[derive(Debug, Clone)]
pub struct ModelClient {
    provider: Provider,
    endpoint: Endpoint,
    http: reqwest::Client,
    retry: RetryPolicy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Provider {
    Anthropic,
    OpenAi,
}

impl ModelClient {
    /// A client for `provider` (`anthropic` or `openai`) at `endpoint`.
    pub fn new(provider: &str, endpoint: Endpoint, retry: RetryPolicy) -> Result<Self> {
        let provider = match provider {
            "anthropic" => Provider::Anthropic,
            "openai" => Provider::OpenAi,
            other => {
                return Err(Error::Config(format!(
                    "unknown provider `{other}`; use anthropic or openai"
                )))
            }
        };
        Ok(ModelClient {
            provider,
            endpoint,
            http: provider_http(),
            retry,
        })
    }

    /// This client, calling through `http` (and its connection pool).
    pub fn with_http(mut self, http: reqwest::Client) -> Self {
        self.http = http;
        self
    }

    /// A client for the provider of `spec`, configured from the environment.
    pub fn from_env(spec: &ModelSpec) -> Result<Self> {
        let endpoint = Endpoint::from_env(&spec.provider).ok_or_else(|| {
            Error::Config(format!(
                "{}_API_KEY is not set",
                spec.provider.to_ascii_uppercase()
            ))
        })?;
        Self::new(&spec.provider, endpoint, RetryPolicy::default())
    }

    /// Calls the model, streaming, and returns the whole reply. `on_delta` sees the
    /// reply as it arrives.
    pub async fn complete(
        &self,
        request: &ModelRequest,
        on_delta: &mut (dyn FnMut(Delta) + Send),
    ) -> Result<ModelResponse> {
        let prepared = RequestBuilder::default().prepare(self, request.head(), &request.messages);
        self.send(&prepared, on_delta).await
    }

    /// Sends a request built for this client's provider (see [`RequestBuilder`]),
    /// streaming, and returns the whole reply. `on_delta` sees the reply as it arrives.
    pub async fn send(
        &self,
        request: &Prepared,
        on_delta: &mut (dyn FnMut(Delta) + Send),
    ) -> Result<ModelResponse> {
        self.send_gated(request, Gate::open(), on_delta).await
    }

    /// [`Self::send`], with the request's last byte held back until `gate` opens (see
    /// [`gate`]); [`Error::Withheld`] if it is refused. Retries wait for it too.
    pub async fn send_gated(
        &self,
        request: &Prepared,
        gate: Gate,
        on_delta: &mut (dyn FnMut(Delta) + Send),
    ) -> Result<ModelResponse> {
        if request.provider != self.provider {
            return Err(Error::Config(format!(
                "a request built for another provider sent to {}",
                self.provider_name()
            )));
        }
        let name = self.provider_name();
        let mut retrier = retry::Retrier::new(&self.retry);
        loop {
            let body = Body {
                bytes: &request.body,
                gate: &gate,
            };
            let result = match self.provider {
                Provider::Anthropic => {
                    anthropic::complete(&self.http, &self.endpoint, body, on_delta).await
                }
                Provider::OpenAi => {
                    openai::complete(&self.http, &self.endpoint, body, on_delta).await
                }
            };
            match result {
                Ok(response) => return Ok(response),
                // Refused while it was sent: nothing to retry.
                Err(_) if gate.refused() => return Err(Error::Withheld),
                Err(failure) => retrier.after_failure(name, failure, on_delta).await?,
            }
        }
    }

    fn provider_name(&self) -> &'static str {
        match self.provider {
            Provider::Anthropic => "anthropic",
            Provider::OpenAi => "openai",
        }
    }
}

/// A request's body and the gate its last byte waits for.
pub(crate) struct Body<'a> {
    bytes: &'a bytes::Bytes,
    gate: &'a Gate,
}

impl Body<'_> {
    /// Puts the body on `request` (see [`Gate::attach`]).
    pub(crate) fn on(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        self.gate.attach(request, self.bytes)
    }
}

/// The text of a provider's error body, for messages.
pub(crate) fn error_message(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| {
            v.pointer("/error/message")
                .and_then(|m| m.as_str())
                .map(str::to_string)
        })
        .unwrap_or_else(|| body.chars().take(500).collect())
}
