"""Workloads for the Python tests, the CLI tests and the py-spy bench: see MODES at the end."""
import gc
import os
import sys
import threading
import time
import zlib

# A round of f50+f30+f20 takes 6-11 ms (3.8-3.13 here).
N = 20000


def f50():
    x = 0
    for i in range(5 * N):
        x += i
    return x


def f30():
    x = 0
    for i in range(3 * N):
        x += i
    return x


def f20():
    x = 0
    for i in range(2 * N):
        x += i
    return x


def one_round(t):
    """f50, f30, f20 once; adds the CPU time (ns) each took to t (the ground truth)."""
    ct = time.thread_time_ns
    a = ct()
    f50()
    b = ct()
    f30()
    c = ct()
    f20()
    d = ct()
    t[0] += b - a
    t[1] += c - b
    t[2] += d - c


def split(truth_path=None):
    # Cumulative truth rewritten in place every 16 rounds.
    fd = os.open(truth_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC) if truth_path else None
    t = [0, 0, 0]
    rounds = 0
    while True:
        rounds += 1
        one_round(t)
        if fd is not None and rounds % 16 == 0:
            os.pwrite(fd, ("%020d %020d %020d\n" % tuple(t)).encode(), 0)


def sleeper():
    while True:
        time.sleep(0.2)


def compressor(half_busy=False):
    # Half busy: on 2 cores the sampler still has CPU to run on.
    data = os.urandom(1 << 20 if half_busy else 1 << 22)
    while True:
        t = time.monotonic()
        zlib.compress(data, 1)
        if half_busy:
            time.sleep(time.monotonic() - t)


def spinner():
    while True:
        f20()


class Node:
    def __init__(self):
        self.me = self


def make_cycles(n):
    for _ in range(n):
        Node()


def garbage():
    """Cyclic garbage: automatic collections while allocating, and explicit ones."""
    while True:
        make_cycles(20000)
        gc.collect()


async def worker():
    while True:
        f20()
        await asyncio.sleep(0)


async def tasks():
    import asyncio
    await asyncio.gather(asyncio.create_task(worker(), name="alpha"), asyncio.create_task(worker()))


def ready():
    print("ready", flush=True)


# MODES: workload.py MODE [ARG]; the long-running modes print "ready" when set up.
#   split [TRUTH_FILE]  50/30/20 forever, cumulative CPU per function in TRUTH_FILE
#   states | threads    threads sleeping, compressing, spinning
#   garbage             cyclic garbage and collections, forever
#   tasks               two asyncio tasks spinning: "alpha" and an unnamed one
#   short SECS          f20 for SECS
#   exec SECS           50/30/20 for SECS beside a sleeper and a half-busy
#                       compressor; prints "truth A B C" (ns) and exits 7
#   bench ROUNDS        ROUNDS rounds of 50/30/20; prints "wall S truth P50 P30 P20"
mode = sys.argv[1]
if mode == "split":
    ready()
    split(sys.argv[2] if len(sys.argv) > 2 else None)
elif mode == "states":
    threading.Thread(target=sleeper, name="sleeper", daemon=True).start()
    threading.Thread(target=compressor, name="compressor", daemon=True).start()
    time.sleep(0.2)
    ready()
    while True:
        time.sleep(1)
elif mode == "threads":
    for i in range(3):
        threading.Thread(target=spinner, name="spinner%d" % i, daemon=True).start()
    threading.Thread(target=sleeper, name="sleeper", daemon=True).start()
    time.sleep(0.2)
    ready()
    while True:
        time.sleep(1)
elif mode == "garbage":
    ready()
    garbage()
elif mode == "tasks":
    import asyncio
    ready()
    asyncio.run(tasks())
elif mode == "short":
    ready()
    t0 = time.time()
    while time.time() - t0 < float(sys.argv[2]):
        f20()
elif mode == "exec":
    threading.Thread(target=sleeper, name="sleeper", daemon=True).start()
    threading.Thread(target=compressor, args=(True,), name="compressor", daemon=True).start()
    t = [0, 0, 0]
    end = time.time() + float(sys.argv[2])
    while time.time() < end:
        one_round(t)
    print("truth %d %d %d" % tuple(t), flush=True)
    sys.exit(7)
elif mode == "bench":
    t = [0, 0, 0]
    w0 = time.perf_counter()
    for _ in range(int(sys.argv[2])):
        one_round(t)
    wall = time.perf_counter() - w0
    s = sum(t)
    print("wall %.6f truth %.3f %.3f %.3f" % (wall, 100 * t[0] / s, 100 * t[1] / s, 100 * t[2] / s), flush=True)
else:
    raise SystemExit("unknown mode " + mode)
