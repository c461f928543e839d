//! Subscription signing secrets sealed at rest.
//!
//! Both backends store `secret` and `previous_secret` as text sealed with
//! ChaCha20-Poly1305 (RFC 8439) under the current key of a [`Keyring`]:
//!
//! ```text
//! enc:v1:<key id>:<base64(nonce ‖ ciphertext ‖ tag)>
//! ```
//!
//! - `key id`: 8 hex digits of SHA-256 over a fixed label and the key, so a
//!   row says which key sealed it (and rotation knows what is left to do)
//!   without saying anything about the key.
//! - the nonce: 12 random bytes per seal.
//! - associated data: the subscription's id, so a sealed secret copied into
//!   another subscription's row does not open there.
//!
//! [`Keyring::open`] accepts text sealed under any key of the ring, and —
//! for databases written before secrets were sealed — legacy plaintext (any
//! text not starting with `enc:`), which the next write of the row or
//! [`Store::reseal_secrets`](crate::Store::reseal_secrets) seals.
//!
//! Pure: no I/O but the random nonce. Where the key comes from
//! (`HOOKD_ENCRYPTION_KEY`, a key file) is the binary's business.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use hookd_domain::SubscriptionId;
use rand::RngCore;
use sha2::{Digest, Sha256};
use zeroize::Zeroize;

/// What every sealed value starts with; anything else is legacy plaintext.
pub const SEALED_PREFIX: &str = "enc:";
const VERSION: &str = "v1";
const KEY_LEN: usize = 32;
const NONCE_LEN: usize = 12;
/// Domain separation for key ids.
const KEY_ID_LABEL: &[u8] = b"hookd encryption key id v1\0";
/// Associated data: this label, then the subscription id's 16 bytes.
const AAD_LABEL: &[u8] = b"hookd subscription secret v1\0";

/// Why a key was refused. Never shows the key text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an encryption key must be the base64 encoding of exactly 32 bytes")]
pub struct InvalidKey;

/// Why a stored secret could not be opened. Never shows the stored text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// Starts with `enc:` but is not `enc:v1:<key id>:<base64>`.
    #[error("sealed secret is malformed")]
    Malformed,
    /// Sealed under a key that is not in the ring.
    #[error(
        "sealed with encryption key {0}, which is not in the keyring \
         (set it as HOOKD_ENCRYPTION_KEY or in HOOKD_ENCRYPTION_KEY_PREVIOUS)"
    )]
    UnknownKey(String),
    /// The key id matched but authentication failed: the text was altered,
    /// or moved from another subscription's row.
    #[error("sealed secret failed authentication under key {0} (altered, or not this row's)")]
    Unauthentic(String),
}

/// A 256-bit key. Its `Debug` shows only its id; its bytes are wiped on drop.
#[derive(Clone)]
pub struct EncryptionKey {
    bytes: [u8; KEY_LEN],
    id: String,
}

impl EncryptionKey {
    /// A new random key.
    pub fn generate() -> Self {
        let mut bytes = [0u8; KEY_LEN];
        rand::rng().fill_bytes(&mut bytes);
        Self::from_bytes(bytes)
    }

    /// A key from its base64 text (surrounding whitespace ignored), the form
    /// of `HOOKD_ENCRYPTION_KEY`, a key file and [`to_base64`](Self::to_base64).
    pub fn from_base64(text: &str) -> Result<Self, InvalidKey> {
        let mut decoded = B64.decode(text.trim()).map_err(|_| InvalidKey)?;
        let key = <[u8; KEY_LEN]>::try_from(decoded.as_slice()).map_err(|_| InvalidKey);
        decoded.zeroize();
        Ok(Self::from_bytes(key?))
    }

    /// A key from its 32 bytes.
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        let digest = Sha256::new()
            .chain_update(KEY_ID_LABEL)
            .chain_update(bytes)
            .finalize();
        Self {
            bytes,
            id: hex_prefix(&digest[..4]),
        }
    }

    /// The base64 text of the key. A secret: show it to no one but the
    /// operator who asked for it.
    pub fn to_base64(&self) -> String {
        B64.encode(self.bytes)
    }

    /// The key's id: 8 hex digits, safe to log.
    pub fn id(&self) -> &str {
        &self.id
    }

    fn cipher(&self) -> ChaCha20Poly1305 {
        ChaCha20Poly1305::new(&Key::from(self.bytes))
    }
}

impl Drop for EncryptionKey {
    fn drop(&mut self) {
        self.bytes.zeroize();
    }
}

impl PartialEq for EncryptionKey {
    fn eq(&self, other: &Self) -> bool {
        // Not secret-dependent timing worth guarding: ids are public and
        // keys are compared only when building a ring.
        self.bytes == other.bytes
    }
}

impl Eq for EncryptionKey {}

impl fmt::Debug for EncryptionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EncryptionKey({}, <redacted>)", self.id)
    }
}

fn hex_prefix(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The key that seals, and older keys that may still open.
///
/// Rotation: start every node with the new key as current and the old one
/// as previous (they read both, write the new), re-seal everything
/// ([`Store::reseal_secrets`](crate::Store::reseal_secrets), `hookd keys
/// rotate`), then drop the old key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keyring {
    current: EncryptionKey,
    previous: Vec<EncryptionKey>,
}

impl Keyring {
    /// A ring of one key.
    pub fn new(current: EncryptionKey) -> Self {
        Self {
            current,
            previous: Vec::new(),
        }
    }

    /// The same ring, also opening what `previous` sealed. Keys equal to the
    /// current one or already present are ignored.
    pub fn with_previous(mut self, previous: impl IntoIterator<Item = EncryptionKey>) -> Self {
        for key in previous {
            if key != self.current && !self.previous.contains(&key) {
                self.previous.push(key);
            }
        }
        self
    }

    /// A ring with a fresh random key that exists only in this value and its
    /// clones: for tests, and for stores whose data need not outlive them.
    pub fn ephemeral() -> Self {
        Self::new(EncryptionKey::generate())
    }

    /// The key that seals.
    pub fn current(&self) -> &EncryptionKey {
        &self.current
    }

    /// The keys that only open, in the order given.
    pub fn previous(&self) -> &[EncryptionKey] {
        &self.previous
    }

    /// `plaintext` sealed under the current key, bound to `sub_id`.
    pub fn seal(&self, sub_id: &SubscriptionId, plaintext: &str) -> String {
        let mut nonce = [0u8; NONCE_LEN];
        rand::rng().fill_bytes(&mut nonce);
        let aad = aad(sub_id);
        let sealed = self
            .current
            .cipher()
            .encrypt(
                &Nonce::from(nonce),
                Payload {
                    msg: plaintext.as_bytes(),
                    aad: &aad,
                },
            )
            .expect("ChaCha20-Poly1305 encrypts any message shorter than 256 GiB");
        let mut body = Vec::with_capacity(NONCE_LEN + sealed.len());
        body.extend_from_slice(&nonce);
        body.extend_from_slice(&sealed);
        format!(
            "{SEALED_PREFIX}{VERSION}:{}:{}",
            self.current.id,
            B64.encode(body)
        )
    }

    /// The plaintext of a stored value of `sub_id`'s row: sealed under any
    /// key of the ring, or legacy plaintext (returned as is).
    pub fn open(&self, sub_id: &SubscriptionId, stored: &str) -> Result<String, OpenError> {
        let Some(rest) = stored.strip_prefix(SEALED_PREFIX) else {
            return Ok(stored.to_owned());
        };
        let mut parts = rest.splitn(3, ':');
        let (Some(VERSION), Some(id), Some(body)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(OpenError::Malformed);
        };
        let key = std::iter::once(&self.current)
            .chain(&self.previous)
            .find(|k| k.id == id)
            .ok_or_else(|| OpenError::UnknownKey(id.to_owned()))?;
        let body = B64.decode(body).map_err(|_| OpenError::Malformed)?;
        if body.len() < NONCE_LEN {
            return Err(OpenError::Malformed);
        }
        let (nonce, sealed) = body.split_at(NONCE_LEN);
        let nonce = <[u8; NONCE_LEN]>::try_from(nonce).map_err(|_| OpenError::Malformed)?;
        let aad = aad(sub_id);
        let plain = key
            .cipher()
            .decrypt(
                &Nonce::from(nonce),
                Payload {
                    msg: sealed,
                    aad: &aad,
                },
            )
            .map_err(|_| OpenError::Unauthentic(id.to_owned()))?;
        String::from_utf8(plain).map_err(|e| {
            let mut bytes = e.into_bytes();
            bytes.zeroize();
            OpenError::Unauthentic(id.to_owned())
        })
    }

    /// Whether a stored value is sealed under the current key already;
    /// `false` for legacy plaintext and for older keys' seals.
    pub fn is_current(&self, stored: &str) -> bool {
        stored
            .strip_prefix(SEALED_PREFIX)
            .and_then(|rest| rest.strip_prefix(VERSION))
            .and_then(|rest| rest.strip_prefix(':'))
            .and_then(|rest| rest.strip_prefix(self.current.id.as_str()))
            .is_some_and(|rest| rest.starts_with(':'))
    }

    /// Opens a stored value and seals it again under the current key, if
    /// it is not sealed under the current key already (`None` then).
    pub fn reseal(
        &self,
        sub_id: &SubscriptionId,
        stored: &str,
    ) -> Result<Option<String>, OpenError> {
        if self.is_current(stored) {
            return Ok(None);
        }
        let mut plain = self.open(sub_id, stored)?;
        let sealed = self.seal(sub_id, &plain);
        plain.zeroize();
        Ok(Some(sealed))
    }
}

fn aad(sub_id: &SubscriptionId) -> Vec<u8> {
    let mut aad = Vec::with_capacity(AAD_LABEL.len() + 16);
    aad.extend_from_slice(AAD_LABEL);
    aad.extend_from_slice(sub_id.as_uuid().as_bytes());
    aad
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn sub() -> SubscriptionId {
        SubscriptionId::new()
    }

    #[test]
    fn sealing_round_trips_and_hides_the_plaintext() {
        let ring = Keyring::ephemeral();
        let id = sub();
        let sealed = ring.seal(&id, SECRET);
        assert!(
            sealed.starts_with(&format!("enc:v1:{}:", ring.current().id())),
            "{sealed}"
        );
        assert!(!sealed.contains(SECRET) && !sealed.contains(&SECRET[6..]));
        assert_eq!(ring.open(&id, &sealed).unwrap(), SECRET);
        // A fresh nonce every time.
        assert_ne!(ring.seal(&id, SECRET), sealed);
        assert!(ring.is_current(&sealed));
        assert_eq!(ring.reseal(&id, &sealed).unwrap(), None);
    }

    #[test]
    fn legacy_plaintext_opens_as_is_and_is_resealed() {
        let ring = Keyring::ephemeral();
        let id = sub();
        assert_eq!(ring.open(&id, SECRET).unwrap(), SECRET);
        assert!(!ring.is_current(SECRET));
        let sealed = ring.reseal(&id, SECRET).unwrap().unwrap();
        assert_eq!(ring.open(&id, &sealed).unwrap(), SECRET);
    }

    #[test]
    fn a_sealed_secret_does_not_open_in_another_row() {
        let ring = Keyring::ephemeral();
        let sealed = ring.seal(&sub(), SECRET);
        let err = ring.open(&sub(), &sealed).unwrap_err();
        assert!(matches!(err, OpenError::Unauthentic(_)), "{err}");
    }

    #[test]
    fn altered_text_is_refused() {
        let ring = Keyring::ephemeral();
        let id = sub();
        let sealed = ring.seal(&id, SECRET);
        let mut bytes = sealed.into_bytes();
        let last = bytes.len() - 3;
        bytes[last] = if bytes[last] == b'A' { b'B' } else { b'A' };
        let altered = String::from_utf8(bytes).unwrap();
        assert!(ring.open(&id, &altered).is_err());
        for bad in ["enc:", "enc:v1:", "enc:v2:abcd:AAAA", "enc:v1:x:!!"] {
            assert!(ring.open(&id, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn rotation_opens_old_seals_and_reseals_under_the_new_key() {
        let a = EncryptionKey::generate();
        let b = EncryptionKey::generate();
        let id = sub();
        let under_a = Keyring::new(a.clone()).seal(&id, SECRET);

        let only_b = Keyring::new(b.clone());
        assert_eq!(
            only_b.open(&id, &under_a).unwrap_err(),
            OpenError::UnknownKey(a.id().to_owned())
        );

        let rotating = Keyring::new(b.clone()).with_previous([a.clone(), b.clone()]);
        assert_eq!(
            rotating.previous().len(),
            1,
            "the current key is not also previous"
        );
        assert_eq!(rotating.open(&id, &under_a).unwrap(), SECRET);
        let under_b = rotating.reseal(&id, &under_a).unwrap().unwrap();
        assert!(under_b.starts_with(&format!("enc:v1:{}:", b.id())));
        assert_eq!(only_b.open(&id, &under_b).unwrap(), SECRET);
    }

    #[test]
    fn keys_parse_from_base64_of_32_bytes_only() {
        let key = EncryptionKey::generate();
        let again = EncryptionKey::from_base64(&format!(" {}\n", key.to_base64())).unwrap();
        assert_eq!(again, key);
        assert_eq!(again.id(), key.id());
        assert_eq!(key.id().len(), 8);
        for bad in [
            "",
            "not base64!",
            "AAAA",
            &B64.encode([0u8; 31]),
            &B64.encode([0u8; 33]),
        ] {
            assert_eq!(EncryptionKey::from_base64(bad), Err(InvalidKey), "{bad}");
        }
    }

    #[test]
    fn debug_never_shows_a_key() {
        let key = EncryptionKey::generate();
        let ring = Keyring::new(key.clone()).with_previous([EncryptionKey::generate()]);
        let shown = format!("{key:?} {ring:?} {ring:#?}");
        assert!(shown.contains(key.id()));
        assert!(!shown.contains(&key.to_base64()), "{shown}");
        for k in ring.previous() {
            assert!(!shown.contains(&k.to_base64()), "{shown}");
        }
        assert!(!shown.contains(&format!("{:?}", key.bytes)), "{shown}");
    }
}
