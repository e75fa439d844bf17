//! Thread labels survive the thread: a named thread that burns CPU for a
//! moment and exits before the next drain is still labelled with its name.

use std::time::Duration;

#[test]
fn short_lived_thread_keeps_its_name() {
    let dir = std::env::temp_dir().join(format!("osprey-labels-{}", std::process::id()));
    let p = osprey::Profiler::builder().out_dir(&dir).hz(1000).start().unwrap();
    std::thread::sleep(Duration::from_millis(30));
    std::thread::Builder::new()
        .name("short-lived".into())
        .spawn(|| {
            let _r = osprey::register_current_thread();
            let end = std::time::Instant::now() + Duration::from_millis(60);
            let mut x = 0u64;
            while std::time::Instant::now() < end {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        })
        .unwrap()
        .join()
        .unwrap();
    let files = p.stop();
    let prof = osprey::export::read_profile(&files[0]).unwrap();
    let named: i64 = prof
        .sample
        .iter()
        .filter(|s| {
            s.label.iter().any(|l| {
                prof.string_table[l.key as usize] == "thread name" && prof.string_table[l.str as usize] == "short-lived"
            })
        })
        .map(|s| s.value[0])
        .sum();
    assert!(named >= 20, "only {named} samples labelled with the exited thread's name");
    let _ = std::fs::remove_dir_all(dir);
}
