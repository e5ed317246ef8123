//! Vaults: each owner's named credentials (a git host's token, an internal API's key),
//! which sessions refer to by name and the harness alone reads.
//!
//! A value is sealed before it reaches the store (ChaCha20-Poly1305 under a key the
//! operator supplies, never stored beside it, with a fresh nonce per value and the
//! owner and name bound in as associated data, so a sealed value moved to another
//! owner or name does not open). Values are write-only through the API: listed by name,
//! never returned, never logged, never in a session's log or a blob. Keys rotate
//! without touching sessions: the new key seals, the old ones still open, and
//! [`VaultKeys::is_current`] tells what a re-key must seal again.

use base64::Engine as _;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};

/// The environment variable holding the current key (32 bytes, base64).
pub const KEY_ENV: &str = "STEADFAST_VAULT_KEY";
/// The environment variable holding keys that still open older values (base64,
/// comma-separated), while a rotation is under way.
pub const OLD_KEYS_ENV: &str = "STEADFAST_VAULT_OLD_KEYS";

/// A sealed value, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    /// Which key sealed it (a fingerprint of the key, not the key).
    pub key_id: String,
    /// The nonce it was sealed with.
    pub nonce: Vec<u8>,
    /// The ciphertext and its tag.
    pub ciphertext: Vec<u8>,
}

/// One stored credential, as listed: never its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VaultEntry {
    /// Whose it is.
    pub owner: String,
    /// Its name.
    pub name: String,
    /// When it was last written, ms since the Unix epoch.
    pub updated_at_ms: u64,
    /// The value, sealed.
    pub sealed: Sealed,
}

/// What can go wrong opening or configuring a vault.
#[derive(Debug, thiserror::Error)]
pub enum VaultError {
    /// A key that is not 32 bytes of base64.
    #[error("{0}: a vault key is 32 bytes, base64-encoded (e.g. `openssl rand -base64 32`)")]
    BadKey(&'static str),
    /// No configured key sealed this value.
    #[error(
        "the key that sealed this credential ({0}) is not configured; add it to {OLD_KEYS_ENV}"
    )]
    UnknownKey(String),
    /// The value does not open: damaged, or moved to another owner or name.
    #[error("the credential does not open: it is damaged or not this owner's")]
    Damaged,
}

struct Key {
    id: String,
    key: LessSafeKey,
}

impl Key {
    fn new(bytes: &[u8], which: &'static str) -> Result<Self, VaultError> {
        let unbound =
            UnboundKey::new(&CHACHA20_POLY1305, bytes).map_err(|_| VaultError::BadKey(which))?;
        let id = blake3::hash(bytes).to_hex()[..16].to_string();
        Ok(Key {
            id,
            key: LessSafeKey::new(unbound),
        })
    }
}

/// The operator's keys: one that seals, and any older ones that still open.
pub struct VaultKeys {
    current: Key,
    old: Vec<Key>,
    random: SystemRandom,
}

impl std::fmt::Debug for VaultKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VaultKeys")
            .field("current", &self.current.id)
            .field("old", &self.old.iter().map(|k| &k.id).collect::<Vec<_>>())
            .finish()
    }
}

fn associated(owner: &str, name: &str) -> Vec<u8> {
    format!("steadfast vault\0{owner}\0{name}").into_bytes()
}

impl VaultKeys {
    /// Keys from raw bytes: `current` seals, `old` still open.
    pub fn new(current: &[u8], old: &[Vec<u8>]) -> Result<Self, VaultError> {
        Ok(VaultKeys {
            current: Key::new(current, KEY_ENV)?,
            old: old
                .iter()
                .map(|k| Key::new(k, OLD_KEYS_ENV))
                .collect::<Result<_, _>>()?,
            random: SystemRandom::new(),
        })
    }

    /// The keys the environment holds ([`KEY_ENV`], [`OLD_KEYS_ENV`]); `None` when no
    /// key is set (vaults are then unavailable).
    pub fn from_env() -> Result<Option<Self>, VaultError> {
        let decode = |text: &str, which| {
            base64::engine::general_purpose::STANDARD
                .decode(text.trim())
                .map_err(|_| VaultError::BadKey(which))
        };
        let Some(current) = std::env::var(KEY_ENV).ok().filter(|k| !k.trim().is_empty()) else {
            return Ok(None);
        };
        let current = decode(&current, KEY_ENV)?;
        let old = std::env::var(OLD_KEYS_ENV)
            .unwrap_or_default()
            .split(',')
            .filter(|k| !k.trim().is_empty())
            .map(|k| decode(k, OLD_KEYS_ENV))
            .collect::<Result<Vec<_>, _>>()?;
        Self::new(&current, &old).map(Some)
    }

    /// Seals `value` as owner `owner`'s credential `name`, under the current key.
    pub fn seal(&self, owner: &str, name: &str, value: &[u8]) -> Sealed {
        let mut nonce = [0u8; NONCE_LEN];
        self.random
            .fill(&mut nonce)
            .expect("the system's random source works");
        let mut ciphertext = value.to_vec();
        self.current
            .key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(associated(owner, name)),
                &mut ciphertext,
            )
            .expect("sealing a value of any length works");
        Sealed {
            key_id: self.current.id.clone(),
            nonce: nonce.to_vec(),
            ciphertext,
        }
    }

    /// Opens owner `owner`'s credential `name`.
    pub fn open(&self, owner: &str, name: &str, sealed: &Sealed) -> Result<Vec<u8>, VaultError> {
        let key = std::iter::once(&self.current)
            .chain(&self.old)
            .find(|k| k.id == sealed.key_id)
            .ok_or_else(|| VaultError::UnknownKey(sealed.key_id.clone()))?;
        let nonce =
            Nonce::try_assume_unique_for_key(&sealed.nonce).map_err(|_| VaultError::Damaged)?;
        let mut bytes = sealed.ciphertext.clone();
        let plain = key
            .key
            .open_in_place(nonce, Aad::from(associated(owner, name)), &mut bytes)
            .map_err(|_| VaultError::Damaged)?;
        Ok(plain.to_vec())
    }

    /// Whether `sealed` is sealed under the current key (a re-key skips it).
    pub fn is_current(&self, sealed: &Sealed) -> bool {
        sealed.key_id == self.current.id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_values_open_only_as_their_own_owner_and_name_and_keys_rotate() {
        let (one, two) = ([7u8; 32], [9u8; 32]);
        let keys = VaultKeys::new(&one, &[]).unwrap();
        let sealed = keys.seal("alice", "github", b"ghp_secret");
        assert!(!sealed
            .ciphertext
            .windows(b"ghp_secret".len())
            .any(|w| w == b"ghp_secret"));
        assert_eq!(
            keys.open("alice", "github", &sealed).unwrap(),
            b"ghp_secret"
        );
        assert!(matches!(
            keys.open("bob", "github", &sealed),
            Err(VaultError::Damaged)
        ));
        assert!(matches!(
            keys.open("alice", "gitlab", &sealed),
            Err(VaultError::Damaged)
        ));
        let mut flipped = sealed.clone();
        flipped.ciphertext[0] ^= 1;
        assert!(keys.open("alice", "github", &flipped).is_err());
        assert_ne!(
            keys.seal("alice", "github", b"ghp_secret"),
            sealed,
            "fresh nonces"
        );

        // Rotation: the new key seals, the old one still opens what it sealed.
        let rotated = VaultKeys::new(&two, &[one.to_vec()]).unwrap();
        assert_eq!(
            rotated.open("alice", "github", &sealed).unwrap(),
            b"ghp_secret"
        );
        assert!(!rotated.is_current(&sealed));
        let resealed = rotated.seal("alice", "github", b"ghp_secret");
        assert!(rotated.is_current(&resealed));
        let without_old = VaultKeys::new(&two, &[]).unwrap();
        assert!(matches!(
            without_old.open("alice", "github", &sealed),
            Err(VaultError::UnknownKey(_))
        ));
        assert!(
            VaultKeys::new(&[1u8; 16], &[]).is_err(),
            "short keys are refused"
        );
    }
}
