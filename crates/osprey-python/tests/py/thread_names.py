"""Threads with Python names, for the thread-name tests.

    thread_names.py [TOTAL] [RENAME_AT]

MainThread, "worker-1", a name longer than the 15 bytes an OS thread name
holds, and "to-be-renamed", renamed "renamed" by the main thread RENAME_AT
seconds after the start. Every thread sleeps for its first second, then
burns CPU in its own function (burn_main, burn_worker, burn_long,
burn_renamed) until TOTAL seconds after the start, then the program exits 0.
Prints "ready" once the threads are started.
"""
import sys
import threading
import time

TOTAL = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
RENAME_AT = float(sys.argv[2]) if len(sys.argv) > 2 else 2.5
START = time.time()
LONG_NAME = "a-rather-long-thread-name-beyond-15"


def spin():
    x = 0
    for i in range(2000):
        x += i
    return x


def burn_worker():
    while time.time() < START + TOTAL:
        spin()


def burn_long():
    while time.time() < START + TOTAL:
        spin()


def burn_renamed():
    while time.time() < START + TOTAL:
        spin()


def burn_main(renamed):
    while time.time() < START + TOTAL:
        spin()
        if renamed.name != "renamed" and time.time() >= START + RENAME_AT:
            renamed.name = "renamed"


def after_a_second(f):
    def run():
        time.sleep(max(0.0, START + 1.0 - time.time()))
        f()

    return run


def main():
    threads = [
        threading.Thread(target=after_a_second(burn_worker), name="worker-1"),
        threading.Thread(target=after_a_second(burn_long), name=LONG_NAME),
        threading.Thread(target=after_a_second(burn_renamed), name="to-be-renamed"),
    ]
    for t in threads:
        t.daemon = True
        t.start()
    print("ready", flush=True)
    time.sleep(max(0.0, START + 1.0 - time.time()))
    burn_main(threads[2])
    for t in threads:
        t.join()
    print("names", ",".join(t.name for t in threads))


main()
