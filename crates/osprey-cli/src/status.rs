//! The private directory where every agent of an `osprey exec` tree leaves
//! its [`RunReport`] at exit (`OSPREY_STATUS`): what was sampled and where
//! it went, for the end-of-run lines.

use osprey_upload::RunReport;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// Created mode 0700 under the temporary directory; removed on drop.
pub struct StatusDir(PathBuf);

impl StatusDir {
    /// A new, empty directory only this user can write. None if it cannot be
    /// made: the end-of-run lines then count the files they find.
    pub fn create() -> Option<StatusDir> {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok()?.subsec_nanos();
        let dir = std::env::temp_dir().join(format!("osprey-status-{}-{nanos:x}", std::process::id()));
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
    }
}
