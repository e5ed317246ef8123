//! Retries with exponential backoff for transient provider failures.

use std::time::Duration;

use crate::{Delta, Error, Result};

/// How many times, and how patiently, to retry.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Attempts in all, including the first.
    pub max_attempts: u32,
    /// Delay before the first retry; doubled each time.
    pub initial_backoff: Duration,
    /// The longest delay between attempts.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
        }
    }
}

/// One attempt's failure: retry (after at least `after`, if the server said so) or stop.
pub(crate) enum Attempt {
    Retry {
        message: String,
        after: Option<Duration>,
        streamed: bool,
    },
    Fatal(Error),
}

/// Counts attempts and waits between them.
pub(crate) struct Retrier<'p> {
    policy: &'p RetryPolicy,
    attempts: u32,
    backoff: Duration,
}

impl<'p> Retrier<'p> {
    pub(crate) fn new(policy: &'p RetryPolicy) -> Self {
        Retrier {
            policy,
            attempts: 0,
            backoff: policy.initial_backoff,
        }
    }

    /// After a failed attempt: waits and returns `Ok` if another attempt should be
    /// made, or returns the error to give up with.
    pub(crate) async fn after_failure(
        &mut self,
        provider: &'static str,
        failure: Attempt,
        on_delta: &mut (dyn FnMut(Delta) + Send),
    ) -> Result<()> {
        self.attempts += 1;
        let (message, after, streamed) = match failure {
            Attempt::Fatal(e) => return Err(e),
            Attempt::Retry {
                message,
                after,
                streamed,
            } => (message, after, streamed),
        };
        if self.attempts >= self.policy.max_attempts {
            return Err(Error::Unavailable {
                provider,
                attempts: self.attempts,
                message,
            });
        }
        tracing::warn!(provider, attempt = self.attempts, %message, "model call failed; retrying");
        if streamed {
            on_delta(Delta::Restart);
        }
        let wait = after.unwrap_or(self.backoff).min(self.policy.max_backoff);
        tokio::time::sleep(wait).await;
        self.backoff = (self.backoff * 2).min(self.policy.max_backoff);
        Ok(())
    }
}

/// Sorts an HTTP failure into retry or fatal.
pub(crate) fn classify_status(
    provider: &'static str,
    status: reqwest::StatusCode,
    retry_after: Option<Duration>,
    body: &str,
) -> Attempt {
    let message = crate::error_message(body);
    if status.as_u16() == 429 || status.is_server_error() || status.as_u16() == 529 {
        Attempt::Retry {
            message: format!("{status}: {message}"),
            after: retry_after,
            streamed: false,
        }
    } else {
        Attempt::Fatal(Error::Rejected {
            provider,
            status: status.as_u16(),
            message,
        })
    }
}

pub(crate) fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64)
}

pub(crate) fn transport(e: reqwest::Error, streamed: bool) -> Attempt {
    Attempt::Retry {
        message: e.to_string(),
        after: None,
        streamed,
    }
}

/// Sends a prepared provider request; a transport failure or a non-2xx status becomes
/// a retryable or fatal [`Attempt`].
pub(crate) async fn send(
    provider: &'static str,
    request: reqwest::RequestBuilder,
) -> Result<reqwest::Response, Attempt> {
    let response = request.send().await.map_err(|e| transport(e, false))?;
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let after = retry_after(response.headers());
    let text = response.text().await.unwrap_or_default();
    Err(classify_status(provider, status, after, &text))
}
