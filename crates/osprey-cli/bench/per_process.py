#!/usr/bin/env python3
"""Per process: the CPU `perf` measured against the CPU osprey's profiles hold.

Runs `perf record -F 5000` (task-clock samples, inherited by every thread and
process) around `osprey exec --children`, then groups the processes of the
tree by the names their threads had (`chaos`, `chaos,sh` for a fork+exec'd
shell, ...) and prints, per group, how many processes, the CPU perf counted,
the CPU their profiles hold, and what is missing per process.

    python3 crates/osprey-cli/bench/per_process.py --osprey target/release/osprey \
        --hz 1000 -- ./chaos 8
"""

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

UNITS = {"ns": 1, "us": 1e3, "µs": 1e3, "ms": 1e6, "s": 1e9}


def profile_ns(osprey, path):
    """The CPU total `osprey report` prints for one profile file."""
    out = subprocess.run([osprey, "report", path], capture_output=True, text=True).stdout
    m = re.search(r"^Total: ([\d.]+)(ns|us|µs|ms|s) ", out, re.M)
    return float(m.group(1)) * UNITS[m.group(2)] if m else 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--osprey", required=True)
    ap.add_argument("--hz", default="1000")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    work = tempfile.mkdtemp(prefix="osprey-per-process-")
    out, data = os.path.join(work, "profiles"), os.path.join(work, "perf.data")
    subprocess.run(
        ["perf", "record", "-q", "-F", "5000", "-o", data, "--", a.osprey, "exec", "--hz", a.hz,
         "--children", "--quiet", "--out", out, "--"] + cmd,
        check=True, stdout=subprocess.DEVNULL)
    script = subprocess.run(["perf", "script", "-i", data, "-F", "comm,pid,period"],
                            capture_output=True, text=True).stdout
    perf, names = collections.Counter(), collections.defaultdict(set)
    for line in script.splitlines():
        f = line.split()
        if len(f) >= 3:
            comm, pid, period = " ".join(f[:-2]), int(f[-2]), float(f[-1])
            perf[pid] += period
            if not comm.startswith("osprey-"):  # osprey's own threads
                names[pid].add(comm)
    prof = collections.Counter()
    for name in os.listdir(out):
        if name.endswith(".pb.gz"):
            prof[int(name.split("-")[1])] += profile_ns(a.osprey, os.path.join(out, name))
    groups = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for pid, ns in perf.items():
        g = groups[",".join(sorted(names[pid])) or "?"]
        g[0] += 1
        g[1] += ns
        g[2] += prof.get(pid, 0.0)
    print(f"{'processes named':32} {'n':>5} {'perf ms':>9} {'profiles ms':>11} {'missing/process':>15}")
    for k, (n, p, q) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        print(f"{k:32} {n:5d} {p / 1e6:9.1f} {q / 1e6:11.1f} {(p - q) / n / 1e3:12.0f} us")
    total_p, total_q = sum(perf.values()), sum(prof.values())
    print(f"all: perf {total_p / 1e6:.0f} ms (the `osprey exec` parent included), profiles {total_q / 1e6:.0f} ms")


if __name__ == "__main__":
    sys.exit(main())
