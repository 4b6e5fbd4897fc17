//! CSRF tokens of the console's forms: `<expiry>.<nonce>.<mac>`, an HMAC-SHA256
//! under a key drawn at start, bound to what the form belongs to (the sign-in
//! page, or one console session). A token stays valid for repeated posts until
//! it expires, so a mistyped key can be tried again with the same page.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;

/// How long a form's token is accepted.
pub const TOKEN_TTL: Duration = Duration::from_secs(2 * 60 * 60);

/// The binding of the sign-in form's tokens (there is no session yet).
pub const LOGIN_BINDING: &str = "login";

/// Why a token was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CsrfRefusal {
    Malformed,
    Expired,
    BadSignature,
}

/// The process's signing key.
pub struct CsrfKey {
    key: [u8; 32],
}

impl std::fmt::Debug for CsrfKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CsrfKey(<redacted>)")
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Default for CsrfKey {
    fn default() -> Self {
        let mut key = [0u8; 32];
        rand::rng().fill_bytes(&mut key);
        Self { key }
    }
}

impl CsrfKey {
    fn mac(&self, binding: &str, expires: u64, nonce: &str) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("any key length");
        mac.update(binding.as_bytes());
        mac.update(b"\n");
        mac.update(expires.to_string().as_bytes());
        mac.update(b"\n");
        mac.update(nonce.as_bytes());
        mac
    }

    /// A fresh token for a form bound to `binding`.
    pub fn issue(&self, binding: &str) -> String {
        let expires = now_secs() + TOKEN_TTL.as_secs();
        let mut nonce = [0u8; 16];
        rand::rng().fill_bytes(&mut nonce);
        let nonce = hex::encode(nonce);
        let mac = hex::encode(self.mac(binding, expires, &nonce).finalize().into_bytes());
        format!("{expires}.{nonce}.{mac}")
    }

    /// Whether `token` was issued for `binding` and has not expired.
    pub fn verify(&self, binding: &str, token: &str) -> Result<(), CsrfRefusal> {
        self.verify_at(binding, token, now_secs())
    }

    fn verify_at(&self, binding: &str, token: &str, now: u64) -> Result<(), CsrfRefusal> {
        let mut parts = token.splitn(3, '.');
        let (Some(expires), Some(nonce), Some(mac)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(CsrfRefusal::Malformed);
        };
        let expires: u64 = expires.parse().map_err(|_| CsrfRefusal::Malformed)?;
        let mac = hex::decode(mac).map_err(|_| CsrfRefusal::Malformed)?;
        // Checked before the expiry, so a forged token learns nothing from timing.
        self.mac(binding, expires, nonce)
            .verify_slice(&mac)
            .map_err(|_| CsrfRefusal::BadSignature)?;
        if expires <= now {
            return Err(CsrfRefusal::Expired);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_verify_for_their_binding_until_they_expire() {
        let key = CsrfKey::default();
        let token = key.issue("session:a");
        assert_eq!(key.verify("session:a", &token), Ok(()));
        assert_eq!(key.verify("session:a", &token), Ok(()), "reusable");
        assert_eq!(
            key.verify("session:b", &token),
            Err(CsrfRefusal::BadSignature)
        );
        assert_eq!(
            CsrfKey::default().verify("session:a", &token),
            Err(CsrfRefusal::BadSignature)
        );
        let later = now_secs() + TOKEN_TTL.as_secs() + 1;
        assert_eq!(
            key.verify_at("session:a", &token, later),
            Err(CsrfRefusal::Expired)
        );
        assert_eq!(key.verify("x", "nonsense"), Err(CsrfRefusal::Malformed));
    }
}
