#!/usr/bin/env python3
"""dnnl_products.py [--top N] -- COMMAND ... : the time of each oneDNN matmul a command runs.

Runs COMMAND (a dtrain or bench_cpu_step run on the CPU backend, whose products go through
oneDNN: training.precision bf16, and fp32 where it is built with oneDNN) with oneDNN's verbose
log on (DNNL_VERBOSE=1 for oneDNN 2.x, ONEDNN_VERBOSE=1 for 3.x), and prints a row for each
distinct primitive: the kernel oneDNN chose, its inputs' types and layouts ("ba": transposed),
the problem as M x K x N, how many times it ran, its median time and the GFLOP/s at that median,
and its total. Then the totals by kernel. The command's standard output (where oneDNN writes its
log) is read, not shown; its standard error is.

  bench/dnnl_products.py -- env OMP_NUM_THREADS=1 build/bench_cpu_step --threads 1 --steps 60 \\
      --bf16 1 --V 1025 --T 32 --L 2 --C 64 --H 4 --B 32

bench_cpu_step's own peak measurement, after its steps, shows as rows of its own (products of
2048 x 2048 and 1024 x 1024). The verbose log times each call alone, which costs a little: the
times are for comparing primitives, not for a step's total. docs/PERFORMANCE.md ("Where the
fine-tune's bf16 products lose time") holds a run of the command above.
"""
import collections
import os
import statistics
import subprocess
import sys


def parse(line):
    """(kernel, layouts, (batch, M, K, N), ms) of a matmul's exec line, else None"""
    if not line.startswith("onednn_verbose,") and not line.startswith("dnnl_verbose,"):
        return None
    f = line.rstrip("\n").split(",")
    if "exec" not in f:
        return None
    i = f.index("exec")
    if len(f) < i + 10 or f[i + 2] != "matmul":
        return None
    kernel, mds, problem = f[i + 3], f[i + 5], f[i + 8]
    try:
        ms = float(f[-1])
        src, wei = ([int(x) for x in p.split("x")] for p in problem.split(":")[:2])
    except ValueError:
        return None
    layouts = []
    for md in mds.split(" "):  # "src_bf16::blocked:ab:f0"
        name, _, rest = md.partition("_")
        if name in ("src", "wei", "dst") and rest:
            parts = rest.split(":")
            layouts.append("%s %s %s" % (name, parts[0], parts[3] if len(parts) > 3 else "?"))
    batch = 1
    for d in src[:-2]:
        batch *= d
    return kernel, ", ".join(layouts), (batch, src[-2], src[-1], wei[-1]), ms


def main(argv):
    top = 30
    if "--" not in argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    k = argv.index("--")
    opts, cmd = argv[:k], argv[k + 1:]
    while opts:
        if opts[0] == "--top" and len(opts) > 1 and opts[1].isdigit() and int(opts[1]) > 0:
            top = int(opts[1])
            opts = opts[2:]
        else:
            print("dnnl_products.py: bad option %s (--top N, N > 0; then -- COMMAND)" % " ".join(opts[:2]), file=sys.stderr)
            return 2
    if not cmd:
        print("dnnl_products.py: no command after --", file=sys.stderr)
        return 2
    env = dict(os.environ, DNNL_VERBOSE="1", ONEDNN_VERBOSE="1")
    try:
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
    except OSError as e:
        print("dnnl_products.py: cannot run %s: %s" % (cmd[0], e.strerror), file=sys.stderr)
        return 2
    calls = collections.defaultdict(list)
    for line in proc.stdout.splitlines():
        r = parse(line)
        if r:
            calls[r[:3]].append(r[3])
    if proc.returncode != 0:
        print("dnnl_products.py: %s exited with %d" % (cmd[0], proc.returncode), file=sys.stderr)
    if not calls:
        print("dnnl_products.py: no oneDNN matmul ran (a build without oneDNN, or fp32 products on OpenBLAS)",
              file=sys.stderr)
        return proc.returncode or 1
    rows = []
    for (kernel, layouts, (b, m, kk, n)), ts in calls.items():
        med = statistics.median(ts)
        flop = 2.0 * b * m * kk * n
        shape = ("%d x " % b if b > 1 else "") + "%d x %d x %d" % (m, kk, n)
        rows.append((sum(ts), kernel, layouts, shape, len(ts), med, flop / (med * 1e6) if med > 0 else 0.0, flop))
    rows.sort(reverse=True)
    print("| kernel | inputs (ba: transposed) | M x K x N | calls | median (us) | GFLOP/s at the median | total (ms) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for tot, kernel, layouts, shape, n, med, gf, _ in rows[:top]:
        print("| %s | %s | %s | %d | %.1f | %.0f | %.1f |" % (kernel, layouts, shape, n, med * 1e3, gf, tot))
    if len(rows) > top:
        print("(%d more primitives, %.1f ms in all)" % (len(rows) - top, sum(r[0] for r in rows[top:])))
    by = collections.defaultdict(lambda: [0.0, 0.0])
    for tot, kernel, _, _, n, _, _, flop in rows:
        by[kernel][0] += tot
        by[kernel][1] += flop * n
    print("\n| kernel | total (ms) | GFLOP/s over its calls |")
    print("| --- | --- | --- |")
    for kernel, (tot, flop) in sorted(by.items(), key=lambda kv: -kv[1][0]):
        print("| %s | %.1f | %.0f |" % (kernel, tot, flop / (tot * 1e6) if tot > 0 else 0.0))
    return 0 if proc.returncode == 0 else proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
