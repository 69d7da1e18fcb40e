//! Identifiers and secrets. Secrets are 32 random bytes; only their SHA-256 is stored.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use rand::{distributions::Alphanumeric, Rng, RngCore};
use sha2::{Digest, Sha256};

/// `prefix_` + 24 random lowercase alphanumerics (~124 bits).
pub fn new_id(prefix: &str) -> String {
    let tail: String = rand::thread_rng()
        .sample_iter(&Alphanumeric)
        .take(24)
        .map(|c| (c as char).to_ascii_lowercase())
        .collect();
    format!("{prefix}_{tail}")
}

/// A credential's kind is told by its prefix.
pub const WORKSPACE_KEY_PREFIX: &str = "mango_wsk_";
pub const ENVIRONMENT_KEY_PREFIX: &str = "mango_envk_";
pub const SESSIONS_TOKEN_PREFIX: &str = "mango_st_";

pub fn new_secret(prefix: &str) -> String {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    format!("{prefix}{}", URL_SAFE_NO_PAD.encode(bytes))
}

pub fn sha256(secret: &str) -> Vec<u8> {
    Sha256::digest(secret.as_bytes()).to_vec()
}

/// The Work secret handed out by Poll: URL-safe base64, no padding, of `{"sessions_token": …}`.
pub fn encode_work_secret(sessions_token: &str) -> String {
    let payload = serde_json::to_vec(&mango_protocol::WorkSecret {
        sessions_token: sessions_token.to_string(),
    })
    .expect("a string map serializes");
    URL_SAFE_NO_PAD.encode(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_distinct_prefixed_and_hash_to_32_bytes() {
        let a = new_secret(SESSIONS_TOKEN_PREFIX);
        let b = new_secret(SESSIONS_TOKEN_PREFIX);
        assert_ne!(a, b);
        assert!(a.starts_with(SESSIONS_TOKEN_PREFIX));
        assert_eq!(a.len(), SESSIONS_TOKEN_PREFIX.len() + 43);
        assert_eq!(sha256(&a).len(), 32);
    }

    #[test]
    fn work_secret_decodes_like_the_sdk_does() {
        let secret = encode_work_secret("mango_st_abc");
        assert!(!secret.contains('='));
        let json = URL_SAFE_NO_PAD.decode(secret).unwrap();
        let payload: mango_protocol::WorkSecret = serde_json::from_slice(&json).unwrap();
        assert_eq!(payload.sessions_token, "mango_st_abc");
    }

    #[test]
    fn ids_carry_their_prefix() {
        let id = new_id("work");
        assert!(id.starts_with("work_") && id.len() == 29);
        assert!(id[5..]
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()));
    }
}
