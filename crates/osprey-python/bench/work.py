"""Bench workload: a fixed amount of CPU-bound work, 50/30/20 over f50/f30/f20
in one thread. Prints one line: `wall SECONDS truth P50 P30 P20` (its own
wall time for the work, and its own per-function CPU split in percent)."""
import sys
import time

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


rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 700
ct = time.thread_time_ns
t = [0, 0, 0]
w0 = time.perf_counter()
for _ in range(rounds):
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
wall = time.perf_counter() - w0
s = sum(t)
print("wall %.6f truth %.3f %.3f %.3f" % (wall, 100 * t[0] / s, 100 * t[1] / s, 100 * t[2] / s), flush=True)
