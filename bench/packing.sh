#!/usr/bin/env bash
# packing.sh — what data.packing buys instruction tuning: configs/sft-smollm2.yaml (SmolLM2-135M-
# Instruct on the shipped data/sft conversations) trained for a few steps in three ways, interleaved,
# for ROUNDS rounds, and the tokens of text (not padding) per second of each, from the runs'
# summaries (metrics.jsonl "text_tokens_per_s"):
#   fit       one conversation a row, data.seq_len 48 (the data's longest fits), batch 8
#   pad       one conversation a row, data.seq_len 384 (a length set for longer data), batch 1
#   packed    data.packing: true, data.seq_len 384, batch 1 (as many tokens a step as fit)
# Prints a markdown table: median text tokens/s, padding share, and the ratio packed / each.
#   bench/packing.sh [BUILD_DIR] [ROUNDS] [STEPS] [DEVICE]    (default: build 3 8 cpu)
# Needs the model: scripts/get-model.sh smollm2-135m-instruct models/smollm2-135m-instruct
# The ratios are what to read: the rounds interleave, so a busy machine slows all three alike.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
ROUNDS=${2:-3}
STEPS=${3:-8}
DEVICE=${4:-cpu}
BIN="$BUILD/dtrain"
[ -f models/smollm2-135m-instruct/model.safetensors ] || {
  echo "packing.sh: models/smollm2-135m-instruct is missing (scripts/get-model.sh smollm2-135m-instruct models/smollm2-135m-instruct)" >&2
  exit 2
}
OUT=$(mktemp -d /tmp/packing.XXXXXX)
trap 'rm -rf "$OUT"' EXIT

run() { # name round packing seq_len batch
  echo "packing.sh: round $2, $1 ..." >&2
  "$BIN" --config configs/sft-smollm2.yaml --quiet --progress never --set run.dir="$OUT/$1-$2" \
    --set training.device="$DEVICE" --set training.max_steps="$STEPS" --set optimizer.warmup_steps=0 \
    --set data.packing="$3" --set data.seq_len="$4" --set data.batch_size_per_worker="$5" \
    --set eval.every_steps=0 --set eval.max_batches=1 --set checkpoint.every_steps=0 >/dev/null
}
for r in $(seq 1 "$ROUNDS"); do
  run fit "$r" false 48 8
  run pad "$r" false 384 1
  run packed "$r" true 384 1
done

python3 - "$OUT" "$ROUNDS" "$STEPS" "$DEVICE" <<'EOF'
import json, os, statistics, sys
out, rounds, steps, device = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]

def summary(name, r):
    lines = [json.loads(l) for l in open(os.path.join(out, "%s-%d" % (name, r), "metrics.jsonl"))]
    return [o for o in lines if o.get("type") == "summary"][-1]

rows = {}
for name in ("fit", "pad", "packed"):
    s = [summary(name, r) for r in range(1, rounds + 1)]
    rows[name] = (statistics.median(o["text_tokens_per_s"] for o in s), s[0]["padding_share"],
                  [round(o["text_tokens_per_s"]) for o in s])
what = {"fit": "one a row, seq_len 48, batch 8", "pad": "one a row, seq_len 384, batch 1",
        "packed": "data.packing, seq_len 384, batch 1"}
print("SmolLM2-135M-Instruct on data/sft, %s, %s steps a run, %d interleaved rounds\n" % (device, steps, rounds))
print("| rows | padding | text tokens/s (median) | each round | packed / this |")
print("| --- | --- | --- | --- | --- |")
for name in ("fit", "pad", "packed"):
    tps, pad, each = rows[name]
    print("| %s | %.1f%% | %.0f | %s | %.2fx |" % (what[name], 100 * pad, tps, ", ".join(map(str, each)),
                                                rows["packed"][0] / tps))
EOF
