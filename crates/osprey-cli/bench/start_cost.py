#!/usr/bin/env python3
"""CPU cost of the agent's start: a shell loop running `/bin/true` N times,
with and without `osprey exec --children`, alternated, RUNS runs each.

CPU is user+sys of the whole process tree (getrusage(RUSAGE_CHILDREN) of
this script around each run), not wall time: the machine may be loaded.

    python3 crates/osprey-cli/bench/start_cost.py [N] [RUNS]
Environment: OSPREY (default target/release/osprey), BENCH_CMD (default
/bin/true) to time another command per iteration, OSPREY_BEFORE (another
`osprey` binary, with its libosprey_preload.so beside it) to alternate
with as well.
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


binaries = {"osprey": osprey}
if os.environ.get("OSPREY_BEFORE"):
    binaries = {"before": os.environ["OSPREY_BEFORE"], "after": osprey}
plain, agent = [], {k: [] for k in binaries}
for _ in range(runs):
    plain.append(cpu(["sh", "-c", loop]))
    for k, b in binaries.items():
        agent[k].append(cpu([b, "exec", "--children", "--out", out, "--", "sh", "-c", loop]))
p = statistics.median(plain)
print(f"command: {loop}")
print(f"alone:  median {p*1000:.1f} ms CPU  runs {[round(x*1000, 1) for x in plain]}")
for k, xs in agent.items():
    a = statistics.median(xs)
    print(f"{k}: median {a*1000:.1f} ms CPU  runs {[round(x*1000, 1) for x in xs]}")
    print(f"  ratio x{a/p:.2f}; agent {(a-p)/(n+1)*1000:.3f} ms CPU per process")
