//! The program takes over one of osprey's signals: osprey steps aside.
//! Agent side (prints, sleeps); called by the preload library's interposed
//! `sigaction` family before the program's disposition is installed, and
//! by the collector once a second ([`check_dispositions`]) for programs that
//! link the agent (no interposition: the takeover is noticed after the fact).

use crate::cpu_clock;
use crate::dispositions::signal_pending_anywhere;
use crate::registry::Registry;
use crate::signal::STATE;
use std::sync::atomic::Ordering::*;

/// The program is about to install its own disposition for `signal`. If it
/// is one of osprey's, osprey steps aside first, with one line on stderr:
/// sampling stops (every clock closed, priming off), and the signals already
/// queued are left to osprey's handler (waited for, at most 200 ms), so the
/// program's handler never receives one. Returns whether osprey stepped aside.
/// `new_handler` is the handler being installed (osprey's own are let through).
pub fn step_aside(signal: i32, new_handler: usize) -> bool {
    let (sample, prime) = (STATE.sample_signal.load(Relaxed), STATE.prime_signal.load(Relaxed));
    if signal <= 0
        || (signal != sample && signal != prime)
        || new_handler == crate::signal::on_sample as *const () as usize
        || new_handler == crate::signal::on_prime as *const () as usize
        || !crate::ownership::owns_process()
    {
        return false;
    }
    let what = if signal == sample { "samples" } else { "finds threads" };
    if STATE.enabled.swap(false, SeqCst) {
        crate::say!("osprey: the program installs its own handler for signal {signal}, which osprey {what} with; profiling stops");
    }
    STATE.prime_signal.store(0, SeqCst);
    if let Some(reg) = Registry::get() {
        reg.for_each_active(|_, rec| cpu_clock::disarm(rec));
    }
    for _ in 0..100 {
        if !signal_pending_anywhere(sample) && !signal_pending_anywhere(prime) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    true
}

/// Whether a disposition of osprey's signals is no longer osprey's handler
/// (the program replaced it without the preload library seeing it); if so,
/// osprey steps aside as [`step_aside`] does. One `sigaction` query per signal.
pub(crate) fn check_dispositions() -> bool {
    if !STATE.enabled.load(Relaxed) {
        return false;
    }
    let ours = [
        (STATE.sample_signal.load(Relaxed), crate::signal::on_sample as *const () as usize),
        (STATE.prime_signal.load(Relaxed), crate::signal::on_prime as *const () as usize),
    ];
    for (signal, handler) in ours {
        if signal <= 0 {
            continue;
        }
        // SAFETY: querying a disposition into a zeroed struct.
        let current = unsafe {
            let mut sa: libc::sigaction = core::mem::zeroed();
            (libc::sigaction(signal, core::ptr::null(), &mut sa) == 0).then_some(sa.sa_sigaction)
        };
        if current.is_some_and(|h| h != handler) {
            return step_aside(signal, current.unwrap_or(0));
        }
    }
    false
}
