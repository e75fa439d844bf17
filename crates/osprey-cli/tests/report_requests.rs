//! `osprey report --span/--trace` and `--timeline` on a real service loop
//! (tests/c/requests.c, through the C context ABI): 50 requests of ~2 ms of
//! CPU, every 10th with a ~40 ms slow path, run under `osprey exec --hz
//! 1000` with the timeline on.

use osprey_pprof::pprof::Profile;
use osprey_testkit::cc::compile_c;
use osprey_testkit::cli::{exec_into, osprey_ok};
use osprey_testkit::paths::crate_dir;
use osprey_testkit::profile::{cpu_in_span, function_names};
use osprey_testkit::readers::chromium_dom;
use osprey_testkit::tempdir;
use std::path::PathBuf;
use std::sync::OnceLock;

/// The run: its output directory and the (span, local root span) ids of
/// the slow requests, as the program printed them.
struct Run {
    out: PathBuf,
    slow: Vec<(u64, u64)>,
}

fn run() -> &'static Run {
    static RUN: OnceLock<Run> = OnceLock::new();
    RUN.get_or_init(|| {
        let dir = tempdir("requests");
        let exe = compile_c(&crate_dir("osprey-cli").join("tests/c/requests.c"), &dir.join("requests"), &["-ldl"]);
        let out = dir.join("profiles");
        let o = exec_into(&out, &["--hz", "1000"], &[exe.as_os_str()], &[("OSPREY_TIMELINE", "1")]);
        let slow = String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| {
                let mut f = l.strip_prefix("slow ")?.split(' ').map(|n| n.parse::<u64>().unwrap());
                Some((f.next()?, f.next()?))
            })
            .collect::<Vec<_>>();
        assert_eq!(slow.len(), 5, "five slow requests");
        Run { out, slow }
    })
}

/// `osprey report OUT ARGS --format pprof` of the run, decoded.
fn report_pprof(args: &[&str]) -> Profile {
    osprey_testkit::cli::report_pprof(&run().out, args)
}

#[test]
fn span_of_a_slow_request_shows_its_40_ms_and_nothing_else() {
    let (span, root) = run().slow[1];
    let p = report_pprof(&["--span", &span.to_string()]);
    let (cpu, only) = cpu_in_span(&p, span);
    assert!(only, "a sample of another request under --span {span}");
    // 40 ms slow path + 2 ms fast path, sampled every ms of CPU.
    assert!((30_000_000..=60_000_000).contains(&cpu), "--span {span}: {} ms", cpu / 1_000_000);
    let slow_path = p.sample.iter().filter(|s| function_names(&p, s).contains(&"slow_path")).count();
    assert!(slow_path * 2 > p.sample.len(), "its stack is slow_path's: {slow_path} of {}", p.sample.len());
    // The same span in hex, 0x-prefixed or 16 digits, and by its local root.
    for id in [format!("{span:#x}"), format!("{span:016x}"), format!("{root:016x}")] {
        assert_eq!(cpu_in_span(&report_pprof(&["--span", &id]), span), (cpu, true), "--span {id}");
    }
    // --trace: a 128-bit id whose low 64 bits are the local root span id.
    let trace = format!("4bf92f3577b34da6{root:016x}");
    assert_eq!(cpu_in_span(&report_pprof(&["--trace", &trace]), span), (cpu, true), "--trace {trace}");
    // A fast request: ~2 ms, no slow_path.
    let fast = report_pprof(&["--span", &(span - 1).to_string()]);
    let (fast_cpu, only) = cpu_in_span(&fast, span - 1);
    assert!(only && fast_cpu < 10_000_000, "fast request: {} ms", fast_cpu / 1_000_000);
    // The top table of the span names the slow path.
    let top = osprey_ok(&["report", run().out.to_str().unwrap(), "--span", &format!("{span:#x}")]);
    assert!(top.lines().any(|l| l.ends_with(" slow_path")), "{top}");
}

#[test]
fn timeline_renders_and_a_click_shows_the_stack() {
    let r = run();
    let html = r.out.with_extension("timeline.html");
    osprey_ok(&["report", r.out.to_str().unwrap(), "--timeline", html.to_str().unwrap()]);
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(!page.contains("src=\"http") && !page.contains("href=\"http"), "self-contained");
    let slow = format!("{:#018x}", r.slow[0].0);
    // Clicks the first bar whose stack has slow_path and the slow request's
    // band, copying what the page shows after each click into the DOM.
    let script = format!(
        r#"
        const copy = (id) => document.body.insertAdjacentHTML('beforeend',
            '<pre id="' + id + '">' + document.getElementById('detail').textContent + '</pre>');
        const click = (el) => el.dispatchEvent(new MouseEvent('click', {{bubbles: true}}));
        const bars = Array.from(document.querySelectorAll('rect[data-seg]'));
        copy('bars-' + bars.length);
        for (const b of bars) {{
            click(b);
            if (document.getElementById('detail').textContent.includes('slow_path')) {{ copy('clicked-bar'); break; }}
        }}
        const band = document.querySelector('rect[data-id="{slow}"]');
        if (band) {{ click(band); copy('clicked-band'); }}
        "#
    );
    let Some(dom) = chromium_dom(&html, &script) else { return };
    let block = |id: &str| {
        let at = dom.find(&format!("<pre id=\"{id}\">")).unwrap_or_else(|| panic!("no #{id} in the DOM"));
        dom[at..at + dom[at..].find("</pre>").unwrap()].to_string()
    };
    assert!(!dom.contains("<pre id=\"bars-0\">"), "no bar drawn");
    let bar = block("clicked-bar");
    assert!(bar.contains("slow_path") && bar.contains("handle_request") && bar.contains("main"), "{bar}");
    let band = block("clicked-band");
    assert!(band.contains(&slow), "{band}");
    let ms: f64 = band.split(" sample(s), ").nth(1).and_then(|v| v.strip_suffix(" ms")).unwrap().parse().unwrap();
    assert!((30.0..=60.0).contains(&ms), "the slow span's band: {band}");
    // A band per request sampled (each of the 50 has 2 ms of CPU or more: 2 samples).
    let bands = dom.matches("class=\"span").count();
    assert!((45..=50).contains(&bands), "{bands} bands for 50 requests");
}

#[test]
fn speedscope_of_the_run_is_valid_with_the_span_alone() {
    let r = run();
    let (span, _) = r.slow[2];
    let out = r.out.with_extension("span.speedscope.json");
    let id = format!("{span:#x}");
    osprey_ok(&[
        "report",
        r.out.to_str().unwrap(),
        "--format",
        "speedscope",
        "--span",
        &id,
        "-o",
        out.to_str().unwrap(),
    ]);
    osprey_testkit::readers::validate_json(&osprey_testkit::readers::speedscope_schema(), &out)
        .unwrap_or_else(|e| panic!("not valid speedscope: {e}"));
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let profiles = doc["profiles"].as_array().unwrap();
    assert_eq!(profiles.len(), 1, "one thread ran the request");
    let ms = profiles[0]["endValue"].as_f64().unwrap() / 1e6;
    assert!((30.0..=60.0).contains(&ms), "{ms} ms");
}
