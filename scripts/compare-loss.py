#!/usr/bin/env python3
"""compare-loss.py — compares the training loss of two dtrain runs step by step.

    python3 scripts/compare-loss.py REF_RUN_DIR TEST_RUN_DIR [--rtol 0.05] [--atol 0.02] [--rows 12]

Reads the "train" records of RUN_DIR/metrics.jsonl (one JSON object a line, written by
src/io/metrics.c: {"time":T,"type":"train","step":S,"loss":L,...}; a run dir may also be given as the
metrics.jsonl file itself). When a step appears more than once (a run resumed after a
restart), its last record counts. Every step that both runs trained is compared; the test
passes when each one has

    |loss_test - loss_ref| <= rtol * |loss_ref| + atol

(defaults: the bf16-vs-fp32 tolerance of scripts/gpu-check.sh, REF = the fp32 CPU run) and the
test run trained every step the reference did. Prints a table (first and last steps, evenly
spaced ones between and the worst step), the largest deviation and a verdict.
Exit status: 0 pass, 1 fail, 2 unreadable input. Python standard library only.
"""
import argparse
import json
import math
import os
import sys


def read_losses(path):
    """{step: loss} from the train records of a run dir's metrics.jsonl."""
    f = os.path.join(path, "metrics.jsonl") if os.path.isdir(path) else path
    losses = {}
    with open(f, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except ValueError as e:
                raise ValueError("%s:%d: not JSON: %s" % (f, n, e))
            if rec.get("type") != "train":
                continue
            loss = rec.get("loss")
            losses[int(rec["step"])] = float("nan") if loss is None else float(loss)
    return f, losses


def pick_rows(steps, worst, rows):
    """First, last, the worst and evenly spaced steps between, at most `rows` (+1)."""
    if len(steps) <= rows:
        return list(steps)
    k = max(rows - 1, 2)
    chosen = {steps[round(i * (len(steps) - 1) / (k - 1))] for i in range(k)}
    chosen.add(worst)
    return sorted(chosen)


def main(argv=None):
    ap = argparse.ArgumentParser(description="compare the train loss of two dtrain runs step by step")
    ap.add_argument("ref", help="reference run dir (or its metrics.jsonl), e.g. the CPU fp32 run")
    ap.add_argument("test", help="run dir (or metrics.jsonl) to check, e.g. the GPU bf16 run")
    ap.add_argument("--rtol", type=float, default=0.05, help="relative tolerance (default 0.05)")
    ap.add_argument("--atol", type=float, default=0.02, help="absolute tolerance (default 0.02)")
    ap.add_argument("--rows", type=int, default=12, help="table rows besides the worst step (default 12)")
    ap.add_argument("--ref-name", default="ref", help="column name of the reference (default ref)")
    ap.add_argument("--test-name", default="test", help="column name of the test run (default test)")
    a = ap.parse_args(argv)

    try:
        ref_file, ref = read_losses(a.ref)
        test_file, test = read_losses(a.test)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print("compare-loss: error: %s" % e, file=sys.stderr)
        return 2
    for name, f, d in ((a.ref_name, ref_file, ref), (a.test_name, test_file, test)):
        if not d:
            print("compare-loss: error: %s: no train records (%s run)" % (f, name), file=sys.stderr)
            return 2

    common = sorted(set(ref) & set(test))
    missing = sorted(set(ref) - set(test))
    bad, worst, worst_dev, worst_ratio = [], None, 0.0, -1.0
    for s in common:
        r, t = ref[s], test[s]
        allowed = a.rtol * abs(r) + a.atol
        dev = abs(t - r)
        if not (math.isfinite(r) and math.isfinite(t)):
            dev, ratio = float("inf"), float("inf")
        else:
            ratio = dev / allowed if allowed > 0 else (0.0 if dev == 0 else float("inf"))
        if not dev <= allowed:
            bad.append(s)
        if ratio > worst_ratio:
            worst, worst_dev, worst_ratio = s, dev, ratio

    w = max(len(a.ref_name), len(a.test_name), 10)
    print("| step | %*s | %*s | abs diff | allowed | ok |" % (w, a.ref_name, w, a.test_name))
    print("| ---: | %s: | %s: | ---: | ---: | :-: |" % ("-" * (w - 1), "-" * (w - 1)))
    for s in pick_rows(common, worst, a.rows) if common else []:
        r, t = ref[s], test[s]
        allowed = a.rtol * abs(r) + a.atol
        dev = abs(t - r)
        print("| %4d | %*.6f | %*.6f | %8.6f | %7.5f | %s |" % (s, w, r, w, t, dev, allowed,
                                                              "yes" if dev <= allowed else "NO"))
    print()
    print("compared %d steps (%s: %d train records, %s: %d); tolerance |diff| <= %g * |%s| + %g"
          % (len(common), a.ref_name, len(ref), a.test_name, len(test), a.rtol, a.ref_name, a.atol))
    if common:
        print("max deviation: %.6f at step %d (%.0f%% of the allowed %.6f)"
              % (worst_dev, worst, 100.0 * worst_ratio, a.rtol * abs(ref[worst]) + a.atol))
    ok = True
    if not common:
        print("FAIL: the runs share no step")
        ok = False
    if missing:
        print("FAIL: %s lacks %d step(s) that %s trained (first: %d)" % (a.test_name, len(missing), a.ref_name,
                                                                      missing[0]))
        ok = False
    if bad:
        print("FAIL: %d of %d steps outside the tolerance (first: step %d)" % (len(bad), len(common), bad[0]))
        ok = False
    if ok:
        print("PASS: all %d steps within the tolerance" % len(common))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
