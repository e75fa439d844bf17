//! [`RunReport`]: what one process's agent sampled and where its profiles
//! went, left for the `osprey exec` that started it (a small text file in
//! the `OSPREY_STATUS` directory, or a record in the spool's journal under
//! `--children`), so the end-of-run line counts what was delivered rather
//! than guessing from the output directory.
//!
//! The format is one fact a line (`key value...`), unknown keys ignored, so
//! an agent and a CLI of different versions still read each other.

use crate::BackendStats;
use std::path::{Path, PathBuf};

/// One process's run, as its agent reports it at exit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunReport {
    /// Profiles made (periods with samples), whether written, sent or both.
    pub profiles: u64,
    /// Samples in them (the `samples` sample type).
    pub samples: u64,
    /// Files written.
    pub files: Vec<PathBuf>,
    /// Per backend: delivered, still queued, dropped, refused, last error.
    pub uploads: Vec<BackendStats>,
}

impl RunReport {
    /// The file's text.
    pub fn to_text(&self) -> String {
        let mut s = format!("profiles {}\nsamples {}\n", self.profiles, self.samples);
        for f in &self.files {
            s.push_str(&format!("file {}\n", f.display()));
        }
        for u in &self.uploads {
            s.push_str(&format!(
                "upload {} {} {} {} {} {}\n",
                u.backend, u.delivered, u.queued, u.dropped, u.rejected, u.url
            ));
            if let Some(e) = &u.last_error {
                s.push_str(&format!("error {}\n", e.replace('\n', " ")));
            }
        }
        s
    }

    /// Reads [`RunReport::to_text`]'s output; lines it does not know are skipped.
    pub fn parse(text: &str) -> RunReport {
        let mut r = RunReport::default();
        for line in text.lines() {
            let (key, rest) = line.split_once(' ').unwrap_or((line, ""));
            match key {
                "profiles" => r.profiles = rest.trim().parse().unwrap_or(0),
                "samples" => r.samples = rest.trim().parse().unwrap_or(0),
                "file" => r.files.push(PathBuf::from(rest)),
                "upload" => {
                    let f: Vec<&str> = rest.splitn(6, ' ').collect();
                    let [backend, delivered, queued, dropped, rejected, url] = f[..] else { continue };
                    let n = |v: &str| v.parse::<u64>().unwrap_or(0);
                    r.uploads.push(BackendStats {
                        backend: backend_name(backend),
                        url: url.to_string(),
                        delivered: n(delivered),
                        queued: n(queued) as usize,
                        dropped: n(dropped),
                        rejected: n(rejected),
                        ..Default::default()
                    });
                }
                "error" => {
                    if let Some(u) = r.uploads.last_mut() {
                        u.last_error = Some(rest.to_string());
                    }
                }
                _ => {}
            }
        }
        r
    }

    /// Writes the report as `dir/<pid>-<runtime id>` (complete or not at
    /// all: written aside, then renamed).
    pub fn write(&self, dir: &Path, pid: i32, runtime_id: &str) -> std::io::Result<()> {
        let name = format!("{pid}-{runtime_id}");
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, self.to_text())?;
        std::fs::rename(&tmp, dir.join(name))
    }

    /// Appends the report to the journal of spool `dir` (an agent of an
    /// `exec --children` tree: no file per process). The record's first
    /// line names the process (`<pid>-<runtime id>`); a later record of the
    /// same process replaces an earlier one.
    pub fn append_to_spool(&self, dir: &Path, pid: i32, runtime_id: &str) -> std::io::Result<()> {
        let record = format!("{pid}-{runtime_id}\n{}", self.to_text());
        osprey_pprof::journal::append(dir, osprey_pprof::journal::Kind::Report, record.as_bytes()).map(|_| ())
    }

    /// A record [`RunReport::append_to_spool`] wrote: the process's name and its report.
    pub fn from_spool_record(record: &[u8]) -> Option<(String, RunReport)> {
        let text = std::str::from_utf8(record).ok()?;
        let (who, rest) = text.split_once('\n')?;
        Some((who.to_string(), RunReport::parse(rest)))
    }

    /// Every report in `dir`.
    pub fn read_all(dir: &Path) -> Vec<RunReport> {
        let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
        rd.flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .map(|t| RunReport::parse(&t))
            .collect()
    }
}

/// The backend names [`BackendStats::backend`] holds.
fn backend_name(s: &str) -> &'static str {
    match s {
        "datadog" => "datadog",
        "pyroscope" => "pyroscope",
        "otlp" => "otlp",
        _ => "unknown",
    }
}

/// Adds up the counters of the same backend and URL.
pub fn merge_uploads<'a>(all: impl IntoIterator<Item = &'a BackendStats>) -> Vec<BackendStats> {
    let mut out: Vec<BackendStats> = Vec::new();
    for s in all {
        match out.iter_mut().find(|o| o.backend == s.backend && o.url == s.url) {
            Some(o) => {
                o.delivered += s.delivered;
                o.queued += s.queued;
                o.dropped += s.dropped;
                o.rejected += s.rejected;
                if s.last_error.is_some() {
                    o.last_error = s.last_error.clone();
                }
            }
            None => out.push(s.clone()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let r = RunReport {
            profiles: 3,
            samples: 2195,
            files: vec![PathBuf::from("/tmp/a b/osprey-1.pb.gz")],
            uploads: vec![BackendStats {
                backend: "otlp",
                url: "http://127.0.0.1:4318/v1development/profiles".into(),
                delivered: 2,
                queued: 1,
                dropped: 0,
                rejected: 0,
                last_error: Some("connection refused\nretrying".into()),
                ..Default::default()
            }],
        };
        let back = RunReport::parse(&r.to_text());
        assert_eq!(back.profiles, 3);
        assert_eq!(back.samples, 2195);
        assert_eq!(back.files, r.files);
        assert_eq!(back.uploads[0].delivered, 2);
        assert_eq!(back.uploads[0].queued, 1);
        assert_eq!(back.uploads[0].url, r.uploads[0].url);
        assert_eq!(back.uploads[0].last_error.as_deref(), Some("connection refused retrying"));
    }

    #[test]
    fn spool_records_round_trip() {
        let dir = osprey_testkit::tempdir("report-spool");
        let r = RunReport { profiles: 2, samples: 40, files: vec![PathBuf::from("/x/y.pb.gz")], uploads: vec![] };
        r.append_to_spool(&dir, 12, "abc").unwrap();
        let sealed = osprey_pprof::journal::seal(&dir).unwrap().unwrap();
        let s = osprey_pprof::journal::Sealed::open(&sealed).unwrap();
        let [(osprey_pprof::journal::Kind::Report, record)] = &s.records[..] else { panic!("{:?}", s.records) };
        assert_eq!(RunReport::from_spool_record(record), Some(("12-abc".to_string(), r)));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unknown_and_broken_lines_are_skipped() {
        let r = RunReport::parse("profiles x\nfuture 1 2\nupload otlp 1\nsamples 7\n");
        assert_eq!((r.profiles, r.samples, r.uploads.len()), (0, 7, 0));
    }

    #[test]
    fn merge_adds_the_same_destination() {
        let a = BackendStats { backend: "otlp", url: "u".into(), delivered: 2, ..Default::default() };
        let b = BackendStats { backend: "otlp", url: "u".into(), delivered: 3, queued: 1, ..Default::default() };
        let c = BackendStats { backend: "datadog", url: "v".into(), delivered: 1, ..Default::default() };
        let m = merge_uploads([&a, &b, &c]);
        assert_eq!(m.len(), 2);
        assert_eq!((m[0].delivered, m[0].queued), (5, 1));
    }
}
