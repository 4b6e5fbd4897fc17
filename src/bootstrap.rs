//! First start: the default account and the default character.

use std::io::Write;
use std::path::Path;

use anyhow::Context;

use crate::config::Settings;
use crate::domain::CharacterName;

use crate::store::Store;

/// What first start created; `generated_key` is set only when the key was not
/// configured and must be shown to the operator once.
#[derive(Debug, Default)]
pub struct Bootstrap {
    pub created: bool,
    pub generated_key: Option<String>,
}

/// Creates the admin account and the default character on an empty database.
/// On a database that already has accounts this does nothing.
pub async fn ensure_defaults(store: &Store, settings: &Settings) -> anyhow::Result<Bootstrap> {
    if store.count_accounts().await? > 0 {
        return Ok(Bootstrap::default());
    }
    let configured = settings.admin_token.as_ref().map(|t| t.expose().to_owned());
    let created = store
        .create_account("default", true, configured.clone())
        .await
        .context("creating the default account")?;
    let generated_key = if configured.is_none() {
        write_token_file(&settings.data_dir, &created.api_key)?;
        Some(created.api_key.clone())
    } else {
        None
    };
    let name = CharacterName::parse(&settings.default_character)
        .map_err(|err| anyhow::anyhow!("default character name: {err}"))?;
    match store
        .create_character(&created.account.id, &name, "The default character.", "")
        .await
    {
        Ok(_) => {}
        Err(err) if err.code() == crate::error::ErrorCode::CharacterConflict => {}
        Err(err) => return Err(anyhow::Error::new(err).context("creating the default character")),
    }
    Ok(Bootstrap {
        created: true,
        generated_key,
    })
}

/// Saves the generated key readable by the owner only.
fn write_token_file(data_dir: &Path, key: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(data_dir)?;
    let path = data_dir.join("admin-token");
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options
        .open(&path)
        .with_context(|| format!("writing {}", path.display()))?;
    writeln!(file, "{key}")?;
    file.sync_all()?;
    Ok(())
}
