//! `--format pprof`: the merged, filtered profile as one gzip pprof file,
//! what `go tool pprof` and every pprof backend read.

use osprey_pprof::pprof::Profile;

/// `p` encoded and gzipped.
pub fn render(p: &Profile) -> std::io::Result<Vec<u8>> {
    osprey_pprof::file::gzip_profile(p)
}
