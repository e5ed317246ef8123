//! One screen for every connection made on a tenant's behalf: a sandbox's through its
//! egress proxy, and the ones Steadfast itself makes to a place a session names (the
//! MCP servers it lists, the git remote it clones and pushes to).
//!
//! A destination is resolved here, outside any sandbox, and every address it resolves
//! to is checked: none may be internal (loopback, private, link-local, ...; see
//! `addresses`) unless the operator opened that host (`[sandbox] internal-hosts`). The
//! addresses checked are the ones to connect to: a caller pins them, so a name cannot
//! resolve to a public address for the check and an internal one for the connection.

use std::net::{IpAddr, SocketAddr};

use crate::HostRule;

/// Why a destination was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The name does not resolve.
    #[error("cannot resolve {host}: {reason}")]
    Unresolved {
        /// The name.
        host: String,
        /// The resolver's reason.
        reason: String,
    },
    /// It resolves to an internal address nobody opened.
    #[error("{host}:{port} resolves to {addr}, {kind}, which only the operator can open (in the server's configuration)")]
    Internal {
        /// The name.
        host: String,
        /// The port.
        port: u16,
        /// The internal address.
        addr: IpAddr,
        /// What kind of address it is.
        kind: &'static str,
    },
}

/// The addresses `host:port` may be reached at: all it resolves to, provided none is
/// internal or the operator opened the host (a rule of `open`). A numeric host is its
/// own address, whatever its spelling (`127.1`, `0x7f.1` and `2130706433` are
/// loopback).
pub async fn resolve(host: &str, port: u16, open: &[HostRule]) -> Result<Vec<SocketAddr>, Refused> {
    let bare = host.trim_matches(['[', ']']);
    let addrs: Vec<SocketAddr> = match bare.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        // The system resolver also reads numeric spellings as the addresses they are.
        Err(_) => tokio::net::lookup_host((bare, port))
            .await
            .map_err(|e| Refused::Unresolved {
                host: host.to_string(),
                reason: e.to_string(),
            })?
            .collect(),
    };
    if addrs.is_empty() {
        return Err(Refused::Unresolved {
            host: host.to_string(),
            reason: "no address".into(),
        });
    }
    if !open.iter().any(|r| r.allows(bare, port)) {
        if let Some((addr, kind)) = addrs
            .iter()
            .find_map(|a| crate::addresses::internal_kind(a.ip()).map(|k| (a.ip(), k)))
        {
            return Err(Refused::Internal {
                host: host.to_string(),
                port,
                addr,
                kind,
            });
        }
    }
    Ok(addrs)
}

/// Where a URL leads: its host (as the URL spells it, brackets kept for IPv6), its
/// port (the scheme's default if none is given) and the addresses screened for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Screened {
    /// The host.
    pub host: String,
    /// The port.
    pub port: u16,
    /// The addresses to connect to, and no other.
    pub addrs: Vec<SocketAddr>,
}

impl Screened {
    /// The addresses as curl's `CURLOPT_RESOLVE` takes them (`host:port:addr,addr`):
    /// what git is given as `http.curloptResolve`, so it connects to these only.
    pub fn curl_resolve(&self) -> String {
        let addrs: Vec<String> = self
            .addrs
            .iter()
            .map(|a| match a.ip() {
                IpAddr::V4(v4) => v4.to_string(),
                IpAddr::V6(v6) => format!("[{v6}]"),
            })
            .collect();
        format!("{}:{}:{}", self.host, self.port, addrs.join(","))
    }
}

/// Screens an `http(s)` URL's destination (see [`resolve`]). The host is read as a
/// browser reads it, so `http://2130706433/` is `127.0.0.1`.
pub async fn screen_url(url: &str, open: &[HostRule]) -> Result<Screened, Refused> {
    let unreadable = |reason: &str| Refused::Unresolved {
        host: url.to_string(),
        reason: reason.to_string(),
    };
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| unreadable("not a URL"))?;
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "https" => 443,
        "http" => 80,
        _ => return Err(unreadable("not an http(s) URL")),
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let authority = authority.rsplit('@').next().unwrap_or_default();
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) if !port.contains(']') => (
            host,
            port.parse::<u16>()
                .map_err(|_| unreadable("the port is not a number"))?,
        ),
        _ => (authority, default_port),
    };
    if host.is_empty() {
        return Err(unreadable("no host"));
    }
    let host = numeric_host(host).unwrap_or_else(|| host.to_ascii_lowercase());
    let addrs = resolve(&host, port, open).await?;
    Ok(Screened { host, port, addrs })
}

/// An IPv4 address spelled as one number or in fewer than four parts, as the URL
/// standard reads it (`2130706433`, `127.1`, `0x7f.1`), in dotted form; `None` for any
/// other host.
fn numeric_host(host: &str) -> Option<String> {
    let parts: Vec<&str> = host.split('.').collect();
    if parts.is_empty() || parts.len() > 4 || host.starts_with('[') {
        return None;
    }
    let number = |p: &str| -> Option<u64> {
        if let Some(hex) = p.strip_prefix("0x").or_else(|| p.strip_prefix("0X")) {
            u64::from_str_radix(hex, 16).ok()
        } else if p.len() > 1 && p.starts_with('0') {
            u64::from_str_radix(&p[1..], 8).ok()
        } else {
            p.parse().ok()
        }
    };
    let values: Vec<u64> = parts.iter().map(|p| number(p)).collect::<Option<_>>()?;
    let (last, leading) = values.split_last()?;
    if leading.iter().any(|v| *v > 255) || *last >= 1u64 << (8 * (5 - values.len())) {
        return None;
    }
    let mut value = *last;
    for (i, v) in leading.iter().enumerate() {
        value |= v << (8 * (3 - i));
    }
    let ip = std::net::Ipv4Addr::from(u32::try_from(value).ok()?);
    Some(ip.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn internal_destinations_are_refused_in_every_spelling_unless_opened() {
        for url in [
            "http://127.0.0.1:8080/repo.git",
            "http://2130706433:8080/",
            "http://127.1:8080/",
            "http://0x7f.1/",
            "http://localhost/mcp",
            "http://[::1]:9000/mcp",
            "https://169.254.169.254/latest/meta-data",
            "http://user@10.0.0.1/",
        ] {
            let refused = screen_url(url, &[]).await.unwrap_err();
            assert!(
                matches!(refused, Refused::Internal { .. }),
                "{url}: {refused}"
            );
        }
        let open = [HostRule::parse("127.0.0.1:8080").unwrap()];
        let screened = screen_url("http://2130706433:8080/repo.git", &open)
            .await
            .unwrap();
        assert_eq!(screened.host, "127.0.0.1");
        assert_eq!(screened.curl_resolve(), "127.0.0.1:8080:127.0.0.1");
        // Opened for one port only.
        assert!(screen_url("http://127.0.0.1:9090/", &open).await.is_err());
        assert!(screen_url("ftp://example.com/", &[]).await.is_err());
    }

    #[test]
    fn numeric_hosts_are_read_as_the_url_standard_reads_them() {
        assert_eq!(numeric_host("2130706433").as_deref(), Some("127.0.0.1"));
        assert_eq!(numeric_host("127.1").as_deref(), Some("127.0.0.1"));
        assert_eq!(numeric_host("0x7f.0.0.1").as_deref(), Some("127.0.0.1"));
        assert_eq!(numeric_host("10.1.2").as_deref(), Some("10.1.0.2"));
        assert_eq!(numeric_host("example.com"), None);
        assert_eq!(numeric_host("256.1.1.1"), None);
    }
}
