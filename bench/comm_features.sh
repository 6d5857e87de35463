#!/usr/bin/env bash
# comm_features.sh — what each communication feature of the data-parallel step costs or saves:
# 2 CPU workers (one thread each) on configs/ci-smoke.yaml widened to 6 layers of n_embd 512
# (19.1M parameters: 76 MB of fp32 gradients a step), with and without training.zero_stage 1
# and training.grad_comm_dtype bf16. Each variant runs REPEAT times, interleaved (so that a busy
# moment of the machine hits every variant alike); the table gives medians over runs of the
# median step (steps 2..), of the time a step waits for collectives (comm_ms: the gradient
# buckets after backward, the agreement, and with zero_stage 1 the weights' all-gather) and the
# bytes each worker sent per step. Prints a markdown table.
#   bench/comm_features.sh [BUILD_DIR] [REPEAT] [STEPS]      (default: build 3 8)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
REPEAT=${2:-3}
STEPS=${3:-8}
BIN="$BUILD/dtrain"
OUT=$(mktemp -d /tmp/comm-features.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
VARIANTS=("0 fp32" "0 bf16" "1 fp32" "1 bf16")

for k in $(seq 1 "$REPEAT"); do
  for v in "${VARIANTS[@]}"; do
    set -- $v
    echo "comm_features: run $k, zero_stage $1, grad_comm_dtype $2 ..." >&2
    "$BIN" --config configs/ci-smoke.yaml --quiet --progress never --set run.dir="$OUT/z$1-$2-$k" \
      --set training.num_workers=2 --set data.batch_size_per_worker=2 --set training.max_steps="$STEPS" \
      --set training.zero_stage="$1" --set training.grad_comm_dtype="$2" --set model.n_layer=6 --set model.n_head=8 \
      --set model.n_embd=512 --set eval.every_steps=0 --set logging.every_steps=1 \
      --set training.cpu_threads_per_worker=1 --set checkpoint.every_steps=0 >/dev/null
  done
done

python3 - "$OUT" "$REPEAT" <<'PY'
import json, os, statistics, sys
out, repeat = sys.argv[1], int(sys.argv[2])
med = statistics.median
print("| zero_stage | grad_comm_dtype | step ms | waiting for collectives, ms/step | MB sent/step | runs |")
print("|---:|---|---:|---:|---:|---:|")
for z, d in ((0, "fp32"), (0, "bf16"), (1, "fp32"), (1, "bf16")):
    steps, comm, sent = [], [], []
    for k in range(1, repeat + 1):
        recs = [json.loads(l) for l in open(os.path.join(out, f"z{z}-{d}-{k}", "metrics.jsonl"))]
        train = [r for r in recs if r.get("type") == "train"][1:]
        steps.append(med(r["step_ms"] for r in train))
        comm.append(med(r["comm_ms"] for r in train))
        sent.append([r for r in recs if r.get("type") == "summary"][0]["sent_bytes_per_step"])
    print(f"| {z} | {d} | {med(steps):.0f} | {med(comm):.1f} | {med(sent) / 1e6:.1f} | {repeat} |")
PY
