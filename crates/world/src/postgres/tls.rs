//! TLS to PostgreSQL, chosen as libpq's `sslmode` and `sslrootcert` choose it, so a
//! managed database that enforces TLS works with the URL its provider prints.
//!
//! | `sslmode` | encrypted | the server's certificate |
//! |---|---|---|
//! | `disable` | never | — |
//! | `prefer` (the default) | when the server offers it | not checked |
//! | `require` | always | not checked (checked as `verify-ca` when `sslrootcert` is given, as libpq does) |
//! | `verify-ca` | always | signed by a trusted authority |
//! | `verify-full` | always | signed by a trusted authority, and for the host connected to |
//!
//! The trusted authorities are the PEM file `sslrootcert` names, or the system's
//! (`sslrootcert=system`, or nothing). tokio-postgres knows only the first three modes
//! and neither of the other settings, so both are read here and taken out of the URL
//! before it parses the rest.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::{Error, Result};

/// How much of the server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// Nothing: the connection is encrypted, but anyone in the middle may answer.
    Nothing,
    /// Signed by a trusted authority, for any host.
    Authority,
    /// Signed by a trusted authority, for the host connected to.
    Full,
}

/// A PostgreSQL connection string read: what tokio-postgres is given, and the TLS
/// connector every connection (the pool's and the notification one) makes.
pub(crate) fn configure(spec: &str) -> Result<(tokio_postgres::Config, MakeRustlsConnect)> {
    let (rest, mode, root) = take_tls_settings(spec)?;
    let mut config: tokio_postgres::Config = rest
        .parse()
        .map_err(|e| Error::backend_in("bad PostgreSQL URL", e))?;
    let (ssl_mode, mut check) = match mode.as_deref().unwrap_or("prefer") {
        "disable" => (SslMode::Disable, Check::Nothing),
        "prefer" => (SslMode::Prefer, Check::Nothing),
        "require" => (SslMode::Require, Check::Nothing),
        "verify-ca" => (SslMode::Require, Check::Authority),
        "verify-full" => (SslMode::Require, Check::Full),
        "allow" => {
            return Err(Error::backend_says("sslmode=allow is not supported: use prefer (encrypted when the server offers it) or disable"))
        }
        other => {
            return Err(Error::backend_says(format!(
                "bad PostgreSQL URL: sslmode={other} is not one of disable, prefer, require, verify-ca, verify-full"
            )))
        }
    };
    if check == Check::Nothing && ssl_mode == SslMode::Require && root.is_some() {
        check = Check::Authority;
    }
    config.ssl_mode(ssl_mode);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let authorities = match check {
        Check::Nothing => None,
        Check::Authority | Check::Full => {
            let roots = Arc::new(trusted(root.as_deref())?);
            Some(
                WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                    .build()
                    .map_err(|e| Error::backend_in("TLS to PostgreSQL", e))?,
            )
        }
    };
    let verifier = Arc::new(Verifier {
        authorities,
        any_host: check != Check::Full,
        provider: provider.clone(),
    });
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::backend_in("TLS to PostgreSQL", e))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok((config, MakeRustlsConnect::new(tls)))
}

/// `spec` without its `sslmode` and `sslrootcert`, and their values. Both forms
/// libpq takes are read: a URL (`postgres://…?sslmode=verify-full`) and key=value
/// pairs (`host=… sslmode=verify-full`).
fn take_tls_settings(spec: &str) -> Result<(String, Option<String>, Option<String>)> {
    let (mut mode, mut root) = (None, None);
    if spec.starts_with("postgres://") || spec.starts_with("postgresql://") {
        let Some((base, query)) = spec.split_once('?') else {
            return Ok((spec.to_string(), None, None));
        };
        // The other parameters are passed on as written.
        let mut kept = Vec::new();
        for raw in query.split('&') {
            let decoded = url::form_urlencoded::parse(raw.as_bytes()).next();
            match decoded {
                Some((key, value)) if key == "sslmode" => mode = Some(value.into_owned()),
                Some((key, value)) if key == "sslrootcert" => root = Some(value.into_owned()),
                _ => kept.push(raw),
            }
        }
        let rest = if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        return Ok((rest, mode, root));
    }
    let mut kept = Vec::new();
    for pair in spec.split_whitespace() {
        match pair.split_once('=') {
            Some(("sslmode", value)) => mode = Some(value.trim_matches('\'').to_string()),
            Some(("sslrootcert", value)) => root = Some(value.trim_matches('\'').to_string()),
            _ => kept.push(pair),
        }
    }
    Ok((kept.join(" "), mode, root))
}

/// The authorities a server's certificate may be signed by: those in the PEM file at
/// `root`, or the system's.
fn trusted(root: Option<&str>) -> Result<RootCertStore> {
    let mut store = RootCertStore::empty();
    match root.filter(|r| *r != "system") {
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect::<std::result::Result<Vec<_>, _>>())
                .map_err(|e| Error::backend_in(format!("sslrootcert={path}"), e))?;
            let (added, _) = store.add_parsable_certificates(certs);
            if added == 0 {
                return Err(Error::backend_says(format!(
                    "sslrootcert={path}: no certificate in it could be read"
                )));
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            store.add_parsable_certificates(found.certs);
            if store.is_empty() {
                return Err(Error::backend_says("the server's certificate is to be checked, but this system has no trusted authorities: set sslrootcert to a PEM file"));
            }
        }
    }
    Ok(store)
}

/// Checks the server's certificate as far as the mode asks: nothing (`prefer`,
/// `require`), its authority (`verify-ca`), or its authority and host
/// (`verify-full`). The handshake's signature by the presented key is checked always.
#[derive(Debug)]
struct Verifier {
    /// The trusted authorities' check; `None`: the certificate is not checked.
    authorities: Option<Arc<WebPkiServerVerifier>>,
    /// Whether a certificate for another host than the one connected to is taken.
    any_host: bool,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        let Some(authorities) = &self.authorities else {
            return Ok(ServerCertVerified::assertion());
        };
        match authorities.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if self.any_host => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_settings_are_taken_out_of_both_forms_and_the_rest_kept() {
        let (rest, mode, root) = take_tls_settings(
            "postgres://u:p@db.example.com:5433/app?sslmode=verify-full&application_name=x&sslrootcert=%2Fetc%2Fca%20b.pem",
        )
        .unwrap();
        assert_eq!(
            rest,
            "postgres://u:p@db.example.com:5433/app?application_name=x"
        );
        assert_eq!(mode.as_deref(), Some("verify-full"));
        assert_eq!(root.as_deref(), Some("/etc/ca b.pem"));
        let (rest, mode, root) =
            take_tls_settings("host=db user=u sslmode=require dbname=app").unwrap();
        assert_eq!(rest, "host=db user=u dbname=app");
        assert_eq!(mode.as_deref(), Some("require"));
        assert_eq!(root, None);
        let (rest, ..) = take_tls_settings("postgres://u@h/db?sslmode=disable").unwrap();
        assert_eq!(rest, "postgres://u@h/db");
    }

    #[test]
    fn an_unknown_or_unsupported_sslmode_is_named() {
        for (mode, says) in [("allow", "sslmode=allow"), ("verify", "sslmode=verify")] {
            let err = configure(&format!("postgres://u@h/db?sslmode={mode}"))
                .err()
                .expect("refused")
                .to_string();
            assert!(err.contains(says), "{err}");
        }
        let err = configure("postgres://u@h/db?sslmode=verify-full&sslrootcert=/nonexistent.pem")
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains("/nonexistent.pem"), "{err}");
    }
}
