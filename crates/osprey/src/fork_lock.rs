//! A lock for the agent's process-wide state that the child of a `fork`
//! never waits on forever.
//!
//! `fork` copies a held lock held, and its holder (another thread of the
//! parent) does not exist in the child: a `std::sync::Mutex` stays locked
//! there for good, and the child's collector, or its `exit`, would wait on it
//! forever. A [`ForkLock`] records the process of its holder; a thread that
//! finds it held by another process takes it over.
//!
//! Invariant: the data under a [`ForkLock`] is valid at every instant of its
//! holder's critical section (a fork can stop the copy anywhere). Its users
//! keep their sections to single updates of plain values. Not for signal
//! handlers; waiters yield, then sleep: the sections are short or rare.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicI32, Ordering::*};

/// Mutual exclusion within one process; see the module documentation.
pub(crate) struct ForkLock<T> {
    /// The pid of the holder's process, 0 when free.
    holder: AtomicI32,
    data: UnsafeCell<T>,
}

// SAFETY: the data is reached only through a guard, held by one thread at a
// time within a process (the holder field is taken by compare-and-swap).
unsafe impl<T: Send> Sync for ForkLock<T> {}

/// Access to the data of a [`ForkLock`]; released on drop.
pub(crate) struct ForkLockGuard<'a, T> {
    lock: &'a ForkLock<T>,
}

impl<T> ForkLock<T> {
    pub const fn new(data: T) -> Self {
        ForkLock { holder: AtomicI32::new(0), data: UnsafeCell::new(data) }
    }

    /// Takes the lock, waiting for a holder of this process; a holder of
    /// another process (the parent this one was forked from) is taken over.
    pub fn lock(&self) -> ForkLockGuard<'_, T> {
        let mut spins = 0u32;
        loop {
            if let Some(g) = self.try_lock() {
                return g;
            }
            spins += 1;
            if spins < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        }
    }

    /// Takes the lock unless a thread of this process holds it.
    pub fn try_lock(&self) -> Option<ForkLockGuard<'_, T>> {
        // SAFETY: a plain id query (a system call: glibc caches no pid).
        let me = unsafe { libc::getpid() };
        match self.holder.compare_exchange(0, me, Acquire, Relaxed) {
            Ok(_) => Some(ForkLockGuard { lock: self }),
            Err(h) if h != me && self.holder.compare_exchange(h, me, Acquire, Relaxed).is_ok() => {
                Some(ForkLockGuard { lock: self })
            }
            Err(_) => None,
        }
    }
}

impl<T> std::ops::Deref for ForkLockGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard is the only access to the data (see `ForkLock`).
        unsafe { &*self.lock.data.get() }
    }
}

impl<T> std::ops::DerefMut for ForkLockGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and the guard is borrowed mutably.
        unsafe { &mut *self.lock.data.get() }
    }
}

impl<T> Drop for ForkLockGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.holder.store(0, Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    /// Excludes within a process: four threads adding under the lock lose no update.
    #[test]
    fn excludes_threads() {
        static L: ForkLock<u64> = ForkLock::new(0);
        let ts: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    for _ in 0..20_000 {
                        let mut g = L.lock();
                        let v = *g;
                        std::hint::black_box(&v);
                        *g = v + 1;
                    }
                })
            })
            .collect();
        ts.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(*L.lock(), 80_000);
    }

    /// A child forked while another thread holds the lock takes it, where a
    /// `std::sync::Mutex` would wait forever.
    #[test]
    fn a_forked_child_takes_a_lock_held_by_a_parent_thread() {
        static L: ForkLock<u32> = ForkLock::new(7);
        let held = Arc::new(AtomicBool::new(false));
        let release = Arc::new(AtomicBool::new(false));
        let (h, r) = (held.clone(), release.clone());
        let holder = std::thread::spawn(move || {
            let _g = L.lock();
            h.store(true, SeqCst);
            while !r.load(SeqCst) {
                std::thread::yield_now();
            }
        });
        while !held.load(SeqCst) {
            std::thread::yield_now();
        }
        // SAFETY: the child only takes the lock, reads it and calls `_exit`.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let v = *L.lock();
            // SAFETY: ends the child without running the test harness's exit path.
            unsafe { libc::_exit(if v == 7 { 0 } else { 1 }) };
        }
        assert!(pid > 0);
        let mut st = 0;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let ended = loop {
            // SAFETY: waiting for our own child.
            if unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG) } == pid {
                break true;
            }
            if std::time::Instant::now() > deadline {
                // SAFETY: killing and reaping our own child.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &mut st, 0);
                }
                break false;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        release.store(true, SeqCst);
        holder.join().unwrap();
        assert!(ended, "the child waited on the lock its parent's thread held");
        assert!(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0, "status {st:#x}");
    }
}
