//! `--instance-file`: how a restarted container's process learns which
//! instance ran there before it, and that it has exited.
//!
//! A worker id alone cannot tell a container's previous run from a live
//! process given the same id, so an instance of this id whose heartbeat is
//! fresh keeps its jobs until its heartbeat is stale ([`super::maintain`]).
//! The file, private to one container and kept across its restarts (a
//! Pod's own `emptyDir`), names the instance that last started there. Each
//! process holds a lock on `<file>.lock` while it runs; the kernel releases
//! it when the process ends, however it ends. A process that takes the
//! lock therefore knows that the instance the file names has exited, and
//! returns its jobs at once. A live process still holding the lock (two
//! processes given one file by hand) is found out, and both keep the
//! shared-id rule.

use std::ffi::OsString;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use workerpool_queue::keys::Instance;

/// Longer content than this is no instance name (a worker id is a pod
/// name, at most 253 characters, and the nonce 8): the file is ignored.
const MAX_LEN: usize = 1024;

/// The instance file, with its lock held for as long as this value lives
/// (the worker keeps it for the life of the process).
#[derive(Debug)]
pub(super) struct InstanceFile {
    path: PathBuf,
    /// The open lock file: dropping it (or the process ending) releases
    /// the lock.
    _lock: File,
}

/// The instance file claimed at start, and what it said.
#[derive(Debug)]
pub(super) struct Claimed {
    pub file: InstanceFile,
    /// The instance of this worker id that last started in this container;
    /// it has exited, since its lock was free.
    pub predecessor: Option<String>,
}

/// `path` with `suffix` appended to its file name.
fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut name = OsString::from(path.as_os_str());
    name.push(suffix);
    PathBuf::from(name)
}

impl InstanceFile {
    /// Takes the lock of the file at `path` and reads the instance it
    /// names. `None`, with a warning, when the lock is held by a live
    /// process or cannot be taken: the worker then runs as without the
    /// file. A file that is missing names no one; one that does not name
    /// an instance of `worker_id` is ignored with a warning (it is input
    /// from outside the process, and it must never hand this process the
    /// jobs of another worker).
    pub(super) fn claim(path: &Path, worker_id: &str) -> Option<Claimed> {
        let lock_path = beside(path, ".lock");
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path);
        let lock = match lock {
            Ok(file) => file,
            Err(e) => {
                tracing::warn!(file = %lock_path.display(), error = %e,
                    "--instance-file: cannot open its lock file; a restart of this worker will wait for its \
                     previous run's heartbeat to go stale");
                return None;
            }
        };
        match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                tracing::warn!(file = %path.display(),
                    "--instance-file: another live process holds this file; each worker process needs one of \
                     its own. Running without it: an earlier process's jobs wait for its heartbeat to go stale");
                return None;
            }
            Err(TryLockError::Error(e)) => {
                tracing::warn!(file = %lock_path.display(), error = %e,
                    "--instance-file: cannot lock its lock file; a restart of this worker will wait for its \
                     previous run's heartbeat to go stale");
                return None;
            }
        }
        let file = InstanceFile {
            path: path.to_path_buf(),
            _lock: lock,
        };
        let predecessor = match file.read(worker_id) {
            Ok(found) => found,
            Err(problem) => {
                tracing::warn!(file = %path.display(), %problem, "--instance-file: ignored");
                None
            }
        };
        Some(Claimed { file, predecessor })
    }

    /// The instance the file names, if it is one of `worker_id`.
    fn read(&self, worker_id: &str) -> Result<Option<String>, String> {
        let mut bytes = Vec::new();
        match File::open(&self.path) {
            Ok(f) => {
                // One byte more than allowed tells a long file from one
                // just at the limit, without reading all of it.
                f.take(MAX_LEN as u64 + 1)
                    .read_to_end(&mut bytes)
                    .map_err(|e| format!("cannot read it: {e}"))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot read it: {e}")),
        }
        parse(&bytes, worker_id)
    }

    /// Writes `instance` as the file's content, whole or not at all: a
    /// temporary file beside it is renamed over it. Not synced to disk:
    /// the file has to outlive the process, not the machine (an
    /// `emptyDir` goes with its Pod).
    pub(super) fn record(&self, instance: &str) -> std::io::Result<()> {
        let temporary = beside(&self.path, ".new");
        let mut f = File::create(&temporary)?;
        f.write_all(format!("{instance}\n").as_bytes())?;
        drop(f);
        std::fs::rename(&temporary, &self.path)
    }

    /// The file's path.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }
}

/// The instance name in a file's `bytes`, if it is one of `worker_id`;
/// `Ok(None)` for an empty file; what is wrong otherwise.
fn parse(bytes: &[u8], worker_id: &str) -> Result<Option<String>, String> {
    if bytes.len() > MAX_LEN {
        return Err(format!("longer than {MAX_LEN} bytes: not an instance name"));
    }
    let text = std::str::from_utf8(bytes)
        .map_err(|_| "not UTF-8: not an instance name".to_string())?
        .trim();
    if text.is_empty() {
        return Ok(None);
    }
    let well_formed = text
        .rsplit_once(Instance::SEPARATOR)
        .is_some_and(|(id, nonce)| {
            !id.is_empty()
                && !nonce.is_empty()
                && !text.chars().any(|c| c.is_whitespace() || c.is_control())
        });
    if !well_formed {
        return Err(format!(
            "{:?} is not an instance name (<worker id>{}<nonce>)",
            text.chars().take(80).collect::<String>(),
            Instance::SEPARATOR
        ));
    }
    match Instance::id_of(text) {
        Some(id) if id == worker_id => Ok(Some(text.to_string())),
        Some(id) => Err(format!(
            "it names an instance of worker id {id:?}, not of this worker's {worker_id:?}"
        )),
        None => Err(format!("{text:?} is not an instance name")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_instance_of_this_worker_id_is_read_from_the_file() {
        assert_eq!(
            parse(b"pod-a~0badc0de\n", "pod-a"),
            Ok(Some("pod-a~0badc0de".into()))
        );
        assert_eq!(parse(b"", "pod-a"), Ok(None));
        assert_eq!(parse(b" \n", "pod-a"), Ok(None));
        for (bytes, why) in [
            (&b"pod-b~0badc0de"[..], "worker id \"pod-b\""),
            (b"pod-a", "not an instance name"),
            (b"pod-a~", "not an instance name"),
            (b"~0badc0de", "not an instance name"),
            (b"pod-a~0bad c0de", "not an instance name"),
            (b"pod-a~\xff\xfe", "not UTF-8"),
        ] {
            let problem = parse(bytes, "pod-a").expect_err("refused");
            assert!(problem.contains(why), "{bytes:?}: {problem}");
        }
        let long = format!("pod-a~{}", "0".repeat(MAX_LEN));
        assert!(
            parse(long.as_bytes(), "pod-a")
                .expect_err("refused")
                .contains("longer than")
        );
    }

    #[test]
    fn the_file_is_replaced_whole_and_read_back_by_the_next_holder_of_its_lock() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("instance");
        let first = InstanceFile::claim(&path, "pod-a").expect("claimed");
        assert_eq!(first.predecessor, None, "a new file names no one");
        first.file.record("pod-a~00000001").expect("recorded");
        // The lock is held: a second process given the same file is told
        // it is in use and gets nothing from it.
        assert!(InstanceFile::claim(&path, "pod-a").is_none());
        drop(first);
        let second = InstanceFile::claim(&path, "pod-a").expect("claimed");
        assert_eq!(second.predecessor.as_deref(), Some("pod-a~00000001"));
        second.file.record("pod-a~00000002").expect("recorded");
        assert_eq!(
            std::fs::read_to_string(&path).expect("read"),
            "pod-a~00000002\n"
        );
        drop(second);
        // Another worker id's process ignores it.
        let other = InstanceFile::claim(&path, "pod-b").expect("claimed");
        assert_eq!(other.predecessor, None);
        drop(other);
    }
}
