//! Who may call the API, and what they did: service tokens an operator issues through
//! the API (stored as BLAKE3 hashes only, with scopes, revocable), and the audit log of
//! who created, changed or revoked tokens, vault entries, ceilings and sessions.

use serde::{Deserialize, Serialize};

/// What a token allows.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Reading one's own sessions (`GET`).
    Read,
    /// Creating, messaging, signalling, stopping and deleting one's own sessions, and
    /// one's vault.
    Run,
    /// Issuing and revoking tokens and reading the audit log.
    Admin,
}

impl Scope {
    /// Every scope, in order.
    pub const ALL: [Scope; 3] = [Scope::Read, Scope::Run, Scope::Admin];

    /// Its name on the wire and in configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Run => "run",
            Scope::Admin => "admin",
        }
    }

    /// A scope by name.
    pub fn parse(name: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

/// Scopes written as the store keeps them: names, comma-separated.
pub fn scopes_text(scopes: &[Scope]) -> String {
    scopes
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

/// Scopes read back from [`scopes_text`] (unknown names dropped).
pub fn scopes_of(text: &str) -> Vec<Scope> {
    text.split(',').filter_map(Scope::parse).collect()
}

/// A token issued through the API, as stored: never the token itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceToken {
    /// Its id (`tok_...`), which listings show and revocation names.
    pub id: String,
    /// What it is for, as its issuer named it.
    pub name: String,
    /// Who it acts as.
    pub owner: String,
    /// What it allows.
    pub scopes: Vec<Scope>,
    /// The BLAKE3 hash of the token, hex.
    pub hash: String,
    /// Issued, ms since the Unix epoch.
    pub created_at_ms: u64,
    /// Who issued it.
    pub created_by: String,
    /// When it stops working, if it does.
    pub expires_at_ms: Option<u64>,
    /// When it was revoked, if it was.
    pub revoked_at_ms: Option<u64>,
}

impl ServiceToken {
    /// Whether it authenticates at `now_ms`.
    pub fn is_live(&self, now_ms: u64) -> bool {
        self.revoked_at_ms.is_none() && self.expires_at_ms.is_none_or(|t| now_ms < t)
    }
}

/// One entry of the audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditEntry {
    /// Increasing; the cursor of the next page.
    pub id: u64,
    /// When, ms since the Unix epoch.
    pub at_ms: u64,
    /// Who (an owner, `operator` for the configuration).
    pub actor: String,
    /// What: `token.issued`, `token.revoked`, `vault.put`, `vault.deleted`,
    /// `ceilings.set`, `session.created`, `session.changed`, `session.closed`,
    /// `session.deleted`.
    pub action: String,
    /// On what: a token id, a credential's name, a session id.
    pub target: String,
    /// Details (a token's owner and scopes, a session's labels, ceilings' values).
    pub detail: serde_json::Value,
}
