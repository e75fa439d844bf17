//! [`Delivery`]: what a profiler does with each period's profile, in one
//! call: symbolize and encode once, write the local file (when configured),
//! queue the upload (when a backend is named), with the runtime id, the
//! container and pod, and the previous periods' upload losses in the
//! profile's comments.
//!
//! The agent's flush calls [`Delivery::flush`] where it wrote files, and its
//! shutdown calls [`Delivery::finish`] after the last flush. A forked child
//! makes a new one (upload threads do not survive `fork`, and the child has
//! its own runtime id).

use crate::{BackendStats, Error, Language, Meta, UploadConfig, Uploader};
use osprey_pprof::ProfileData;
use std::path::PathBuf;
use std::time::Duration;

/// Files and uploads of one profiled process.
pub struct Delivery {
    /// The configuration it runs with.
    pub cfg: UploadConfig,
    /// The process's runtime id.
    pub runtime_id: String,
    /// `key=value` comments naming its container and pod (see [`crate::Deployment::comments`]).
    deployment: Vec<String>,
    uploader: Option<Uploader>,
}

impl Delivery {
    /// Starts the upload threads if `cfg` names a backend. `period`: the
    /// profiling period (failures are logged at most once per period).
    pub fn new(cfg: UploadConfig, meta: Meta, period: Duration) -> Delivery {
        Self::with_spawner(cfg, meta, period, crate::worker::std_spawner)
    }

    /// [`Delivery::new`] with the upload threads started by `spawn`.
    pub fn with_spawner(cfg: UploadConfig, meta: Meta, period: Duration, spawn: crate::worker::Spawner) -> Delivery {
        let uploader = cfg.uploads().then(|| Uploader::start_with(cfg.clone(), meta.clone(), period, spawn));
        Delivery { cfg, runtime_id: meta.runtime_id, deployment: meta.deployment.comments(), uploader }
    }

    /// [`UploadConfig::from_env`] (the preloaded agent), for this process.
    pub fn from_env(program: &str, runtime_id: &str, language: Language, period: Duration) -> Result<Delivery, Error> {
        let cfg = UploadConfig::from_env(program)?;
        let meta = Meta::new(runtime_id, std::process::id() as i32, language);
        Ok(Delivery::new(cfg, meta, period))
    }

    /// Symbolizes and encodes `data` once; writes it into the output
    /// directory if there is one (returning the file), and queues it for
    /// the backends (never blocking). `runtime-id=...` (unless a
    /// `runtime-id=` comment is there already), the container and pod
    /// (`container.id=...`, `k8s.pod.name=...`) and the upload losses since
    /// the last flush are added to its comments. `late`: samples measured once
    /// symbolization is done (see `osprey_pprof::to_pprof_late`).
    pub fn flush(
        &self,
        data: &ProfileData,
        late: impl FnOnce() -> Vec<osprey_pprof::Sample>,
    ) -> std::io::Result<Option<PathBuf>> {
        // A file is created first: its cost falls before `late` measures (a
        // spool's journal takes one append at the end instead).
        let spool = self.cfg.out.as_deref().filter(|_| self.cfg.out_spool);
        let pending = match self.cfg.out.as_deref() {
            Some(dir) if spool.is_none() => Some(osprey_pprof::file::Pending::create(dir)?),
            _ => None,
        };
        // A part no backend gets is named by the merge (the backends want names).
        let mut profile = match (spool, &self.uploader) {
            (Some(_), None) => osprey_pprof::to_pprof_part(data, late),
            _ => osprey_pprof::to_pprof_late(data, late),
        };
        let mut comments = Vec::new();
        if !data.comments.iter().any(|c| c.starts_with("runtime-id=")) {
            comments.push(format!("runtime-id={}", self.runtime_id));
        }
        comments.extend(self.deployment.iter().filter(|c| !data.comments.contains(c)).cloned());
        if let Some(u) = &self.uploader {
            comments.extend(u.take_comments());
        }
        crate::add_comments(&mut profile, &comments);
        let bytes = prost::Message::encode_to_vec(&profile);
        let written = match (pending, spool) {
            (Some(p), _) => Some(p.publish(data.pid, &bytes)?),
            (None, Some(dir)) => {
                Some(osprey_pprof::journal::append(dir, osprey_pprof::journal::Kind::Profile, &bytes)?)
            }
            (None, None) => None,
        };
        if let Some(u) = &self.uploader {
            u.submit(bytes, data.start_realtime_ns, data.start_realtime_ns + data.duration_ns);
        }
        Ok(written)
    }

    /// Is a backend named?
    pub fn uploads(&self) -> bool {
        self.uploader.is_some()
    }

    /// The uploader's counters (empty without a backend).
    pub fn stats(&self) -> Vec<BackendStats> {
        self.uploader.as_ref().map(Uploader::stats).unwrap_or_default()
    }

    /// Waits until every backend has sent what is queued (delivered or
    /// given up), or until `deadline`; uploads go on afterwards.
    pub fn wait_delivered(&self, deadline: std::time::Instant) {
        if let Some(u) = &self.uploader {
            u.wait_idle(deadline);
        }
    }

    /// Sends what is queued, waiting at most the configured exit wait.
    pub fn finish(&mut self) -> Vec<BackendStats> {
        let wait = self.cfg.exit_wait;
        self.uploader.as_mut().map(|u| u.shutdown(wait)).unwrap_or_default()
    }
}
