"""multiprocessing.Pool of 4 workers: task i runs f<i> for (4 - i) * 0.25 s
of its own CPU, so f0..f3 should get 40/30/20/10% of the workers' CPU."""
import multiprocessing as mp
import sys
import time


def spin(secs, body):
    t = time.process_time()
    while time.process_time() - t < secs:
        body(5000)


def f0(n):
    return sum(i * i for i in range(n))


def f1(n):
    return sum(i ^ 3 for i in range(n))


def f2(n):
    return sum(i + 7 for i in range(n))


def f3(n):
    return sum(i | 5 for i in range(n))


def task(i):
    spin((4 - i) * 0.25, [f0, f1, f2, f3][i])
    return i


if __name__ == "__main__":
    mp.set_start_method(sys.argv[1])
    with mp.Pool(4) as pool:
        print(sorted(pool.map(task, range(4), chunksize=1)))
