#!/usr/bin/env python3
"""CPU cost of the agent's start: a shell loop running `/bin/true` N times,
with and without `osprey exec --children`, alternated, RUNS runs each.

CPU is user+sys of the whole process tree (getrusage(RUSAGE_CHILDREN) of
this script around each run), not wall time: the machine may be loaded.

    python3 crates/osprey-cli/bench/start_cost.py [N] [RUNS]
Environment: OSPREY (default target/release/osprey), BENCH_CMD (default
/bin/true) to time another command per iteration.
"""
import os, resource, statistics, subprocess, sys, tempfile

n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
osprey = os.environ.get("OSPREY", "target/release/osprey")
cmd = os.environ.get("BENCH_CMD", "/bin/true")
loop = f"for i in $(seq {n}); do {cmd}; done"
out = tempfile.mkdtemp(prefix="osprey-start-")


def cpu(argv):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


plain, agent = [], []
for _ in range(runs):
    plain.append(cpu(["sh", "-c", loop]))
    agent.append(cpu([osprey, "exec", "--children", "--out", out, "--", "sh", "-c", loop]))
p, a = statistics.median(plain), statistics.median(agent)
print(f"command: {loop}")
print(f"alone:  median {p*1000:.1f} ms CPU  runs {[round(x*1000, 1) for x in plain]}")
print(f"osprey: median {a*1000:.1f} ms CPU  runs {[round(x*1000, 1) for x in agent]}")
print(f"ratio x{a/p:.2f}; agent {(a-p)/(n+1)*1000:.3f} ms CPU per process")
