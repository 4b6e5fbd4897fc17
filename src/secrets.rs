//! Secrets at rest: the key that seals stored secrets (MCP servers' stdio `env`
//! and http `headers`) and the sealing itself.
//!
//! Sealing is XChaCha20-Poly1305 from RustCrypto's `chacha20poly1305` crate with
//! a fresh random 24-byte nonce per value, stored as nonce ‖ ciphertext ‖ tag.
//! The caller names what the value belongs to (a server id) as associated data,
//! so a sealed value copied onto another row does not open there.
//!
//! The key is 32 bytes written as 64 hexadecimal digits: `TOOLGATE_SECRETS_KEY`
//! when set, else `<data-dir>/secrets-key`, generated at first start (mode
//! 0600, written only once the database has accepted the start) and reused
//! afterwards. A malformed key refuses to start, and so does one that does not
//! open the database's key check (`store/secrets_key_check.rs`). Neither the
//! key nor any value is ever logged or shown by `Debug`.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use chacha20poly1305::aead::{Aead, Generate, Key, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};

/// The environment variable that supplies the key.
pub const KEY_ENV: &str = "TOOLGATE_SECRETS_KEY";
/// The file of the data directory that holds a generated key.
pub const KEY_FILE: &str = "secrets-key";

const KEY_BYTES: usize = 32;
const NONCE_BYTES: usize = 24;

/// Where the key in use came from (logged at start, without the key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// `TOOLGATE_SECRETS_KEY` (or its flag / config-file key).
    Configured,
    /// The data directory's key file, generated now or at an earlier start.
    File { path: PathBuf, generated: bool },
}

/// A sealed value that the key cannot open: another key sealed it, or it was
/// changed on disk. Carries no detail on purpose (AEAD failures have none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the value cannot be decrypted with the current secrets key")]
pub struct Unreadable;

/// The key that seals and opens stored secrets; cheap to clone.
#[derive(Clone)]
pub struct SecretsKey {
    cipher: Arc<XChaCha20Poly1305>,
    /// What the key's instances call themselves to their own MCP endpoint.
    deployment_mark: Arc<str>,
}

/// What [`SecretsKey::deployment_mark`] is derived for (HMAC's message).
const DEPLOYMENT_MARK_LABEL: &[u8] = b"toolgate deployment mark 1";

impl fmt::Debug for SecretsKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretsKey(<redacted>)")
    }
}

impl SecretsKey {
    /// A key from its 64 hexadecimal digits (surrounding whitespace ignored).
    /// The error never repeats the text.
    pub fn from_hex(text: &str) -> anyhow::Result<Self> {
        let text = text.trim();
        let bytes = hex::decode(text)
            .ok()
            .filter(|bytes| bytes.len() == KEY_BYTES);
        let Some(bytes) = bytes else {
            anyhow::bail!(
                "a secrets key must be {KEY_BYTES} bytes written as {} hexadecimal digits (got {} characters); generate one with `openssl rand -hex 32`",
                KEY_BYTES * 2,
                text.chars().count()
            );
        };
        let cipher = XChaCha20Poly1305::new_from_slice(&bytes)
            .map_err(|_| anyhow::anyhow!("the secrets key has the wrong length"))?;
        Ok(Self {
            cipher: Arc::new(cipher),
            deployment_mark: deployment_mark(&bytes).into(),
        })
    }

    /// A mark every instance with this key shares, and nothing else: the
    /// instances of one database (whose key check makes them share the key)
    /// send it with their MCP client's requests, and their MCP endpoint
    /// refuses a request that carries it (an MCP server configured with the
    /// deployment's own endpoint would make a catalog that feeds itself). It
    /// tells nothing of the key.
    pub fn deployment_mark(&self) -> &str {
        &self.deployment_mark
    }

    /// A fresh random key, and its hexadecimal text.
    pub fn generate() -> anyhow::Result<(Self, String)> {
        let key = Key::<XChaCha20Poly1305>::try_generate()
            .map_err(|err| anyhow::anyhow!("the system random generator failed: {err}"))?;
        let text = hex::encode(key.as_slice());
        Ok((Self::from_hex(&text)?, text))
    }

    /// The key of a server: `configured` (from `TOOLGATE_SECRETS_KEY`) when
    /// given, else the data directory's key file. Without a file, a new key is
    /// generated but not yet written: [`LoadedKey::save`] writes it once the
    /// database has accepted the start, so a refused start leaves none behind.
    pub fn load(configured: Option<&str>, data_dir: &Path) -> anyhow::Result<LoadedKey> {
        if let Some((key, source)) = Self::find(configured, data_dir)? {
            return Ok(LoadedKey {
                key,
                source,
                unsaved: None,
                wrote_file: false,
            });
        }
        let (key, text) = Self::generate()?;
        Ok(LoadedKey {
            key,
            source: KeySource::File {
                path: data_dir.join(KEY_FILE),
                generated: true,
            },
            unsaved: Some(text),
            wrote_file: false,
        })
    }

    /// The key a start would use without generating one: `configured` when
    /// given, else the data directory's key file; None when there is neither.
    pub fn find(
        configured: Option<&str>,
        data_dir: &Path,
    ) -> anyhow::Result<Option<(Self, KeySource)>> {
        if let Some(text) = configured {
            let key = Self::from_hex(text).with_context(|| {
                format!(
                    "the configured secrets key ({KEY_ENV}, --secrets-key or secrets_key) is malformed"
                )
            })?;
            return Ok(Some((key, KeySource::Configured)));
        }
        let path = data_dir.join(KEY_FILE);
        Ok(read_key_file(&path)?.map(|key| {
            let source = KeySource::File {
                path,
                generated: false,
            };
            (key, source)
        }))
    }

    /// Seals `plaintext` as belonging to `owner`: nonce ‖ ciphertext ‖ tag.
    pub fn seal(&self, owner: &str, plaintext: &[u8]) -> anyhow::Result<Vec<u8>> {
        let nonce = XNonce::try_generate()
            .map_err(|err| anyhow::anyhow!("the system random generator failed: {err}"))?;
        let payload = Payload {
            msg: plaintext,
            aad: owner.as_bytes(),
        };
        let ciphertext = self
            .cipher
            .encrypt(&nonce, payload)
            .map_err(|_| anyhow::anyhow!("sealing a secret failed"))?;
        let mut sealed = Vec::with_capacity(NONCE_BYTES + ciphertext.len());
        sealed.extend_from_slice(nonce.as_slice());
        sealed.extend_from_slice(&ciphertext);
        Ok(sealed)
    }

    /// Opens what [`seal`](Self::seal) made for the same `owner`.
    pub fn open(&self, owner: &str, sealed: &[u8]) -> Result<Vec<u8>, Unreadable> {
        if sealed.len() < NONCE_BYTES {
            return Err(Unreadable);
        }
        let (nonce, ciphertext) = sealed.split_at(NONCE_BYTES);
        let nonce = XNonce::try_from(nonce).map_err(|_| Unreadable)?;
        let payload = Payload {
            msg: ciphertext,
            aad: owner.as_bytes(),
        };
        self.cipher.decrypt(&nonce, payload).map_err(|_| Unreadable)
    }
}

/// HMAC-SHA256 of a fixed label under the key, its first 16 bytes in hex.
fn deployment_mark(key: &[u8]) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(key).expect("any key length");
    mac.update(DEPLOYMENT_MARK_LABEL);
    hex::encode(&mac.finalize().into_bytes()[..16])
}

/// The key in `path`, or None when there is no such file.
fn read_key_file(path: &Path) -> anyhow::Result<Option<SecretsKey>> {
    match std::fs::read_to_string(path) {
        Ok(text) => SecretsKey::from_hex(&text)
            .with_context(|| {
                format!(
                    "the secrets key file {} is malformed; restore it or set {KEY_ENV}",
                    path.display()
                )
            })
            .map(Some),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(anyhow::Error::new(err).context(format!("reading {}", path.display()))),
    }
}

/// A key as a start found or generated it.
pub struct LoadedKey {
    pub key: SecretsKey,
    pub source: KeySource,
    /// The text of a generated key its file does not hold yet.
    unsaved: Option<String>,
    /// Whether [`save`](Self::save) created the key file.
    wrote_file: bool,
}

impl LoadedKey {
    /// Writes a generated key into its file, readable by the owner only; does
    /// nothing for a configured key or one read from its file. The caller
    /// holds the data directory, so a file found there now was put there by
    /// hand: it is kept, and the start refused unless it holds this key.
    pub fn save(&mut self) -> anyhow::Result<()> {
        let (Some(text), KeySource::File { path, .. }) = (&self.unsaved, &self.source) else {
            return Ok(());
        };
        self.wrote_file = write_key_file(path, text)?;
        self.unsaved = None;
        Ok(())
    }

    /// Removes the key file this start generated, so that a start refused
    /// after [`save`](Self::save) leaves no key behind that would be taken
    /// for the database's at the next start.
    pub fn discard_generated(&self) {
        if let (KeySource::File { path, .. }, true) = (&self.source, self.wrote_file)
            && let Err(err) = std::fs::remove_file(path)
            && err.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %path.display(), %err, "could not remove the secrets key generated by this refused start");
        }
    }
}

/// Creates the key file; false when it already held this key.
fn write_key_file(path: &Path, text: &str) -> anyhow::Result<bool> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating data directory {}", dir.display()))?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = match options.open(path) {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {
            let found = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            anyhow::ensure!(
                found.trim() == text,
                "{} appeared while toolgate was starting and holds another key; start again to use it",
                path.display()
            );
            return Ok(false);
        }
        Err(err) => {
            return Err(anyhow::Error::new(err).context(format!("writing {}", path.display())));
        }
    };
    writeln!(file, "{text}").with_context(|| format!("writing {}", path.display()))?;
    file.sync_all()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    #[test]
    fn the_deployment_mark_is_the_keys_alone_and_tells_nothing_of_it() {
        let key = SecretsKey::from_hex(HEX).unwrap();
        let again = SecretsKey::from_hex(&format!(" {HEX}\n")).unwrap();
        let (other, _) = SecretsKey::generate().unwrap();
        assert_eq!(key.deployment_mark(), again.deployment_mark());
        assert_ne!(key.deployment_mark(), other.deployment_mark());
        assert_eq!(key.deployment_mark().len(), 32);
        assert!(!HEX.contains(key.deployment_mark()));
        assert!(!key.deployment_mark().contains(&HEX[..8]));
    }

    #[test]
    fn seals_with_a_fresh_nonce_and_opens_for_the_same_owner_only() {
        let key = SecretsKey::from_hex(HEX).unwrap();
        let one = key.seal("mcp_a", b"hunter2").unwrap();
        let two = key.seal("mcp_a", b"hunter2").unwrap();
        assert_ne!(one, two, "a nonce was reused");
        assert_eq!(one.len(), NONCE_BYTES + 7 + 16);
        assert_eq!(key.open("mcp_a", &one).unwrap(), b"hunter2");
        assert_eq!(key.open("mcp_b", &one), Err(Unreadable));
        let mut tampered = one.clone();
        *tampered.last_mut().unwrap() ^= 1;
        assert_eq!(key.open("mcp_a", &tampered), Err(Unreadable));
        assert_eq!(key.open("mcp_a", &one[..10]), Err(Unreadable));
        let (other, _) = SecretsKey::generate().unwrap();
        assert_eq!(other.open("mcp_a", &one), Err(Unreadable));
    }

    #[test]
    fn malformed_keys_are_refused_without_being_repeated() {
        for bad in [
            "",
            "abc",
            &HEX[..62],
            &format!("{HEX}00"),
            &HEX.replace('0', "g"),
        ] {
            let err = SecretsKey::from_hex(bad).unwrap_err().to_string();
            assert!(err.contains("64 hexadecimal digits"), "{err}");
            assert!(bad.len() < 8 || !err.contains(bad), "{err}");
        }
        assert!(SecretsKey::from_hex(&format!(" {} \n", HEX.to_uppercase())).is_ok());
        assert_eq!(
            format!("{:?}", SecretsKey::from_hex(HEX).unwrap()),
            "SecretsKey(<redacted>)"
        );
    }

    #[test]
    fn the_key_file_is_written_when_saved_then_reused() {
        let dir = tempfile::tempdir().unwrap();
        let mut first = SecretsKey::load(None, dir.path()).unwrap();
        assert!(matches!(
            first.source,
            KeySource::File {
                generated: true,
                ..
            }
        ));
        assert!(
            !dir.path().join(KEY_FILE).exists(),
            "a generated key was written before the start was accepted"
        );
        first.save().unwrap();
        first.save().unwrap();
        let sealed = first.key.seal("x", b"v").unwrap();
        let again = SecretsKey::load(None, dir.path()).unwrap();
        assert!(matches!(
            again.source,
            KeySource::File {
                generated: false,
                ..
            }
        ));
        assert_eq!(again.key.open("x", &sealed).unwrap(), b"v");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join(KEY_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let configured = SecretsKey::load(Some(HEX), dir.path()).unwrap();
        assert_eq!(configured.source, KeySource::Configured);
        assert_eq!(configured.key.open("x", &sealed), Err(Unreadable));
        std::fs::write(dir.path().join(KEY_FILE), "not a key").unwrap();
        let err = format!("{:#}", SecretsKey::load(None, dir.path()).err().unwrap());
        assert!(err.contains("malformed"), "{err}");
        let err = format!(
            "{:#}",
            SecretsKey::load(Some("zz"), dir.path()).err().unwrap()
        );
        assert!(err.contains(KEY_ENV), "{err}");
    }

    #[test]
    fn a_key_file_put_there_while_starting_is_kept_and_refused_if_it_differs() {
        let dir = tempfile::tempdir().unwrap();
        let mut generated = SecretsKey::load(None, dir.path()).unwrap();
        std::fs::write(dir.path().join(KEY_FILE), format!("{HEX}\n")).unwrap();
        let err = format!("{:#}", generated.save().unwrap_err());
        assert!(err.contains("appeared"), "{err}");
        assert_eq!(
            std::fs::read_to_string(dir.path().join(KEY_FILE)).unwrap(),
            format!("{HEX}\n")
        );
        generated.discard_generated();
        assert!(
            dir.path().join(KEY_FILE).exists(),
            "a key this start did not write was removed"
        );
        std::fs::remove_file(dir.path().join(KEY_FILE)).unwrap();
        let mut refused = SecretsKey::load(None, dir.path()).unwrap();
        refused.save().unwrap();
        refused.discard_generated();
        assert!(!dir.path().join(KEY_FILE).exists());
    }
}
