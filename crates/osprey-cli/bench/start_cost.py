#!/usr/bin/env python3
"""CPU cost of the agent's start in short processes, with and without the
agent, alternated, RUNS runs each; medians.

CPU is user+sys of the whole process tree (getrusage(RUSAGE_CHILDREN) of
this script around each run), not wall time: the machine may be loaded.

    python3 crates/osprey-cli/bench/start_cost.py [MODE] [N] [RUNS]

MODE (default `loop`):
  loop     `sh -c 'for i in $(seq N); do CMD; done'` alone and under
           `osprey exec --children` (the shell is profiled too: N + 1
           processes).
  preload  the same loop run by a shell without the agent, each CMD run
           with the agent preloaded as `exec --children` does for a
           descendant (LD_PRELOAD and OSPREY_* set on the command line):
           the agent alone, without `osprey exec`'s own process.
  spawn    as `preload`, but this script starts CMD N times itself
           (`posix_spawn`, no shell, whose own cost varies the most):
           resolves differences of 0.05 ms a process with RUNS >= 21.
  gcc      loop of N `gcc -O2 -c x.c` (3 processes each: gcc, cc1, as).
  make     `make -j2 -B` of N small C files (default 40) into a program.

Environment: OSPREY (default target/release/osprey, with
libosprey_preload.so beside it), BENCH_CMD (loop/preload: the command per
iteration, default /bin/true), BENCH_SHELL (loop/preload: the shell, default
`sh`; `bash` forks for each command where dash vforks), OSPREY_BEFORE (another `osprey` binary with
its libosprey_preload.so beside it) to alternate with as well.
"""
import os
import resource
import statistics
import subprocess
import sys
import tempfile

mode = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].isdigit() else "loop"
args = [a for a in sys.argv[1:] if a.isdigit()]
n = int(args[0]) if args else {"loop": 200, "preload": 200, "spawn": 100, "gcc": 30, "make": 40}.get(mode, 200)
runs = int(args[1]) if len(args) > 1 else 5
osprey = os.path.abspath(os.environ.get("OSPREY", "target/release/osprey"))
out = tempfile.mkdtemp(prefix="osprey-start-")
work = tempfile.mkdtemp(prefix="osprey-start-src-")

C_UNIT = """
#include <stdio.h>
#include <string.h>
struct item_{i} {{ char name[32]; double weight; int count; }};
static int cmp_{i}(const void *a, const void *b) {{
    const struct item_{i} *x = a, *y = b;
    return (x->weight > y->weight) - (x->weight < y->weight);
}}
int unit_{i}(int n) {{
    struct item_{i} items[64];
    for (int k = 0; k < 64; k++) {{
        snprintf(items[k].name, sizeof items[k].name, "item-%d-%d", {i}, k);
        items[k].weight = (k * 7919 + n) % 101 / 3.0;
        items[k].count = (int)strlen(items[k].name);
    }}
    qsort(items, 64, sizeof items[0], cmp_{i});
    int s = 0;
    for (int k = 0; k < 64; k++) s += items[k].count * (k + 1);
    return s;
}}
"""


def setup():
    """The command run alone (argv), the processes it starts, its directory."""
    if mode in ("loop", "preload"):
        cmd = os.environ.get("BENCH_CMD", "/bin/true")
        shell = os.environ.get("BENCH_SHELL", "sh")
        return [shell, "-c", f"for i in $(seq {n}); do {cmd}; done"], n + (mode == "loop")
    if mode == "spawn":
        return os.environ.get("BENCH_CMD", "/bin/true").split(), n
    if mode == "gcc":
        with open(os.path.join(work, "x.c"), "w") as f:
            f.write(C_UNIT.format(i=0))
        return ["sh", "-c", f"for i in $(seq {n}); do gcc -O2 -c x.c -o x.o; done"], 3 * n + 1
    if mode == "make":
        objs = []
        for i in range(n):
            with open(os.path.join(work, f"u{i}.c"), "w") as f:
                f.write(C_UNIT.format(i=i))
            objs.append(f"u{i}.o")
        with open(os.path.join(work, "main.c"), "w") as f:
            f.write("".join(f"int unit_{i}(int);\n" for i in range(n)))
            f.write("int main(void) { int s = 0;\n")
            f.write("".join(f"  s += unit_{i}(s);\n" for i in range(n)))
            f.write("  return s == 42; }\n")
        with open(os.path.join(work, "Makefile"), "w") as f:
            f.write(f"prog: main.o {' '.join(objs)}\n\tgcc -o $@ $^\n%.o: %.c\n\tgcc -O2 -c $< -o $@\n")
        # make, then gcc + cc1 + as per object (main too), then gcc + collect2 + ld.
        return ["make", "-s", "-j2", "-B"], 1 + 3 * (n + 1) + 3
    sys.exit(f"unknown mode {mode} (loop, preload, spawn, gcc, make)")


def cpu(argv, env=None):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    if mode == "spawn":
        for _ in range(n):
            quiet = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_WRONLY, 0) for fd in (1, 2)]
            pid = os.posix_spawn(argv[0], argv, env if env is not None else os.environ, file_actions=quiet)
            if os.waitpid(pid, 0)[1] != 0:
                sys.exit(f"{argv} failed")
    else:
        subprocess.run(argv, check=True, cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def with_agent(binary, argv):
    """`argv` under the agent of `binary` (its library beside it)."""
    if mode not in ("preload", "spawn"):
        return [binary, "exec", "--children", "--out", out, "--"] + argv, None
    lib = os.path.join(os.path.dirname(os.path.abspath(binary)), "libosprey_preload.so")
    # As `exec --children` sets them for a descendant; OSPREY_SPOOL: `out`
    # stands for the spool `osprey exec` merges (parts without fsync).
    agent = {"LD_PRELOAD": lib, "OSPREY_ROOT_PID": "1", "OSPREY_CHILDREN": "1", "OSPREY_SPOOL": "1", "OSPREY_OUT": out}
    if mode == "spawn":
        return argv, dict(os.environ, **agent)
    cmd = os.environ.get("BENCH_CMD", "/bin/true")
    pre = " ".join(f"{k}={v}" for k, v in agent.items())
    return ["sh", "-c", f"for i in $(seq {n}); do {pre} {cmd}; done"], None


argv, procs = setup()
binaries = {"osprey": osprey}
if os.environ.get("OSPREY_BEFORE"):
    binaries = {"before": os.path.abspath(os.environ["OSPREY_BEFORE"]), "after": osprey}
plain, agent = [], {k: [] for k in binaries}
for _ in range(runs):
    plain.append(cpu(argv))
    for k, b in binaries.items():
        agent[k].append(cpu(*with_agent(b, argv)))
p = statistics.median(plain)
print(f"mode {mode}: {' '.join(argv)}  ({procs} processes per run; in {work})")
print(f"alone:  median {p*1000:.1f} ms CPU  runs {[round(x*1000, 1) for x in plain]}")
for k, xs in agent.items():
    a = statistics.median(xs)
    print(f"{k}: median {a*1000:.1f} ms CPU  runs {[round(x*1000, 1) for x in xs]}")
    print(f"  ratio x{a/p:.3f}; agent {(a-p)/procs*1000:.3f} ms CPU per process")
