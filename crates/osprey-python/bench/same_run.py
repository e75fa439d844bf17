#!/usr/bin/env python3
"""osprey and py-spy (blocking mode) on the *same* run of a workload.

Both attach to one process at the same time, at the same rate, for the
same duration; the flat shares of the workload's functions are compared
(osprey by cpu, py-spy by non-idle samples).

  python3 same_run.py --osprey target/release/osprey [--python python3.12]
      [--workload calls|mixed|gen] [--secs 10] [--hz 100] [--nonblocking]

Workloads: `calls`, a 3-level call loop (a -> b -> c, each doing a little
work: where a sampler that drops torn stacks under-counts the innermost;
`chain` of tests/py/calls.py);
`mixed`, CPU in two functions, freeing a result at the module level, file
writes and random sleeps; the program times each part with its own
`time.thread_time()` and those shares are printed as `program`;
`gen`, a `for` loop over a generator (each side well under a microsecond
an item; `gen` of tests/py/calls.py)."""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

CALLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "py", "calls.py")
WORKLOADS = {
    "calls": None,
    "gen": None,
    "mixed": '''
import json, os, random, signal, sys, tempfile, time
def crunch(n):
    s = 0
    for i in range(n):
        s += i * i
    return s
def parse(n):
    out = []
    for i in range(n):
        out.append(str(i).split("1"))
    return out
def write_files(d):
    for i in range(5):
        with open(os.path.join(d, str(i)), "w") as f:
            f.write("x" * 10000)
d = tempfile.mkdtemp()
cpu = {}
def timed(name, f, *a):
    c0 = time.thread_time()
    r = f(*a)
    cpu[name] = cpu.get(name, 0) + time.thread_time() - c0
    return r
# SIGUSR1 (the profilers start): count from now. The counts are written
# every 0.2 s to the file named by argv[1].
signal.signal(signal.SIGUSR1, lambda *_: cpu.clear())
rnd = random.Random(1)
print("ready", flush=True)
last = time.time()
while True:
    timed("crunch", crunch, 30000)
    x = timed("parse", parse, 10000)
    c0 = time.thread_time()
    del x
    cpu["<module>"] = cpu.get("<module>", 0) + time.thread_time() - c0
    timed("write_files", write_files, d)
    # Random sleeps: a loop with a fixed period near the sampling interval
    # would be seen at the same phase by a fixed-rate sampler.
    timed("sleep", time.sleep, rnd.uniform(0.001, 0.009))
    if time.time() - last > 0.2:
        last = time.time()
        json.dump(cpu, open(sys.argv[1] + ".tmp", "w"))
        os.replace(sys.argv[1] + ".tmp", sys.argv[1])
''',
}
FUNCS = {"calls": ["a", "b", "c"], "mixed": ["crunch", "parse", "write_files", "<module>"],
         "gen": ["produce", "consume"]}


def short(name):
    """`Class.method` -> `method`; `<module>`, `<lambda>` stay whole."""
    return name if name.startswith("<") else name.split(".")[-1]


def osprey_flat(osprey, out):
    """Flat shares by cpu, read by `go tool pprof` (the reference reader).
    The `[gc]` frame osprey puts over a stack while the collector runs is
    hidden: py-spy has none and charges a collection to the frame that
    triggered it, which is what hiding it does."""
    files = [os.path.join(out, f) for f in sorted(os.listdir(out))] if os.path.isdir(out) else [out]
    rep = subprocess.run(["go", "tool", "pprof", "-top", "-nodecount=1000", "-nodefraction=0", "-sample_index=cpu",
                          "-hide=^\\[gc\\]$"] + files, capture_output=True, text=True, check=True).stdout
    flat = {}
    for line in rep.splitlines():
        m = re.match(r"\s*\S+\s+([\d.]+)%\s+[\d.]+%\s+\S+\s+[\d.]+%\s+(.*)$", line)
        if m:
            name = short(m.group(2))
            flat[name] = flat.get(name, 0.0) + float(m.group(1))
    return flat


def pyspy_flat(raw):
    counts, total = {}, 0
    for line in open(raw):
        stack, _, n = line.rstrip().rpartition(" ")
        if not stack:
            continue
        n = int(n)
        leaf = stack.split(";")[-1]
        name = short(leaf.split(" (")[0])
        counts[name] = counts.get(name, 0) + n
        total += n
    return {k: 100.0 * v / total for k, v in counts.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--osprey", required=True)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--workload", default="calls", choices=WORKLOADS)
    ap.add_argument("--secs", type=float, default=10)
    ap.add_argument("--hz", type=int, default=100)
    ap.add_argument("--blocking", action="store_true", help="osprey attach --blocking")
    ap.add_argument("--nonblocking", action="store_true", help="py-spy record --nonblocking")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
    if WORKLOADS[args.workload] is None:
        argv = [CALLS, {"calls": "chain", "gen": "gen"}[args.workload]]
    else:
        argv = [os.path.join(tmp, "w.py"), os.path.join(tmp, "program.json")]
        open(argv[0], "w").write(WORKLOADS[args.workload])
    p = subprocess.Popen([args.python] + argv, stdout=subprocess.PIPE)
    assert p.stdout.readline().strip() == b"ready"
    out, raw = os.path.join(tmp, "osprey"), os.path.join(tmp, "pyspy.txt")
    secs = str(int(args.secs))
    o = subprocess.Popen([args.osprey, "attach", "--pid", str(p.pid), "--duration", secs,
                          "--hz", str(args.hz), "--out", out] + (["--blocking"] if args.blocking else []),
                         stderr=subprocess.PIPE, text=True)
    # osprey first: its thread-state discovery may use ptrace, which py-spy's
    # attachment would refuse; once found, thread states are cached.
    time.sleep(0.5)
    if args.workload == "mixed":
        p.send_signal(signal.SIGUSR1)  # the program's own clock counts from now
    s = subprocess.Popen(["py-spy", "record", "--pid", str(p.pid), "--duration", secs, "--rate",
                          str(args.hz), "--format", "raw", "-o", raw] + (["--nonblocking"] if args.nonblocking else []),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, err = o.communicate()
    s.wait()
    if o.returncode != 0 or not (os.path.isdir(out) and os.listdir(out)):
        p.kill()
        sys.exit(f"osprey attach failed: {err}")
    p.kill()
    a, b = osprey_flat(args.osprey, out), pyspy_flat(raw)
    own = {}
    if args.workload == "mixed":
        cpu = json.load(open(argv[1]))
        own = {k: 100.0 * v / sum(cpu.values()) for k, v in cpu.items()}
    worst = 0.0
    print(f"{'function':<14} {'osprey':>8} {'py-spy':>8}" + (f" {'program':>8}" if own else ""))
    for f in FUNCS[args.workload]:
        x, y = a.get(f, 0.0), b.get(f, 0.0)
        worst = max(worst, abs(x - y))
        print(f"{f:<14} {x:>7.1f}% {y:>7.1f}%" + (f" {own.get(f, 0.0):>7.1f}%" if own else ""))
    print(f"largest difference {worst:.1f} points")
    print(err.strip())


if __name__ == "__main__":
    main()
