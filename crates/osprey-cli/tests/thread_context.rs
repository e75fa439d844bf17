//! OpenTelemetry thread contexts (OTEP 4947) of another process: `osprey
//! dump` shows each thread's ids and attributes, `osprey attach` labels
//! each sample with the span its thread was in; the target runs as it would
//! have. The writer is `tests/c/otel_spans.c`, not osprey's agent.
//!
//! Needs the osprey binary built (`cargo build -p osprey-cli`), a C
//! compiler, ptrace and perf_event_open allowed on one's own processes.

use osprey_testkit::cc::compile_c;
use osprey_testkit::cli::osprey_output;
use osprey_testkit::profile::label;
use osprey_testkit::{osprey, tempdir};
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// `tests/c/otel_spans.c` built into `dir`, exporting its TLS symbol.
fn otel_spans(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/otel_spans.c");
    compile_c(&src, &dir.join("otel_spans"), &["-rdynamic", "-pthread"])
}

/// `osprey dump --pid PID [--json]`: its stdout and stderr.
fn dump(pid: u32, json: bool) -> (String, String) {
    let pid = pid.to_string();
    let o = osprey_output(&[&["dump", "--pid", &pid][..], if json { &["--json"] } else { &[] }].concat());
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{:?}\n{stderr}", o.status);
    (String::from_utf8(o.stdout).unwrap(), stderr)
}

#[test]
fn dump_shows_the_ids_each_thread_published() {
    let dir = tempdir("otel-dump");
    let bin = otel_spans(&dir);
    let mut child =
        Command::new(&bin).args(["hold", "3"]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    // tid -> (trace, span), as the program printed them.
    let mut wrote: HashMap<i64, (String, String)> = HashMap::new();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    loop {
        let mut l = String::new();
        assert!(out.read_line(&mut l).unwrap() > 0, "target ended before ready");
        match l.split_whitespace().collect::<Vec<_>>()[..] {
            ["ready"] => break,
            ["ctx", tid, trace, span] => {
                wrote.insert(tid.parse().unwrap(), (trace.into(), span.into()));
            }
            _ => panic!("unexpected line {l:?}"),
        }
    }
    let pid = child.id();
    let (json, _) = dump(pid, true);
    let (text, _) = dump(pid, false);
    drop(child.stdin.take());
    assert_eq!(child.wait().unwrap().code(), Some(0), "the target did not end as it would have");

    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let threads = v["threads"].as_array().unwrap();
    assert_eq!(threads.len(), 4, "{v}");
    for t in threads {
        let tid = t["tid"].as_i64().unwrap();
        match wrote.get(&tid) {
            Some((trace, span)) => {
                assert_eq!(t["trace_id"].as_str(), Some(trace.as_str()), "{t}");
                assert_eq!(t["span_id"].as_str(), Some(span.as_str()), "{t}");
                let i = span.chars().last().unwrap();
                assert_eq!(t["attributes"], serde_json::json!({ "#0": format!("/thread/{i}") }), "{t}");
                let line = text.lines().find(|l| l.starts_with(&format!("thread {tid} "))).unwrap();
                assert!(line.ends_with(&format!(" trace {trace} span {span} #0=\"/thread/{i}\"")), "{line}");
            }
            // The main thread published nothing.
            None => assert!(t.get("trace_id").is_none() && t.get("attributes").is_none(), "{t}"),
        }
    }
}

#[test]
fn dump_of_a_process_without_contexts_adds_nothing() {
    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let (json, stderr) = dump(child.id(), true);
    let (text, _) = dump(child.id(), false);
    child.kill().unwrap();
    let _ = child.wait();
    assert!(!json.contains("trace_id") && !json.contains("span_id") && !json.contains("attributes"), "{json}");
    assert!(!text.contains(" trace ") && !stderr.contains("context"), "{text}\n{stderr}");
}

/// One span a thread was in: (span id, wall-clock start and end in ns).
type Span = (u64, i64, i64);

#[test]
fn attach_labels_samples_with_the_span_of_their_thread() {
    let dir = tempdir("otel-attach");
    let bin = otel_spans(&dir);
    let args = ["switch", "3", "8", "300"];
    let alone = Command::new(&bin).args(args).output().unwrap();

    let target = Command::new(&bin).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let out = dir.join("out");
    let o = Command::new(osprey())
        .args(["attach", "--pid", &target.id().to_string(), "--hz", "200", "--out"])
        .arg(&out)
        .env("OSPREY_TIMELINE", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{:?}\n{stderr}", o.status);
    let ran = target.wait_with_output().unwrap();
    assert_eq!(ran.status.code(), alone.status.code(), "exit status changed under attach");
    assert_eq!(ran.stdout, alone.stdout, "output changed under attach");
    assert_eq!(ran.status.code(), Some(3));

    let mut spans: HashMap<i64, Vec<Span>> = HashMap::new();
    for l in String::from_utf8_lossy(&ran.stderr).lines() {
        if let ["span", tid, span, start, end] = l.split_whitespace().collect::<Vec<_>>()[..] {
            let span = u64::from_str_radix(span, 16).unwrap();
            spans.entry(tid.parse().unwrap()).or_default().push((span, start.parse().unwrap(), end.parse().unwrap()));
        }
    }
    assert_eq!(spans.values().map(Vec::len).sum::<usize>(), 24, "{}", String::from_utf8_lossy(&ran.stderr));

    let (mut right, mut total) = (0i64, 0i64);
    for e in std::fs::read_dir(&out).unwrap().flatten() {
        let p = osprey_pprof::read_profile(&e.path()).unwrap();
        for s in &p.sample {
            let Some((_, tid)) = label(&p, s, "thread id") else { continue };
            let Some((_, at)) = label(&p, s, osprey_pprof::TIMESTAMP_LABEL) else { continue };
            let Some(&(want, _, _)) = spans.get(&tid).and_then(|v| v.iter().find(|&&(_, a, b)| a <= at && at < b))
            else {
                continue; // not a worker, or outside its spans
            };
            let n = s.value[0];
            total += n;
            let got = label(&p, s, "span id").map(|(_, v)| v as u64);
            let trace = label(&p, s, "trace id").map(|(t, _)| t.to_string());
            let root = label(&p, s, "local root span id").map(|(_, v)| v as u64);
            let i = (want >> 16) & 0xff;
            if got == Some(want)
                && trace == Some(format!("4bf92f3577b34da6{:016x}", 0x1000 + i))
                && root == Some(0x1000 + i)
            {
                right += n;
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let share = right as f64 * 100.0 / total.max(1) as f64;
    eprintln!("{right} of {total} worker samples carry their thread's span ({share:.1}%)\n{stderr}");
    assert!(total >= 50, "{total} worker samples");
    assert!(share >= 90.0, "{share:.1}% of the samples carry the span their thread was in");
}
