#!/usr/bin/env bash
# pretrain_gain.sh — what pretraining buys the shipped fine-tune: configs/finetune.yaml from
# data/pretrained (the language model of configs/pretrain-bpe.yaml) against the same config
# from random weights (model.init_from empty), same steps, tokenizer, shape and data, for
# several seeds; then configs/finetune-bytes.yaml (the byte-level classifier from random
# weights, 2 500 steps) for the tokenizer's share. Prints a markdown table of validation
# accuracy and loss (mean over the seeds, min-max in brackets) at each evaluation.
#   bench/pretrain_gain.sh [BUILD_DIR] [SEEDS...]      (default: build 1337 1 2)
# Accuracy, not time, is measured: the machine may be busy.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
shift || true
SEEDS=("$@")
[ ${#SEEDS[@]} -gt 0 ] || SEEDS=(1337 1 2)
BIN="$BUILD/dtrain"
OUT=$(mktemp -d /tmp/pretrain-gain.XXXXXX)
trap 'rm -rf "$OUT"' EXIT

for seed in "${SEEDS[@]}"; do
  for init in pretrained scratch; do
    from=data/pretrained
    [ "$init" = scratch ] && from=
    echo "pretrain_gain: seed $seed, $init ..." >&2
    "$BIN" --config configs/finetune.yaml --quiet --progress never --set run.dir="$OUT/$init-$seed" \
      --set training.seed="$seed" --set model.init_from="$from" >/dev/null
  done
  echo "pretrain_gain: seed $seed, bytes from scratch (2500 steps) ..." >&2
  "$BIN" --config configs/finetune-bytes.yaml --quiet --progress never --set run.dir="$OUT/bytes-$seed" \
    --set training.seed="$seed" --set eval.every_steps=100 >/dev/null
done

python3 - "$OUT" "${SEEDS[@]}" <<'EOF'
import json, os, sys
out, seeds = sys.argv[1], sys.argv[2:]

def evals(run):
    rows = {}
    for line in open(os.path.join(out, run, "metrics.jsonl")):
        o = json.loads(line)
        if o.get("type") == "eval":
            rows[o["step"]] = (o["val_accuracy"], o["val_loss"])
    return rows

runs = {k: [evals("%s-%s" % (k, s)) for s in seeds] for k in ("pretrained", "scratch", "bytes")}

def cell(k, step, i):
    v = [r[step][i] for r in runs[k] if step in r]
    if not v:
        return ""
    f = "%.3f" if i == 0 else "%.4f"
    return (f + " [" + f + "-" + f + "]") % (sum(v) / len(v), min(v), max(v))

print("seeds: %s; val accuracy / val loss, mean [min-max]" % ", ".join(seeds))
print()
print("| step | BPE, from data/pretrained | BPE, from random weights | bytes, from random weights |")
print("|---:|---|---|---|")
steps = sorted(set().union(*[r.keys() for k in runs for r in runs[k]]))
for step in steps:
    if step > 500 and step % 500:
        continue
    print("| %d | %s | %s | %s |" % (step, *(" / ".join(c for c in (cell(k, step, 0), cell(k, step, 1)) if c)
                                             for k in ("pretrained", "scratch", "bytes"))))
EOF
