#!/usr/bin/env python3
"""osprey and py-spy on the same run of a real program: `black` formatting
a real source tree (a copy of part of the interpreter's own standard
library), or `mypy` checking one (by default black's own package).

  python3 black_run.py --osprey target/release/osprey --black VENV/bin/black
      [--tree DIR] [--hz 100]
  python3 black_run.py --osprey target/release/osprey --mypy VENV/bin/mypy
      [--tree DIR] [--hz 100]

Install them pure-Python, as a profile of Python code needs:
`pip install --no-binary black,mypy black mypy`.

Both attach to one black process (one worker, pure-Python black: install
it with `pip install --no-binary black black`) at the same rate, osprey in
its default mode or with `--blocking` (both then stop threads with ptrace,
each for a few microseconds a sample: they seldom meet, and osprey counts
the stops it could not make). Compares the flat shares of the
top functions: osprey by cpu, py-spy by samples holding the GIL."""
import argparse
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from same_run import osprey_flat, pyspy_flat  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--osprey", required=True)
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--black")
    which.add_argument("--mypy")
    ap.add_argument("--tree")
    ap.add_argument("--hz", type=int, default=100)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--blocking", action="store_true")
    a = ap.parse_args()
    if a.tree is None and a.mypy:
        find = "import black, os; print(os.path.dirname(black.__file__))"
        python = os.path.join(os.path.dirname(a.mypy), "python")
        a.tree = subprocess.run([python, "-c", find], capture_output=True, text=True, check=True).stdout.strip()
    a.tree = a.tree or sysconfig.get_paths()["stdlib"]
    tmp = tempfile.mkdtemp()
    ignore = shutil.ignore_patterns("test", "tests", "idlelib", "site-packages", "__pycache__", "lib2to3")
    out, raw = os.path.join(tmp, "osprey"), os.path.join(tmp, "pyspy.txt")
    osprey_cmd = [a.osprey, "attach", "--hz", str(a.hz), "--out", out] + (["--blocking"] if a.blocking else [])
    # `--gil`: black's main thread waits in `select` for its worker, which
    # py-spy counts as active (5% of its samples) though it uses no CPU;
    # the samples of the thread holding the GIL are the ones on a CPU.
    pyspy_cmd = ["py-spy", "record", "--gil", "--rate", str(a.hz), "--format", "raw", "-o", raw]

    def run(profilers):
        src = tempfile.mkdtemp(dir=tmp)
        shutil.rmtree(src)
        shutil.copytree(a.tree, src, ignore=ignore)
        if a.black:
            cmd = [a.black, "-W", "1", "-q", "--fast", src]
        else:
            cmd = [a.mypy, "--no-incremental", "--cache-dir", os.devnull, "--ignore-missing-imports", src]
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        procs = []
        for cmd, pipe in profilers:
            procs.append(subprocess.Popen(cmd + ["--pid", str(p.pid)], stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE if pipe else subprocess.DEVNULL, text=True))
            time.sleep(0.5)
        p.wait()
        return [q.communicate()[1] for q in procs]

    err = run([(osprey_cmd, True), (pyspy_cmd, False)])[0]
    x, y = osprey_flat(a.osprey, out), pyspy_flat(raw)
    top = sorted(y, key=lambda k: -y[k])[: a.top]
    worst = 0.0
    print(f"{'function':<28} {'osprey':>8} {'py-spy':>8}")
    for f in top:
        worst = max(worst, abs(x.get(f, 0.0) - y[f]))
        print(f"{f:<28} {x.get(f, 0.0):>7.1f}% {y[f]:>7.1f}%")
    print(f"largest difference over py-spy's top {a.top}: {worst:.1f} points")
    print(err.strip())
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
