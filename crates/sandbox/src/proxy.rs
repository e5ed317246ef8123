//! The egress proxy: how a sandbox under an allow-list policy reaches the network.
//!
//! The sandbox has its own network namespace with nothing but loopback. The harness
//! runs this proxy outside it, on a Unix socket in the directory it shares with the
//! sandbox; the sandbox's agent carries connections from a loopback port to it, and
//! commands find it through `HTTP_PROXY`/`HTTPS_PROXY`. The proxy speaks HTTP proxy
//! requests (`CONNECT host:port` for TLS, absolute-form requests for plain HTTP),
//! checks each destination against the allow-list by name and port, and refuses the
//! rest with a 403 that says why. The decision is made here, outside the sandbox, so
//! nothing a command does can widen it.

use std::path::Path;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener, UnixStream};

use crate::HostRule;

/// The most bytes of a request head the proxy reads.
const MAX_HEAD: usize = 64 * 1024;

/// A running proxy; stops when dropped.
#[derive(Debug)]
pub struct EgressProxy {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl EgressProxy {
    /// Starts a proxy on the Unix socket `socket` allowing `rules`.
    pub fn start(socket: &Path, rules: Vec<HostRule>) -> std::io::Result<Self> {
        let _ = std::fs::remove_file(socket);
        let listener = UnixListener::bind(socket)?;
        let rules = Arc::new(rules);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let rules = rules.clone();
                tokio::spawn(async move {
                    if let Err(e) = serve(stream, &rules).await {
                        tracing::debug!(error = %e, "egress proxy connection ended");
                    }
                });
            }
        });
        Ok(EgressProxy { task })
    }
}

/// A parsed proxy request: where to, and what to send upstream first.
struct Target {
    host: String,
    port: u16,
    /// `None` for CONNECT (the tunnel starts empty), else the rewritten request head.
    head: Option<Vec<u8>>,
}

async fn serve(mut client: UnixStream, rules: &[HostRule]) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(4096);
    let head_end = loop {
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > MAX_HEAD {
            return refuse(
                &mut client,
                "431 Request Header Fields Too Large",
                "request head too large",
            )
            .await;
        }
        let mut chunk = [0u8; 4096];
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let target = match parse(&buf[..head_end]) {
        Ok(t) => t,
        Err(why) => return refuse(&mut client, "400 Bad Request", &why).await,
    };
    if !rules.iter().any(|r| r.allows(&target.host, target.port)) {
        let why = format!(
            "egress to {}:{} is not allowed by this session's network policy",
            target.host, target.port
        );
        tracing::info!(host = %target.host, port = target.port, "egress refused");
        return refuse(&mut client, "403 Forbidden", &why).await;
    }
    let mut upstream = match TcpStream::connect((target.host.as_str(), target.port)).await {
        Ok(s) => s,
        Err(e) => {
            let why = format!("cannot reach {}:{}: {e}", target.host, target.port);
            return refuse(&mut client, "502 Bad Gateway", &why).await;
        }
    };
    match target.head {
        None => {
            client
                .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                .await?
        }
        Some(head) => upstream.write_all(&head).await?,
    }
    upstream.write_all(&buf[head_end..]).await?;
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}

async fn refuse(client: &mut UnixStream, status: &str, why: &str) -> std::io::Result<()> {
    let body = format!("steadfast egress proxy: {why}\n");
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    client.write_all(reply.as_bytes()).await?;
    client.shutdown().await
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Splits `host[:port]`, with `default` for a missing port.
fn host_port(authority: &str, default: u16) -> Result<(String, u16), String> {
    let authority = authority.rsplit('@').next().unwrap_or(authority);
    match authority.rsplit_once(':') {
        Some((h, p)) if !h.contains(']') || h.ends_with(']') => Ok((
            h.trim_matches(['[', ']']).to_string(),
            p.parse()
                .map_err(|_| format!("bad port in `{authority}`"))?,
        )),
        _ => Ok((authority.trim_matches(['[', ']']).to_string(), default)),
    }
}

fn parse(head: &[u8]) -> Result<Target, String> {
    let text = std::str::from_utf8(head).map_err(|_| "request head is not UTF-8".to_string())?;
    let (line, rest) = text.split_once("\r\n").ok_or("no request line")?;
    let mut parts = line.split(' ');
    let (Some(method), Some(uri), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(format!("malformed request line `{line}`"));
    };
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = host_port(uri, 443)?;
        return Ok(Target {
            host,
            port,
            head: None,
        });
    }
    let Some(after) = uri.strip_prefix("http://") else {
        return Err(format!(
            "`{uri}`: only CONNECT and absolute http:// requests go through this proxy"
        ));
    };
    let (authority, path) = match after.find('/') {
        Some(i) => (&after[..i], &after[i..]),
        None => (after, "/"),
    };
    let (host, port) = host_port(authority, 80)?;
    let head = format!("{method} {path} {version}\r\n{rest}").into_bytes();
    Ok(Target {
        host,
        port,
        head: Some(head),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_into_destinations() {
        let t = parse(b"CONNECT api.example.com:8443 HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.head.is_none()),
            ("api.example.com", 8443, true)
        );
        let t =
            parse(b"GET http://localhost:9000/a?b=1 HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("localhost", 9000));
        assert_eq!(
            t.head.unwrap(),
            b"GET /a?b=1 HTTP/1.1\r\nHost: localhost\r\n\r\n".to_vec()
        );
        let t = parse(b"GET http://example.com HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("example.com", 80));
        assert!(parse(b"GET /relative HTTP/1.1\r\n\r\n").is_err());
        assert!(parse(b"garbage\r\n\r\n").is_err());
    }
}
