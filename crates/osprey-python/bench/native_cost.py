#!/usr/bin/env python3
"""What `--native` costs the program: the one-thread workload of bench.py
(tests/py/workload.py bench ROUNDS) unprofiled, under `osprey exec --native`
and under `osprey exec --native --blocking`, alternating, RUNS times each
per rate. Prints the medians of the program's own user and system CPU
(getrusage at its end) and of its own wall clock.

Usage: python3 native_cost.py --osprey PATH/TO/osprey [--python PY] [--rounds 400] [--runs 5] [--hz 100,1000]"""
import argparse
import glob
import os
import statistics
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
WORK = os.path.join(HERE, "..", "tests", "py", "workload.py")
WRAP = ("import resource,runpy,sys; sys.argv=[%r,'bench','%s']; runpy.run_path(%r, run_name='__main__');"
        "r=resource.getrusage(resource.RUSAGE_SELF); print('cpu', r.ru_utime, r.ru_stime, flush=True)")


def run(a, flags, out):
    cmd = [a.python, "-c", WRAP % (WORK, a.rounds, WORK)]
    if flags is not None:
        cmd = [a.osprey, "exec", "-q", "--out", out] + flags + ["--"] + cmd
    lines = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()
    cpu = next(l for l in lines if l.startswith("cpu ")).split()
    wall = next(l for l in lines if l.startswith("wall ")).split()[1]
    return float(cpu[1]), float(cpu[2]), float(wall)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--osprey", required=True)
    ap.add_argument("--python", default=(sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3"))) or ["python3"])[-1])
    ap.add_argument("--rounds", default="400")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--hz", default="100,1000")
    a = ap.parse_args()
    out = tempfile.mkdtemp(prefix="osprey-native-cost-")
    for hz in a.hz.split(","):
        cfgs = [("none", None), ("--native", ["--hz", hz, "--native"]),
                ("--native --blocking", ["--hz", hz, "--native", "--blocking"])]
        res = {n: [] for n, _ in cfgs}
        for _ in range(a.runs):
            for n, f in cfgs:
                res[n].append(run(a, f, out))
        med = {n: [statistics.median(r[i] for r in res[n]) for i in range(3)] for n in res}
        bu, bs, bw = med["none"]
        for n, _ in cfgs:
            u, s, w = med[n]
            print("%5s Hz %-20s user %.3f s  sys %.3f s  user+sys %+.1f%%  wall %.3f s %+.1f%%"
                  % (hz, n, u, s, 100 * ((u + s) / (bu + bs) - 1), w, 100 * (w / bw - 1)), flush=True)


if __name__ == "__main__":
    main()
