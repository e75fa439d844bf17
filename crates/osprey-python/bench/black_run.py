#!/usr/bin/env python3
"""osprey and py-spy on the same run of `black` formatting a real source
tree (a copy of part of the interpreter's own standard library).

  python3 black_run.py --osprey target/release/osprey --black VENV/bin/black
      [--tree DIR] [--hz 100]

Both attach to one black process (one worker, pure-Python black: install
it with `pip install --no-binary black black`) at the same rate, osprey in
its default mode (py-spy's blocking mode and osprey's `--blocking` both use
ptrace and cannot share a process). Compares the flat shares of the top
functions: osprey by cpu, py-spy by non-idle samples."""
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
    ap.add_argument("--black", required=True)
    ap.add_argument("--tree", default=sysconfig.get_paths()["stdlib"])
    ap.add_argument("--hz", type=int, default=100)
    ap.add_argument("--top", type=int, default=10)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    src = os.path.join(tmp, "src")
    shutil.copytree(a.tree, src, ignore=shutil.ignore_patterns("test", "tests", "idlelib", "site-packages", "__pycache__", "lib2to3"))
    p = subprocess.Popen([a.black, "-W", "1", "-q", "--fast", src], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    out, raw = os.path.join(tmp, "osprey"), os.path.join(tmp, "pyspy.txt")
    o = subprocess.Popen([a.osprey, "attach", "--pid", str(p.pid), "--hz", str(a.hz), "--out", out],
                         stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    s = subprocess.Popen(["py-spy", "record", "--pid", str(p.pid), "--rate", str(a.hz), "--format", "raw", "-o", raw],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    p.wait()
    _, err = o.communicate()
    s.wait()
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
