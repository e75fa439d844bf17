//! OTEP 4947 thread contexts read from outside: a C writer that is not
//! osprey (local-exec TLS in an executable), and osprey's own agent
//! (TLSDESC in the preloaded library, with the OTEP 4719 process context).

use osprey_perf::thread_ctx::{read_thread_contexts, Contexts};
use osprey_testkit::{cc, paths, tmp};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// Starts `cmd` with piped stdin/stdout and waits for its `ready` line.
fn start_ready(cmd: &mut Command) -> Child {
    let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("target starts");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    loop {
        let mut l = String::new();
        assert!(out.read_line(&mut l).unwrap() > 0, "target ended before ready");
        if l.trim_end() == "ready" {
            break;
        }
    }
    child
}

fn finish(mut child: Child) {
    drop(child.stdin.take());
    let st = child.wait().unwrap();
    assert!(st.success(), "the target must run on unharmed: {st:?}");
}

#[test]
fn reads_a_c_writer_and_skips_torn_records() {
    let dir = tmp::tempdir("otel-writer");
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/otel_writer.c");
    let exe = cc::compile_c(&src, &dir.join("otel_writer"), &["-rdynamic"]);
    let child = start_ready(&mut Command::new(&exe));
    let pid = child.id() as i32;
    let (mut torn, mut churn_seen) = (0, 0);
    for _ in 0..20 {
        let c: Contexts = read_thread_contexts(pid).expect("readable");
        assert_eq!(c.module.as_deref(), Some(exe.to_str().unwrap()), "{c:?}");
        assert_eq!(c.unreadable, 0, "{c:?}");
        assert_eq!(c.empty, 1, "the main thread publishes nothing: {c:?}");
        assert_eq!(c.threads.len() as u32 + c.torn, 4, "{c:?}");
        for t in &c.threads {
            if t.span_id >> 8 == 0xb7ad6b71692033 {
                let i = t.span_id & 0xff;
                assert_eq!(t.trace_hex(), format!("0af7651916cd43dd8448eb211c8031{i:02x}"));
                assert_eq!(t.trace_flags, 1);
                assert_eq!(t.attributes, vec![(0, format!("/thread/{i}"))]);
            } else {
                // The churning thread: never a mix of two updates.
                churn_seen += 1;
                assert_eq!(
                    t.trace_id,
                    (t.span_id as u128 * 3) << 64 | t.span_id as u128,
                    "torn record reported: {t:?}"
                );
            }
        }
        torn += c.torn;
    }
    eprintln!("20 reads: churning thread read {churn_seen} times, {torn} torn records skipped");
    assert!(churn_seen + torn as usize == 20);
    finish(child);
}

#[test]
fn reads_the_osprey_agent() {
    let dir = tmp::tempdir("otel-agent");
    // A C program that sets its context through osprey's C ABI under the agent.
    let src = dir.join("traced.c");
    std::fs::write(
        &src,
        r#"
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
#include "osprey.h"
static volatile int ready;
static void *worker(void *arg) {
    (void)arg;
    osprey_set_tag("http.route", "/checkout");
    osprey_set_trace_context(0x4bf92f3577b34da6ULL, 0xa3ce929d0e0e4736ULL, 0x00f067aa0ba902b7ULL, 1, 42);
    __atomic_store_n(&ready, 1, __ATOMIC_SEQ_CST);
    char c;
    while (read(0, &c, 1) > 0) {
    }
    return NULL;
}
int main(void) {
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);
    while (!__atomic_load_n(&ready, __ATOMIC_SEQ_CST)) usleep(1000);
    osprey_set_context(7, 7); /* span without trace id: no OTel span */
    printf("ready\n");
    fflush(stdout);
    pthread_join(t, NULL);
    return 0;
}
"#,
    )
    .unwrap();
    // This tree's header first; linked against the agent, which LD_PRELOAD also names.
    let include = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../include");
    let exe = cc::Cc::new("cc")
        .flags(cc::FRAME_POINTERS)
        .flags([std::ffi::OsStr::new("-I"), include.as_os_str()])
        .after([paths::preload_lib()])
        .build(&src, &dir.join("traced"));
    let child = start_ready(
        Command::new(&exe)
            .env("LD_PRELOAD", paths::preload_lib())
            .env("OSPREY_OUT", &dir)
            .env("OTEL_SERVICE_NAME", "traced-test"),
    );
    let c = read_thread_contexts(child.id() as i32).expect("readable");
    eprintln!("{c:?}");
    assert!(c.module.as_deref().is_some_and(|m| m.ends_with("libosprey_preload.so")), "{c:?}");
    let r = c.reference.as_ref().expect("process context published");
    assert_eq!(r.schema_version, "tlsdesc_v1_dev");
    assert_eq!(r.attribute_keys, ["http.route"]);
    let traced: Vec<_> = c.threads.iter().filter(|t| t.trace_id != 0).collect();
    assert_eq!(traced.len(), 1, "{c:?}");
    let t = traced[0];
    assert_eq!(t.trace_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!((t.span_id, t.trace_flags), (0x00f067aa0ba902b7, 1));
    assert_eq!(t.attributes, vec![(0, "/checkout".to_string())]);
    assert_eq!(c.key_name(0), Some("http.route"));
    // The main thread: an osprey span without a trace id is "no span" here.
    assert!(c.threads.iter().any(|t| t.trace_id == 0 && t.span_id == 0), "{c:?}");
    finish(child);
}

/// Reading without stopping the threads (as `osprey attach` does per
/// sample): the churning thread is rewritten under the reads, yet no record
/// read is ever a mix of two updates; the fixed threads read right each time.
#[test]
fn live_reads_skip_records_changing_under_them() {
    use osprey_perf::thread_ctx::{LiveReader, ThreadRead};
    let dir = tmp::tempdir("otel-live");
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/otel_writer.c");
    let exe = cc::compile_c(&src, &dir.join("otel_writer"), &["-rdynamic"]);
    let child = start_ready(&mut Command::new(&exe));
    let pid = child.id() as i32;
    let mut live = LiveReader::open(pid).expect("readable").expect("the writer exports the symbol");
    let tids: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    live.track(tids.iter().copied());
    let (mut fixed, mut churn, mut null) = (0, 0, 0);
    for _ in 0..2000 {
        for &tid in &tids {
            match live.read(tid) {
                ThreadRead::Record(t) if t.span_id >> 8 == 0xb7ad6b71692033 => {
                    let i = t.span_id & 0xff;
                    assert_eq!(t.trace_hex(), format!("0af7651916cd43dd8448eb211c8031{i:02x}"));
                    assert_eq!(t.attributes, vec![(0, format!("/thread/{i}"))]);
                    fixed += 1;
                }
                ThreadRead::Record(t) => {
                    assert_eq!(t.trace_id, (t.span_id as u128 * 3) << 64 | t.span_id as u128, "mixed record: {t:?}");
                    churn += 1;
                }
                ThreadRead::Null => null += 1,
                r => assert!(matches!(r, ThreadRead::Torn), "{r:?}"),
            }
        }
    }
    eprintln!("live: {fixed} fixed, {churn} churning read whole, {} torn skipped, {null} empty", live.torn());
    assert_eq!((fixed, null), (3 * 2000, 2000), "the fixed threads and the main thread read every time");
    assert_eq!(churn + live.torn(), 2000);
    assert_eq!(live.unreadable(), 0);
    finish(child);
}
