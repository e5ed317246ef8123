//! The HTTP API as the CLI's way to a session (`--server URL`): operators and users
//! read and control sessions with a bearer token, and never need the database's
//! credentials or a route to it.

use std::path::Path;

use serde_json::Value;

/// Where the token comes from when `--token-file` is not given.
pub const TOKEN_ENV: &str = "STEADFAST_TOKEN";

/// A client of one server, acting as the token's owner.
pub struct Remote {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

/// What a call to the server can fail with.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The server could not be reached, or its answer not read.
    #[error("cannot reach the server at {base}: {source}")]
    Unreachable {
        /// The server.
        base: String,
        /// Why.
        source: reqwest::Error,
    },
    /// The server answered with an API error.
    #[error("the server refused: {message} ({status} {code})")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The API's error code (`session_not_found`, `unauthorized`, ...).
        code: String,
        /// Its message.
        message: String,
    },
}

impl Remote {
    /// A client of `server` (`http://host:port`), with the token read from
    /// `token_file` if given, else from [`TOKEN_ENV`] (none: a server without tokens).
    pub fn new(server: &str, token_file: Option<&Path>) -> anyhow::Result<Self> {
        let base = server.trim_end_matches('/').to_string();
        let parsed = url::Url::parse(&base)
            .map_err(|e| anyhow::anyhow!("--server: `{base}` is not a URL: {e}"))?;
        anyhow::ensure!(
            matches!(parsed.scheme(), "http" | "https") && parsed.host().is_some(),
            "--server: `{base}` is not an http:// or https:// URL"
        );
        anyhow::ensure!(
            parsed.username().is_empty() && parsed.password().is_none(),
            "--server: put the token in {TOKEN_ENV} or --token-file, not in the URL"
        );
        let token = match token_file {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| anyhow::anyhow!("--token-file {}: {e}", path.display()))?
                    .trim()
                    .to_string(),
            ),
            None => std::env::var(TOKEN_ENV).ok().map(|t| t.trim().to_string()),
        }
        .filter(|t| !t.is_empty());
        Ok(Remote {
            base,
            token,
            http: reqwest::Client::builder()
                .connect_timeout(std::time::Duration::from_secs(10))
                .build()?,
        })
    }

    /// The token calls are made with, if any (for connections made outside `reqwest`:
    /// a shell's WebSocket).
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The server's address, for messages.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Sends a request to `path` (with `query`), the body as JSON if given; the answer
    /// if it is a success, else the API's error.
    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<reqwest::Response, RemoteError> {
        let unreachable = |source| RemoteError::Unreachable {
            base: self.base.clone(),
            source,
        };
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .query(query)
            .header(reqwest::header::ACCEPT, "application/json");
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.map_err(unreachable)?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status().as_u16();
        let answer: Value = response.json().await.unwrap_or(Value::Null);
        let text = |key: &str| {
            answer["error"][key]
                .as_str()
                .unwrap_or_default()
                .to_string()
        };
        Err(RemoteError::Refused {
            status,
            code: text("code"),
            message: match text("message") {
                m if m.is_empty() => format!("HTTP {status}"),
                m => m,
            },
        })
    }

    /// [`Remote::send`], and the answer's JSON body (`null` if it has none).
    pub async fn json(
        &self,
        method: reqwest::Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<Value, RemoteError> {
        let response = self.send(method, path, query, body).await?;
        if response.status() == reqwest::StatusCode::NO_CONTENT {
            return Ok(Value::Null);
        }
        response
            .json()
            .await
            .map_err(|source| RemoteError::Unreachable {
                base: self.base.clone(),
                source,
            })
    }
}

/// `segment` made safe to put in a URL path (a session id or signal name a user typed).
pub fn segment(text: &str) -> String {
    let mut url = url::Url::parse("http://x/").expect("a valid URL");
    url.path_segments_mut()
        .expect("an http URL has segments")
        .pop()
        .push(text);
    url.path()[1..].to_string()
}
