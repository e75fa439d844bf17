//! Resident memory cost of one `write_profile` (symbolizer created and dropped
//! inside) for a small Rust program with DWARF line tables, symbolized from
//! outside (another pid, as `osprey attach` would). Prints the figures; run
//! with `--nocapture`.
//!
//! The program is compiled here with `rustc -O -C debuginfo=1` (the toolchain
//! running the tests), prints the address of its `spin` function and waits
//! for its stdin to close. Peak is `VmHWM` after a reset through
//! `/proc/self/clear_refs` (Linux >= 4.0; if refused, an upper bound).

use osprey_pprof::{read_profile, write_profile, Frame, ProfileData, Sample};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

const PROGRAM: &str = r#"
#[inline(never)]
fn spin(n: u64) -> u64 { (0..n).fold(1, |a, b| a ^ b.rotate_left(3)) }
fn main() {
    println!("{} {}", spin(std::hint::black_box(10)), spin as fn(u64) -> u64 as usize);
    let mut b = [0u8; 1];
    let _ = std::io::Read::read(&mut std::io::stdin(), &mut b);
}
"#;

fn status_kib(field: &str) -> i64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Builds and starts the program; returns it and the address of its `spin`.
fn start_program(dir: &Path) -> (Child, u64) {
    std::fs::create_dir_all(dir).unwrap();
    let (src, exe) = (dir.join("small.rs"), dir.join("small"));
    std::fs::write(&src, PROGRAM).unwrap();
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let st = Command::new(rustc).args(["-O", "-C", "debuginfo=1", "-o"]).arg(&exe).arg(&src).status().unwrap();
    assert!(st.success(), "rustc failed");
    let mut child = Command::new(&exe).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    let spin = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    (child, spin)
}

#[test]
fn rss_growth_of_one_write() {
    let dir = std::env::temp_dir().join(format!("osprey-rss-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (mut child, spin) = start_program(&dir);
    let exe_size = std::fs::metadata(dir.join("small")).unwrap().len();
    let samples = (0..64)
        .map(|i| Sample {
            frames: vec![Frame::Native { addr: spin + i % 16, return_address: false }],
            values: vec![1, 1_000_000],
            labels: vec![],
        })
        .collect();
    let data = ProfileData {
        pid: child.id() as i32,
        sample_types: vec![("samples".into(), "count".into()), ("cpu".into(), "nanoseconds".into())],
        period: ("cpu".into(), "nanoseconds".into(), 1_000_000),
        samples,
        ..ProfileData::default()
    };
    let mut retained = Vec::new();
    for round in ["cold", "warm"] {
        let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
        let before = status_kib("VmRSS:");
        let path = write_profile(&dir.join("out"), &data).unwrap();
        let (after, peak) = (status_kib("VmRSS:"), status_kib("VmHWM:"));
        eprintln!(
            "{round}: binary {:.1} MiB; RSS before {before} KiB, retained {:+} KiB, peak {:+} KiB{}",
            exe_size as f64 / 1048576.0,
            after - before,
            peak - before,
            if reset { "" } else { " (HWM not reset: upper bound)" },
        );
        retained.push(after - before);
        let p = read_profile(&path).unwrap();
        let names: Vec<&str> = p.function.iter().map(|f| p.string(f.name)).collect();
        assert!(names.iter().any(|n| n.ends_with("small::spin")), "{names:?}");
        // Inlined frames first, the physical function last.
        for loc in &p.location {
            let outer = p.string(p.function[loc.line.last().unwrap().function_id as usize - 1].name);
            assert!(outer.ends_with("small::spin"), "{outer}");
        }
        assert_eq!(p.string(p.mapping[0].filename), dir.join("small").to_str().unwrap());
    }
    drop(child.stdin.take());
    child.wait().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    // Once warm, a write must give back what it took (allocator slack aside).
    assert!(retained[1] < 1024, "a warm write_profile kept {} KiB resident", retained[1]);
}
