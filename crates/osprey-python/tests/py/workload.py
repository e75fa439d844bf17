"""Workloads for osprey-python's tests. Usage: workload.py MODE; prints "ready" when set up."""
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


def split():
    while True:
        f50()
        f30()
        f20()


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
    split()
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
