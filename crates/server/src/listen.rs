//! Serving the API on a TCP listener with the edges a public server needs: a cap on
//! open connections, in all and from one address, a request rate per address, a
//! deadline for each request's head
//! (which also closes idle kept-alive connections), an idle timeout and a deadline for
//! its body, `TCP_NODELAY`, and a graceful stop. `axum::serve` offers none of the
//! timeouts, so the accept loop is ours, over hyper.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

/// The limits of [`serve`].
#[derive(Debug, Clone, Copy)]
pub struct ServeOptions {
    /// How long a connection may take to send a request's head, and how long a
    /// kept-alive connection may sit idle between requests.
    pub header_timeout: Duration,
    /// How long a request's body may go without sending anything once its head has
    /// arrived.
    pub body_timeout: Duration,
    /// How long a request's body may take to arrive in all once its head has: a
    /// client trickling a byte now and then still has to finish by then.
    pub body_deadline: Duration,
    /// Connections open at once; more are closed as soon as they are accepted.
    pub max_connections: usize,
    /// Connections open at once from one address, so one client cannot take every
    /// slot (`None`: no cap of its own; a platform's backend may hold many event
    /// streams from one address, so it is for public servers above all).
    pub max_connections_per_ip: Option<usize>,
    /// Requests one address may make per minute (a token bucket as deep as the
    /// rate), health probes aside; more are answered 429 (`None`: no rate of its
    /// own, as for the connection cap).
    pub requests_per_minute_per_ip: Option<u32>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            body_deadline: Duration::from_secs(300),
            max_connections: 4096,
            max_connections_per_ip: None,
            requests_per_minute_per_ip: None,
        }
    }
}

/// Health probes, which a load balancer sends from one address all day: never
/// rate-limited.
const PROBES: [&str; 3] = ["/healthz", "/livez", "/readyz"];

/// Answers 429 to an address past its request rate, before the request reaches the
/// API (or its body is read).
fn limit_rate(
    router: Router,
    peer: IpAddr,
    limiter: &Arc<crate::limits::RateLimiter>,
    per_minute: u32,
) -> Router {
    let limiter = limiter.clone();
    router.layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            let limiter = limiter.clone();
            async move {
                use axum::response::IntoResponse;
                let probe = PROBES.contains(&request.uri().path());
                if !probe && !limiter.allow(&peer.to_string(), per_minute) {
                    return crate::error::ApiError::rate_limited(format!(
                        "this address has made its {per_minute} requests this minute; slow down"
                    ))
                    .into_response();
                }
                next.run(request).await
            }
        },
    ))
}

/// Accepts a connection with `TCP_NODELAY` set: a streamed response writes many small
/// frames, and with Nagle's algorithm each one after the first would wait for the
/// client's delayed ACK (40 ms) on a kept-alive connection.
async fn accept(
    listener: &TcpListener,
) -> std::io::Result<(tokio::net::TcpStream, std::net::SocketAddr)> {
    let (stream, peer) = listener.accept().await?;
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "cannot set TCP_NODELAY");
    }
    Ok((stream, peer))
}

/// Serves `router` on `listener` until `shutdown` completes, then stops accepting and
/// waits for open connections to finish their requests (callers bound that wait).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let deadline = options.body_deadline;
    let router = router
        .layer(tower_http::timeout::RequestBodyTimeoutLayer::new(
            options.body_timeout,
        ))
        .layer(axum::middleware::map_request(
            move |request: axum::extract::Request| async move {
                request.map(|body| Body::new(DeadlineBody::new(body, deadline)))
            },
        ));
    let slots = Arc::new(tokio::sync::Semaphore::new(options.max_connections));
    let per_ip = PerIp::new(options.max_connections_per_ip);
    let rates = Arc::new(crate::limits::RateLimiter::default());
    // Told to each connection when the server stops: it finishes the request in hand.
    let (stopping, stop) = tokio::sync::watch::channel(false);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(options.header_timeout);
    tokio::pin!(shutdown);
    let mut refused_logged = None::<std::time::Instant>;
    loop {
        let (stream, peer) = tokio::select! {
            accepted = accept(&listener) => match accepted {
                Ok(pair) => pair,
                // Out of descriptors and the like: wait a little rather than spin.
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            steadfast_metrics::metrics().http_refused("connection_cap");
            if refused_logged.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                tracing::warn!(
                    max = options.max_connections,
                    "connection cap reached; closing new connections"
                );
                refused_logged = Some(std::time::Instant::now());
            }
            drop(stream);
            continue;
        };
        let Some(from_ip) = per_ip.take(peer.ip()) else {
            steadfast_metrics::metrics().http_refused("connections_per_ip");
            tracing::debug!(%peer, "this address holds its most connections; closing another");
            drop(stream);
            continue;
        };
        let router = match options.requests_per_minute_per_ip {
            Some(per_minute) => limit_rate(router.clone(), peer.ip(), &rates, per_minute),
            None => router.clone(),
        };
        let service = hyper_util::service::TowerToHyperService::new(router);
        // With upgrades: a preview URL's WebSocket is handed on to the sandbox.
        let connection = http
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let mut connection = std::pin::pin!(connection);
            let ended = tokio::select! {
                ended = connection.as_mut() => ended,
                () = async { let _ = stop.wait_for(|stop| *stop).await; } => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(e) = ended {
                tracing::debug!(%peer, error = %e, "connection ended");
            }
            drop(slot);
            drop(from_ip);
        });
    }
    drop(listener);
    stopping.send_replace(true);
    // Every connection holds a slot until it has ended.
    let all = u32::try_from(options.max_connections).unwrap_or(u32::MAX);
    let _ = slots.acquire_many(all).await;
    Ok(())
}

/// The connections each address holds, against a cap.
#[derive(Clone)]
struct PerIp {
    held: Arc<Mutex<HashMap<IpAddr, usize>>>,
    max: Option<usize>,
}

/// One connection counted against its address, given back when dropped.
struct IpSlot {
    held: Arc<Mutex<HashMap<IpAddr, usize>>>,
    ip: IpAddr,
}

impl PerIp {
    fn new(max: Option<usize>) -> Self {
        PerIp {
            held: Arc::default(),
            max,
        }
    }

    /// A slot for one more connection from `ip`, unless it holds its most.
    fn take(&self, ip: IpAddr) -> Option<IpSlot> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let count = held.entry(ip).or_default();
        if self.max.is_some_and(|max| *count >= max) {
            return None;
        }
        *count += 1;
        Some(IpSlot {
            held: self.held.clone(),
            ip,
        })
    }
}

impl Drop for IpSlot {
    fn drop(&mut self) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = held.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.ip);
            }
        }
    }
}

/// The body did not arrive whole by its deadline.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within its deadline")]
struct BodyDeadlinePassed;

/// A request body that must arrive whole by a deadline, whatever its pace: past it,
/// reading it fails (the handler answers, and the connection is closed).
struct DeadlineBody {
    inner: Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
}

impl DeadlineBody {
    fn new(inner: Body, within: Duration) -> Self {
        DeadlineBody {
            inner,
            deadline: Box::pin(tokio::time::sleep(within)),
        }
    }
}

impl HttpBody for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        if this.inner.is_end_stream() {
            return Pin::new(&mut this.inner).poll_frame(cx);
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            steadfast_metrics::metrics().http_refused("body_deadline");
            return Poll::Ready(Some(Err(axum::Error::new(BodyDeadlinePassed))));
        }
        Pin::new(&mut this.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn accepted_connections_send_small_frames_at_once() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = tokio::spawn(tokio::net::TcpStream::connect(addr));
        let (stream, _) = super::accept(&listener).await.unwrap();
        assert!(
            stream.nodelay().unwrap(),
            "TCP_NODELAY is set on every accepted connection"
        );
        client.await.unwrap().unwrap();
    }
}
