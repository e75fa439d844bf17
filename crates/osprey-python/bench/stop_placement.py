#!/usr/bin/env python3
"""Where a stopping reader's samples land, against the process's own CPU time.

One CPython 3.12 process runs `calls.py short`, held on CPU 0, with an
in-process SIGPROF sampler (sigprof/profsig.c: ITIMER_PROF, the process's
CPU time, about 250 Hz at the kernel's tick) as the reference. In turns, on
the same process: the reference alone for 4 s, `py-spy record` run on CPU 0
(the target's), `py-spy record` on CPU 1, and osprey's default mode
(`osprey attach`, on CPU 1), 2 s each at 1000 Hz. Flat shares of the five
functions of the workload, pooled over the rounds.

  python3 stop_placement.py --osprey target/release/osprey [--rounds 8] [--python PATH]

Needs root (py-spy, osprey's copies at the interrupt), gcc, go (pprof), 2 CPUs."""
import argparse
import collections
import glob
import json
import os
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CALLS = os.path.join(HERE, "..", "tests", "py", "calls.py")
FUNCS = ["__init__", "__hash__", "produce", "direct", "short_loop"]
# Run inside the target: the reference sampler, on while the file `on` is
# there, dumped (names by code object) when `done` appears.
DRIVER = r"""
import gc, json, os, runpy, sys, threading, time, types
sys.path.insert(0, sys.argv[1])
import profsig
d = sys.argv[1]
def control():
    on = False
    while True:
        time.sleep(0.05)
        want = os.path.exists(d + "/on")
        if want != on:
            profsig.start(1000 if want else 0)
            on = want
        if os.path.exists(d + "/done"):
            known = [o.__code__ for o in gc.get_objects()
                     if isinstance(o, types.FunctionType) and o.__code__.co_filename.endswith("calls.py")]
            json.dump({str(k): v for k, v in profsig.dump(known).items()}, open(d + "/truth.json", "w"))
            os._exit(0)
profsig.init()
threading.Thread(target=control, daemon=True).start()
sys.argv = ["calls.py", "short"]
runpy.run_path(os.environ["CALLS"], run_name="__main__")
"""


def build(python, d):
    """profsig for `python` in `d`."""
    q = lambda expr: subprocess.run([python, "-c", f"import sysconfig; print({expr})"], capture_output=True,
                                    text=True, check=True).stdout.strip()
    inc, suffix = q("sysconfig.get_paths()['include']"), q("sysconfig.get_config_var('EXT_SUFFIX')")
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-I" + inc, os.path.join(HERE, "sigprof", "profsig.c"),
                    "-o", os.path.join(d, "profsig" + suffix)], check=True)


def leaf_counts(raw_files):
    c = collections.Counter()
    for f in raw_files:
        for line in open(f):
            if "short_loop" not in line:
                continue
            stack, n = line.rsplit(" ", 1)
            c[stack.split(";")[-1].split(" ")[0].split(".")[-1]] += int(n)
    return c


def osprey_cpu(files):
    rep = subprocess.run(["go", "tool", "pprof", "-top", "-nodecount=100", "-sample_index=cpu", "-focus=short_loop",
                          "-unit=ms"] + files, capture_output=True, text=True, check=True).stdout
    c = {}
    for line in rep.splitlines():
        p = line.split()
        if len(p) >= 6 and p[1].endswith("%") and p[0].endswith("ms"):
            c[p[-1].split(".")[-1]] = float(p[0][:-2])
    return c


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--osprey", required=True)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--python", default=(sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12.*/bin/python3")))
                                         or [""])[-1])
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="stop-placement-")
    build(a.python, d)
    env = dict(os.environ, CALLS=os.path.abspath(CALLS))
    p = subprocess.Popen(["taskset", "-c", "0", a.python, "-c", DRIVER, d], stdout=subprocess.DEVNULL, env=env)
    time.sleep(1)
    pid = str(p.pid)
    for i in range(a.rounds):
        open(d + "/on", "w").close()
        time.sleep(4)
        os.unlink(d + "/on")
        time.sleep(0.2)
        for cpu, name in ((0, "same"), (1, "other")):
            subprocess.run(["taskset", "-c", str(cpu), "py-spy", "record", "--pid", pid, "--duration", "2", "--rate",
                            "1000", "--format", "raw", "-o", f"{d}/{name}.{i}.txt"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=True, timeout=30)
        subprocess.run(["taskset", "-c", "1", a.osprey, "attach", "--pid", pid, "--duration", "2", "--hz", "1000",
                        "--out", f"{d}/osprey.{i}"], stderr=subprocess.DEVNULL, check=True, timeout=30)
    open(d + "/done", "w").close()
    p.wait(timeout=30)
    truth = {k: v for k, v in json.load(open(d + "/truth.json")).items() if k != "None"}
    rows = [("SIGPROF (reference)", truth),
            ("py-spy, target's CPU", leaf_counts(glob.glob(d + "/same.*.txt"))),
            ("py-spy, other CPU", leaf_counts(glob.glob(d + "/other.*.txt"))),
            ("osprey default", osprey_cpu(glob.glob(d + "/osprey.*/*")))]
    print(f"| reader | samples | {' | '.join(FUNCS)} |\n|---|---|" + "---|" * len(FUNCS))
    for name, c in rows:
        t = sum(c.values())
        n = f"{t:.0f} ms" if name.startswith("osprey") else f"{t:.0f}"
        print(f"| {name} | {n} | " + " | ".join(f"{100 * c.get(k, 0) / t:.1f}" for k in FUNCS) + " |")


if __name__ == "__main__":
    main()
