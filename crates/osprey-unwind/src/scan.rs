//! Keeping the published [`ModuleSet`] current with the loaded modules
//! ([`crate::loaded`]), on the agent thread (never in a handler: this takes
//! the loader's lock, reads files and allocates).

use crate::cache::Cache;
use crate::compile::{compile_elf, compile_file};
use crate::error::Error;
pub use crate::loaded::{file_of, generation, loaded, loaded_from, loaded_from_bytes, loaded_in, Generation, Loaded};
use crate::modules::{Module, ModuleSet};
use crate::publish::Shared;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What one [`Tracker::refresh`] did.
#[derive(Debug, Default)]
pub struct Refresh {
    /// A new module set was published.
    pub published: bool,
    /// Modules whose tables were compiled this time.
    pub compiled: usize,
    /// Modules that could not be compiled (they are still in the set, with
    /// an empty table, so their frames end the walk as truncated).
    pub errors: Vec<Error>,
}

/// Keeps the published [`ModuleSet`] in step with the loaded objects. Owned
/// by the agent thread; handlers only see [`Tracker::shared`].
pub struct Tracker {
    shared: Arc<Shared<ModuleSet>>,
    cache: HashMap<(PathBuf, u64), Module>,
    generation: Option<Generation>,
    debug_root: Option<PathBuf>,
    disk: Option<Cache>,
}

impl Tracker {
    /// `debug_root`: where separate debug files are found by build id
    /// (normally `Some(compile::DEBUG_ROOT)`).
    pub fn new(debug_root: Option<PathBuf>) -> Tracker {
        Tracker {
            shared: Arc::new(Shared::new(ModuleSet::default())),
            cache: HashMap::new(),
            generation: None,
            debug_root,
            disk: None,
        }
    }

    /// Compiles through `disk` (see [`crate::cache`]).
    pub fn with_cache(mut self, disk: Option<Cache>) -> Tracker {
        self.disk = disk;
        self
    }

    /// What handlers read.
    pub fn shared(&self) -> &Arc<Shared<ModuleSet>> {
        &self.shared
    }

    /// Rescans if the loader's generation moved (or on the first call),
    /// compiles new modules and publishes the new set; waits for handlers
    /// still reading the previous set before freeing it.
    pub fn refresh(&mut self) -> Refresh {
        let mut out = Refresh::default();
        let generation = generation();
        if generation.is_some() && generation == self.generation {
            return out;
        }
        let (generation, objects) = loaded();
        let mut modules = Vec::with_capacity(objects.len());
        let mut cache = HashMap::with_capacity(objects.len());
        for o in objects {
            let key = (o.path.clone(), o.bias);
            let m = match self.cache.remove(&key) {
                Some(m) => m,
                None => {
                    out.compiled += 1;
                    let compiled = match o.image.filter(|_| !o.path.is_file()) {
                        // SAFETY (of the read inside): the vDSO image is mapped
                        // for the process's lifetime, as the loader reports.
                        Some((lo, hi)) => compile_image(&o.path, lo, hi, self.debug_root.as_deref()),
                        None => match &self.disk {
                            Some(d) => d.compile_file(&o.path, self.debug_root.as_deref()),
                            None => compile_file(&o.path, self.debug_root.as_deref()),
                        },
                    };
                    let (table, build_id) = match compiled {
                        Ok(c) => (c.table, c.build_id),
                        Err(e) => {
                            out.errors.push(e);
                            Default::default()
                        }
                    };
                    Module {
                        path: o.path.clone(),
                        start: o.start,
                        end: o.end,
                        bias: o.bias,
                        build_id: build_id.map(Into::into),
                        table,
                    }
                }
            };
            modules.push(m.clone());
            cache.insert(key, m);
        }
        self.cache = cache;
        self.generation = generation;
        self.shared.publish(ModuleSet::new(modules));
        out.published = true;
        out
    }
}

/// Compiles an object that has no file (the vDSO) from its mapped image.
/// Its section headers lie past the segment's file size but inside the last
/// mapped page (the kernel maps the whole image): read up to their end.
fn compile_image(
    path: &Path,
    lo: u64,
    hi: u64,
    debug_root: Option<&Path>,
) -> crate::error::Result<crate::compile::Compiled> {
    const PAGE: u64 = 4096;
    let seg = hi.saturating_sub(lo);
    let mapped = seg.div_ceil(PAGE) * PAGE;
    let mut len = seg;
    if seg >= 64 {
        // SAFETY: the first 64 bytes (the ELF header) lie in the segment,
        // mapped for the process's lifetime (vDSO).
        let hdr = unsafe { std::slice::from_raw_parts(lo as *const u8, 64) };
        let u = |at: usize, n: usize| {
            hdr.get(at..at + n).map_or(0, |b| b.iter().rev().fold(0u64, |v, &x| v << 8 | u64::from(x)))
        };
        let end = u(0x28, 8).saturating_add(u(0x3a, 2).saturating_mul(u(0x3c, 2)));
        if end <= mapped {
            len = len.max(end);
        }
    }
    let len = usize::try_from(len).unwrap_or(0);
    // SAFETY: `[lo, lo + len)` lies within the whole pages of the object's
    // first PT_LOAD segment from file offset 0, mapped by the kernel and never
    // unmapped (vDSO).
    let bytes = unsafe { std::slice::from_raw_parts(lo as *const u8, len) };
    compile_elf(path, bytes, debug_root)
}
