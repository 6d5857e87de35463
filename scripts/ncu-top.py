#!/usr/bin/env python3
"""ncu-top.py — the kernels of one profiled training step, summed by name, from ncu's CSV
(gpu-check.sh's profile step: ncu --csv --print-units base --print-kernel-base function
--metrics gpu__time_duration.sum --log-file FILE). Writes a markdown table of the top N kernels
by total time, with the step's kernel count and total.

    python3 scripts/ncu-top.py NCU_CSV [--step N] [--top 20] [--out profile.md]

Each time is the kernel's own duration as ncu replays it alone (one kernel at a time, caches
flushed between replays), so the sum is not the step's wall time: gaps between kernels and
overlap are not in it.
"""
import argparse
import csv
import sys

TO_MS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0, "second": 1e3, "s": 1e3}


def read(path):
    """{kernel name: [launches, total ms]} from the CSV lines of ncu's log (others are ncu's own)"""
    with open(path, newline="", errors="replace") as f:
        rows = list(csv.reader(line for line in f if line.startswith('"')))
    if not rows or "Kernel Name" not in rows[0]:
        raise ValueError("no CSV header with \"Kernel Name\" in " + path)
    h = {name: i for i, name in enumerate(rows[0])}
    need = ["ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value"]
    missing = [n for n in need if n not in h]
    if missing:
        raise ValueError("ncu CSV without the columns " + ", ".join(missing))
    kernels, seen = {}, set()
    for r in rows[1:]:
        if len(r) < len(rows[0]) or r[h["Metric Name"]] != "gpu__time_duration.sum":
            continue
        unit = r[h["Metric Unit"]].strip()
        if unit not in TO_MS:
            raise ValueError("unknown time unit %r" % unit)
        ms = float(r[h["Metric Value"]].replace(",", "")) * TO_MS[unit]
        if r[h["ID"]] in seen:  # one row per kernel launch and metric
            continue
        seen.add(r[h["ID"]])
        k = kernels.setdefault(r[h["Kernel Name"]], [0, 0.0])
        k[0] += 1
        k[1] += ms
    return kernels


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--step", type=int, default=0, help="the training step profiled (for the heading)")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--out", help="markdown file (default: standard output)")
    a = ap.parse_args()
    try:
        kernels = read(a.csv)
    except (OSError, ValueError) as e:
        print("ncu-top.py: %s" % e, file=sys.stderr)
        return 1
    if not kernels:
        print("ncu-top.py: no kernel times in %s (did the profiled range hold any kernels?)" % a.csv, file=sys.stderr)
        return 1
    launches = sum(k[0] for k in kernels.values())
    total = sum(k[1] for k in kernels.values())
    top = sorted(kernels.items(), key=lambda kv: -kv[1][1])[: a.top]
    lines = ["### One training step under ncu%s" % (" (step %d)" % a.step if a.step else ""), "",
             "Profiled: %d kernel launches, %d different kernels, %.2f ms of kernel time (each kernel replayed alone, "
             "clocks not locked)" % (launches, len(kernels), total), "",
             "| # | kernel | launches | total ms | share |", "|---|---|---|---|---|"]
    for i, (name, (n, ms)) in enumerate(top, 1):
        lines.append("| %d | `%s` | %d | %.3f | %.1f%% |" % (i, name.replace("|", "\\|"), n, ms, 100 * ms / total))
    text = "\n".join(lines) + "\n"
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
