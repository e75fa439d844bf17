//! Publishing an immutable value (the [`crate::ModuleSet`]) to signal
//! handlers, lock-free for readers, with safe reclamation of replaced values.
//!
//! # Protocol (two-slot epoch with reader counters)
//! - `current` points to the published value; `epoch` counts publications;
//!   `readers[e % 2]` counts readers that entered while `epoch == e`.
//! - Reader ([`Shared::read`], signal-safe): load `epoch` = e, increment
//!   `readers[e % 2]`, SeqCst fence (F_r), load `epoch` again; if it moved,
//!   undo and retry (at most [`READ_TRIES`] times, then give up: no value this
//!   time). Then load `current`, use it, decrement the same counter.
//! - Writer ([`Shared::publish`], one at a time under `writer`, never in a
//!   handler): swap `current` to the new value, bump `epoch` e -> e + 1, SeqCst
//!   fence (F_w), wait until `readers[e % 2] == 0`, free the old value.
//!
//! **Invariant R**: a value is freed only after every reader that may hold it
//! has left. Proof sketch: the two fences are ordered. If F_w comes first, the
//! reader's loads after F_r see the swap and the bump: either its recheck sees
//! the epoch moved (it retries) or it entered on the new epoch, and either way
//! it loads the new pointer. If F_r comes first, the writer's counter load
//! after F_w sees the reader's increment; the reader counts in `readers[e % 2]`
//! because a reader passing its recheck with an older epoch e - 1 had its F_r
//! before the previous writer's fence, so that writer already waited for it.
//! Readers entering after the bump count in the other slot, so the writer's
//! wait ends once the readers in flight leave (a handler's read lasts one
//! unwind). Without the fences (SeqCst loads and RMWs alone) the loom model
//! (which treats SeqCst accesses as acquire/release)
//! finds a use after free: that store-load pattern needs them.
//!
//! Readers never block and never spin unboundedly (bounded retries); the
//! writer waits (off the signal path). Loom model: `loom_tests` below.

use crate::sync::{fence, wait_step, AtomicPtr, AtomicUsize, Mutex, Ordering::SeqCst};

/// How many times a reader retries when a publication races its entry.
pub const READ_TRIES: u32 = 4;

/// A published value readers can use lock-free.
pub struct Shared<T> {
    current: AtomicPtr<T>,
    epoch: AtomicUsize,
    readers: [AtomicUsize; 2],
    writer: Mutex<()>,
}

// SAFETY: the value is only shared by `&T` (needs `Sync`) and moved to the
// writer's thread to be dropped (needs `Send`).
unsafe impl<T: Send + Sync> Sync for Shared<T> {}
// SAFETY: as above; `Shared` owns the value.
unsafe impl<T: Send + Sync> Send for Shared<T> {}

impl<T> Shared<T> {
    /// Publishes `value` as the first current value.
    pub fn new(value: T) -> Shared<T> {
        Shared {
            current: AtomicPtr::new(Box::into_raw(Box::new(value))),
            epoch: AtomicUsize::new(0),
            readers: [AtomicUsize::new(0), AtomicUsize::new(0)],
            writer: Mutex::new(()),
        }
    }

    /// Calls `f` with the current value; `None` if a publication raced the
    /// entry [`READ_TRIES`] times in a row. **Signal-safe**: atomics only.
    #[inline]
    pub fn read<R>(&self, f: impl FnOnce(&T) -> R) -> Option<R> {
        let slot = self.enter()?;
        // Leaves on drop (also if `f` unwinds, which handler code never does).
        let _guard = Leave(slot);
        let p = self.current.load(SeqCst);
        // SAFETY: `p` came from `Box::into_raw` and, by invariant R, is not
        // freed before this reader decrements `slot` (the guard, after `f`).
        Some(f(unsafe { &*p }))
    }

    fn enter(&self) -> Option<&AtomicUsize> {
        for _ in 0..READ_TRIES {
            let e = self.epoch.load(SeqCst);
            let slot = self.readers.get(e % 2)?;
            slot.fetch_add(1, SeqCst);
            fence(SeqCst); // F_r
            if self.epoch.load(SeqCst) == e {
                return Some(slot);
            }
            slot.fetch_sub(1, SeqCst);
        }
        None
    }

    /// Publishes `value`, then waits for the readers of the previous value and
    /// drops it. Not for a signal handler (locks, may sleep, frees).
    pub fn publish(&self, value: T) {
        let _w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.current.swap(Box::into_raw(Box::new(value)), SeqCst);
        let e = self.epoch.fetch_add(1, SeqCst);
        fence(SeqCst); // F_w
        let slot = &self.readers[e % 2];
        let mut round = 0;
        while slot.load(SeqCst) != 0 {
            wait_step(round);
            round = round.saturating_add(1);
        }
        // SAFETY: `old` came from `Box::into_raw`, is no longer reachable from
        // `current`, and no reader holds it (invariant R).
        unsafe { reclaim(old) };
    }
}

struct Leave<'a>(&'a AtomicUsize);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

/// Frees a replaced value. Under loom the value is dropped but its memory kept,
/// so a model can observe (instead of commit) a use after reclamation.
///
/// # Safety
/// `p` came from `Box::into_raw` and no one else uses it.
unsafe fn reclaim<T>(p: *mut T) {
    #[cfg(not(loom))]
    // SAFETY: see the function's contract.
    drop(unsafe { Box::from_raw(p) });
    #[cfg(loom)]
    // SAFETY: see the function's contract; the allocation is leaked.
    unsafe {
        std::ptr::drop_in_place(p)
    };
}

impl<T> Drop for Shared<T> {
    fn drop(&mut self) {
        // `&mut self`: no reader can be inside.
        // SAFETY: the pointer came from `Box::into_raw` and is owned by us.
        unsafe { reclaim(self.current.load(SeqCst)) };
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    /// A value that knows whether it has been dropped. Stress check of
    /// invariant R: readers must never see a dropped value.
    struct Probe {
        alive: AtomicBool,
        payload: Vec<u64>,
    }

    impl Drop for Probe {
        fn drop(&mut self) {
            self.alive.store(false, SeqCst);
            self.payload.iter_mut().for_each(|w| *w = 0xdead);
        }
    }

    fn probe(v: u64) -> Probe {
        Probe { alive: AtomicBool::new(true), payload: vec![v; 64] }
    }

    #[test]
    fn readers_never_see_a_freed_value() {
        let s = Arc::new(Shared::new(probe(0)));
        let stop = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (s, stop) = (s.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut reads = 0u64;
                    while !stop.load(SeqCst) || reads < 1000 {
                        s.read(|p| {
                            let first = p.payload[0];
                            std::hint::spin_loop();
                            assert!(p.alive.load(SeqCst), "read a reclaimed value");
                            assert!(p.payload.iter().all(|&w| w == first), "value changed under a reader");
                        });
                        reads += 1;
                    }
                    reads
                })
            })
            .collect();
        for i in 1..2000 {
            s.publish(probe(i));
        }
        stop.store(true, SeqCst);
        for r in readers {
            assert!(r.join().unwrap() > 0);
        }
        assert_eq!(s.read(|p| p.payload[0]), Some(1999));
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! Run: `RUSTFLAGS="--cfg loom" cargo test -p osprey-unwind --release --lib loom`
    //! Checks invariant R in every interleaving of readers and publishers.
    use super::*;
    use ::loom::sync::Arc;
    use ::loom::thread;
    use std::sync::atomic::AtomicBool;

    /// `alive` is a plain std atomic: reclaim under loom keeps the memory, so
    /// reading it after the drop is defined and reports the violation.
    struct Probe(AtomicBool, usize);

    impl Drop for Probe {
        fn drop(&mut self) {
            self.0.store(false, std::sync::atomic::Ordering::SeqCst);
        }
    }

    fn probe(v: usize) -> Probe {
        Probe(AtomicBool::new(true), v)
    }

    fn check(s: &Shared<Probe>) -> Option<usize> {
        s.read(|p| {
            assert!(p.0.load(std::sync::atomic::Ordering::SeqCst), "reader saw a reclaimed value");
            p.1
        })
    }

    #[test]
    fn loom_reader_vs_two_publications() {
        ::loom::model(|| {
            let s = Arc::new(Shared::new(probe(0)));
            let s2 = s.clone();
            let r = thread::spawn(move || check(&s2));
            s.publish(probe(1));
            s.publish(probe(2));
            let seen = r.join().unwrap();
            assert!(matches!(seen, None | Some(0..=2)));
            assert_eq!(check(&s), Some(2));
        });
    }

    #[test]
    fn loom_two_readers_two_writers() {
        let mut b = ::loom::model::Builder::new();
        b.preemption_bound = Some(3);
        b.check(|| {
            let s = Arc::new(Shared::new(probe(0)));
            let (s2, s3) = (s.clone(), s.clone());
            let r1 = thread::spawn(move || {
                let a = check(&s2);
                let b = check(&s2);
                (a, b)
            });
            let w = thread::spawn(move || s3.publish(probe(1)));
            let r2 = check(&s);
            s.publish(probe(2));
            w.join().unwrap();
            let _ = r1.join().unwrap();
            assert!(matches!(r2, None | Some(0..=2)));
        });
    }
}
