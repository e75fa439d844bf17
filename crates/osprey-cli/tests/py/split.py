"""osprey exec test workload: 50/30/20 CPU split over f50/f30/f20 in the
main thread for SECS seconds, a thread in time.sleep, a thread in
zlib.compress. Prints its own per-function CPU split and exits 7."""
import os
import sys
import threading
import time
import zlib

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


def sleeper():
    while True:
        time.sleep(0.2)


def compressor():
    # Half busy, so that on 2 cores the sampler has CPU to run on.
    data = os.urandom(1 << 20)
    while True:
        t = time.monotonic()
        zlib.compress(data, 1)
        time.sleep(time.monotonic() - t)


threading.Thread(target=sleeper, name="sleeper", daemon=True).start()
threading.Thread(target=compressor, name="compressor", daemon=True).start()
secs = float(sys.argv[1])
ct = time.thread_time_ns
t = [0, 0, 0]
end = time.time() + secs
while time.time() < end:
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
print("truth %d %d %d" % tuple(t), flush=True)
sys.exit(7)
