"""A small app for the launcher tests: prints its pid, burns ~1 s of CPU in
`work`, exits 7 (or as told)."""
import os
import sys
import time


def work(n):
    s = 0
    for i in range(n):
        s += i * i
    return s


def main():
    print(f"pid {os.getpid()}", flush=True)
    t = time.process_time()
    while time.process_time() - t < float(os.environ.get("APP_SECS", "1.0")):
        work(200000)
    return int(os.environ.get("APP_EXIT", "7"))


if __name__ == "__main__":
    sys.exit(main())
