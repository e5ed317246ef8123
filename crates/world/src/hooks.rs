//! Inbound hooks: a URL per session and name that a third party (CI, GitHub, Slack, a
//! pager) posts to, reaching the session without holding its owner's token.
//!
//! The world keeps what the server needs to check a delivery — how it is checked, the
//! hash of a URL token or the sealed key of a signature — and the ids of deliveries
//! taken, so a replay is refused by every API host alike: taking a delivery is one
//! insert that only the first of two racing copies wins.

use serde::{Deserialize, Serialize};

use crate::Sealed;

/// How a delivery proves it comes from whoever was given the hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HookCheck {
    /// A secret token in the URL (`?token=`): for senders that cannot sign.
    Token,
    /// GitHub's `X-Hub-Signature-256: sha256=<hex>`, the delivery named by
    /// `X-GitHub-Delivery`.
    Github,
    /// Slack's `X-Slack-Signature: v0=<hex>` over `v0:<timestamp>:<body>`.
    Slack,
    /// Steadfast's own `Steadfast-Signature: t=<ms>,v1=<hex>` over `<t>.<body>`, as
    /// its outgoing webhooks sign.
    Hmac,
}

impl HookCheck {
    /// The name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            HookCheck::Token => "token",
            HookCheck::Github => "github",
            HookCheck::Slack => "slack",
            HookCheck::Hmac => "hmac",
        }
    }

    /// The check named `name`, if there is one.
    pub fn parse(name: &str) -> Option<Self> {
        [Self::Token, Self::Github, Self::Slack, Self::Hmac]
            .into_iter()
            .find(|c| c.as_str() == name)
    }
}

/// What a delivery does to its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HookThen {
    /// Answers the session's wait for the signal named as the hook.
    Signal,
    /// Starts a turn (or queues one) with the delivery as the message.
    Message,
}

impl HookThen {
    /// The name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            HookThen::Signal => "signal",
            HookThen::Message => "message",
        }
    }

    /// The action named `name`, if there is one.
    pub fn parse(name: &str) -> Option<Self> {
        [Self::Signal, Self::Message]
            .into_iter()
            .find(|c| c.as_str() == name)
    }
}

/// What proves a delivery: the hash of a URL token, or a signing key sealed by the
/// vault's keys (the store never sees either secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookSecret {
    /// BLAKE3 (hex) of the token a [`HookCheck::Token`] URL carries.
    TokenHash(String),
    /// The HMAC key of a signing check, sealed as the session's credential named
    /// [`Hook::sealed_name`].
    Sealed(Sealed),
}

/// One inbound hook of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hook {
    /// The session it reaches.
    pub session: String,
    /// Its name: the signal it delivers, the last segment of its URL.
    pub name: String,
    /// How a delivery is checked.
    pub check: HookCheck,
    /// What a delivery does.
    pub then: HookThen,
    /// What a delivery is checked against.
    pub secret: HookSecret,
    /// When it was made, ms since the Unix epoch.
    pub created_at_ms: u64,
    /// Who made it (the session's owner).
    pub created_by: String,
}

impl Hook {
    /// The name its signing key is sealed under, with the session as the owner, so a
    /// key sealed for one hook opens for no other.
    pub fn sealed_name(name: &str) -> String {
        format!("hook/{name}")
    }
}

/// A hook as a store keeps it: the columns both stores share.
pub(crate) struct StoredHook {
    pub session: String,
    pub name: String,
    pub check: String,
    pub then: String,
    pub token_hash: Option<String>,
    pub key_id: Option<String>,
    pub nonce: Option<Vec<u8>>,
    pub ciphertext: Option<Vec<u8>>,
    pub created_at_ms: i64,
    pub created_by: String,
}

impl StoredHook {
    /// The hook, or damage naming what the row lacks.
    pub(crate) fn into_hook(self) -> crate::Result<Hook> {
        let damage = |what: &str| {
            crate::Error::corrupt_store(format!(
                "hook {} of session {}: {what}",
                self.name, self.session
            ))
        };
        let check = HookCheck::parse(&self.check).ok_or_else(|| damage("unknown check"))?;
        let then = HookThen::parse(&self.then).ok_or_else(|| damage("unknown action"))?;
        let secret = match (self.token_hash, self.key_id, self.nonce, self.ciphertext) {
            (Some(hash), None, None, None) => HookSecret::TokenHash(hash),
            (None, Some(key_id), Some(nonce), Some(ciphertext)) => HookSecret::Sealed(Sealed {
                key_id,
                nonce,
                ciphertext,
            }),
            _ => return Err(damage("no secret, or two")),
        };
        Ok(Hook {
            session: self.session,
            name: self.name,
            check,
            then,
            secret,
            created_at_ms: self.created_at_ms.max(0) as u64,
            created_by: self.created_by,
        })
    }
}

/// The secret's columns: a token's hash, or a sealed key.
pub(crate) fn stored_secret(secret: &HookSecret) -> (Option<&str>, Option<&Sealed>) {
    match secret {
        HookSecret::TokenHash(hash) => (Some(hash), None),
        HookSecret::Sealed(sealed) => (None, Some(sealed)),
    }
}
