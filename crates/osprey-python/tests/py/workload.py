"""Workloads for osprey-python's tests. Usage: workload.py MODE; prints "ready" when set up."""
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


def split(truth_path=None):
    # Ground truth: CPU time spent in each function, cumulative, rewritten
    # in place after every round.
    fd = os.open(truth_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC) if truth_path else None
    ct = time.thread_time_ns
    t = [0, 0, 0]
    rounds = 0
    while True:
        rounds += 1
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
        if fd is not None and rounds % 16 == 0:
            os.pwrite(fd, ("%020d %020d %020d\n" % tuple(t)).encode(), 0)


def sleeper():
    while True:
        time.sleep(0.2)


def compressor():
    data = os.urandom(1 << 22)
    while True:
        zlib.compress(data, 1)


def spinner():
    while True:
        f20()


def ready():
    print("ready", flush=True)


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
elif mode == "short":
    ready()
    t0 = time.time()
    while time.time() - t0 < float(sys.argv[2]):
        f20()
else:
    raise SystemExit("unknown mode " + mode)
