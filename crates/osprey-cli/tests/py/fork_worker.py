"""Forks one worker (no exec) that spins for SECS of CPU, then waits for it."""
import os
import sys
import time

SECS = float(sys.argv[1]) if len(sys.argv) > 1 else 0.25


def spin():
    end = time.process_time() + SECS
    n = 0
    while time.process_time() < end:
        n += 1
    return n


pid = os.fork()
if pid == 0:
    spin()
    os._exit(0)
os.waitpid(pid, 0)
