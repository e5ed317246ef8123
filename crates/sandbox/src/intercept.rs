//! HTTPS to a destination with a bound credential: the egress proxy ends the
//! sandbox's TLS itself, so that it can add the credential to each request, and
//! opens its own TLS connection to the destination.
//!
//! Each sandbox gets its own certificate authority, made when its proxy starts. Its
//! key lives only in the proxy's memory (outside the sandbox, never on disk); its
//! certificate is added to the roots the sandbox trusts, and nothing else trusts
//! it. It can sign only for the destinations credentials are bound to (X.509 name
//! constraints), and the proxy signs a certificate for a destination only when the
//! sandbox asks to reach it through `CONNECT`. Every other TLS connection is carried
//! through untouched, end to end.
//!
//! Towards the destination the proxy verifies the server's certificate against the
//! host's roots (`SSL_CERT_FILE` and `SSL_CERT_DIR` honoured), so the sandbox loses
//! nothing of TLS's protection: a destination the host would not trust gets a 502
//! that says so.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rcgen::{
    BasicConstraints, CertificateParams, CidrSubnet, DnType, ExtendedKeyUsagePurpose,
    GeneralSubtree, IsCa, Issuer, KeyPair, KeyUsagePurpose, NameConstraints,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::net::TcpStream;

use crate::proxy::{refusal, relay, Body, Injection};

/// The destination closed a tunnel's connection: the sandbox's side is closed too.
#[derive(Debug)]
struct UpstreamClosed;

impl std::fmt::Display for UpstreamClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the destination closed the connection")
    }
}

impl std::error::Error for UpstreamClosed {}

/// The proxy's side of HTTPS interception for one sandbox.
pub(crate) struct Interceptor {
    issuer: Issuer<'static, KeyPair>,
    ca: CertificateDer<'static>,
    /// PEM: the host's roots and this sandbox's authority.
    trust: String,
    /// Server configurations by destination host, each with its certificate.
    leaves: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
    upstream: tokio_rustls::TlsConnector,
}

impl std::fmt::Debug for Interceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interceptor").finish_non_exhaustive()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// From an hour ago (clocks differ a little) to thirty days on: longer than a
/// sandbox lives, since the key dies with its proxy.
fn validity(params: &mut CertificateParams) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(30);
}

/// The names a certificate for `host` (an allow-list host: a name, `*.domain` or
/// an address) may carry.
fn subtree(host: &str) -> GeneralSubtree {
    match host.parse::<std::net::IpAddr>() {
        Ok(ip) => GeneralSubtree::IpAddress(CidrSubnet::from_addr_prefix(
            ip,
            if ip.is_ipv4() { 32 } else { 128 },
        )),
        Err(_) => GeneralSubtree::DnsName(host.trim_start_matches("*.").to_string()),
    }
}

/// PEM text of one certificate.
fn pem(der: &[u8]) -> String {
    let text = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in text.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

impl Interceptor {
    /// A new authority for the destinations of `inject`, and the connector that
    /// reaches them.
    pub(crate) fn new(inject: &[Injection]) -> Result<Self, String> {
        let failed = |e: rcgen::Error| format!("the sandbox's certificate authority: {e}");
        let mut params = CertificateParams::default();
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.distinguished_name.push(
            DnType::CommonName,
            "Steadfast egress proxy (one sandbox only)",
        );
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.name_constraints = Some(NameConstraints {
            permitted_subtrees: inject.iter().map(|i| subtree(&i.rule.host)).collect(),
            excluded_subtrees: Vec::new(),
        });
        validity(&mut params);
        let key = KeyPair::generate().map_err(failed)?;
        let ca = params.self_signed(&key).map_err(failed)?.der().clone();

        let native = rustls_native_certs::load_native_certs();
        for e in &native.errors {
            tracing::warn!(error = %e, "egress proxy: a root certificate could not be read");
        }
        let mut roots = rustls::RootCertStore::empty();
        let (_, unusable) = roots.add_parsable_certificates(native.certs.iter().cloned());
        if unusable > 0 {
            tracing::debug!(unusable, "egress proxy: root certificates skipped");
        }
        let mut trust: String = native.certs.iter().map(|c| pem(c)).collect();
        trust.push_str(&pem(&ca));
        let mut client = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS towards destinations: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        client.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Interceptor {
            issuer: Issuer::new(params, key),
            ca,
            trust,
            leaves: Mutex::default(),
            upstream: tokio_rustls::TlsConnector::from(Arc::new(client)),
        })
    }

    /// The roots a sandbox behind this proxy trusts, as PEM: the host's, and its own
    /// authority's certificate (never its key).
    pub(crate) fn trust(&self) -> &str {
        &self.trust
    }

    /// The TLS server configuration that presents a certificate for `host`.
    fn leaf(&self, host: &str) -> Result<Arc<rustls::ServerConfig>, String> {
        let mut leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(config) = leaves.get(host) {
            return Ok(config.clone());
        }
        let (cert, key) = self.certify(host)?;
        let chain = vec![cert, self.ca.clone()];
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .and_then(|b| b.with_no_client_auth().with_single_cert(chain, key))
            .map_err(|e| format!("TLS for {host}: {e}"))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        leaves.insert(host.to_string(), config.clone());
        Ok(config)
    }

    /// A certificate for `host` signed by this sandbox's authority, and its key.
    fn certify(
        &self,
        host: &str,
    ) -> Result<(CertificateDer<'static>, PrivateKeyDer<'static>), String> {
        let failed = |e: rcgen::Error| format!("a certificate for {host}: {e}");
        let mut params = CertificateParams::new(vec![host.to_string()]).map_err(failed)?;
        params.distinguished_name.push(DnType::CommonName, host);
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        validity(&mut params);
        let key = KeyPair::generate().map_err(failed)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(failed)?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        Ok((cert.der().clone(), key))
    }

    /// Serves one `CONNECT` tunnel to `host:port`: TLS with the sandbox on `tunnel`,
    /// TLS with the destination on `upstream`, and each request between them relayed
    /// with the credentials of `inject` added.
    pub(crate) async fn serve<T>(
        self: Arc<Self>,
        tunnel: T,
        host: String,
        port: u16,
        upstream: TcpStream,
        inject: Vec<Injection>,
    ) where
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let accepted = match self.leaf(&host) {
            Ok(config) => tokio_rustls::TlsAcceptor::from(config).accept(tunnel).await,
            Err(why) => {
                tracing::warn!(%host, %why, "egress proxy: cannot present a certificate");
                return;
            }
        };
        let inside = match accepted {
            Ok(stream) => stream,
            Err(e) => {
                tracing::info!(%host, error = %e, "egress proxy: the sandbox's TLS handshake failed");
                return;
            }
        };
        let outside = match ServerName::try_from(host.clone()) {
            Ok(name) => self
                .upstream
                .connect(name, upstream)
                .await
                .map_err(|e| format!("TLS with {host}:{port} failed: {e}")),
            Err(e) => Err(format!("`{host}` is not a TLS server name: {e}")),
        };
        let sender = match outside {
            Ok(stream) => match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await {
                Ok((sender, connection)) => {
                    tokio::spawn(connection);
                    Ok(sender)
                }
                Err(e) => Err(format!("cannot talk to {host}:{port}: {e}")),
            },
            Err(why) => Err(why),
        };
        let sender = Arc::new(tokio::sync::Mutex::new(sender));
        let authority = match port {
            443 => host.clone(),
            _ if host.contains(':') => format!("[{host}]:{port}"),
            _ => format!("{host}:{port}"),
        };
        let inject = Arc::new(inject);
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let (sender, authority, inject) = (sender.clone(), authority.clone(), inject.clone());
            async move {
                let mut sender = sender.lock().await;
                match sender.as_mut() {
                    // The destination closed the connection since the last request
                    // (its keep-alive ended): this one ends too, unanswered, so the
                    // client opens a new tunnel and retries, as it would had it been
                    // talking to the destination directly.
                    Ok(sender) if sender.is_closed() => Err(UpstreamClosed),
                    Ok(sender) => Ok(relay(req, sender, &authority, &inject).await),
                    Err(why) => Ok::<Response<Body>, _>(refusal(StatusCode::BAD_GATEWAY, why)),
                }
            }
        });
        let served = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(inside), service)
            .await;
        if let Err(e) = served {
            tracing::debug!(error = %e, "egress proxy: an intercepted connection ended");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::client::danger::ServerCertVerifier;

    #[test]
    fn the_authority_vouches_only_for_destinations_with_a_credential() {
        let inject = [
            Injection::new("localhost:8443", "authorization", "Bearer ", "x").unwrap(),
            Injection::new("*.example.com", "authorization", "", "y").unwrap(),
            Injection::new("10.1.2.3", "authorization", "", "z").unwrap(),
        ];
        let interceptor = Interceptor::new(&inject).unwrap();
        assert!(interceptor.trust().ends_with(&pem(&interceptor.ca)));
        assert!(!interceptor.trust().contains("PRIVATE KEY"));
        let mut roots = rustls::RootCertStore::empty();
        roots.add(interceptor.ca.clone()).unwrap();
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            provider(),
        )
        .build()
        .unwrap();
        let now = rustls::pki_types::UnixTime::now();
        for (host, vouched) in [
            ("localhost", true),
            ("api.example.com", true),
            ("10.1.2.3", true),
            ("evil.test", false),
            ("localhost.evil.test", false),
            ("10.1.2.4", false),
        ] {
            // Even were the proxy made to sign for another name, no client would
            // believe it: the authority's name constraints forbid it.
            let (cert, _) = interceptor.certify(host).unwrap();
            let name = ServerName::try_from(host.to_string()).unwrap();
            let verdict = verifier.verify_server_cert(&cert, &[], &name, &[], now);
            assert_eq!(verdict.is_ok(), vouched, "{host}: {verdict:?}");
        }
    }
}
