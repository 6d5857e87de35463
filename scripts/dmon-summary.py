#!/usr/bin/env python3
"""dmon-summary.py — one line from `nvidia-smi dmon -s pucm -d 1` output taken during a run
(gpu-check.sh's benchmark): how many samples, how busy the SMs were while busy at all, the SM
clock, the power and the memory in use.

    python3 scripts/dmon-summary.py DMON_TXT
"""
import statistics
import sys


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip().split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    cols, rows = None, []
    with open(sys.argv[1], errors="replace") as f:
        for line in f:
            w = line.split()
            if not w:
                continue
            if w[0] == "#":
                if cols is None and len(w) > 1 and w[1] == "gpu":
                    cols = w[1:]
                continue
            if cols and len(w) == len(cols):
                rows.append(dict(zip(cols, w)))

    def num(r, c):
        try:
            return float(r[c])
        except (KeyError, ValueError):
            return None

    if not rows:
        print("nvidia-smi dmon: no samples")
        return 0
    busy = [r for r in rows if (num(r, "sm") or 0) > 0]
    parts = ["nvidia-smi dmon during the benchmark: %d samples, %d with the SMs busy" % (len(rows), len(busy))]
    for c, what, f, unit in (("sm", "SM busy", statistics.median, "%"), ("pclk", "SM clock", statistics.median, " MHz"),
                             ("mclk", "memory clock", statistics.median, " MHz"), ("pwr", "power", max, " W"),
                             ("fb", "memory used", max, " MiB")):
        v = [x for x in (num(r, c) for r in (busy or rows)) if x is not None]
        if v:
            parts.append("%s %s %.0f%s" % (what, "median" if f is statistics.median else "max", f(v), unit))
    print("; ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
