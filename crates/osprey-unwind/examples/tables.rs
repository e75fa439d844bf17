//! Table memory per MiB of `.eh_frame`, and compile time, for ELF files.
//!
//! `cargo run --release -p osprey-unwind --example tables -- /lib/x86_64-linux-gnu/libc.so.6 ...`

use osprey_unwind::compile::{compile_file, DEBUG_ROOT};
use std::path::Path;

fn main() -> Result<(), osprey_unwind::Error> {
    println!("| module | .eh_frame KiB | FDEs (eh + debug) | entries | table KiB | table KiB per MiB .eh_frame | compile ms |");
    println!("|---|---|---|---|---|---|---|");
    for arg in std::env::args().skip(1) {
        let t0 = std::time::Instant::now();
        let c = compile_file(Path::new(&arg), Some(Path::new(DEBUG_ROOT)))?;
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        let eh_kib = c.eh_frame_bytes as f64 / 1024.0;
        let kib = c.table.heap_bytes() as f64 / 1024.0;
        println!(
            "| {} | {eh_kib:.0} | {} + {} | {} | {kib:.0} | {:.0} | {ms:.0} |",
            Path::new(&arg).file_name().unwrap().to_string_lossy(),
            c.eh_fdes,
            c.debug_fdes,
            c.table.len(),
            kib / (eh_kib / 1024.0),
        );
    }
    Ok(())
}
