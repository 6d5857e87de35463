#!/usr/bin/env bash
# zero_memory.sh — what training.zero_stage 1 saves: each worker's peak memory (the kernel's
# ru_maxrss, the run summary's peak_rss_mb) with and without sharding the AdamW state, for a
# model large enough to show it (configs/ci-smoke.yaml widened to 6 layers of n_embd 512:
# 19.1M parameters, 153 MB of moments), on 2 and 4 CPU workers, plus the step time and the
# bytes each worker sent per step. Rank 0 also stages the whole moments on the host for the
# final checkpoint (in both stages), so the other ranks show the saving alone. Prints a
# markdown table.
#   bench/zero_memory.sh [BUILD_DIR] [STEPS]      (default: build 6)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
STEPS=${2:-6}
BIN="$BUILD/dtrain"
OUT=$(mktemp -d /tmp/zero-memory.XXXXXX)
trap 'rm -rf "$OUT"' EXIT

for w in 2 4; do
  for z in 0 1; do
    echo "zero_memory: $w workers, zero_stage $z ..." >&2
    "$BIN" --config configs/ci-smoke.yaml --quiet --progress never --set run.dir="$OUT/w$w-z$z" \
      --set training.num_workers=$w --set data.batch_size_per_worker=2 --set training.max_steps="$STEPS" \
      --set training.zero_stage=$z --set model.n_layer=6 --set model.n_head=8 --set model.n_embd=512 \
      --set eval.every_steps=0 --set logging.every_steps=1 --set training.cpu_threads_per_worker=1 >/dev/null
  done
done

python3 - "$OUT" <<'PY'
import json, os, statistics, sys
out = sys.argv[1]
def read(run):
    steps, summ = [], None
    for line in open(os.path.join(out, run, "metrics.jsonl")):
        o = json.loads(line)
        if o.get("type") == "train": steps.append(o)
        if o.get("type") == "summary": summ = o
    return steps, summ
print("| workers | zero_stage | peak memory rank 0 (MB) | peak memory, other ranks (MB) | step ms (median, steps 2..) | MB sent/step |")
print("|---:|---:|---:|---|---:|---:|")
for w in (2, 4):
    for z in (0, 1):
        steps, s = read(f"w{w}-z{z}")
        peaks = s["peak_rss_mb"]
        ms = statistics.median(o["step_ms"] for o in steps[1:])
        print(f"| {w} | {z} | {peaks[0]:.0f} | {', '.join(f'{p:.0f}' for p in peaks[1:])} | {ms:.0f} | "
              f"{s['sent_bytes_per_step'] / 1e6:.1f} |")
PY
