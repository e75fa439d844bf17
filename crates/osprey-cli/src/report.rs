//! `osprey report` (stub, being implemented).
use std::path::{Path, PathBuf};
pub fn run(_files: &[PathBuf], _top: usize, _flamegraph: Option<&Path>, _sample_index: Option<&str>) -> Result<(), String> {
    Err("report: not implemented yet".into())
}
