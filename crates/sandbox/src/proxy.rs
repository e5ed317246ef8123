//! The egress proxy: how a sandbox under an allow-list policy reaches the network.
//!
//! The sandbox has its own network namespace with nothing but loopback. The harness
//! runs this proxy outside it, on a Unix socket in the directory it shares with the
//! sandbox; the sandbox's agent carries connections from a loopback port to it, and
//! commands find it through `HTTP_PROXY`/`HTTPS_PROXY`. The proxy speaks HTTP proxy
//! requests (`CONNECT host:port` for TLS, absolute-form requests for plain HTTP),
//! checks every request (each one on a kept-alive connection, too) against the
//! allow-list by name and port, resolves the name itself and refuses any internal
//! address (see [`crate::addresses`]) unless the operator opened that name, and refuses
//! the rest with a 403 that says why. The decision is made here, outside the sandbox,
//! so nothing a command does can widen it.
//!
//! For a destination the session bound a credential to, the proxy adds it to each
//! request (ending the sandbox's TLS for HTTPS, see [`crate::intercept`]), forwards
//! only methods it knows, sets `Host` from the destination it checked, and masks the
//! credential in what comes back (see [`crate::masked`]).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpStream, UnixListener};

use crate::intercept::Interceptor;
use crate::masked::Secrets;
use crate::HostRule;

/// What the proxy lets through: the session's allow-list, screened by address.
#[derive(Debug, Clone, Default)]
pub struct EgressRules {
    /// The session's allow-list, by name and port.
    pub allow: Vec<HostRule>,
    /// Internal destinations the operator opened in the server's configuration: only
    /// these names may lead to a loopback, private or link-local address.
    pub internal: Vec<HostRule>,
    /// Headers added to requests to some destinations (see [`Injection`]).
    pub inject: Vec<Injection>,
    /// Who is asked before a connection the rules allow is opened (the harness, which
    /// records it against the calls running): none, and the rules alone decide.
    pub watch: Option<EgressWatch>,
}

/// A connection the sandbox is about to open, put to whoever watches the proxy: it
/// opens only once the answer is `Ok` (the harness has recorded it), and is refused
/// with the reason given otherwise, or if no answer ever comes.
#[derive(Debug)]
pub struct EgressAttempt {
    /// Where to: `host:port`.
    pub destination: String,
    /// The answer.
    pub reply: tokio::sync::oneshot::Sender<Result<(), String>>,
}

/// Where the proxy puts each [`EgressAttempt`] (see [`EgressRules::watch`]).
pub type EgressWatch = tokio::sync::mpsc::Sender<EgressAttempt>;

/// Asks the watch, if there is one, whether `host:port` may be opened now.
async fn ask(watch: Option<&EgressWatch>, host: &str, port: u16) -> Result<(), String> {
    let Some(watch) = watch else { return Ok(()) };
    let (reply, answer) = tokio::sync::oneshot::channel();
    let destination = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let attempt = EgressAttempt { destination, reply };
    let unwatched = || "the harness is not watching this sandbox's egress now".to_string();
    watch.send(attempt).await.map_err(|_| unwatched())?;
    answer.await.map_err(|_| unwatched())?
}

/// A header the proxy adds to every request to one destination, replacing any the
/// sandbox sent: a credential the sandbox uses without ever holding it. Plain HTTP
/// gets it as it passes; for HTTPS the proxy ends the sandbox's TLS with a
/// certificate of the sandbox's own authority (see [`crate::intercept`]). Responses
/// from the destination come back with the credential masked wherever they echo it.
#[derive(Clone)]
pub struct Injection {
    /// Which requests get it.
    pub rule: HostRule,
    /// The header.
    pub header: hyper::header::HeaderName,
    /// Its value (marked sensitive; never printed).
    pub value: hyper::header::HeaderValue,
    /// The credential alone, without its prefix: what is masked in responses.
    secret: Vec<u8>,
}

impl std::fmt::Debug for Injection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Injection")
            .field("rule", &self.rule)
            .field("header", &self.header)
            .field("value", &"<redacted>")
            .finish()
    }
}

impl Injection {
    /// `header: {prefix}{credential}` for requests to `host` (`host[:port]`, as in an
    /// allow-list).
    pub fn new(host: &str, header: &str, prefix: &str, credential: &str) -> Result<Self, String> {
        let rule = HostRule::parse(host)?;
        let header = hyper::header::HeaderName::from_bytes(header.as_bytes())
            .map_err(|_| format!("`{header}` is not a header name"))?;
        let mut value = hyper::header::HeaderValue::from_str(&format!("{prefix}{credential}"))
            .map_err(|_| "the credential cannot be sent in a header".to_string())?;
        value.set_sensitive(true);
        Ok(Injection {
            rule,
            header,
            value,
            secret: credential.as_bytes().to_vec(),
        })
    }
}

/// A running proxy; stops when dropped.
#[derive(Debug)]
pub struct EgressProxy {
    task: tokio::task::JoinHandle<()>,
    intercept: Option<Arc<Interceptor>>,
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl EgressProxy {
    /// Starts a proxy on the Unix socket `socket` allowing what `rules` allow. With
    /// credentials to inject, it makes the sandbox's certificate authority too (see
    /// [`EgressProxy::trust`]).
    pub fn start(socket: &Path, rules: EgressRules) -> std::io::Result<Self> {
        let intercept = match rules.inject.is_empty() {
            true => None,
            false => Some(Arc::new(
                Interceptor::new(&rules.inject).map_err(std::io::Error::other)?,
            )),
        };
        let _ = std::fs::remove_file(socket);
        let listener = UnixListener::bind(socket)?;
        let rules = Arc::new(rules);
        let serving = intercept.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (rules, intercept) = (rules.clone(), serving.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let (rules, intercept) = (rules.clone(), intercept.clone());
                        async move { Ok::<_, Infallible>(handle(req, &rules, intercept).await) }
                    });
                    // Every request on a kept-alive connection comes through `handle`.
                    let served = hyper::server::conn::http1::Builder::new()
                        .preserve_header_case(true)
                        .serve_connection(TokioIo::new(stream), service)
                        .with_upgrades()
                        .await;
                    if let Err(e) = served {
                        tracing::debug!(error = %e, "egress proxy connection ended");
                    }
                });
            }
        });
        Ok(EgressProxy { task, intercept })
    }

    /// The root certificates, as PEM, a sandbox behind this proxy must trust for its
    /// HTTPS requests to get their credentials: the host's roots and the sandbox's
    /// own authority. None when no credential is bound.
    pub fn trust(&self) -> Option<&str> {
        self.intercept.as_deref().map(Interceptor::trust)
    }
}

pub(crate) type Body = BoxBody<Bytes, hyper::Error>;

/// The proxy's own answer to a request it does not carry out.
pub(crate) fn refusal(status: StatusCode, why: &str) -> Response<Body> {
    let body = format!("steadfast egress proxy: {why}\n");
    let mut response = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain"),
    );
    response
}

/// Methods forwarded with a credential: those whose meaning is known. Anything else
/// (`TRACE`, WebDAV, a made-up method an upstream might echo) gets no credential.
const CREDENTIALED_METHODS: [Method; 7] = [
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::PATCH,
    Method::DELETE,
    Method::OPTIONS,
];

/// Why a request with `method` is not forwarded, if it is not: `TRACE` never (it
/// echoes the request back, a credential added here included), and with a credential
/// nothing but [`CREDENTIALED_METHODS`].
fn refused_method(method: &Method, credentialed: bool) -> Option<Response<Body>> {
    if method == Method::TRACE || method.as_str() == "TRACK" {
        return Some(refusal(
            StatusCode::METHOD_NOT_ALLOWED,
            "TRACE is not forwarded: it would echo the request back into the sandbox",
        ));
    }
    if credentialed && !CREDENTIALED_METHODS.contains(method) {
        return Some(refusal(
            StatusCode::METHOD_NOT_ALLOWED,
            &format!("{method} is not forwarded to a destination with a bound credential"),
        ));
    }
    None
}

/// Checks one request against the rules and carries it out.
async fn handle(
    req: Request<Incoming>,
    rules: &EgressRules,
    intercept: Option<Arc<Interceptor>>,
) -> Response<Body> {
    let (host, port) = match destination(&req) {
        Ok(d) => d,
        Err(why) => return refusal(StatusCode::BAD_REQUEST, &why),
    };
    let injected: Vec<Injection> = rules
        .inject
        .iter()
        .filter(|i| i.rule.allows(&host, port))
        .cloned()
        .collect();
    if req.method() != Method::CONNECT {
        if let Some(refused) = refused_method(req.method(), !injected.is_empty()) {
            return refused;
        }
    }
    let addrs = match admit(rules, &host, port).await {
        Ok(a) => a,
        Err(why) => {
            tracing::info!(%host, port, %why, "egress refused");
            return refusal(StatusCode::FORBIDDEN, &why);
        }
    };
    // Recorded (or refused) before anything leaves: the first byte is the effect.
    if let Err(why) = ask(rules.watch.as_ref(), &host, port).await {
        tracing::info!(%host, port, %why, "egress held back");
        return refusal(StatusCode::FORBIDDEN, &why);
    }
    let upstream = match TcpStream::connect(&addrs[..]).await {
        Ok(s) => s,
        Err(e) => {
            let why = format!("cannot reach {host}:{port}: {e}");
            return refusal(StatusCode::BAD_GATEWAY, &why);
        }
    };
    let _ = upstream.set_nodelay(true);
    if req.method() == Method::CONNECT {
        // A destination with a credential: TLS ends here, so the credential can be
        // added. Any other: a tunnel the proxy cannot see into.
        let intercept = intercept.filter(|_| !injected.is_empty());
        tokio::spawn(async move {
            let tunnel = match hyper::upgrade::on(req).await {
                Ok(upgraded) => TokioIo::new(upgraded),
                Err(e) => {
                    tracing::debug!(error = %e, "egress tunnel never started");
                    return;
                }
            };
            match intercept {
                Some(intercept) => {
                    intercept
                        .serve(tunnel, host, port, upstream, injected)
                        .await
                }
                None => {
                    let (mut tunnel, mut upstream) = (tunnel, upstream);
                    let _ = tokio::io::copy_bidirectional(&mut tunnel, &mut upstream).await;
                }
            }
        });
        return Response::new(
            Full::new(Bytes::new())
                .map_err(|never| match never {})
                .boxed(),
        );
    }
    // The request goes to the host its URI names, whatever `Host:` the sandbox wrote
    // (a credential added for that host must not reach another one it serves).
    let Some(authority) = req.uri().authority().map(|a| a.as_str().to_string()) else {
        return refusal(StatusCode::BAD_REQUEST, "the request names no host");
    };
    let (mut sender, connection) =
        match hyper::client::conn::http1::handshake(TokioIo::new(upstream)).await {
            Ok(pair) => pair,
            Err(e) => {
                let why = format!("cannot talk to {host}:{port}: {e}");
                return refusal(StatusCode::BAD_GATEWAY, &why);
            }
        };
    tokio::spawn(connection);
    relay(req, &mut sender, &authority, &injected).await
}

/// Sends one request upstream on `sender` in origin form, to `authority` whatever
/// `Host:` the sandbox wrote, with the credentials of `inject` added (replacing the
/// sandbox's own headers of those names), and relays the response with the
/// credentials masked.
pub(crate) async fn relay(
    mut req: Request<Incoming>,
    sender: &mut hyper::client::conn::http1::SendRequest<Incoming>,
    authority: &str,
    inject: &[Injection],
) -> Response<Body> {
    if let Some(refused) = refused_method(req.method(), !inject.is_empty()) {
        return refused;
    }
    let path = req
        .uri()
        .path_and_query()
        .map_or("/".to_string(), |p| p.to_string());
    match hyper::header::HeaderValue::from_str(authority) {
        Ok(value) => {
            req.headers_mut().insert(hyper::header::HOST, value);
        }
        Err(_) => return refusal(StatusCode::BAD_REQUEST, "the request names no host"),
    }
    *req.uri_mut() = match path.parse() {
        Ok(uri) => uri,
        Err(_) => return refusal(StatusCode::BAD_REQUEST, "bad request path"),
    };
    for hop in ["proxy-connection", "proxy-authorization", "keep-alive"] {
        req.headers_mut().remove(hop);
    }
    for injection in inject {
        req.headers_mut()
            .insert(injection.header.clone(), injection.value.clone());
    }
    if !inject.is_empty() {
        // A compressed echo would hide the credential from the mask.
        req.headers_mut().insert(
            hyper::header::ACCEPT_ENCODING,
            hyper::header::HeaderValue::from_static("identity"),
        );
    }
    match sender.send_request(req).await {
        Ok(response) if inject.is_empty() => response.map(|b| b.boxed()),
        Ok(response) => {
            let secrets = Secrets::new(inject.iter().map(|i| i.secret.clone()));
            let (mut head, body) = response.into_parts();
            secrets.mask_headers(&mut head.headers);
            Response::from_parts(head, secrets.mask_body(body).boxed())
        }
        Err(e) => refusal(
            StatusCode::BAD_GATEWAY,
            &format!("{authority} did not answer: {e}"),
        ),
    }
}

/// Where a proxy request goes: `CONNECT host:port`, or an absolute `http://` URI.
fn destination<B>(req: &Request<B>) -> Result<(String, u16), String> {
    let uri = req.uri();
    if req.method() == Method::CONNECT {
        let authority = uri
            .authority()
            .ok_or_else(|| format!("CONNECT `{uri}` names no host:port"))?;
        return Ok((
            bare_host(authority.host()),
            authority.port_u16().unwrap_or(443),
        ));
    }
    if uri.scheme_str() != Some("http") {
        return Err(format!(
            "`{uri}`: only CONNECT and absolute http:// requests go through this proxy"
        ));
    }
    let host = uri.host().ok_or_else(|| format!("`{uri}` names no host"))?;
    Ok((bare_host(host), uri.port_u16().unwrap_or(80)))
}

fn bare_host(host: &str) -> String {
    host.trim_matches(['[', ']']).to_ascii_lowercase()
}

/// Decides whether `host:port` may be reached, resolving it here (outside the
/// sandbox) and checking every address it resolves to. Returns the addresses to
/// connect to, so what was checked is what is used: a name cannot resolve to a public
/// address for the check and an internal one for the connection.
pub(crate) async fn admit(
    rules: &EgressRules,
    host: &str,
    port: u16,
) -> Result<Vec<SocketAddr>, String> {
    if !rules.allow.iter().any(|r| r.allows(host, port)) {
        return Err(format!(
            "egress to {host}:{port} is not allowed by this session's network policy"
        ));
    }
    crate::outbound::resolve(host, port, &rules.internal)
        .await
        .map_err(|refused| match refused {
            crate::outbound::Refused::Internal { addr, kind, .. } => format!(
                "egress to {host}:{port} is refused: it resolves to {addr}, {kind}, which a \
                 sandbox may never reach (only the operator can open an internal \
                 destination, in the server's configuration)"
            ),
            unresolved => unresolved.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(allow: &str, internal: &[&str]) -> EgressRules {
        let crate::NetworkPolicy::AllowList(allow) =
            crate::NetworkPolicy::parse(&format!("allow:{allow}")).unwrap()
        else {
            panic!()
        };
        EgressRules {
            allow,
            internal: internal
                .iter()
                .map(|r| HostRule::parse(r).unwrap())
                .collect(),
            inject: Vec::new(),
            watch: None,
        }
    }

    #[tokio::test]
    async fn internal_destinations_are_refused_whatever_their_spelling() {
        let names = "localhost:5432,127.0.0.1:5432,127.1:5432,0x7f.1:5432,2130706433:5432,\
                     10.0.0.7:80,169.254.169.254:80,0.0.0.0:5432";
        let r = rules(names, &[]);
        for host in [
            "localhost",
            "127.0.0.1",
            "127.1",
            "0x7f.1",
            "2130706433",
            "0.0.0.0",
        ] {
            let why = admit(&r, host, 5432).await.unwrap_err();
            assert!(why.contains("may never reach"), "{host}: {why}");
        }
        for host in ["10.0.0.7", "169.254.169.254"] {
            assert!(admit(&r, host, 80).await.is_err(), "{host}");
        }
        // Not on the list at all: refused by name, before any lookup.
        let why = admit(&r, "example.com", 443).await.unwrap_err();
        assert!(why.contains("not allowed"), "{why}");
    }

    #[tokio::test]
    async fn an_operator_opens_an_internal_name_and_only_that_one() {
        let r = rules("localhost:8080,127.0.0.1:8080", &["localhost:8080"]);
        let addrs = admit(&r, "localhost", 8080).await.unwrap();
        assert!(addrs.iter().all(|a| a.ip().is_loopback()));
        assert!(admit(&r, "127.0.0.1", 8080).await.is_err());
        assert!(admit(&r, "localhost", 8081).await.is_err());
    }

    #[test]
    fn requests_name_their_destinations() {
        let req =
            |method: &str, uri: &str| Request::builder().method(method).uri(uri).body(()).unwrap();
        assert_eq!(
            destination(&req("CONNECT", "api.example.com:8443")).unwrap(),
            ("api.example.com".to_string(), 8443)
        );
        assert_eq!(
            destination(&req("GET", "http://LocalHost:9000/a?b=1")).unwrap(),
            ("localhost".to_string(), 9000)
        );
        assert_eq!(
            destination(&req("GET", "http://[::1]/")).unwrap(),
            ("::1".to_string(), 80)
        );
        assert!(destination(&req("GET", "/relative")).is_err());
        assert!(destination(&req("GET", "https://example.com/")).is_err());
    }
}
