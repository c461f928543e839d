//! Standard Webhooks signatures (<https://www.standardwebhooks.com/>), the
//! convention Svix and others use, so any Standard Webhooks library verifies
//! what hookd sends.
//!
//! `webhook-signature` = `v1,` + base64(HMAC-SHA256(secret, "{id}.{timestamp}.{body}")),
//! one per active secret, separated by spaces. Secrets are written
//! `whsec_` + base64 of the key bytes.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::{EventId, SubscriptionId};

type HmacSha256 = Hmac<Sha256>;

const SECRET_PREFIX: &str = "whsec_";
/// Key length hookd generates (the Standard Webhooks range is 24 to 64 bytes).
const GENERATED_KEY_LEN: usize = 32;
const MIN_KEY_LEN: usize = 16;
const MAX_KEY_LEN: usize = 64;

/// Why a secret was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("secret must be `whsec_` followed by base64 of 16 to 64 random bytes")]
pub struct InvalidSecret;

/// A subscription's signing key. Its `Debug` never shows the key.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningSecret(Vec<u8>);

impl SigningSecret {
    /// A new random secret.
    pub fn generate() -> Self {
        let mut key = vec![0u8; GENERATED_KEY_LEN];
        rand::rng().fill_bytes(&mut key);
        Self(key)
    }

    /// Parses `whsec_<base64>`.
    pub fn parse(s: &str) -> Result<Self, InvalidSecret> {
        let b64 = s.strip_prefix(SECRET_PREFIX).ok_or(InvalidSecret)?;
        let key = B64.decode(b64).map_err(|_| InvalidSecret)?;
        if (MIN_KEY_LEN..=MAX_KEY_LEN).contains(&key.len()) {
            Ok(Self(key))
        } else {
            Err(InvalidSecret)
        }
    }

    /// The text form, `whsec_<base64>`. Only for showing the secret to its
    /// owner once, and for storing it.
    pub fn expose(&self) -> String {
        format!("{SECRET_PREFIX}{}", B64.encode(&self.0))
    }

    /// The key bytes.
    pub fn key(&self) -> &[u8] {
        &self.0
    }

    /// `v1,<base64 signature>` of one message.
    pub fn sign(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> String {
        let mut mac = HmacSha256::new_from_slice(&self.0).expect("HMAC takes keys of any size");
        mac.update(msg_id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", B64.encode(mac.finalize().into_bytes()))
    }

    /// Whether `header` (a `webhook-signature` value, possibly several
    /// space-separated signatures) holds a valid `v1` signature of the message
    /// under this secret. Compares in constant time.
    pub fn verify(&self, msg_id: &str, timestamp: i64, body: &[u8], header: &str) -> bool {
        use subtle::ConstantTimeEq;
        let expected = self.sign(msg_id, timestamp, body);
        header
            .split_whitespace()
            .filter(|sig| sig.starts_with("v1,"))
            .any(|sig| bool::from(sig.as_bytes().ct_eq(expected.as_bytes())))
    }
}

impl fmt::Debug for SigningSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SigningSecret(<redacted>)")
    }
}

/// The `webhook-signature` header value for a message under every active
/// secret (current first), space-separated.
pub fn signature_header<'a>(
    secrets: impl IntoIterator<Item = &'a SigningSecret>,
    msg_id: &str,
    timestamp: i64,
    body: &[u8],
) -> String {
    let mut out = String::new();
    for secret in secrets {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(&secret.sign(msg_id, timestamp, body));
    }
    out
}

/// The delivery's stable idempotency key: hex sha256 of `"{event_id}|{sub_id}"`.
/// It is the same on every attempt and every replay of that delivery, and is
/// sent as `webhook-id`, `Idempotency-Key`, and the body's `id`.
pub fn idempotency_key(event_id: &EventId, sub_id: &SubscriptionId) -> String {
    let mut h = Sha256::new();
    h.update(event_id.to_string().as_bytes());
    h.update(b"|");
    h.update(sub_id.to_string().as_bytes());
    hex::encode(h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test vector published with the Standard Webhooks specification.
    #[test]
    fn signs_the_published_test_vector() {
        let secret = SigningSecret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let sig = secret.sign(
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn verify_accepts_any_listed_signature_and_rejects_tampering() {
        let old = SigningSecret::generate();
        let new = SigningSecret::generate();
        let header = signature_header([&new, &old], "id1", 100, b"{}");
        assert!(new.verify("id1", 100, b"{}", &header));
        assert!(old.verify("id1", 100, b"{}", &header));
        assert!(!new.verify("id1", 101, b"{}", &header));
        assert!(!new.verify("id1", 100, b"{ }", &header));
        assert!(!SigningSecret::generate().verify("id1", 100, b"{}", &header));
    }

    #[test]
    fn secrets_parse_and_redact() {
        let s = SigningSecret::generate();
        assert_eq!(SigningSecret::parse(&s.expose()).unwrap(), s);
        assert!(!format!("{s:?}").contains(&s.expose()[6..]));
        for bad in ["", "whsec_", "whsec_!!!", "sk_abc", "whsec_YWJj"] {
            assert!(SigningSecret::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn idempotency_key_is_stable_and_distinct() {
        let e = EventId::new();
        let (a, b) = (SubscriptionId::new(), SubscriptionId::new());
        assert_eq!(idempotency_key(&e, &a), idempotency_key(&e, &a));
        assert_ne!(idempotency_key(&e, &a), idempotency_key(&e, &b));
        assert_eq!(idempotency_key(&e, &a).len(), 64);
    }

    proptest::proptest! {
        #[test]
        fn sign_then_verify_round_trips(id in "[a-z0-9_]{1,40}", ts in 0i64..4_000_000_000, body in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let s = SigningSecret::generate();
            let header = signature_header([&s], &id, ts, &body);
            proptest::prop_assert!(s.verify(&id, ts, &body, &header));
        }
    }
}
