#!/usr/bin/env python3
"""osprey's default (non-stopping) read against stopping readers, per
interpreter and workload.

Each workload of tests/py/calls.py runs in one process, sampled by one
profiler at a time, in turns of `--chunk` seconds: osprey's default mode,
`osprey attach --blocking` (the thread stopped for its read) and `py-spy
record` in its default mode (the process stopped for each read), run on
the CPU the process is on. Flat shares (osprey by
cpu, py-spy by its non-idle samples) are printed with the largest
difference of the default mode from each stopping reader.

  python3 accuracy.py --osprey target/release/osprey [--python 3.11 --python forky-3.14 ...]
      [--workload short,recurse,gen] [--secs 10] [--hz 500] [--chunk 2] [--rounds 1]

Interpreters: `3.8`..`3.13` (pyenv), `debian-3.11` (/usr/bin/python3.11),
`forky-3.13`..`forky-3.15` (the chroot of tests/chroot/build-forky.sh), or a
path. Workloads: `short` (calls of a microsecond or so, most entered from
C), `recurse` (a loop calling a 20-deep recursion), `gen` (a loop over a
generator), `task_short` (the short calls in two asyncio tasks), `span_short`
(the short calls inside OpenTelemetry spans: the SDK the tests install,
`target/otel-py/<name>` or the chroot's `/tmp/osprey-otel-py-<name>-*`; run
`cargo test -p osprey-python --test otel_spans` once first)."""
import argparse
import contextlib
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from same_run import osprey_flat, pyspy_flat  # noqa: E402

CALLS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "py", "calls.py")
FORKY = os.environ.get("OSPREY_FORKY", "/var/cache/osprey/forky")
FUNCS = {
    "short": ["__init__", "__hash__", "produce", "direct", "short_loop"],
    "recurse": ["recurse", "main"],
    "gen": ["produce", "consume"],
    "task_short": ["__init__", "__hash__", "produce", "direct", "short_task"],
    "span_short": ["__init__", "__hash__", "produce", "direct", "span_loop"],
}
REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
MODES = ["default", "blocking", "py-spy"]


def argv_of(name):
    """The command running calls.py on interpreter `name`."""
    if name.startswith("forky-"):
        inner = "/tmp/osprey-accuracy-calls.py"
        shutil.copy(CALLS, FORKY + inner)
        return ["chroot", FORKY, "/usr/bin/python" + name[len("forky-"):], inner]
    if name.startswith("debian-"):
        return ["/usr/bin/python" + name[len("debian-"):], CALLS]
    if os.path.sep in name:
        return [name, CALLS]
    found = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{name}.*/bin/python3")))
    if not found:
        sys.exit(f"no pyenv CPython {name}")
    return [found[-1], CALLS]


def osprey_samples(out):
    """The number of samples osprey kept (pprof's total of `samples`)."""
    files = [os.path.join(out, f) for f in sorted(os.listdir(out))]
    rep = subprocess.run(["go", "tool", "pprof", "-top", "-nodecount=1", "-sample_index=samples"] + files,
                         capture_output=True, text=True, check=True).stdout
    for line in rep.splitlines():
        if " total" in line:
            return int(line.split(" of ")[1].split()[0])
    return 0


PYSPY = shutil.which("py-spy") or os.path.expanduser("~/.local/bin/py-spy")


@contextlib.contextmanager
def pinned(pid):
    """`pid`'s threads held on the CPU it is on, for py-spy to run there too
    (the set yielded): stopped from another CPU, its stops were not spread
    as the thread's CPU time is (docs/benchmarks/2026-12-03-python-stop-placement.md)."""
    cpu = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[36])
    tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    old = {t: os.sched_getaffinity(t) for t in tids}
    for t in tids:
        os.sched_setaffinity(t, {cpu})
    try:
        yield {cpu}
    finally:
        for t, m in old.items():
            try:
                os.sched_setaffinity(t, m)
            except OSError:
                pass


def sample(osprey, pid, mode, secs, hz):
    """`mode` attached to `pid` for `secs`: (flat shares, samples)."""
    tmp = tempfile.mkdtemp()
    try:
        if mode == "py-spy":
            raw = os.path.join(tmp, "raw.txt")
            with pinned(pid) as cpus:
                subprocess.run([PYSPY, "record", "--pid", str(pid), "--duration", str(secs), "--rate", str(hz),
                                "--format", "raw", "-o", raw], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               check=True, preexec_fn=lambda: os.sched_setaffinity(0, cpus))
            n = sum(int(line.rsplit(" ", 1)[1]) for line in open(raw) if line.strip())
            return pyspy_flat(raw), n
        out = os.path.join(tmp, "osprey")
        subprocess.run([osprey, "attach", "--pid", str(pid), "--duration", str(secs), "--hz", str(hz),
                        "--out", out] + (["--blocking"] if mode == "blocking" else []),
                       stderr=subprocess.DEVNULL, check=True)
        return osprey_flat(osprey, out), osprey_samples(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def otel_path(name):
    """Where interpreter `name` finds the OpenTelemetry SDK (as it sees it)."""
    if name.startswith("forky-"):
        found = sorted(glob.glob(f"{FORKY}/tmp/osprey-otel-py-{name}-*"))
        inner = found[-1][len(FORKY):] if found else None
    else:
        inner = os.path.join(REPO, "target", "otel-py", os.path.basename(name).replace("debian-", ""))
        inner = inner if os.path.isdir(inner) else None
    if inner is None:
        sys.exit(f"no OpenTelemetry SDK for {name}: run `cargo test -p osprey-python --test otel_spans` first")
    return inner


def measure(osprey, python, workload, modes, secs, hz, chunk):
    """One process running `workload`, sampled by each of `modes` in turn,
    `chunk` seconds at a time, `secs` in all per mode (so that all modes see
    the same load): {mode: (mean flat shares, samples)}."""
    env = dict(os.environ, PYTHONPATH=otel_path(python)) if workload == "span_short" else None
    p = subprocess.Popen(argv_of(python) + [workload], stdout=subprocess.PIPE, env=env)
    res = {m: ({}, 0) for m in modes}
    try:
        assert p.stdout.readline().strip() == b"ready"
        time.sleep(0.3)
        chunks = max(1, round(secs / chunk))
        for _ in range(chunks):
            for m in modes:
                flat, n = sample(osprey, p.pid, m, max(1, secs // chunks), hz)
                acc = res[m][0]
                for f, v in flat.items():
                    acc[f] = acc.get(f, 0.0) + v / chunks
                res[m] = (acc, res[m][1] + n)
        return res
    finally:
        p.kill()
        p.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--osprey", required=True)
    ap.add_argument("--python", action="append", help="repeatable; default 3.11, 3.12, 3.13")
    ap.add_argument("--workload", default="short,recurse,gen")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--secs", type=int, default=10)
    ap.add_argument("--hz", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--chunk", type=int, default=2, help="seconds per mode before the next mode's turn")
    args = ap.parse_args()
    modes = args.modes.split(",")
    for python in args.python or ["3.11", "3.12", "3.13"]:
        for workload in args.workload.split(","):
            for rnd in range(args.rounds):
                res = measure(args.osprey, python, workload, modes, args.secs, args.hz, args.chunk)
                print(f"== {python} {workload} (round {rnd + 1}): samples "
                      + ", ".join(f"{m} {res[m][1]}" for m in modes))
                print(f"{'function':<12}" + "".join(f"{m:>10}" for m in modes))
                worst = {m: 0.0 for m in modes if m != "default"}
                for f in FUNCS[workload]:
                    shares = {m: res[m][0].get(f, 0.0) for m in modes}
                    print(f"{f:<12}" + "".join(f"{shares[m]:>9.1f}%" for m in modes))
                    for m in worst:
                        if "default" in shares:
                            worst[m] = max(worst[m], abs(shares["default"] - shares[m]))
                if "default" in modes:
                    print("largest difference of default: "
                          + ", ".join(f"vs {m} {w:.1f} points" for m, w in worst.items()), flush=True)


if __name__ == "__main__":
    main()
