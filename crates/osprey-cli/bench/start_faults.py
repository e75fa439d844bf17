#!/usr/bin/env python3
"""Page faults the agent adds to a short process, and where.

Runs `/bin/true` N times (default 200) alone and with the agent preloaded
as `exec --children` does for a descendant (in a spool), under
`perf record -e page-faults -c 1 -d`, and prints the faults a process
takes, by the mapping of the faulting address and the object of the
faulting instruction, with and without the agent. Then decodes the
library's relative relocations (`.relr.dyn`): how many pointers the loader
writes, in which section, and to what.

    python3 crates/osprey-cli/bench/start_faults.py [N]

Environment: OSPREY_PRELOAD (default target/osprey-agent/agent/
libosprey_preload.so: `cargo build --profile agent -p osprey-preload`).
Needs `perf` (linux-perf) and `readelf`.
"""
import collections
import os
import re
import struct
import subprocess
import sys
import tempfile

n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
lib = os.path.abspath(os.environ.get("OSPREY_PRELOAD", "target/osprey-agent/agent/libosprey_preload.so"))
work = tempfile.mkdtemp(prefix="osprey-faults-")
spool = os.path.join(work, "spool")
os.mkdir(spool)
AGENT = f"LD_PRELOAD={lib} OSPREY_ROOT_PID=1 OSPREY_CHILDREN=1 OSPREY_SPOOL=1 OSPREY_OUT={spool} "
MMAP = re.compile(r"(\d+)/\d+\s+PERF_RECORD_MMAP2? \d+/\d+: \[0x([0-9a-f]+)\(0x([0-9a-f]+)\) @ \S+ .*?\]: \S+ ?(.*)$")
FAULT = re.compile(r"^\s*(\S+)\s+(\d+)/\d+\s+([0-9a-f]+) .*? [0-9a-f]+ .*? \(([^()]*)\)\s*$")


def faults(prefix):
    """Faults per process of `prefix`/bin/true, by (thread, mapping, code's object)."""
    data = os.path.join(work, "perf.data")
    script = f"for i in $(seq {n}); do {prefix}/bin/true; done"
    subprocess.run(["perf", "record", "-q", "-e", "page-faults", "-c", "1", "-d", "-o", data, "sh", "-c", script],
                   check=True, stderr=subprocess.DEVNULL)
    out = subprocess.run(["perf", "script", "-i", data, "--show-mmap-events", "-F", "comm,pid,tid,addr,ip,sym,dso"],
                         capture_output=True, text=True).stdout
    maps = collections.defaultdict(list)
    counts = collections.Counter()
    pids = set()
    for line in out.splitlines():
        m = MMAP.search(line)
        if m:
            start = int(m.group(2), 16)
            maps[int(m.group(1))].append((start, start + int(m.group(3), 16), m.group(4).split("/")[-1] or "anon"))
            continue
        m = FAULT.match(line)
        if not m or m.group(1) not in ("true", "osprey-collect"):
            continue
        pid, addr = int(m.group(2)), int(m.group(3), 16)
        pids.add(pid)
        # The last mapping recorded over the address (a later mmap or mprotect replaces it).
        where = "anon"
        for s, e, name in maps[pid]:
            if s <= addr < e:
                where = name
        counts[(m.group(1), where, m.group(4).split("/")[-1])] += 1
    return counts, max(len(pids), 1)


def relocations(path):
    """Relative relocations of `path` by (section written, section pointed to)."""
    data = open(path, "rb").read()
    out = subprocess.run(["readelf", "-S", "-W", path], capture_output=True, text=True).stdout
    secs = []
    for line in out.splitlines():
        m = re.match(r"\s*\[\s*\d+\]\s+(\S+)\s+\S+\s+([0-9a-f]+)\s+([0-9a-f]+)\s+([0-9a-f]+)", line)
        if m and m.group(1) != ".tbss":
            secs.append((m.group(1), int(m.group(2), 16), int(m.group(3), 16), int(m.group(4), 16)))
    by_name = {s[0]: s for s in secs}
    if ".relr.dyn" not in by_name:
        return collections.Counter()
    _, _, off, size = by_name[".relr.dyn"]
    where, locs = 0, []
    for e in struct.unpack(f"<{size // 8}Q", data[off:off + size]):
        if e & 1 == 0:
            locs.append(e)
            where = e + 8
        else:
            locs += [where + 8 * i for i in range(63) if e >> (i + 1) & 1]
            where += 63 * 8

    def section(addr):
        return next(((name, a, o) for name, a, o, s in secs if a <= addr < a + s), (None, 0, 0))

    kinds = collections.Counter()
    for loc in locs:
        name, a, o = section(loc)
        if name in (None, ".bss"):
            continue
        value, length, line, col = struct.unpack("<QQII", data[o + loc - a:o + loc - a + 24].ljust(24, b"\0"))
        to, ta, to_off = section(value)
        what = to
        if to == ".rodata" and length < 4096:
            text = data[to_off + value - ta:to_off + value - ta + length]
            # core::panic::Location: a file name, then line and column.
            what = ".rodata (a panic location)" if text.endswith(b".rs") and 0 < line < 10**6 and col < 10**4 else ".rodata"
        kinds[(name, what)] += 1
    return kinds


alone, na = faults("")
agent, nb = faults(AGENT)
print(f"faults a process: alone {sum(alone.values()) / na:.1f}, with the agent {sum(agent.values()) / nb:.1f}")
print(f"{'alone':>7} {'agent':>7}  thread, mapping of the address, object of the code")
for k in sorted(set(alone) | set(agent), key=lambda k: alone[k] / na - agent[k] / nb)[:20]:
    print(f"{alone[k] / na:7.2f} {agent[k] / nb:7.2f}  {k}")
print()
rel = relocations(lib)
print(f"{sum(rel.values())} relative relocations in {os.path.basename(lib)}:")
for (sec, to), count in rel.most_common(8):
    print(f"{count:7}  in {sec} to {to}")
