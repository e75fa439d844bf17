"""Workload of osprey-cli's `exec_native_signals_and_exit_status`: busy in
Python while real-time signals arrive (they queue: none may be lost, each is
counted at delivery through the wakeup fd); SIGUSR1 ends it; prints the
count and exits 7."""
import os
import signal
import sys

r, w = os.pipe()
os.set_blocking(w, False)
signal.set_wakeup_fd(w)
signal.signal(signal.SIGRTMIN + 1, lambda s, f: None)
done = []
signal.signal(signal.SIGUSR1, lambda s, f: done.append(1))
print(os.getpid(), flush=True)


def busy():
    x = 0
    for i in range(1000):
        x += i
    return x


while not done:
    busy()
signal.set_wakeup_fd(-1)
os.set_blocking(r, False)
data = b""
try:
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        data += chunk
except BlockingIOError:
    pass
print(data.count(bytes([signal.SIGRTMIN + 1])), flush=True)
sys.exit(7)
