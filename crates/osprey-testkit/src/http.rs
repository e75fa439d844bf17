//! A real HTTP server profiled by `osprey exec`, under a load of concurrent
//! requests sent by the test: a free port, requests with W3C `traceparent`
//! headers, and the server stopped as an operator does (SIGTERM).

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Output};
use std::time::{Duration, Instant};

use crate::run::output_within;

/// A loopback port free now (the server binds it a moment later).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `GET path` on the loopback `port` (HTTP/1.1, `Connection: close`), with
/// a `traceparent` of trace `trace_id` and a remote parent span `parent`
/// when given; the response's status code and body.
pub fn get(port: u16, path: &str, trace: Option<(u128, u64)>) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let tp = trace.map_or(String::new(), |(t, p)| format!("traceparent: 00-{t:032x}-{p:016x}-01\r\n"));
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n{tp}\r\n")?;
    let mut r = String::new();
    s.read_to_string(&mut r)?;
    let code = r.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = r.split_once("\r\n\r\n").map_or(String::new(), |(_, b)| b.to_string());
    Ok((code, body))
}

/// Waits until something accepts connections on `port`; fails the test,
/// showing what `child` printed if it exited, after `limit`.
pub fn wait_listening(port: u16, child: &mut Child, limit: Duration) {
    let deadline = Instant::now() + limit;
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Some(st) = child.try_wait().unwrap() {
            let mut err = String::new();
            let _ = child.stderr.take().map(|mut e| e.read_to_string(&mut err));
            panic!("the server exited ({st}) before listening on {port}:\n{err}");
        }
        assert!(Instant::now() < deadline, "nothing listens on {port} after {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The direct children of `pid` (of all its threads).
pub fn children(pid: u32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    let mut out = Vec::new();
    for t in tasks.flatten() {
        let text = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        out.extend(text.split_whitespace().filter_map(|c| c.parse::<i32>().ok()));
    }
    out
}

/// A pseudo-random 64-bit id, never 0 (xorshift over the clock and `n`).
pub fn random_id(n: u64) -> u64 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    let mut x = t ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x2545_f491_4f6c_dd1d;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x | 1
}

/// Runs `osprey exec -q --out OUT FLAGS -- CMD` (the server, listening on
/// `port`) with the variables `env`; once it listens, `clients` threads
/// send `GET path` for `seconds`, each request with a new trace and a
/// remote parent; then SIGTERM goes to the server (osprey's child) and its
/// output is returned. Fails the test if a request fails or osprey does.
/// Returns the requests answered too.
pub fn serve_under_exec<S: AsRef<OsStr>>(
    out: &Path,
    flags: &[&str],
    cmd: &[S],
    env: &[(&str, &str)],
    port: u16,
    load: (usize, f64, &str),
) -> (Output, usize) {
    let (clients, seconds, path) = load;
    let mut child = crate::cli::spawn_exec(out, flags, cmd, env);
    wait_listening(port, &mut child, Duration::from_secs(60));
    let stop_at = Instant::now() + Duration::from_secs_f64(seconds);
    let answered: usize = std::thread::scope(|s| {
        let ts: Vec<_> = (0..clients as u64)
            .map(|c| {
                s.spawn(move || {
                    let mut n = 0;
                    while Instant::now() < stop_at {
                        let trace = (u128::from(random_id(c)) << 64) | u128::from(random_id(c + 100));
                        let (code, body) = get(port, path, Some((trace, random_id(c + 200))))
                            .unwrap_or_else(|e| panic!("GET {path} on {port}: {e}"));
                        assert_eq!(code, 200, "GET {path}: {body}");
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        ts.into_iter().map(|t| t.join().unwrap()).sum()
    });
    for pid in children(child.id()) {
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let o = output_within(child, Duration::from_secs(120), "osprey exec (server)");
    // A server may exit 0 or, as uvicorn does, re-raise the signal it
    // handled: osprey exec then dies of that signal too.
    let ok = o.status.success() || o.status.signal() == Some(libc::SIGTERM);
    assert!(ok, "osprey exec: {}: {}", o.status, String::from_utf8_lossy(&o.stderr));
    (o, answered)
}
