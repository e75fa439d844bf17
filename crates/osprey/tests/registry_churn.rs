//! Churn: 10,000 short-lived threads under a running profiler with
//! a pool of 64 — every record comes back to the free list, none leak.

use osprey::internals::record::RecordState;
use osprey::internals::registry::{Registry, RegistryConfig};
use std::time::{Duration, Instant};

#[test]
fn ten_thousand_threads_leave_no_record_behind() {
    // This binary's registry: 64 records, no growth.
    let reg = Registry::get_or_init(RegistryConfig { capacity: 64, growable: false }).unwrap();
    let dir = std::env::temp_dir().join(format!("osprey-churn-{}", std::process::id()));
    let p = osprey::Profiler::builder().out_dir(&dir).hz(1000).threads(64, false).start().unwrap();
    let mut made = 0;
    while made < 10_000 {
        // 16 at a time; even ones register themselves (thread-start path), odd
        // ones are left to discovery or to nobody if they die first.
        let hs: Vec<_> = (0..16)
            .map(|i| {
                std::thread::spawn(move || {
                    let _r = (i % 2 == 0).then(osprey::register_current_thread);
                    let mut x = 0u64;
                    for k in 0..20_000u64 {
                        x = std::hint::black_box(x.wrapping_add(k));
                    }
                })
            })
            .collect();
        made += hs.len();
        for h in hs {
            h.join().unwrap();
        }
    }
    // Records of dead threads are retired by the scan and recycled by the drain.
    let live = |reg: &Registry| {
        let mut n = 0;
        reg.for_each_active(|_, r| {
            if r.state() == RecordState::Claimed {
                n += 1
            }
        });
        n
    };
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let mut retired = 0;
        reg.for_each_active(|_, r| {
            if r.state() == RecordState::Retired {
                retired += 1
            }
        });
        let threads_alive = osprey::internals::threads::list_threads().unwrap().len();
        let claimed = live(reg);
        if retired == 0 && claimed <= threads_alive && reg.free_count() + claimed == 64 {
            break;
        }
        assert!(
            Instant::now() < end,
            "records leaked: free {} claimed {claimed} retired {retired} threads alive {threads_alive}",
            reg.free_count()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(reg.capacity(), 64, "pool grew although growth was disabled");
    drop(p);
    let _ = std::fs::remove_dir_all(dir);
}
