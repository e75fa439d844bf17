#!/usr/bin/env python3
"""osprey vs py-spy on one CPython workload (tests/py/workload.py bench: ~5 s of fixed
CPU-bound work, 50/30/20 over three functions, one thread).

Usage: python3 bench.py --osprey PATH/TO/osprey [--python PY] [--runs 5]
                        [--hz 100,1000] [--rounds 700] [--chroot DIR]

--chroot DIR runs PY (a path inside DIR, e.g. /usr/bin/python3.14) under
chroot(8), the way a container runs it, and both profilers attach to it by
pid from the host (`osprey attach`, `py-spy record --pid`) 0.3 s after it
starts (the workload's clock starts after its imports, so about 0.25 s of
its ~5 s are unprofiled, the same for both).

For each rate, runs unprofiled / osprey exec / osprey exec --native [--blocking] / py-spy
record --nonblocking / py-spy record (blocking) / py-spy record --native
(choose with --profilers), alternating, --runs times each. Reports, per
profiler: slowdown = median workload wall time (the workload's own clock,
start-up excluded) over the unprofiled median; samples delivered over
requested (rate x workload wall time); attribution error = the largest
difference, in points, between the profile's f50/f30/f20 shares and the
workload's own per-function CPU split (time.thread_time)."""
import argparse
import glob
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORK = os.path.join(HERE, "..", "tests", "py", "workload.py")
FUNCS = ("f50", "f30", "f20")


def parse_work(out):
    m = re.search(r"wall (\S+) truth (\S+) (\S+) (\S+)", out)
    if not m:
        raise SystemExit("workload printed no result: %r" % out)
    return float(m.group(1)), [float(m.group(i)) for i in (2, 3, 4)]


def py_cmd(a):
    """The workload command: the interpreter, directly or under chroot."""
    if a.chroot:
        return ["chroot", a.chroot, a.python, a.work, "bench", str(a.rounds)]
    return [a.python, a.work, "bench", str(a.rounds)]


def attached(a, profiler_cmd):
    """Starts the workload, runs profiler_cmd(pid) beside it; returns (workload stdout, profiler stderr)."""
    w = subprocess.Popen(py_cmd(a), stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    p = subprocess.Popen(profiler_cmd(w.pid), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    out, _ = w.communicate()
    _, err = p.communicate()
    return out, err


def run_none(a, hz, tmp):
    out = subprocess.run(py_cmd(a), capture_output=True, text=True, check=True).stdout
    wall, truth = parse_work(out)
    return wall, truth, None, None


def run_osprey(a, hz, tmp, extra=()):
    d = tempfile.mkdtemp(dir=tmp)
    flags = ["--hz", str(hz), "--out", d] + list(extra)
    if a.chroot:
        stdout, stderr = attached(a, lambda pid: [a.osprey, "attach", "--pid", str(pid)] + flags)
    else:
        p = subprocess.run([a.osprey, "exec"] + flags + ["--"] + py_cmd(a),
                           capture_output=True, text=True, check=True)
        stdout, stderr = p.stdout, p.stderr
    wall, truth = parse_work(stdout)
    files = glob.glob(os.path.join(d, "*.pb.gz"))
    rep = subprocess.run([a.osprey, "report", "--sample-index", "cpu", "--top", "100"] + files,
                         capture_output=True, text=True, check=True).stdout
    cpu = {}
    for line in rep.splitlines():
        parts = line.split()
        # cum%: with --native the leaf is often a C function under f50.
        if len(parts) == 5 and parts[4] in FUNCS:
            cpu[parts[4]] = float(parts[3].rstrip("%"))
    m = re.search(r"osprey: (\d+) samples", stderr)
    # `exec` does not print its sample count (only `attach` does).
    samples = int(m.group(1)) if m else None
    return wall, truth, [cpu.get(f, 0.0) for f in FUNCS], samples


def run_pyspy(a, hz, tmp, blocking, native=False):
    out = os.path.join(tempfile.mkdtemp(dir=tmp), "raw.txt")
    cmd = ["py-spy", "record", "-r", str(hz), "-f", "raw", "-o", out]
    if not blocking:
        cmd.append("--nonblocking")
    if native:
        cmd.append("--native")
    if a.chroot:
        stdout, _ = attached(a, lambda pid: cmd + ["--pid", str(pid)])
    else:
        stdout = subprocess.run(cmd + ["--"] + py_cmd(a), capture_output=True, text=True, check=True).stdout
    wall, truth = parse_work(stdout)
    counts = dict.fromkeys(FUNCS, 0)
    total = 0
    with open(out) as f:
        for line in f:
            stack, _, n = line.rstrip().rpartition(" ")
            total += int(n)
            for fn in FUNCS:
                if re.search(r"(^|;)%s \(" % fn, stack):
                    counts[fn] += int(n)
    return wall, truth, [counts[f] for f in FUNCS], total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--osprey", required=True)
    ap.add_argument("--python", default=sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3")))[-1:] or None)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--hz", default="100,1000")
    ap.add_argument("--rounds", type=int, default=700)
    ap.add_argument("--chroot", help="run --python inside this root filesystem, profilers attach by pid")
    ap.add_argument("--profilers", default="none,osprey,py-spy --nonblocking,py-spy (blocking)")
    a = ap.parse_args()
    a.work = WORK
    if a.chroot:
        a.work = "/tmp/osprey-bench-workload.py"
        shutil.copy(WORK, os.path.join(a.chroot, a.work.lstrip("/")))
    if isinstance(a.python, list):
        a.python = a.python[0] if a.python else "python3"
    if not shutil.which("py-spy"):
        raise SystemExit("py-spy not found (pip install py-spy)")
    tmp = tempfile.mkdtemp(prefix="osprey-bench-")
    profilers = [("none", run_none), ("osprey", run_osprey),
                 ("osprey --native", lambda a, h, t: run_osprey(a, h, t, ["--native"])),
                 ("osprey --native --blocking", lambda a, h, t: run_osprey(a, h, t, ["--native", "--blocking"])),
                 ("py-spy --nonblocking", lambda a, h, t: run_pyspy(a, h, t, False)),
                 ("py-spy (blocking)", lambda a, h, t: run_pyspy(a, h, t, True)),
                 ("py-spy --native", lambda a, h, t: run_pyspy(a, h, t, True, True))]
    profilers = [p for p in profilers if p[0] in a.profilers.split(",")]
    print("python %s%s, %d rounds, %d runs each, %d CPUs"
          % (a.python, " in chroot " + a.chroot if a.chroot else "", a.rounds, a.runs, os.cpu_count()))
    print("%-22s %6s %10s %9s %20s %9s" % ("profiler", "hz", "wall (s)", "slowdown", "samples/requested", "error"))
    for hz in [int(h) for h in a.hz.split(",")]:
        res = {name: [] for name, _ in profilers}
        for _ in range(a.runs):
            for name, fn in profilers:
                res[name].append(fn(a, hz, tmp))
        base = statistics.median(r[0] for r in res["none"])
        for name, _ in profilers:
            rs = res[name]
            wall = statistics.median(r[0] for r in rs)
            line = "%-22s %6d %10.3f %+8.1f%%" % (name, hz, wall, 100 * (wall / base - 1))
            if name != "none":
                errs, got, want = [], 0, 0
                for w, truth, shares, samples in rs:
                    s = sum(shares) or 1
                    errs.append(max(abs(100 * x / s - t) for x, t in zip(shares, truth)))
                    got = None if samples is None or got is None else got + samples
                    want += hz * w
                delivered = "-" if got is None else "%d/%d (%.0f%%)" % (got, want, 100 * got / want)
                line += " %20s %8.2f" % (delivered, statistics.median(errs))
            print(line, flush=True)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
