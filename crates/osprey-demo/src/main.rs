//! `osprey-demo [--threads N] [--seconds S] [--rounds R]`: burns CPU split
//! 50/30/20 between `work_a`, `work_b` and `work_c` on N worker threads.

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let get = |flag: &str, default: f64| -> f64 {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .map(|v| v.parse().unwrap_or_else(|_| panic!("{flag} takes a number")))
            .unwrap_or(default)
    };
    let threads = get("--threads", 2.0) as usize;
    let rounds = get("--rounds", 0.0) as u64;
    let seconds = get("--seconds", 3.0);
    if rounds > 0 {
        osprey_demo::on_threads(threads, move || {
            osprey_demo::split_work(rounds);
        });
    } else {
        let d = std::time::Duration::from_secs_f64(seconds);
        osprey_demo::on_threads(threads, move || {
            osprey_demo::split_work_for(d);
        });
    }
}
