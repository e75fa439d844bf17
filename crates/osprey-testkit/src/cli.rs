//! Running the `osprey` command as a user does: a workload under `osprey
//! exec` or `osprey attach`, then `osprey report` or `osprey diff` on what
//! it wrote.

use crate::run::output_within;
use std::ffi::OsStr;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

/// Runs `osprey exec -q --out OUT FLAGS -- CMD` with the variables `env`;
/// fails the test (showing stderr) unless it exits 0.
pub fn exec_into<S: AsRef<OsStr>>(out: &Path, flags: &[&str], cmd: &[S], env: &[(&str, &str)]) -> Output {
    let child = spawn_exec(out, flags, cmd, env);
    let o = output_within(child, Duration::from_secs(120), "osprey exec");
    assert!(o.status.success(), "osprey exec: {}", String::from_utf8_lossy(&o.stderr));
    o
}

/// Starts `osprey exec -q --out OUT FLAGS -- CMD` with the variables `env`,
/// its output piped.
pub fn spawn_exec<S: AsRef<OsStr>>(out: &Path, flags: &[&str], cmd: &[S], env: &[(&str, &str)]) -> Child {
    Command::new(crate::osprey())
        .args(["exec", "-q", "--out"])
        .arg(out)
        .args(flags)
        .arg("--")
        .args(cmd)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Runs `osprey attach --pid PID --out OUT FLAGS`; fails the test (showing
/// stderr) unless it exits 0 within 2 minutes.
pub fn attach_into(out: &Path, pid: u32, flags: &[&str]) -> Output {
    let child = Command::new(crate::osprey())
        .args(["attach", "--pid", &pid.to_string(), "--out"])
        .arg(out)
        .args(flags)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let o = output_within(child, Duration::from_secs(120), "osprey attach");
    assert!(o.status.success(), "osprey attach: {:?}: {}", o.status, String::from_utf8_lossy(&o.stderr));
    o
}

/// `osprey ARGS`' output (whatever its exit status).
pub fn osprey_output<S: AsRef<OsStr>>(args: &[S]) -> Output {
    Command::new(crate::osprey()).args(args).output().unwrap()
}

/// `osprey ARGS`' standard output; fails the test (showing stderr) unless it exits 0.
pub fn osprey_ok<S: AsRef<OsStr>>(args: &[S]) -> String {
    let o = osprey_output(args);
    assert!(o.status.success(), "osprey: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

/// `osprey report DIR ARGS --format pprof`, written beside `dir` (named
/// after the arguments) and decoded.
pub fn report_pprof(dir: &Path, args: &[&str]) -> osprey_pprof::pprof::Profile {
    let file = dir.with_extension(format!("{}.pb.gz", args.join("_").replace(['/', ' '], "")));
    let mut a = vec!["report", dir.to_str().unwrap(), "--format", "pprof", "-o", file.to_str().unwrap()];
    a.extend(args);
    osprey_ok(&a);
    crate::profile::decode(&std::fs::read(file).unwrap())
}
