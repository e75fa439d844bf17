//! Project tasks: `cargo xtask demo` (the quick start), `cargo xtask test`
//! (the whole test suite, as CI runs it) and `cargo xtask dist` (the release
//! tarball, see `dist.rs`).

mod dist;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

fn main() -> ExitCode {
    let task = std::env::args().nth(1).unwrap_or_default();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    let ok = match task.as_str() {
        "demo" => demo(&root),
        "test" => test(&root),
        "dist" => dist::dist(&root),
        _ => {
            eprintln!("usage: cargo xtask demo | test | dist");
            false
        }
    };
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

pub(crate) fn run(root: &Path, program: &str, args: &[&str], env: &[(&str, &str)]) -> bool {
    eprintln!("+ {program} {}", args.join(" "));
    let mut c = Command::new(program);
    c.args(args).current_dir(root).process_group(0);
    for (k, v) in env {
        c.env(k, v);
    }
    let started = Instant::now();
    let status = c.spawn().and_then(|mut child| loop {
        if let Some(s) = child.try_wait()? {
            break Ok(s);
        }
        if started.elapsed() > deadline() {
            // A hang fails the step with what was running, instead of
            // running into CI's own limit with no output.
            eprintln!("xtask: `{program} {}` still running after {:?}; processes:", args.join(" "), deadline());
            let _ = Command::new("ps").args(["-eo", "pid,ppid,etime,stat,wchan:20,args", "--forest"]).status();
            let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", child.id())]).status();
            let _ = child.wait();
            break Err(std::io::Error::other("killed at the deadline"));
        }
        std::thread::sleep(Duration::from_millis(200));
    });
    eprintln!("xtask: `{program} {}` took {:.0?}", args.join(" "), started.elapsed());
    match status {
        Ok(s) if s.success() => true,
        Ok(s) => {
            eprintln!("xtask: `{program} {}` failed: {s}", args.join(" "));
            false
        }
        Err(e) => {
            eprintln!("xtask: cannot run {program}: {e}");
            false
        }
    }
}

/// The longest one step may take (`OSPREY_STEP_MINUTES`, default 30): the
/// whole CI must stay under 40 minutes.
fn deadline() -> Duration {
    let min = std::env::var("OSPREY_STEP_MINUTES").ok().and_then(|v| v.parse().ok()).unwrap_or(30);
    Duration::from_secs(60 * min)
}

/// Builds everything, profiles the bundled demo, prints its hottest functions.
fn demo(root: &Path) -> bool {
    let out = root.join("profiles");
    if !run(root, "cargo", &["build", "--release", "--workspace"], &[]) {
        return false;
    }
    let before = profiles(&out);
    let osprey = root.join("target/release/osprey");
    let demo = root.join("target/release/osprey-demo");
    let (o, d, out_s) = (osprey.to_str().unwrap(), demo.to_str().unwrap(), out.to_str().unwrap());
    if !run(root, o, &["exec", "--hz", "1000", "--out", out_s, "--", d, "--threads", "2", "--seconds", "3"], &[]) {
        return false;
    }
    let Some(newest) = profiles(&out).into_iter().filter(|p| !before.contains(p)).max() else {
        eprintln!("xtask: the demo wrote no profile in {out_s}");
        return false;
    };
    let svg = out.join("flamegraph.svg");
    let ok =
        run(root, o, &["report", newest.to_str().unwrap(), "--top", "10", "--flamegraph", svg.to_str().unwrap()], &[]);
    println!("\nprofile:    {}\nflamegraph: {}", newest.display(), svg.display());
    ok
}

fn profiles(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).filter(|p| p.to_string_lossy().ends_with(".pb.gz")).collect())
        .unwrap_or_default()
}

/// The whole suite: formatting and lints, build every artifact the tests
/// drive (the preload agent, the CLI, the demo), run all tests with all
/// features, then the loom model.
fn test(root: &Path) -> bool {
    run(root, "cargo", &["fmt", "--all", "--check"], &[])
        && run(
            root,
            "cargo",
            &["clippy", "--workspace", "--all-targets", "--all-features", "--", "-D", "warnings"],
            &[],
        )
        && run(root, "cargo", &["build", "--workspace", "--all-features"], &[])
        && run(root, "cargo", &["test", "--workspace", "--all-features"], &[])
        && run(
            root,
            "cargo",
            &["test", "-p", "osprey", "--release", "--lib", "--target-dir", "target/loom", "loom"],
            &[("RUSTFLAGS", "--cfg loom -C force-frame-pointers=yes")],
        )
        && run(
            root,
            "cargo",
            &["test", "-p", "osprey-unwind", "--release", "--lib", "--target-dir", "target/loom", "loom"],
            &[("RUSTFLAGS", "--cfg loom -C force-frame-pointers=yes")],
        )
}
