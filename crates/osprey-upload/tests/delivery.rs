//! The uploader against loopback backends that fail: outage, 5xx, 429 with
//! Retry-After, 4xx, a backend that never answers at exit, a full queue.
//! Figures are printed (`cargo test -p osprey-upload --test delivery -- --nocapture`).

use osprey_testkit::backends::*;
use osprey_upload::{Flags, Language, Meta, UploadConfig, Uploader};
use std::net::TcpListener;
use std::time::{Duration, Instant};

fn config(pyroscope_url: &str) -> UploadConfig {
    let flags = Flags { pyroscope: Some(pyroscope_url.into()), service: Some("svc".into()), ..Default::default() };
    let mut c = UploadConfig::resolve(&flags, "test", &|_| None).unwrap();
    c.retry_base = Duration::from_millis(50);
    c.retry_max = Duration::from_millis(400);
    c.timeout = Duration::from_secs(2);
    c
}

fn meta() -> Meta {
    Meta::new("rt-1", std::process::id() as i32, Language::Python)
}

fn submit(u: &Uploader, data: &osprey_pprof::ProfileData) {
    let p = osprey_pprof::to_pprof(data);
    u.submit_profile(&p);
}

#[test]
fn outage_of_two_periods_loses_nothing() {
    // A port nobody listens on (connection refused), then a backend on it.
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}");
    let mut u = Uploader::start(config(&url), meta(), Duration::from_secs(60));
    let mut taken = 0;
    for i in 0..3 {
        let d = profile(50 + i, 3, false);
        taken += d.samples.iter().map(|s| s.values[0]).sum::<i64>();
        submit(&u, &d);
        std::thread::sleep(Duration::from_millis(300)); // a "period"
    }
    assert_eq!(u.stats()[0].delivered, 0);
    assert!(u.stats()[0].retries >= 2, "{:?}", u.stats());
    let r = Receiver::start_on(TcpListener::bind(("127.0.0.1", port)).unwrap(), |_, _| ok());
    let d = profile(10, 1, false);
    taken += d.samples.iter().map(|s| s.values[0]).sum::<i64>();
    submit(&u, &d);
    let reqs = r.wait_for(4, Duration::from_secs(10));
    let stats = u.shutdown(Duration::from_secs(5));
    assert_eq!(reqs.len(), 4, "{stats:?}");
    let delivered: i64 = reqs.iter().map(|q| sample_count(&q.body)).sum();
    // In order, contiguous.
    let from: Vec<i64> = reqs.iter().map(|q| q.query("from").unwrap().parse().unwrap()).collect();
    let until: Vec<i64> = reqs.iter().map(|q| q.query("until").unwrap().parse().unwrap()).collect();
    assert!(from.windows(2).all(|w| w[0] <= w[1]));
    for i in 1..4 {
        assert!(from[i] <= until[i - 1] && until[i - 1] <= from[i] + 1, "{from:?} {until:?}");
    }
    eprintln!("outage: samples taken {taken}, delivered {delivered}, lost {}; {:?}", taken - delivered, stats[0]);
    assert_eq!(delivered, taken);
    assert_eq!((stats[0].delivered, stats[0].dropped, stats[0].queued), (4, 0, 0));
}

#[test]
fn server_errors_are_retried_until_accepted() {
    let r = Receiver::start(|n, _| if n < 2 { Answer::Status(503, vec![], "busy".into()) } else { ok() });
    let mut u = Uploader::start(config(&r.url), meta(), Duration::from_secs(60));
    submit(&u, &profile(5, 2, false));
    let reqs = r.wait_for(3, Duration::from_secs(10));
    let stats = u.shutdown(Duration::from_secs(5));
    assert_eq!(reqs.len(), 3);
    assert_eq!(reqs[0].body, reqs[2].body, "the same profile again");
    assert_eq!((stats[0].delivered, stats[0].retries, stats[0].rejected), (1, 2, 0));
}

#[test]
fn too_many_requests_waits_for_retry_after() {
    let r = Receiver::start(|n, _| {
        if n == 0 {
            Answer::Status(429, vec![("Retry-After".into(), "1".into())], "slow down".into())
        } else {
            ok()
        }
    });
    let mut u = Uploader::start(config(&r.url), meta(), Duration::from_secs(60));
    let t = Instant::now();
    submit(&u, &profile(5, 2, false));
    let reqs = r.wait_for(2, Duration::from_secs(10));
    let waited = t.elapsed();
    let stats = u.shutdown(Duration::from_secs(5));
    assert_eq!(reqs.len(), 2);
    assert!(waited >= Duration::from_millis(950), "retried after {waited:?} (backoff base is 50 ms)");
    assert_eq!(stats[0].delivered, 1);
}

#[test]
fn client_errors_are_not_retried_and_counted() {
    let r = Receiver::start(|_, _| Answer::Status(403, vec![], "{\"errors\":[\"Forbidden\"]}".into()));
    let mut u = Uploader::start(config(&r.url), meta(), Duration::from_secs(60));
    submit(&u, &profile(5, 2, false));
    r.wait_for(1, Duration::from_secs(5));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(r.count(), 1, "a 403 is not retried");
    let comments = u.take_comments();
    assert!(comments.iter().any(|c| c.contains("1 refused") && c.contains("403")), "{comments:?}");
    assert!(u.take_comments().is_empty(), "reported once");
    assert_eq!(u.shutdown(Duration::from_secs(1))[0].rejected, 1);
}

#[test]
fn a_hung_backend_does_not_hold_the_exit() {
    let r = Receiver::start(|_, _| Answer::Hang);
    let mut cfg = config(&r.url);
    cfg.timeout = Duration::from_secs(10);
    let mut u = Uploader::start(cfg, meta(), Duration::from_secs(60));
    submit(&u, &profile(5, 2, false));
    r.wait_for(1, Duration::from_secs(5));
    let t = Instant::now();
    let stats = u.shutdown(Duration::from_millis(500));
    let took = t.elapsed();
    eprintln!("hung backend: shutdown(500 ms) returned after {took:?}; {:?}", stats[0]);
    assert!(took < Duration::from_millis(900), "{took:?}");
    assert_eq!((stats[0].delivered, stats[0].queued), (0, 1));
}

#[test]
fn a_full_queue_drops_the_oldest_and_counts() {
    let r = Receiver::start(|n, _| if n == 0 { Answer::Hang } else { ok() });
    let mut cfg = config(&r.url);
    cfg.timeout = Duration::from_millis(1500);
    let mut u = Uploader::start(cfg, meta(), Duration::from_secs(60));
    let mut sizes = Vec::new();
    for i in 0..8 {
        let d = profile(20 + i, 1, false);
        sizes.push(d.samples.len() as i64);
        submit(&u, &d);
        if i == 0 {
            r.wait_for(1, Duration::from_secs(5));
        }
    }
    let s = u.stats();
    assert_eq!((s[0].queued, s[0].dropped), (5, 3), "{s:?}");
    let comments = u.take_comments();
    assert!(comments.iter().any(|c| c.contains("3 profiles dropped")), "{comments:?}");
    // The first (hung) request times out; the 5 newest are then delivered.
    let reqs = r.wait_for(6, Duration::from_secs(10));
    let stats = u.shutdown(Duration::from_secs(5));
    let got: Vec<i64> = reqs[1..].iter().map(|q| sample_count(&q.body)).collect();
    assert_eq!(got, sizes[3..].to_vec(), "the oldest were dropped");
    eprintln!("full queue: 8 submitted, 3 dropped (oldest), 5 delivered; {:?}", stats[0]);
}

#[test]
fn queue_memory_is_bounded_by_bytes() {
    let r = Receiver::start(|_, _| Answer::Hang);
    let mut cfg = config(&r.url);
    let one = encoded(&profile(2000, 1, false)).len();
    cfg.queue_bytes = one * 2 + one / 2;
    let mut u = Uploader::start(cfg.clone(), meta(), Duration::from_secs(60));
    for _ in 0..4 {
        submit(&u, &profile(2000, 1, false));
    }
    let s = &u.stats()[0];
    assert!(s.queued_bytes <= cfg.queue_bytes && s.queued == 2 && s.dropped == 2, "{s:?}");
    u.shutdown(Duration::from_millis(100));
}

/// Figures for the README: a 10k-stack profile through every backend.
#[test]
fn figures_for_a_10k_stack_profile() {
    let r = Receiver::start(|_, _| ok());
    let flags = Flags {
        datadog: Some(r.url.clone()),
        pyroscope: Some(r.url.clone()),
        otlp: Some(r.url.clone()),
        ..Default::default()
    };
    let mut cfg = UploadConfig::resolve(&flags, "figures", &|_| None).unwrap();
    cfg.retry_base = Duration::from_millis(50);
    let data = profile(10_000, 1, true);
    let pprof = encoded(&data);
    let mut u = Uploader::start(cfg.clone(), meta(), Duration::from_secs(60));
    let t = Instant::now();
    u.submit(pprof.clone(), data.start_realtime_ns, data.start_realtime_ns + data.duration_ns);
    let submit_took = t.elapsed();
    r.wait_for(3, Duration::from_secs(30));
    let stats = u.shutdown(Duration::from_secs(10));
    eprintln!(
        "10k stacks: pprof {} bytes ({} gzip); submit() {:?}; queue at bound (5 profiles) {} bytes",
        pprof.len(),
        osprey_pprof::pprof::Profile::default().string_table.len() + gzip_len(&pprof),
        submit_took,
        pprof.len() * 5
    );
    for s in &stats {
        eprintln!("  {}: {} bytes sent, encode CPU {:.1} ms", s.backend, s.bytes_sent, s.encode_cpu_ns as f64 / 1e6);
        assert_eq!(s.delivered, 1);
    }
    assert!(submit_took < Duration::from_millis(50), "submit never waits for I/O: {submit_took:?}");
}

fn gzip_len(b: &[u8]) -> usize {
    use std::io::Write;
    let mut g = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    g.write_all(b).unwrap();
    g.finish().unwrap().len()
}
