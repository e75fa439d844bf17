//! STUB (being implemented on another branch).
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Duration;
pub struct Options { pub hz: u32, pub period: Duration, pub out_dir: PathBuf, pub duration: Option<Duration>, pub method: Option<Method> }
pub enum Method { Tls, Tss, Lists, Cache }
pub struct Summary { pub samples: u64, pub files: Vec<PathBuf> }
pub fn is_cpython_executable(_path: &Path) -> bool { false }
pub fn attach(_pid: i32, _opts: &Options, _stop: &AtomicBool) -> Result<Summary, String> { Err("python sampling not implemented yet".into()) }
