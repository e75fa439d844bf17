//! The private directory where every agent of an `osprey exec` tree leaves
//! its [`RunReport`] at exit (`OSPREY_STATUS`): what was sampled and where
//! it went, for the end-of-run lines.

use osprey_upload::RunReport;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// Starts the name of a status directory: `<PREFIX><pid>-<nanos>`.
const PREFIX: &str = "osprey-status-";

/// Created mode 0700 under the temporary directory; removed on drop.
pub struct StatusDir(PathBuf);

impl StatusDir {
    /// A new, empty directory only this user can write. None if it cannot be
    /// made: the end-of-run lines then count the files they find.
    pub fn create() -> Option<StatusDir> {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok()?.subsec_nanos();
        let dir = std::env::temp_dir().join(format!("{PREFIX}{}-{nanos:x}", std::process::id()));
        std::fs::DirBuilder::new().mode(0o700).create(&dir).ok()?;
        Some(StatusDir(dir))
    }

    /// Where the agents write.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// The reports written so far.
    pub fn reports(&self) -> Vec<RunReport> {
        RunReport::read_all(&self.0)
    }
}

impl Drop for StatusDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
        if let Some(tmp) = self.0.parent() {
            remove_orphans(tmp);
        }
    }
}

/// Removes the status directories of `osprey exec` runs killed before they
/// could (SIGKILL): this user's, named after a process that no longer
/// exists. Agents those runs left still running write there best effort,
/// and nothing reads it any more.
fn remove_orphans(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else { return };
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(PREFIX))
            .and_then(|n| n.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<i32>().ok())
            .filter(|&pid| pid > 0)
        else {
            continue;
        };
        // `DirEntry::metadata` does not follow a symbolic link.
        let ours = e.metadata().is_ok_and(|m| m.is_dir() && std::os::unix::fs::MetadataExt::uid(&m) == uid);
        // SAFETY: signal 0 only checks that the process exists.
        let gone =
            unsafe { libc::kill(pid, 0) } != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if ours && gone {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}
