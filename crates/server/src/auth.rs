//! Authentication: bearer tokens (stored only as BLAKE3 hashes) mapped to owners, and
//! OpenID Connect tokens from the company's identity provider ([`crate::oidc`]).

use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;
use steadfast_world::{Scope, World};

use crate::error::ApiError;

/// A configured token: its owner, the hex BLAKE3 hash of the token and its scopes.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct TokenEntry {
    /// Who the token acts as.
    pub owner: String,
    /// `hash_token(token)`.
    pub token_hash: String,
    /// What it allows; default [`DEFAULT_SCOPES`] (`admin` must be asked for).
    #[serde(default)]
    pub scopes: Option<Vec<Scope>>,
}

/// How a token issued through the API begins, so the server knows to look it up.
pub(crate) const TOKEN_PREFIX: &str = "sft_";
/// How a share link's secret begins. It is looked up like an issued token and acts
/// with the scopes stored on it: `read` for a link to a session's view (which
/// [`crate::console::credentials`] holds to that session's read routes), none for a
/// link to a port.
pub(crate) const LINK_PREFIX: &str = "sfl_";

/// What a token allows unless it says otherwise: its owner's sessions and vault.
pub const DEFAULT_SCOPES: [Scope; 2] = [Scope::Read, Scope::Run];

/// Who a request acts as, and what it may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The owner whose sessions it reaches.
    pub owner: String,
    /// What it may do.
    pub scopes: Vec<Scope>,
}

/// How requests are authenticated.
#[derive(Debug, Clone)]
pub enum AuthMode {
    /// Bearer tokens required: a static one, or a JWT of the configured issuer.
    Tokens {
        /// Static tokens' hashes, owners and scopes.
        tokens: Vec<(blake3::Hash, Caller)>,
        /// The OpenID Connect issuer whose tokens are accepted too.
        oidc: Option<std::sync::Arc<crate::oidc::Oidc>>,
    },
    /// Development: no auth configured, not production; everyone is `local`.
    Development,
    /// Production with no tokens configured: every request is refused.
    Closed,
    /// Asked for by name: anyone may call; each session gets its own owner id (the
    /// session id is the capability) and a spend cap.
    Public {
        /// The most any session may spend, millionths of a dollar.
        session_cap_micro_usd: u64,
    },
}

/// The server's authentication.
#[derive(Debug, Clone)]
pub struct Auth {
    /// The mode.
    pub mode: AuthMode,
}

/// The hash stored in configuration for `token`.
pub fn hash_token(token: &str) -> String {
    blake3::hash(token.as_bytes()).to_hex().to_string()
}

impl Auth {
    /// Authentication from configured tokens and the mode flags.
    pub fn new(
        tokens: &[TokenEntry],
        production: bool,
        public_cap_usd: Option<f64>,
    ) -> Result<Self, String> {
        Self::with_oidc(tokens, None, production, public_cap_usd)
    }

    /// [`Auth::new`], accepting the tokens of an OpenID Connect issuer too.
    pub fn with_oidc(
        tokens: &[TokenEntry],
        oidc: Option<std::sync::Arc<crate::oidc::Oidc>>,
        production: bool,
        public_cap_usd: Option<f64>,
    ) -> Result<Self, String> {
        if let Some(cap) = public_cap_usd {
            if !cap.is_finite() || cap <= 0.0 {
                return Err("--public needs a positive per-session spend cap".into());
            }
            return Ok(Auth {
                mode: AuthMode::Public {
                    session_cap_micro_usd: steadfast_log::money::micro_usd(cap),
                },
            });
        }
        if tokens.is_empty() && oidc.is_none() {
            return Ok(Auth {
                mode: if production {
                    AuthMode::Closed
                } else {
                    AuthMode::Development
                },
            });
        }
        let mut parsed = Vec::new();
        for t in tokens {
            let hash = blake3::Hash::from_hex(&t.token_hash).map_err(|e| {
                format!("token hash for {} is not a BLAKE3 hex digest: {e}", t.owner)
            })?;
            parsed.push((
                hash,
                Caller {
                    owner: t.owner.clone(),
                    scopes: t.scopes.clone().unwrap_or_else(|| DEFAULT_SCOPES.to_vec()),
                },
            ));
        }
        Ok(Auth {
            mode: AuthMode::Tokens {
                tokens: parsed,
                oidc,
            },
        })
    }

    /// How requests are authenticated, in words for the server's banner and logs.
    pub fn mode_name(&self) -> &'static str {
        match self.mode {
            AuthMode::Tokens { oidc: None, .. } => "token authentication",
            AuthMode::Tokens { oidc: Some(_), .. } => {
                "token authentication (static tokens and OpenID Connect)"
            }
            AuthMode::Development => "no authentication: development",
            AuthMode::Closed => "production with no tokens configured: refusing every request",
            AuthMode::Public { .. } => "no authentication: public, anonymous sessions",
        }
    }

    /// Who a request acts as: a static token, a JWT of the OpenID issuer, or a token
    /// issued through the API (looked up in `world`); in development, `local` with
    /// every scope; in public mode, `public` without `admin`.
    pub(crate) async fn caller<W: World>(
        &self,
        headers: &HeaderMap,
        world: &W,
    ) -> Result<Caller, ApiError> {
        let unauthorized = |m: &str| ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", m);
        match &self.mode {
            AuthMode::Development => Ok(Caller {
                owner: "local".into(),
                scopes: Scope::ALL.to_vec(),
            }),
            AuthMode::Public { .. } => Ok(Caller {
                owner: "public".into(),
                scopes: DEFAULT_SCOPES.to_vec(),
            }),
            AuthMode::Closed => Err(unauthorized(
                "this server runs in production mode with no authentication configured, so it refuses every request",
            )),
            AuthMode::Tokens { tokens, oidc } => {
                let token = headers
                    .get(axum::http::header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().split_once(' '))
                    // The scheme is case-insensitive (RFC 9110): `bearer` is `Bearer`.
                    .and_then(|(scheme, token)| scheme.eq_ignore_ascii_case("bearer").then_some(token))
                    .ok_or_else(|| unauthorized("send a bearer token: Authorization: Bearer <token>"))?;
                let token = token.trim();
                let presented = blake3::hash(token.as_bytes());
                // blake3::Hash compares in constant time.
                if let Some((_, caller)) = tokens.iter().find(|(hash, _)| *hash == presented) {
                    return Ok(caller.clone());
                }
                if let Some(oidc) = oidc.as_ref().filter(|_| crate::oidc::Oidc::looks_like_jwt(token)) {
                    let who = oidc.identify(token).await.map_err(|e| unauthorized(&e.to_string()))?;
                    let mut scopes = DEFAULT_SCOPES.to_vec();
                    if who.admin {
                        scopes.push(steadfast_world::Scope::Admin);
                    }
                    return Ok(Caller {
                        owner: who.owner,
                        scopes,
                    });
                }
                if token.starts_with(TOKEN_PREFIX) || token.starts_with(LINK_PREFIX) {
                    // Looked up by its hash, which is all the store keeps.
                    let issued = world.token_by_hash(&presented.to_hex()).await?;
                    if let Some(issued) = issued.filter(|t| t.is_live(steadfast_world::now_ms())) {
                        return Ok(Caller {
                            owner: issued.owner,
                            scopes: issued.scopes,
                        });
                    }
                    return Err(unauthorized("unknown, expired or revoked token"));
                }
                Err(unauthorized("unknown token"))
            }
        }
    }
}
