#!/usr/bin/env bash
# llama_vs_torch.sh [--rounds R] [--steps K] [--python PY] [--bin DIR] [--lora RANK] [--bf16] — dtrain's training step of
# SmolLM2-135M's shape (B=4, T=256, fp32, 2 threads: bench_cpu_step --smollm2) against PyTorch
# eager's (bench/torch_llama.py: transformers' LlamaForCausalLM, the same shape, step and threads),
# interleaved in the same run: R rounds of one dtrain run then one torch run, each timing K steps
# after warm-up; prints each run's median step and the median over the rounds of each, and their
# ratio (torch's step time / dtrain's: > 1 is dtrain faster). PY: a python with torch and
# transformers (default python3). DIR: the build directory (default build). --lora RANK: both with
# LoRA of that rank (alpha 2 RANK) on every projection, the base frozen (torch: PEFT's
# get_peft_model; PY needs peft too). --bf16: both with bf16 products (dtrain: training.precision bf16,
# bench_cpu_step --bf16 1, on a CPU with AVX512-BF16 or AMX; torch: the forward under CPU bf16 autocast).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=3 STEPS=5 PY=python3 BIN=build LORA=0 BF16=0
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --python) PY=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    --lora) LORA=$2; shift 2 ;;
    --bf16) BF16=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "llama_vs_torch.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
"$PY" -c "import torch, transformers" 2>/dev/null || { echo "llama_vs_torch.sh: $PY has no torch/transformers (pip install torch transformers)" >&2; exit 2; }
d=() t=() tbf=()
[ "$BF16" = 1 ] && tbf=(--bf16)
for r in $(seq "$ROUNDS"); do
  a=$(OMP_NUM_THREADS=2 "$BIN/bench_cpu_step" --smollm2 --threads 2 --steps "$STEPS" --lora "$LORA" --bf16 "$BF16" | tail -1)
  b=$(OMP_NUM_THREADS=2 "$PY" bench/torch_llama.py --threads 2 --steps "$STEPS" --lora "$LORA" "${tbf[@]}" 2>/dev/null | tail -1)
  echo "round $r: dtrain $a"
  echo "round $r: torch  $b"
  d+=("$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["ms_per_step"])' "$a")")
  t+=("$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["ms_per_step"])' "$b")")
done
python3 - "${d[*]}" "${t[*]}" <<'PY'
import statistics, sys
d = [float(x) for x in sys.argv[1].split()]
t = [float(x) for x in sys.argv[2].split()]
md, mt = statistics.median(d), statistics.median(t)
print("dtrain: median step %.1f ms (rounds: %s)" % (md, ", ".join("%.1f" % x for x in d)))
print("torch eager: median step %.1f ms (rounds: %s)" % (mt, ", ".join("%.1f" % x for x in t)))
print("ratio (torch / dtrain): %.2fx" % (mt / md))
PY
