//! Serving the API on a TCP listener with the edges a public server needs: a cap on
//! open connections, a deadline for each request's head (which also closes idle
//! kept-alive connections) and for its body, `TCP_NODELAY`, and a graceful stop.
//! `axum::serve` offers none of the timeouts, so the accept loop is ours, over hyper.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

/// The limits of [`serve`].
#[derive(Debug, Clone, Copy)]
pub struct ServeOptions {
    /// How long a connection may take to send a request's head, and how long a
    /// kept-alive connection may sit idle between requests.
    pub header_timeout: Duration,
    /// How long a request's body may take to arrive once its head has.
    pub body_timeout: Duration,
    /// Connections open at once; more are closed as soon as they are accepted.
    pub max_connections: usize,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_connections: 4096,
        }
    }
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
    let router = router.layer(tower_http::timeout::RequestBodyTimeoutLayer::new(
        options.body_timeout,
    ));
    let slots = Arc::new(tokio::sync::Semaphore::new(options.max_connections));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
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
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(%peer, error = %e, "connection ended");
            }
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
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
