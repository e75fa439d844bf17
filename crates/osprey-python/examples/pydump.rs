//! Debug helper: `pydump PID [tls|tss|lists|cache]` prints one sampling pass.
use osprey_python::{open_target, Method, Sampler};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let pid: i32 = args.get(1).and_then(|a| a.parse().ok()).expect("usage: pydump PID [method]");
    let method = args.get(2).map(|m| match m.as_str() {
        "tls" => Method::Tls,
        "tss" => Method::Tss,
        "lists" => Method::Lists,
        _ => Method::Cache,
    });
    let t = match open_target(pid) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    eprintln!(
        "python {} module {} tls {:?} ({:?}) pthread {:?} ({:?}) debug_offsets {}",
        t.version, t.module.path, t.tls, t.tls_error, t.pthread, t.pthread_error, t.debug_offsets
    );
    let mut s = Sampler::new(t, method).unwrap_or_else(|e| panic!("{e}"));
    for ts in osprey_python::threads::list_tstates(&s.target).unwrap() {
        eprintln!("list: {ts:x?}");
    }
    eprintln!("gils: {:x?}", s.gils());
    for _ in 0..std::env::var("N").ok().and_then(|n| n.parse().ok()).unwrap_or(0) { let _ = s.sample(); }
    match s.sample() {
        Ok(v) => {
            for t in v {
                println!("tid {} {:?} {} tstate {:#x}", t.tid, t.name, t.state, t.tstate);
                for f in &t.frames {
                    println!("    {f:?}");
                }
            }
        }
        Err(_) => println!("gone"),
    }
}
