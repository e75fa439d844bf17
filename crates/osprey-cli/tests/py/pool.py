"""multiprocessing.Pool of 4 workers: task i calls f<i>, which spins for
(4 - i) * 0.25 s of its own CPU, so f0..f3 should get 40/30/20/10% of the
workers' CPU."""
import multiprocessing as mp
import sys
import time


def body(n):
    return sum(i * i for i in range(n))


def spin(secs):
    t = time.process_time()
    while time.process_time() - t < secs:
        body(5000)


def f0(secs):
    spin(secs)


def f1(secs):
    spin(secs)


def f2(secs):
    spin(secs)


def f3(secs):
    spin(secs)


def task(i):
    [f0, f1, f2, f3][i]((4 - i) * 0.25)
    return i


if __name__ == "__main__":
    mp.set_start_method(sys.argv[1])
    with mp.Pool(4) as pool:
        print(sorted(pool.map(task, range(4), chunksize=1)))
