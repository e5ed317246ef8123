//! A git server for tests: `git http-backend` (git's own smart-HTTP server, as a CGI
//! program) behind a small HTTP server on loopback that asks for HTTP basic auth, so
//! tests clone and push over the real protocol with a real credential. It records every
//! request: who asked (authorized or not) and which service, so a test can count the
//! pushes that arrived.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use axum::Router;

/// One request the server answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitRequest {
    /// `GET` or `POST`.
    pub method: String,
    /// The path and query, e.g. `/repo.git/git-receive-pack`.
    pub uri: String,
    /// Whether it carried the expected credential.
    pub authorized: bool,
}

impl GitRequest {
    /// Whether this request delivered a push (objects and ref updates).
    pub fn is_push(&self) -> bool {
        self.method == "POST" && self.uri.ends_with("/git-receive-pack")
    }
}

struct Shared {
    root: PathBuf,
    authorization: String,
    requests: Mutex<Vec<GitRequest>>,
}

/// A running git server over the bare repositories in a directory.
pub struct GitServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl GitServer {
    /// Serves the bare repositories under `root` (`<root>/<name>.git`) to clients
    /// authenticating as `user` with `password`.
    pub async fn start(root: PathBuf, user: &str, password: &str) -> std::io::Result<Self> {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let shared = Arc::new(Shared {
            root,
            authorization: format!("Basic {}", b64.encode(format!("{user}:{password}"))),
            requests: Mutex::new(Vec::new()),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let app = Router::new().fallback(serve).with_state(shared.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(GitServer { addr, shared, task })
    }

    /// The URL of repository `name` (`<root>/<name>.git`).
    pub fn url(&self, name: &str) -> String {
        format!("http://{}/{name}.git", self.addr)
    }

    /// Every request answered so far.
    pub fn requests(&self) -> Vec<GitRequest> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// How many authorized pushes arrived.
    pub fn pushes(&self) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.is_push() && r.authorized)
            .count()
    }
}

impl Drop for GitServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let authorized = req
        .headers()
        .get("authorization")
        .is_some_and(|v| v.as_bytes() == shared.authorization.as_bytes());
    let method = req.method().to_string();
    let uri = req.uri().to_string();
    shared.requests.lock().unwrap().push(GitRequest {
        method: method.clone(),
        uri: uri.clone(),
        authorized,
    });
    if !authorized {
        let mut resp = Response::new(Body::from("authentication required\n"));
        *resp.status_mut() = StatusCode::UNAUTHORIZED;
        resp.headers_mut().insert(
            "www-authenticate",
            HeaderValue::from_static("Basic realm=\"git\""),
        );
        return resp;
    }
    let [content_type, encoding, protocol] = ["content-type", "content-encoding", "git-protocol"]
        .map(|name| {
            req.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string()
        });
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let body = match axum::body::to_bytes(req.into_body(), 512 << 20).await {
        Ok(body) => body,
        Err(e) => return plain(StatusCode::BAD_REQUEST, format!("{e}\n")),
    };
    let mut cgi = tokio::process::Command::new("git");
    cgi.arg("http-backend")
        .env("GIT_PROJECT_ROOT", &shared.root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("REQUEST_METHOD", &method)
        .env("PATH_INFO", &path)
        .env("QUERY_STRING", &query)
        .env("CONTENT_TYPE", &content_type)
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("HTTP_CONTENT_ENCODING", &encoding)
        .env("GIT_PROTOCOL", &protocol)
        .env("REMOTE_USER", "tester")
        .env("REMOTE_ADDR", "127.0.0.1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = match cgi.spawn() {
        Ok(child) => child,
        Err(e) => return plain(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
    };
    let mut stdin = child.stdin.take().expect("piped");
    let feed = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt as _;
        let _ = stdin.write_all(&body).await;
    });
    let out = match child.wait_with_output().await {
        Ok(out) => out,
        Err(e) => return plain(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
    };
    let _ = feed.await;
    cgi_response(&out.stdout)
        .unwrap_or_else(|| plain(StatusCode::BAD_GATEWAY, "bad CGI output\n".into()))
}

fn plain(status: StatusCode, text: String) -> Response {
    let mut resp = Response::new(Body::from(text));
    *resp.status_mut() = status;
    resp
}

/// A CGI program's output as an HTTP response: headers (with `Status:`), a blank line,
/// the body.
fn cgi_response(out: &[u8]) -> Option<Response> {
    let (head_len, sep) = [&b"\r\n\r\n"[..], &b"\n\n"[..]]
        .iter()
        .filter_map(|sep| {
            out.windows(sep.len())
                .position(|w| w == *sep)
                .map(|at| (at, sep.len()))
        })
        .min()?;
    let head = std::str::from_utf8(&out[..head_len]).ok()?;
    let mut resp = Response::new(Body::from(out[head_len + sep..].to_vec()));
    for line in head.lines() {
        let (name, value) = line.split_once(':')?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("status") {
            let code = value.split_whitespace().next()?.parse().ok()?;
            *resp.status_mut() = StatusCode::from_u16(code).ok()?;
        } else {
            resp.headers_mut().append(
                axum::http::HeaderName::from_bytes(name.trim().as_bytes()).ok()?,
                HeaderValue::from_str(value).ok()?,
            );
        }
    }
    Some(resp)
}
