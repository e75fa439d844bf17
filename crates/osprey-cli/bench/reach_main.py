#!/usr/bin/env python3
"""Share of main-thread samples whose stack reaches main (a frame named
__libc_start*, main's caller's caller) for osprey and for
`perf record -e cpu-clock --call-graph dwarf`, on programs without frame
pointers. Main thread only, 1 kHz.

    cargo build --release -p osprey-cli -p osprey-preload
    python3 crates/osprey-cli/bench/reach_main.py [name filter...]

Needs gcc, zlib headers, rustc, perf, go (for `go tool pprof -traces`), and
Debian's xz, zstd, sqlite3, python3.11. osprey runs through LD_PRELOAD with
the variables `osprey exec` sets (exec would sample python3.11 from outside).
"""
import subprocess, sys, os, glob, re

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../../.."))
WORK = "/tmp/osprey-reach-main"

def osprey_share(tag, cmd, stdin=None):
    out = f"{WORK}/o-{tag}"
    subprocess.run(["rm", "-rf", out])
    # What `osprey exec` sets up, without its CPython detection (native stacks of python3.11).
    env = dict(os.environ, LD_PRELOAD=f"{ROOT}/target/release/libosprey_preload.so", OSPREY_HZ="1000", OSPREY_OUT=out)
    subprocess.run(cmd, env=env, stdin=open(stdin) if stdin else None, stdout=subprocess.DEVNULL, check=True)
    files = glob.glob(out + "/*.pb.gz")
    pid = int(os.path.basename(files[0]).split("-")[1])
    txt = subprocess.run(["go", "tool", "pprof", "-traces"] + files, capture_output=True, text=True).stdout
    tot = hit = 0.0
    for block in txt.split("-----------+-------------------------------------------------------")[1:]:
        lines = [l for l in block.strip().split("\n") if l.strip()]
        tid = None
        frames = []
        val = None
        for l in lines:
            m = re.match(r"\s*thread id:\s+(\d+)", l)
            if m: tid = int(m.group(1)); continue
            if ":" in l and val is None and not re.match(r"\s*[\d.]+(ns|us|ms|s)\s", l): continue
            m = re.match(r"\s*([\d.]+)(ns|us|ms|s)\s+(.*)", l)
            if m and val is None:
                val = float(m.group(1)) * {"ns":1e-9,"us":1e-6,"ms":1e-3,"s":1}[m.group(2)]
                frames.append(m.group(3).strip())
            elif val is not None:
                frames.append(l.strip())
        if tid != pid or val is None: continue
        tot += val
        if any(f.startswith("__libc_start") for f in frames): hit += val
    return hit, tot

def perf_share(tag, cmd, stdin=None):
    data = f"{WORK}/perf-{tag}.data"
    p = subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-F", "1000", "--call-graph", "dwarf", "-o", data, "--"] + cmd,
                   stdin=open(stdin) if stdin else None, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    txt = subprocess.run(["perf", "script", "-i", data, "-F", "pid,tid,ip,sym"], capture_output=True, text=True).stdout
    tot = hit = 0
    for block in txt.split("\n\n"):
        lines = block.strip().split("\n")
        if not lines or not lines[0].strip(): continue
        m = re.match(r"\s*(\d+)/(\d+)", lines[0])
        if not m or m.group(1) != m.group(2): continue
        tot += 1
        if any("__libc_start" in l for l in lines[1:]): hit += 1
    os.remove(data)
    return hit, tot

def build():
    os.makedirs(WORK, exist_ok=True)
    subprocess.run(["cc", "-O2", "-fomit-frame-pointer", "-pthread", "-o", f"{WORK}/fl",
                    f"{ROOT}/crates/osprey-cli/tests/c/frameless.c", "-lz", "-ldl"], check=True)
    test = open(f"{ROOT}/crates/osprey-cli/tests/frameless.rs").read()
    src = test.split('r#"')[1].split('"#')[0].replace("0..120_000", "0..240_000")
    open(f"{WORK}/frameless_rs.rs", "w").write(src)
    subprocess.run(["rustc", "-O", "-C", "force-frame-pointers=no", "-o", f"{WORK}/frs", f"{WORK}/frameless_rs.rs"], check=True)
    with open(f"{WORK}/input", "wb") as f:
        data = b"".join(open(p, "rb").read() for p in sorted(glob.glob("/usr/share/doc/*/copyright")))
        data += open("/lib/x86_64-linux-gnu/libc.so.6", "rb").read()
        f.write(data[:12_000_000])

if __name__ == "__main__":
    build()
    progs = {
      "frameless C (-O2 -fomit-frame-pointer)": ([f"{WORK}/fl", "split", "8"], None),
      "Rust release, no frame pointers": ([f"{WORK}/frs"], None),
      "xz -6 -T1": (["xz", "-6", "-T1", "-c"], f"{WORK}/input"),
      "zstd -19 --single-thread": (["zstd", "-19", "--single-thread", "-c"], f"{WORK}/input"),
      "sqlite3 recursive CTE": (["sqlite3", ":memory:", "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<3000000) SELECT sum(x*x%7), count(*) FROM c;"], None),
      "python3.11 (Debian)": (["/usr/bin/python3.11", "-c", "import json,re\ndef f(n): return n if n<2 else f(n-1)+f(n-2)\nf(27)\ns=json.dumps([{'a':i,'b':str(i)*5} for i in range(300000)])\nprint(len(json.loads(s)), len(re.findall(r'[0-9]+', s)))"], None),
    }
    only = sys.argv[1:]
    print("| program | perf --call-graph dwarf | osprey (CPU seconds) |")
    print("|---|---|---|")
    for name, (cmd, stdin) in progs.items():
        if only and not any(o in name for o in only): continue
        h1, t1 = perf_share(name[:4].strip(), cmd, stdin)
        h2, t2 = osprey_share(name[:4].strip(), cmd, stdin)
        print(f"| {name} | {h1}/{t1} ({100*h1/max(t1,1):.1f}%) | {h2:.3f}/{t2:.3f} s ({100*h2/max(t2,1e-9):.1f}%) |", flush=True)
