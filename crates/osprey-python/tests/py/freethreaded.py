"""Workloads for the free-threaded (3.13t) tests: threads that run Python at
once on every core. Each mode prints one line per thread at the end:
`thread NATIVE_ID NAME THREAD_TIME_NS` (the thread's own time.thread_time_ns()).

  threads SECS   four threads, each in its own function, all busy (and a
                 thread blocked on a lock meanwhile)
  split SECS     two threads: hot60 busy all the time, hot40 two thirds of it
  churn SECS     threads started and joined in a loop, the main thread busy too
  attach SECS    as `threads`, after a `ready` line (for osprey attach)
"""
import sys
import threading
import time
import types

results = []
lock = threading.Lock()


def report():
    with lock:
        results.append((threading.get_native_id(), threading.current_thread().name, time.thread_time_ns()))


def burn(ms):
    end = time.thread_time() + ms / 1000.0
    x = 0
    while time.thread_time() < end:
        for i in range(1000):
            x += i
    return x


def spin(stop):
    while not stop.is_set():
        burn(5)
    report()


def named(f, name):
    """A copy of f whose code object is called name: its frames show that name."""
    return types.FunctionType(f.__code__.replace(co_name=name, co_qualname=name), f.__globals__, name)


# Four busy functions, one per thread, told apart by name in the stacks.
SPINNERS = [named(spin, "spin_" + n) for n in ("alpha", "beta", "gamma", "delta")]


def hot60(stop):
    while not stop.is_set():
        burn(15)
    report()


def hot40(stop):
    # 10 ms of CPU, then 5 ms asleep: two thirds of hot60's CPU.
    while not stop.is_set():
        burn(10)
        time.sleep(0.005)
    report()


def short_lived(n):
    x = 0
    for i in range(n):
        x += i
    return x


def wait_for_gate(gate):
    with gate:
        pass


def run_threads(targets, secs):
    """Runs each target in a thread for secs, and one more thread blocked
    on a lock the main thread holds meanwhile (the main thread sleeps)."""
    stop = threading.Event()
    gate = threading.Lock()
    gate.acquire()
    ts = [threading.Thread(target=f, args=(stop,), name="worker-" + f.__name__) for f in targets]
    ts.append(threading.Thread(target=wait_for_gate, args=(gate,), name="waiter"))
    for t in ts:
        t.start()
    time.sleep(secs)
    gate.release()
    stop.set()
    for t in ts:
        t.join()


def churn(secs):
    end = time.monotonic() + secs
    started = 0
    while time.monotonic() < end:
        ts = [threading.Thread(target=short_lived, args=(100000,)) for _ in range(4)]
        for t in ts:
            t.start()
        short_lived(100000)
        for t in ts:
            t.join()
        started += len(ts)
    print("started", started)


def main():
    mode, secs = sys.argv[1], float(sys.argv[2])
    if sys._is_gil_enabled():
        sys.exit("the GIL is enabled: not a free-threaded run")
    if mode == "threads":
        run_threads(SPINNERS, secs)
    elif mode == "split":
        run_threads([hot60, hot40], secs)
    elif mode == "churn":
        churn(secs)
    elif mode == "attach":
        print("ready", flush=True)
        run_threads(SPINNERS, secs)
    else:
        sys.exit("unknown mode " + mode)
    for tid, name, ns in results:
        print("thread", tid, name, ns)


main()
