//! What a delivery to an inbound hook proves: each check the senders people use
//! sign with, verified in constant time, with the id that makes a replay visible.
//!
//! - `token`: the URL's `?token=` is compared by its BLAKE3 hash; a sender's
//!   `Idempotency-Key` (or `X-Request-Id`) names the delivery when it sends one.
//! - `github`: `X-Hub-Signature-256: sha256=<hex>` is HMAC-SHA256 of the body; the
//!   delivery is `X-GitHub-Delivery` (GitHub keeps it on a redelivery). GitHub signs
//!   no time, so its ids are what refuses a replay.
//! - `slack`: `X-Slack-Signature: v0=<hex>` over `v0:<X-Slack-Request-Timestamp>:<body>`,
//!   the time within [`SKEW`] of ours; the signature names the delivery.
//! - `hmac`: Steadfast's own `Steadfast-Signature: t=<ms>,v1=<hex>` over `<t>.<body>`
//!   (as its outgoing webhooks sign), the time within [`SKEW`]; `Idempotency-Key`
//!   names the delivery, or else the signature.

use axum::http::HeaderMap;
use hmac::{KeyInit, Mac};
use steadfast_world::HookCheck;

/// How far a signed time may be from this server's clock.
pub(crate) const SKEW: std::time::Duration = std::time::Duration::from_secs(300);

/// Why a delivery is refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// A header the check needs is absent or malformed.
    Missing(&'static str),
    /// The token or signature does not match.
    BadSignature,
    /// The signed time is further than [`SKEW`] from ours, by this many seconds.
    Stale(i64),
}

impl Refused {
    /// The result counted in `/metrics`.
    pub(crate) fn metric(&self) -> &'static str {
        match self {
            Refused::Missing(_) | Refused::BadSignature => "bad_signature",
            Refused::Stale(_) => "stale",
        }
    }
}

/// What a delivery that passed its check says about itself.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Proven {
    /// The id a replay would repeat, when the sender gives one.
    pub delivery: Option<String>,
    /// The sender's name for what happened (`X-GitHub-Event`), when it gives one.
    pub event: Option<String>,
}

/// The proof a hook is checked against.
pub(crate) enum Key<'a> {
    /// The BLAKE3 hash (hex) of a URL token, and the token the request carries.
    Token {
        hash: &'a str,
        given: Option<&'a str>,
    },
    /// The HMAC key of a signing check.
    Signing(&'a [u8]),
}

/// Checks a delivery of `body` with `headers` under `check` against `key`, at `now_ms`.
pub(crate) fn verify(
    check: HookCheck,
    key: Key<'_>,
    headers: &HeaderMap,
    body: &[u8],
    now_ms: u64,
) -> Result<Proven, Refused> {
    let header = |name: &'static str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    let idempotency = || {
        header("idempotency-key")
            .or_else(|| header("x-request-id"))
            .map(str::to_string)
    };
    match (check, key) {
        (HookCheck::Token, Key::Token { hash, given }) => {
            let given = given.ok_or(Refused::Missing("token"))?;
            // Hashes compared, so how long a comparison takes says nothing of the token.
            let expected = blake3::Hash::from_hex(hash).map_err(|_| Refused::BadSignature)?;
            if blake3::hash(given.as_bytes()) != expected {
                return Err(Refused::BadSignature);
            }
            Ok(Proven {
                delivery: idempotency(),
                event: None,
            })
        }
        (HookCheck::Github, Key::Signing(secret)) => {
            let signature = header("x-hub-signature-256")
                .and_then(|v| v.strip_prefix("sha256="))
                .ok_or(Refused::Missing("X-Hub-Signature-256"))?;
            let delivery =
                header("x-github-delivery").ok_or(Refused::Missing("X-GitHub-Delivery"))?;
            matches(secret, &[body], signature)?;
            Ok(Proven {
                delivery: Some(delivery.to_string()),
                event: header("x-github-event").map(str::to_string),
            })
        }
        (HookCheck::Slack, Key::Signing(secret)) => {
            let signature = header("x-slack-signature")
                .and_then(|v| v.strip_prefix("v0="))
                .ok_or(Refused::Missing("X-Slack-Signature"))?;
            let at = header("x-slack-request-timestamp")
                .ok_or(Refused::Missing("X-Slack-Request-Timestamp"))?;
            let seconds: i64 = at
                .parse()
                .map_err(|_| Refused::Missing("X-Slack-Request-Timestamp"))?;
            fresh(seconds.saturating_mul(1000), now_ms)?;
            matches(secret, &[b"v0:", at.as_bytes(), b":", body], signature)?;
            Ok(Proven {
                delivery: Some(format!("slack:{signature}")),
                event: None,
            })
        }
        (HookCheck::Hmac, Key::Signing(secret)) => {
            let value = header(crate::webhooks::SIGNATURE_HEADER)
                .ok_or(Refused::Missing("Steadfast-Signature"))?;
            let (mut at, mut signature) = (None, None);
            for part in value.split(',') {
                match part.trim().split_once('=') {
                    Some(("t", t)) => at = Some(t),
                    Some(("v1", v)) => signature = Some(v),
                    _ => {}
                }
            }
            let (Some(at), Some(signature)) = (at, signature) else {
                return Err(Refused::Missing("Steadfast-Signature"));
            };
            let t_ms: i64 = at
                .parse()
                .map_err(|_| Refused::Missing("Steadfast-Signature"))?;
            fresh(t_ms, now_ms)?;
            matches(secret, &[at.as_bytes(), b".", body], signature)?;
            Ok(Proven {
                delivery: idempotency().or_else(|| Some(format!("v1:{signature}"))),
                event: None,
            })
        }
        // A hook's secret is made for its check: a token for `token`, a key otherwise.
        _ => Err(Refused::BadSignature),
    }
}

/// Whether `hex_signature` is HMAC-SHA256 under `secret` of `parts`, in constant time.
fn matches(secret: &[u8], parts: &[&[u8]], hex_signature: &str) -> Result<(), Refused> {
    let given = hex::decode(hex_signature).map_err(|_| Refused::BadSignature)?;
    let mut mac =
        hmac::Hmac::<sha2::Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
    for part in parts {
        mac.update(part);
    }
    mac.verify_slice(&given).map_err(|_| Refused::BadSignature)
}

/// Whether a signed time `at_ms` is within [`SKEW`] of `now_ms`.
fn fresh(at_ms: i64, now_ms: u64) -> Result<(), Refused> {
    let skew = (now_ms as i64).saturating_sub(at_ms);
    if skew.unsigned_abs() > SKEW.as_millis() as u64 {
        return Err(Refused::Stale(skew / 1000));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn sign(secret: &[u8], parts: &[&[u8]]) -> String {
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret).unwrap();
        for part in parts {
            mac.update(part);
        }
        hex::encode(mac.finalize().into_bytes())
    }

    fn headers(pairs: &[(&'static str, String)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    const NOW: u64 = 1_800_000_000_000;

    #[test]
    fn github_signatures_are_checked_and_name_their_delivery() {
        let body = br#"{"action":"completed"}"#;
        let good = headers(&[
            (
                "x-hub-signature-256",
                format!("sha256={}", sign(b"s3cret", &[body])),
            ),
            ("x-github-delivery", "72d3162e".into()),
            ("x-github-event", "check_run".into()),
        ]);
        let proven = verify(HookCheck::Github, Key::Signing(b"s3cret"), &good, body, NOW).unwrap();
        assert_eq!(proven.delivery.as_deref(), Some("72d3162e"));
        assert_eq!(proven.event.as_deref(), Some("check_run"));
        // Another key, another body, no delivery id, no signature.
        let check = |key: &[u8], body: &[u8], h: &HeaderMap| {
            verify(HookCheck::Github, Key::Signing(key), h, body, NOW)
        };
        assert_eq!(check(b"other", body, &good), Err(Refused::BadSignature));
        assert_eq!(check(b"s3cret", b"{}", &good), Err(Refused::BadSignature));
        let mut no_id = good.clone();
        no_id.remove("x-github-delivery");
        assert_eq!(
            check(b"s3cret", body, &no_id),
            Err(Refused::Missing("X-GitHub-Delivery"))
        );
        let mut unsigned = good.clone();
        unsigned.remove("x-hub-signature-256");
        assert_eq!(
            check(b"s3cret", body, &unsigned),
            Err(Refused::Missing("X-Hub-Signature-256"))
        );
    }

    #[test]
    fn slack_and_steadfast_signatures_carry_a_time_that_must_be_recent() {
        let body = b"token=x&text=deploy";
        let at = (NOW / 1000).to_string();
        let slack = |at: &str| {
            headers(&[
                ("x-slack-request-timestamp", at.to_string()),
                (
                    "x-slack-signature",
                    format!("v0={}", sign(b"k", &[b"v0:", at.as_bytes(), b":", body])),
                ),
            ])
        };
        assert!(verify(HookCheck::Slack, Key::Signing(b"k"), &slack(&at), body, NOW).is_ok());
        let old = (NOW / 1000 - 301).to_string();
        assert_eq!(
            verify(
                HookCheck::Slack,
                Key::Signing(b"k"),
                &slack(&old),
                body,
                NOW
            ),
            Err(Refused::Stale(301))
        );

        let ours = |t: u64| {
            headers(&[(
                "steadfast-signature",
                crate::webhooks::signature("k", t, body).to_string(),
            )])
        };
        let proven = verify(
            HookCheck::Hmac,
            Key::Signing(b"k"),
            &ours(NOW - 1000),
            body,
            NOW,
        )
        .unwrap();
        assert!(proven.delivery.unwrap().starts_with("v1:"));
        assert_eq!(
            verify(
                HookCheck::Hmac,
                Key::Signing(b"k"),
                &ours(NOW + 400_000),
                body,
                NOW
            ),
            Err(Refused::Stale(-400))
        );
        assert_eq!(
            verify(HookCheck::Hmac, Key::Signing(b"x"), &ours(NOW), body, NOW),
            Err(Refused::BadSignature)
        );
    }

    #[test]
    fn a_token_is_compared_by_its_hash() {
        let hash = blake3::hash(b"hk_abc").to_hex().to_string();
        let with_id = headers(&[("idempotency-key", "run-7".into())]);
        let check = |given: Option<&str>| {
            verify(
                HookCheck::Token,
                Key::Token { hash: &hash, given },
                &with_id,
                b"",
                NOW,
            )
        };
        assert_eq!(
            check(Some("hk_abc")).unwrap().delivery.as_deref(),
            Some("run-7")
        );
        assert_eq!(check(Some("hk_abd")), Err(Refused::BadSignature));
        assert_eq!(check(None), Err(Refused::Missing("token")));
        // A signing key never passes for a token check, nor the other way round.
        assert_eq!(
            verify(HookCheck::Token, Key::Signing(b"k"), &with_id, b"", NOW),
            Err(Refused::BadSignature)
        );
    }
}
