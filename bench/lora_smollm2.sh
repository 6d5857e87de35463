#!/usr/bin/env bash
# lora_smollm2.sh [--rounds R] [--steps K] [--workers N] [--bin DIR] — LoRA against the full
# fine-tune of SmolLM2-135M-Instruct on the CPU, in the same run: configs/finetune-smollm2.yaml and
# configs/finetune-smollm2-lora.yaml (rank 8 on all seven projections), the latter also with its
# frozen base kept in bf16 (model.lora.base_dtype: bf16), each for K steps on N workers of 1 thread
# (default 2: the all-reduce has something to send), interleaved over R rounds (full, LoRA, LoRA
# on the bf16 base). Each run's median step (metrics.jsonl's step_ms, the first step left out),
# the workers' peak memory (the summary's peak_rss_mb, the largest rank's), the bytes each worker
# sends per step (sent_bytes_per_step) and the size of the checkpoint it writes at the end; then
# the medians over the rounds and LoRA's ratios. Needs the model (scripts/get-model.sh
# smollm2-135m-instruct models/smollm2-135m-instruct). Runs go to WORK (default /tmp/dtrain-lora-bench).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=2 STEPS=8 WORKERS=2 BIN=build WORK=${WORK:-/tmp/dtrain-lora-bench}
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --workers) WORKERS=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "lora_smollm2.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -d models/smollm2-135m-instruct ] || { echo "lora_smollm2.sh: no models/smollm2-135m-instruct (scripts/get-model.sh smollm2-135m-instruct models/smollm2-135m-instruct)" >&2; exit 2; }
mkdir -p "$WORK"
one() { # KIND ROUND: one run, its line of numbers as JSON
  local kind=$1 r=$2 cfg=configs/finetune-smollm2.yaml dir base=fp32
  [ "$kind" != full ] && cfg=configs/finetune-smollm2-lora.yaml
  [ "$kind" = lora16 ] && base=bf16
  dir=$WORK/$kind-$r
  rm -rf "$dir"
  "$BIN/dtrain" --config "$cfg" --set run.dir="$dir" --set training.max_steps="$STEPS" --set training.device=cpu \
    --set training.num_workers="$WORKERS" --set training.cpu_threads_per_worker=1 --set training.adapt_cpu_threads=false \
    --set eval.every_steps=0 --set eval.max_batches=1 --set checkpoint.every_steps=0 --set logging.every_steps=1 \
    $([ "$kind" = full ] || echo --set model.lora.base_dtype=$base) --quiet --progress never >/dev/null
  python3 - "$dir" "$kind" <<'PY'
import glob, json, os, statistics, sys
d, kind = sys.argv[1], sys.argv[2]
recs = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))]
steps = [r["step_ms"] for r in recs if r.get("type") == "train" and r["step"] > 1]
s = [r for r in recs if r.get("type") == "summary"][-1]
ck = sorted(glob.glob(os.path.join(d, "checkpoints", "step_*")))[-1]
size = sum(os.path.getsize(os.path.join(ck, f)) for f in os.listdir(ck))
print(json.dumps({"kind": kind, "ms_per_step": statistics.median(steps), "peak_rss_mb": max(s["peak_rss_mb"]),
                  "sent_mb_per_step": s["sent_bytes_per_step"] / 1e6, "checkpoint_mb": size / 1e6}))
PY
}
res=()
for r in $(seq "$ROUNDS"); do
  for kind in full lora lora16; do
    line=$(one "$kind" "$r")
    echo "round $r: $line"
    res+=("$line")
  done
done
python3 - "${res[@]}" <<'PY'
import json, statistics, sys
rows = [json.loads(a) for a in sys.argv[1:]]
keys = [("ms_per_step", "step (ms, median)"), ("peak_rss_mb", "peak memory per worker (MB)"),
        ("sent_mb_per_step", "sent per step per worker (MB)"), ("checkpoint_mb", "checkpoint (MB)")]
kinds = ("full", "lora", "lora16")
med = {k: {kind: statistics.median(r[k] for r in rows if r["kind"] == kind) for kind in kinds} for k, _ in keys}
ratio = lambda a, b: "%.3f" % (a / b) if b else "-"
print("| | full fine-tune | LoRA (rank 8, 7 projections) | LoRA, base in bf16 | LoRA / full | bf16 base / fp32 base |")
print("| --- | --- | --- | --- | --- | --- |")
for k, name in keys:
    f, l, h = med[k]["full"], med[k]["lora"], med[k]["lora16"]
    print("| %s | %.1f | %.1f | %.1f | %s | %s |" % (name, f, l, h, ratio(l, f), ratio(h, l)))
PY
