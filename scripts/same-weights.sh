#!/usr/bin/env bash
# same-weights.sh BASE [NEW] — proves a refactor changed no numerics: builds the commit BASE
# (and NEW, default: the working tree) CPU-only, runs the same trainings with each binary and
# compares every file they leave that holds numbers, byte for byte (cmp):
#   finetune-1w   configs/finetune.yaml, 200 steps, 1 worker
#   finetune-2w   the same with 2 workers (shm all-reduce)
#   lm-2w         configs/pretrain.yaml shrunk to 60 steps, 2 workers, grad_accum_steps 2,
#                 a checkpoint every 20 steps, then resumed for 20 more steps on 1 worker
#   lora-2w       the fine-tune with model.lora (rank 4 on its four products), 60 steps, 2 workers
#   llama-lora-2w the shrunk pretrain as a 2-layer Llama (grouped-query attention, SwiGLU) with
#                 model.lora on all seven projections, 40 steps, 2 workers
#   then greedy generation from lm-2w (with the key/value cache and without), and predict over
#   the validation texts with finetune-2w (a classifier) and lm-2w (a language model)
# Compared: model.safetensors of each run, each checkpoint's model.safetensors and
# optimizer.safetensors, the generated texts and the predictions. Exit 0 when all are
# identical, 1 otherwise (naming the files).
# Environment: WORK (default /tmp/dtrain-same-weights) holds the builds and the runs.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 BASE [NEW]   (git revisions; NEW defaults to the working tree)" >&2; exit 2; }
cd "$(dirname "$0")/.."
ROOT=$(pwd)
WORK=${WORK:-/tmp/dtrain-same-weights}
mkdir -p "$WORK"

build() { # REV DIR: a CPU-only Release build of REV ("" = the working tree) into DIR/build
    local rev=$1 dir=$2 src
    mkdir -p "$dir"
    if [ -z "$rev" ]; then src=$ROOT; else
        src=$dir/src
        if [ ! -d "$src" ] || [ "$(git -C "$src" rev-parse HEAD 2>/dev/null)" != "$(git rev-parse "$rev^{commit}")" ]; then
            rm -rf "$src"
            git worktree prune
            git worktree add --detach "$src" "$rev" >/dev/null
        fi
    fi
    cmake -S "$src" -B "$dir/build" -DDTRAIN_CUDA=OFF -DCMAKE_BUILD_TYPE=Release >"$dir/cmake.log" 2>&1 ||
        { cat "$dir/cmake.log"; return 1; }
    cmake --build "$dir/build" -j "$(nproc)" --target dtrain >"$dir/make.log" 2>&1 || { tail -30 "$dir/make.log"; return 1; }
    echo "$dir/build/dtrain"
}

run_all() { # DTRAIN OUT: the trainings, from the repository root (the configs' data paths)
    local bin=$1 out=$2
    rm -rf "$out"
    mkdir -p "$out"
    "$bin" data tokenize --tokenizer bytes data/tinytext/corpus.txt "$out/corpus.bin" >/dev/null
    "$bin" data tokenize --tokenizer bytes data/tinytext/val.txt "$out/val.bin" >/dev/null
    local common=(--progress never --quiet --set training.device=cpu --set fault_tolerance.max_restarts=0)
    "$bin" --config configs/finetune.yaml "${common[@]}" --set run.dir="$out/finetune-1w" \
        --set training.max_steps=200 >"$out/finetune-1w.log"
    "$bin" --config configs/finetune.yaml "${common[@]}" --set run.dir="$out/finetune-2w" \
        --set training.max_steps=200 --set training.num_workers=2 >"$out/finetune-2w.log"
    local lm=(--set data.train_path="$out/corpus.bin" --set data.val_path="$out/val.bin" --set model.n_layer=2
              --set data.seq_len=64 --set data.batch_size_per_worker=4 --set training.grad_accum_steps=2
              --set checkpoint.every_steps=20 --set eval.every_steps=20 --set eval.max_batches=2)
    "$bin" --config configs/pretrain.yaml "${common[@]}" "${lm[@]}" --set run.dir="$out/lm-2w" \
        --set training.max_steps=60 --set training.num_workers=2 >"$out/lm-2w.log"
    "$bin" --config configs/pretrain.yaml "${common[@]}" "${lm[@]}" --set run.dir="$out/lm-2w" \
        --set training.max_steps=80 --set training.num_workers=1 >>"$out/lm-2w.log"
    "$bin" --config configs/finetune.yaml "${common[@]}" --set run.dir="$out/lora-2w" --set training.max_steps=60 \
        --set training.num_workers=2 --set model.lora.rank=4 \
        --set "model.lora.targets=[c_attn, attn.c_proj, c_fc, mlp.c_proj]" >"$out/lora-2w.log"
    "$bin" --config configs/pretrain.yaml "${common[@]}" "${lm[@]}" --set run.dir="$out/llama-lora-2w" \
        --set training.max_steps=40 --set training.num_workers=2 --set model.type=llama \
        --set model.num_key_value_heads=2 --set model.intermediate_size=256 --set model.lora.rank=4 \
        --set "model.lora.targets=[q, k, v, o, gate, up, down]" >"$out/llama-lora-2w.log"
    # what the trained models say: generated text (the key/value cache, and without it),
    # a classifier's and a language model's predictions, printed with every digit
    local gen=(--checkpoint "$out/lm-2w" --prompt "The " --max-new-tokens 48 --temperature 0)
    "$bin" generate "${gen[@]}" >"$out/generate.txt" 2>/dev/null
    "$bin" generate "${gen[@]}" --no-cache >"$out/generate-nocache.txt" 2>/dev/null
    "$bin" predict --checkpoint "$out/finetune-2w" --input data/sentiment/val.tsv --out "$out/predict-cls.jsonl" \
        --progress never 2>/dev/null
    "$bin" predict --checkpoint "$out/lm-2w" --input data/tinytext/val.txt --out "$out/predict-lm.jsonl" \
        --progress never 2>/dev/null
}

echo "same-weights: building $1"
old=$(build "$1" "$WORK/base")
echo "same-weights: building ${2:-the working tree}"
new=$(build "${2:-}" "$WORK/new")
echo "same-weights: training with both (about a minute each)"
run_all "$old" "$WORK/runs-base"
run_all "$new" "$WORK/runs-new"

bad=0 n=0
while IFS= read -r f; do
    n=$((n + 1))
    if ! cmp -s "$WORK/runs-base/$f" "$WORK/runs-new/$f"; then
        echo "DIFFERS: $f"
        bad=1
    fi
done < <(cd "$WORK/runs-base" && { find . -name 'model.safetensors' -o -name 'optimizer.safetensors'; \
                                    ls generate.txt generate-nocache.txt predict-cls.jsonl predict-lm.jsonl; } | sort)
[ "$n" -ge 15 ] || { echo "same-weights: only $n files were written (expected >= 15)"; exit 1; }
for f in $(cd "$WORK/runs-new" && find . -name '*.safetensors' | sort); do
    [ -e "$WORK/runs-base/$f" ] || { echo "only the new binary wrote $f"; bad=1; }
done
if [ $bad = 0 ]; then echo "same-weights: all $n files (weights, generated text, predictions) are byte-identical"; fi
exit $bad
