//! The spool of an `osprey exec` tree: one profile file per period for the
//! whole tree instead of one per process.
//!
//! Every agent of the tree (and every Python sampler of `osprey exec`)
//! writes its profiles into `OUT/.osprey-spool-<pid>-<start>/`
//! (`OSPREY_OUT` points there); each period `osprey exec` merges what is
//! there into one file in `OUT` (samples keep their `pid`/`process` labels)
//! and deletes the parts.
//!
//! Agents append their profiles to the spool's journal
//! (`osprey_pprof::journal`: no file per process); CPython samplers write
//! files. Both are parts.
//!
//! Invariants:
//! - a part is complete or absent (files are published by hard link; a
//!   journal record torn by its writer's death is skipped), so a child
//!   killed by SIGKILL loses only the period it had not written;
//! - a sealed journal is read and deleted under its exclusive lock, so no
//!   record lands in it after it was read;
//! - parts are deleted only once the merged file is synced and linked under
//!   its name; the name is recorded in `.commit` (with the parts) before the
//!   link, so a crash between the link and the deletions is finished by the
//!   next merge of that spool rather than merging the parts twice;
//! - a spool whose owner is gone (osprey killed) is merged by the next
//!   `osprey exec` with the same output directory;
//! - a part that cannot be read is moved to `OUT` as it is, never dropped;
//! - the temporary files of writers killed mid-write (osprey's merge, an
//!   agent's part) stay inside the spool and go when it is closed.

use flate2::write::GzEncoder;
use osprey_pprof::journal::Kind;
use osprey_upload::RunReport;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

const PREFIX: &str = ".osprey-spool-";
const COMMIT: &str = ".commit";

/// A spool directory inside the output directory.
pub struct Spool {
    dir: PathBuf,
    out: PathBuf,
    /// The agents' run reports read from the journal, the latest per process.
    reports: RefCell<BTreeMap<String, RunReport>>,
}

impl Spool {
    /// A new spool for this process in `out` (created if missing).
    pub fn create(out: &Path) -> io::Result<Spool> {
        let pid = std::process::id() as i32;
        let start = osprey::internals::threads::start_ticks(pid).unwrap_or(0);
        let dir = out.join(format!("{PREFIX}{pid}-{start}"));
        std::fs::create_dir_all(&dir)?;
        Ok(Spool { dir, out: out.to_path_buf(), reports: RefCell::default() })
    }

    /// Where the agents write their parts.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Merges the parts written so far into one file of `pid` in the output
    /// directory; returns it (None when there was nothing to merge).
    pub fn merge(&self, pid: i32) -> io::Result<Option<PathBuf>> {
        self.finish_commit()?;
        let parts = self.parts()?;
        let mut profiles = Vec::with_capacity(parts.len());
        let mut merged_parts = Vec::with_capacity(parts.len());
        // Sealed journals stay locked (no writer adds to them) until deleted.
        let journals = self.journals()?;
        for j in &journals {
            for (kind, record) in &j.records {
                match kind {
                    Kind::Profile => match osprey_pprof::read::decode(record) {
                        Ok(profile) => profiles.push(profile),
                        Err(_) => self.keep_unreadable(record)?,
                    },
                    Kind::Report => {
                        if let Some((who, report)) = RunReport::from_spool_record(record) {
                            self.reports.borrow_mut().insert(who, report);
                        }
                    }
                }
            }
            merged_parts.push(j.path().to_path_buf());
        }
        for p in parts {
            match osprey_pprof::read_profile(&p) {
                Ok(profile) => {
                    profiles.push(profile);
                    merged_parts.push(p);
                }
                Err(_) => {
                    let name = p.file_name().map(|n| n.to_os_string()).unwrap_or_default();
                    std::fs::rename(&p, self.out.join(name))?;
                }
            }
        }
        if merged_parts.is_empty() {
            return Ok(None);
        }
        // The agents left their modules' names to this merge: one read per file for the tree.
        osprey_pprof::deferred::name_parts(&mut profiles);
        osprey_pprof::symbolize::release_free_heap();
        let mut merged = osprey_pprof::merge::merge(&profiles);
        // The agents of a tree leave its container and pod to the merge: they are the tree's.
        for c in osprey_upload::Deployment::of(0).comments() {
            merged.add_comment(&c);
        }
        let file = if merged.sample.is_empty() {
            None
        } else {
            Some(self.publish(pid, &prost::Message::encode_to_vec(&merged), &merged_parts)?)
        };
        for p in &merged_parts {
            std::fs::remove_file(p)?;
        }
        drop(journals);
        let _ = std::fs::remove_file(self.dir.join(COMMIT));
        Ok(file)
    }

    /// Seals the parts journal and reads every sealed one, oldest first.
    fn journals(&self) -> io::Result<Vec<osprey_pprof::journal::Sealed>> {
        osprey_pprof::journal::seal(&self.dir)?;
        osprey_pprof::journal::sealed(&self.dir)?.iter().map(|p| osprey_pprof::journal::Sealed::open(p)).collect()
    }

    /// A complete record that is not a profile goes to the output directory
    /// as a file of its own, as an unreadable part does.
    fn keep_unreadable(&self, record: &[u8]) -> io::Result<()> {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        std::fs::write(self.out.join(format!("osprey-unreadable-{nanos}.pb")), record)
    }

    /// The run reports the agents appended so far, the latest per process.
    pub fn reports(&self) -> Vec<RunReport> {
        self.reports.borrow().values().cloned().collect()
    }

    /// Merges what is left and removes the spool (unless a process still
    /// writes to it: the next `osprey exec` merges that).
    pub fn close(&self, pid: i32) -> io::Result<Option<PathBuf>> {
        let file = self.merge(pid)?;
        self.sweep();
        let _ = std::fs::remove_dir(&self.dir);
        Ok(file)
    }

    /// Removes the temporary files of writers that are gone (killed while
    /// writing): this spool's own, and a part's (`.osprey-<pid>-<n>.tmp`,
    /// see `osprey_pprof::file`) whose process has ended.
    fn sweep(&self) {
        let Ok(rd) = std::fs::read_dir(&self.dir) else { return };
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let writer = name.strip_prefix(".osprey-").and_then(|r| r.split('-').next()?.parse::<i32>().ok());
            let gone = match writer {
                Some(pid) => !Path::new(&format!("/proc/{pid}")).exists(),
                None => name == ".merge.tmp" || name == ".commit.tmp",
            };
            if gone {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    /// Complete parts (agents write under dot names, then link), by name.
    fn parts(&self) -> io::Result<Vec<PathBuf>> {
        std::fs::metadata(&self.dir)?;
        Ok(crate::hints::profile_files(&self.dir).into_iter().collect())
    }

    /// Writes `bytes` gzipped and synced under a temporary name, records the name it will take and the parts it
    /// replaces in `.commit`, then links it under that name.
    fn publish(&self, pid: i32, bytes: &[u8], parts: &[PathBuf]) -> io::Result<PathBuf> {
        // In the spool (the same file system as the output directory, for
        // the link): an osprey killed while writing it leaves it there only.
        let tmp = self.dir.join(".merge.tmp");
        let written = (|| {
            let mut gz = GzEncoder::new(std::fs::File::create(&tmp)?, flate2::Compression::default());
            gz.write_all(bytes)?;
            gz.finish()?.sync_all()
        })();
        let linked = written.and_then(|()| {
            let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
            let mut seq = 0;
            loop {
                let path = self.out.join(osprey_pprof::file::file_name(pid, now, seq));
                seq += 1;
                if path.exists() {
                    continue;
                }
                self.record(&path, parts)?;
                match std::fs::hard_link(&tmp, &path) {
                    Ok(()) => return Ok(path),
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                    Err(e) => return Err(e),
                }
            }
        });
        let _ = std::fs::remove_file(&tmp);
        linked
    }

    /// `.commit`: the merged file's path, then the parts it holds, one a line.
    fn record(&self, merged: &Path, parts: &[PathBuf]) -> io::Result<()> {
        let mut text = format!("{}\n", merged.display());
        for p in parts {
            text.push_str(&format!("{}\n", p.display()));
        }
        let tmp = self.dir.join(".commit.tmp");
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, self.dir.join(COMMIT))
    }

    /// After a crash between linking a merged file and deleting its parts:
    /// deletes the parts if the merged file exists.
    fn finish_commit(&self) -> io::Result<()> {
        let Ok(text) = std::fs::read_to_string(self.dir.join(COMMIT)) else { return Ok(()) };
        let mut lines = text.lines();
        if lines.next().is_some_and(|merged| Path::new(merged).is_file()) {
            for part in lines {
                let _ = std::fs::remove_file(part);
            }
        }
        std::fs::remove_file(self.dir.join(COMMIT))
    }
}

/// Merges and removes the spools in `out` whose `osprey exec` is gone;
/// returns the files written.
pub fn recover(out: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(out) else { return Vec::new() };
    let mut files = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some((pid, start)) = name.strip_prefix(PREFIX).and_then(|o| o.split_once('-')) else { continue };
        let (Ok(pid), Ok(start)) = (pid.parse::<i32>(), start.parse::<u64>()) else { continue };
        // Its osprey still runs (or may: a pid whose start time cannot be read).
        match osprey::internals::threads::start_ticks(pid) {
            Some(t) if t == start => continue,
            None if Path::new(&format!("/proc/{pid}")).exists() => continue,
            _ => {}
        }
        let spool = Spool { dir: e.path(), out: out.to_path_buf(), reports: RefCell::default() };
        if let Ok(Some(f)) = spool.close(pid) {
            files.push(f);
        }
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(spool: &Spool, stacks: &[(&str, i64)]) -> PathBuf {
        let data = osprey_testkit::profile::folded(stacks);
        osprey_pprof::write_profile(spool.path(), &data).unwrap()
    }

    /// Parts merge into one file and go; a `.commit` left by a crash after
    /// the link makes the next merge delete its parts without merging them
    /// again; one naming a file that was never linked keeps them.
    #[test]
    fn merges_once_even_after_a_crash_between_link_and_delete() {
        let out = osprey_testkit::tempdir("spool-commit");
        let spool = Spool::create(&out).unwrap();
        part(&spool, &[("main;a", 2)]);
        part(&spool, &[("main;b", 3)]);
        let merged = spool.merge(7).unwrap().expect("a merged file");
        let p = osprey_pprof::read_profile(&merged).unwrap();
        assert_eq!(p.sample.iter().map(|s| s.value[0]).sum::<i64>(), 5);
        assert!(spool.parts().unwrap().is_empty());

        let again = part(&spool, &[("main;a", 2)]);
        spool.record(&merged, std::slice::from_ref(&again)).unwrap();
        assert_eq!(spool.merge(7).unwrap(), None, "already in {}", merged.display());
        assert!(!again.exists() && !spool.path().join(COMMIT).exists());

        let kept = part(&spool, &[("main;c", 1)]);
        spool.record(&out.join("osprey-7-never.pb.gz"), std::slice::from_ref(&kept)).unwrap();
        assert!(spool.merge(7).unwrap().is_some(), "never linked: merged now");
        let dir = spool.path().to_path_buf();
        assert_eq!(spool.close(7).unwrap(), None);
        assert!(!dir.exists());
        assert_eq!(crate::hints::profile_files(&out).len(), 2);
    }

    /// Profiles appended to the journal (what the agents of a tree do) merge
    /// with file parts into one file; the sealed journal goes with them,
    /// and a record appended after the merge waits for the next one. Run
    /// reports in the journal are kept for the end of the run.
    #[test]
    fn journal_records_merge_with_file_parts() {
        let out = osprey_testkit::tempdir("spool-journal");
        let spool = Spool::create(&out).unwrap();
        let append = |stacks: &[(&str, i64)]| {
            let data = osprey_testkit::profile::folded(stacks);
            osprey_pprof::write_profile_with(spool.path(), &data, Vec::new, osprey_pprof::Destination::Journal).unwrap()
        };
        let report = RunReport { profiles: 1, samples: 5, ..Default::default() };
        report.append_to_spool(spool.path(), 42, "rt").unwrap();
        append(&[("main;a", 2)]);
        append(&[("main;b", 3)]);
        part(&spool, &[("main;c", 4)]);
        let merged = spool.merge(7).unwrap().expect("a merged file");
        let p = osprey_pprof::read_profile(&merged).unwrap();
        assert_eq!(p.sample.iter().map(|s| s.value[0]).sum::<i64>(), 9);
        assert_eq!(spool.reports(), vec![report]);
        let left: Vec<_> = std::fs::read_dir(spool.path()).unwrap().flatten().map(|e| e.file_name()).collect();
        assert!(left.is_empty(), "left in the spool: {left:?}");
        append(&[("main;d", 5)]);
        let next = spool.close(7).unwrap().expect("the later record merged");
        let p = osprey_pprof::read_profile(&next).unwrap();
        assert_eq!(p.sample.iter().map(|s| s.value[0]).sum::<i64>(), 5);
        assert_eq!(crate::hints::profile_files(&out).len(), 2);
    }
}
