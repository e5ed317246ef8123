//! OpenID Connect bearer tokens: JWTs a company's identity provider signs, accepted
//! beside the static tokens so people and services authenticate as they do elsewhere.
//!
//! A token is checked against the issuer's published keys (its JWKS, found through
//! `/.well-known/openid-configuration` unless named), its issuer, audience, expiry and
//! not-before (30 s of leeway), and the key's own algorithm (asymmetric only: a JWKS
//! that offers a shared secret is refused, so no token can pick its own check). One
//! claim (`sub` unless configured) names the owner; a token whose configured claim
//! holds one of the operator's values (a group, a role) is an operator (`admin`
//! scope), the rest `read` and `run`. Keys are fetched at start (a server
//! that cannot reach its issuer does not start), every ten minutes, and when a token
//! names a key not yet known (at most every `min_refresh`), so a rotation needs no
//! restart.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

/// How often the keys are fetched again while nothing asks.
const REFRESH_EVERY: Duration = Duration::from_secs(600);

/// What the operator configures (`[server.oidc]`).
#[derive(Debug, Clone)]
pub struct OidcConfig {
    /// The issuer, exactly as tokens' `iss` says it (`https://login.example.com`).
    pub issuer: String,
    /// The audience tokens must name in `aud` (this API's client id).
    pub audience: String,
    /// The claim whose value is the owner (default `sub`).
    pub owner_claim: String,
    /// Where the keys are; default: the discovery document's `jwks_uri`.
    pub jwks_url: Option<String>,
    /// The least time between fetches a token with an unknown key triggers.
    pub min_refresh: Duration,
    /// Which tokens are operators: those whose claim (a string, or an array of
    /// them, as `groups` and `roles` usually are) holds one of these values.
    pub admins: Option<AdminClaim>,
}

/// A claim and the values of it that make a token an operator's.
#[derive(Debug, Clone)]
pub struct AdminClaim {
    /// The claim, e.g. `groups`.
    pub claim: String,
    /// Its values that mean an operator, e.g. `steadfast-admins`.
    pub values: Vec<String>,
}

/// Who a valid token is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The owner its claim names.
    pub owner: String,
    /// Whether it is an operator's ([`OidcConfig::admins`]).
    pub admin: bool,
}

impl OidcConfig {
    /// Tokens of `issuer` for `audience`, owners from `sub`.
    pub fn new(issuer: &str, audience: &str) -> Self {
        OidcConfig {
            issuer: issuer.to_string(),
            audience: audience.to_string(),
            owner_claim: "sub".into(),
            jwks_url: None,
            min_refresh: Duration::from_secs(30),
            admins: None,
        }
    }
}

/// Why a token or the issuer's keys were refused.
#[derive(Debug, thiserror::Error)]
pub enum OidcError {
    /// The issuer's discovery document or keys could not be fetched or read.
    #[error("OpenID issuer {issuer}: {detail}")]
    Issuer {
        /// The issuer.
        issuer: String,
        /// What failed.
        detail: String,
    },
    /// The token is not one this server accepts; says why, for the caller.
    #[error("{0}")]
    Token(String),
}

/// A usable key: how to check a signature with it.
struct Key {
    decoding: DecodingKey,
    algorithm: Algorithm,
}

/// The issuer's keys as last fetched.
struct Keys {
    by_id: HashMap<String, Arc<Key>>,
    fetched: Instant,
}

/// A configured issuer and its keys.
pub struct Oidc {
    config: OidcConfig,
    jwks_url: String,
    keys: std::sync::RwLock<Keys>,
    /// Serialises fetches, so a burst of unknown keys fetches once.
    fetching: tokio::sync::Mutex<()>,
    http: reqwest::Client,
}

impl std::fmt::Debug for Oidc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Oidc")
            .field("issuer", &self.config.issuer)
            .field("jwks_url", &self.jwks_url)
            .finish()
    }
}

impl Oidc {
    /// Finds the issuer's keys and fetches them, then keeps them fresh in the
    /// background; fails if the issuer cannot be reached or offers no usable key.
    pub async fn start(config: OidcConfig) -> Result<Arc<Self>, OidcError> {
        let issuer_error = |detail: String| OidcError::Issuer {
            issuer: config.issuer.clone(),
            detail,
        };
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| issuer_error(e.to_string()))?;
        let jwks_url = match &config.jwks_url {
            Some(url) => url.clone(),
            None => discover(&http, &config.issuer)
                .await
                .map_err(issuer_error)?,
        };
        let by_id = fetch_keys(&http, &jwks_url).await.map_err(issuer_error)?;
        let oidc = Arc::new(Oidc {
            config,
            jwks_url,
            keys: std::sync::RwLock::new(Keys {
                by_id,
                fetched: Instant::now(),
            }),
            fetching: tokio::sync::Mutex::new(()),
            http,
        });
        let weak = Arc::downgrade(&oidc);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(REFRESH_EVERY).await;
                let Some(oidc) = weak.upgrade() else { return };
                if let Err(e) = oidc.refresh().await {
                    tracing::warn!(error = %e, "could not refresh the OpenID issuer's keys; keeping the last ones");
                }
            }
        });
        Ok(oidc)
    }

    /// Whether `token` looks like a JWT (three base64url parts) rather than a static
    /// token.
    pub(crate) fn looks_like_jwt(token: &str) -> bool {
        token.starts_with("eyJ") && token.split('.').count() == 3
    }

    /// The owner a valid token names.
    pub(crate) async fn identify(&self, token: &str) -> Result<Identity, OidcError> {
        let refused = |m: String| OidcError::Token(m);
        let header = jsonwebtoken::decode_header(token)
            .map_err(|e| refused(format!("not a JWT this server can read: {e}")))?;
        let kid = header
            .kid
            .ok_or_else(|| refused("the token names no signing key (`kid`)".into()))?;
        let key = match self.key(&kid) {
            Some(key) => key,
            None => {
                self.refresh_for_unknown_key().await;
                self.key(&kid).ok_or_else(|| {
                    refused(format!(
                        "the token's signing key `{kid}` is not among the issuer's keys"
                    ))
                })?
            }
        };
        let mut validation = Validation::new(key.algorithm);
        validation.set_issuer(&[&self.config.issuer]);
        validation.set_audience(&[&self.config.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        validation.validate_nbf = true;
        validation.leeway = 30;
        let data = jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(
            token,
            &key.decoding,
            &validation,
        )
        .map_err(|e| refused(format!("the token is not valid here: {e}")))?;
        let owner = match data.claims.get(&self.config.owner_claim) {
            Some(serde_json::Value::String(owner)) if !owner.trim().is_empty() => owner.clone(),
            _ => {
                return Err(refused(format!(
                    "the token has no `{}` claim to name its owner",
                    self.config.owner_claim
                )))
            }
        };
        let admin = self.config.admins.as_ref().is_some_and(|admins| {
            let held = |v: &serde_json::Value| {
                v.as_str()
                    .is_some_and(|v| admins.values.iter().any(|a| a == v))
            };
            match data.claims.get(&admins.claim) {
                Some(serde_json::Value::Array(values)) => values.iter().any(held),
                Some(value) => held(value),
                None => false,
            }
        });
        Ok(Identity { owner, admin })
    }

    fn key(&self, kid: &str) -> Option<Arc<Key>> {
        self.keys
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .by_id
            .get(kid)
            .cloned()
    }

    /// Fetches the keys again if the last fetch is older than `min_refresh`.
    async fn refresh_for_unknown_key(&self) {
        let _one = self.fetching.lock().await;
        let fetched = self.keys.read().unwrap_or_else(|e| e.into_inner()).fetched;
        if fetched.elapsed() < self.config.min_refresh {
            return;
        }
        if let Err(e) = self.fetch_now().await {
            tracing::warn!(error = %e, "could not refresh the OpenID issuer's keys for an unknown key");
        }
    }

    async fn refresh(&self) -> Result<(), OidcError> {
        let _one = self.fetching.lock().await;
        self.fetch_now().await
    }

    async fn fetch_now(&self) -> Result<(), OidcError> {
        let result = fetch_keys(&self.http, &self.jwks_url).await;
        let mut keys = self.keys.write().unwrap_or_else(|e| e.into_inner());
        // A failed fetch is not retried at once by every request that follows.
        keys.fetched = Instant::now();
        keys.by_id = result.map_err(|detail| OidcError::Issuer {
            issuer: self.config.issuer.clone(),
            detail,
        })?;
        Ok(())
    }
}

/// The JWKS address the issuer's discovery document names (its `issuer` must be the
/// one configured, as OpenID Connect Discovery requires).
async fn discover(http: &reqwest::Client, issuer: &str) -> Result<String, String> {
    let url = format!(
        "{}/.well-known/openid-configuration",
        issuer.trim_end_matches('/')
    );
    let document: serde_json::Value = get_json(http, &url, "JSON").await?;
    if document["issuer"].as_str() != Some(issuer) {
        return Err(format!(
            "{url} names the issuer {}, not {issuer}",
            document["issuer"]
        ));
    }
    document["jwks_uri"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("{url} names no jwks_uri"))
}

/// `url`'s JSON body as a `T` (`what` names it in errors).
async fn get_json<T: serde::de::DeserializeOwned>(
    http: &reqwest::Client,
    url: &str,
    what: &str,
) -> Result<T, String> {
    http.get(url)
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .map_err(|e| format!("{url}: {e}"))?
        .json()
        .await
        .map_err(|e| format!("{url}: not {what}: {e}"))
}

/// The usable keys of a JWKS, by key id.
async fn fetch_keys(
    http: &reqwest::Client,
    url: &str,
) -> Result<HashMap<String, Arc<Key>>, String> {
    let set: JwkSet = get_json(http, url, "a JWKS").await?;
    let mut by_id = HashMap::new();
    for jwk in &set.keys {
        let Some(kid) = &jwk.common.key_id else {
            continue;
        };
        let Some(algorithm) = algorithm_of(jwk) else {
            tracing::warn!(kid, "skipping a JWKS key this server does not accept (a shared secret, or an unknown algorithm)");
            continue;
        };
        match DecodingKey::from_jwk(jwk) {
            Ok(decoding) => {
                by_id.insert(
                    kid.clone(),
                    Arc::new(Key {
                        decoding,
                        algorithm,
                    }),
                );
            }
            Err(e) => tracing::warn!(kid, error = %e, "skipping a JWKS key that does not read"),
        }
    }
    if by_id.is_empty() {
        return Err(format!(
            "{url} offers no key this server can check tokens with"
        ));
    }
    Ok(by_id)
}

/// The algorithm a key is used with: the one it names, or its type's usual one;
/// `None` for shared secrets and what is not known.
fn algorithm_of(jwk: &jsonwebtoken::jwk::Jwk) -> Option<Algorithm> {
    let named = match jwk.common.key_algorithm {
        Some(KeyAlgorithm::RS256) => Some(Algorithm::RS256),
        Some(KeyAlgorithm::RS384) => Some(Algorithm::RS384),
        Some(KeyAlgorithm::RS512) => Some(Algorithm::RS512),
        Some(KeyAlgorithm::PS256) => Some(Algorithm::PS256),
        Some(KeyAlgorithm::PS384) => Some(Algorithm::PS384),
        Some(KeyAlgorithm::PS512) => Some(Algorithm::PS512),
        Some(KeyAlgorithm::ES256) => Some(Algorithm::ES256),
        Some(KeyAlgorithm::ES384) => Some(Algorithm::ES384),
        Some(KeyAlgorithm::EdDSA) => Some(Algorithm::EdDSA),
        Some(_) => return None,
        None => None,
    };
    let by_type = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Some(Algorithm::RS256),
        AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
            EllipticCurve::P256 => Some(Algorithm::ES256),
            EllipticCurve::P384 => Some(Algorithm::ES384),
            _ => None,
        },
        AlgorithmParameters::OctetKeyPair(_) => Some(Algorithm::EdDSA),
        AlgorithmParameters::OctetKey(_) => return None,
    };
    named.or(by_type)
}
