//! One toolgate process per data directory. The process holds an exclusive
//! lock on `<data dir>/instance.lock` while it runs and writes its instance id
//! there, so the next process on the directory knows, for certain and at once,
//! which instance was there before it: that instance is dead (the operating
//! system released its lock), so whatever it left running on a shared
//! database can be ended without waiting for its heartbeat to go stale.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::Mutex;

use anyhow::Context;

/// The held lock, and the instance that held it before.
#[derive(Debug)]
pub(super) struct InstanceFile {
    file: Mutex<Option<File>>,
    /// The previous process's instance id on this data directory, if any.
    pub(super) previous: Option<String>,
}

impl InstanceFile {
    /// Takes the data directory for `instance_id`; refuses when another
    /// process holds it.
    pub(super) fn claim(data_dir: &Path, instance_id: &str) -> anyhow::Result<Self> {
        std::fs::create_dir_all(data_dir)
            .with_context(|| format!("creating data directory {}", data_dir.display()))?;
        let path = data_dir.join("instance.lock");
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => anyhow::bail!(
                "another toolgate process is running on the data directory {} (it holds {}); give each instance its own data directory",
                data_dir.display(),
                path.display()
            ),
            Err(TryLockError::Error(err)) => {
                return Err(err).with_context(|| format!("locking {}", path.display()));
            }
        }
        let mut previous = String::new();
        file.read_to_string(&mut previous)
            .with_context(|| format!("reading {}", path.display()))?;
        let previous = Some(previous.trim().to_owned()).filter(|id| !id.is_empty());
        file.set_len(0)?;
        file.seek(SeekFrom::Start(0))?;
        file.write_all(instance_id.as_bytes())?;
        file.sync_all()?;
        Ok(Self {
            file: Mutex::new(Some(file)),
            previous,
        })
    }

    /// Lets the next process have the directory (at a clean stop; a crash
    /// releases it too).
    pub(super) fn release(&self) {
        let file = self.file.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(file) = file {
            let _ = file.unlock();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_process_is_refused_and_the_next_one_learns_the_previous_id() {
        let dir = tempfile::tempdir().unwrap();
        let first = InstanceFile::claim(dir.path(), "inst_1").unwrap();
        assert_eq!(first.previous, None);
        let refused = InstanceFile::claim(dir.path(), "inst_2").unwrap_err();
        assert!(
            refused.to_string().contains("another toolgate process"),
            "{refused}"
        );
        first.release();
        let second = InstanceFile::claim(dir.path(), "inst_3").unwrap();
        assert_eq!(second.previous.as_deref(), Some("inst_1"));
    }
}
