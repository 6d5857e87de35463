#!/usr/bin/env bash
# cpu_vs_torch.sh [--rounds R] [--steps K] [--python PY] [--bin DIR] [--threads N] [--bf16] — dtrain's
# CPU training step (build/bench_cpu_step, fp32) against PyTorch eager's on the same model shape, in
# the same run, interleaved: each round runs, shape after shape, dtrain then torch. The shapes:
#   small    GPT-2 V=256 T=256 L=4 C=256 H=4 B=8       (bench_cpu_step's default)
#   wide     GPT-2 V=50257 T=256 L=6 C=384 H=6 B=4     (a real vocabulary's head)
#   smollm2  SmolLM2-135M: Llama, V=49152 T=256 L=30 C=576, 9 heads on 3, B=4
#   finetune configs/finetune.yaml's model as a language model: V=1025 T=32 L=2 C=64 H=4 B=32
# torch: bench/torch_gpt2.py --device cpu (a minimal GPT-2 in fp32) and bench/torch_llama.py
# (transformers' LlamaForCausalLM), each with N threads (default 2) and AdamW, as dtrain's step.
# Prints one line per run, then per shape the medians over the rounds of dtrain's median step,
# of its share of the sgemm peak (measured by bench_cpu_step in each run), of torch's median step,
# and the ratio torch / dtrain (> 1: dtrain faster). PY: a python with torch and transformers
# (default python3). DIR: the build directory (default build). SHAPES (environment): the shapes to
# run, default "small wide smollm2 finetune". --bf16: both with bf16 products (dtrain: bench_cpu_step
# --bf16 1, training.precision bf16; torch: the step under CPU bf16 autocast, --cpu-bf16 / --bf16);
# each round then also runs dtrain in fp32 right before its bf16 run, and the table adds its median
# step and the median over the rounds of fp32 / bf16 (> 1: bf16 faster).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=3 STEPS=5 PY=python3 BIN=build THREADS=2 BF16=0
SHAPES=${SHAPES:-small wide smollm2 finetune}
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --python) PY=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --bf16) BF16=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "cpu_vs_torch.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$BIN/bench_cpu_step" ] || { echo "cpu_vs_torch.sh: no $BIN/bench_cpu_step (build with DTRAIN_TEST_TOOLS=1)" >&2; exit 2; }
"$PY" -c "import torch, transformers" 2>/dev/null || { echo "cpu_vs_torch.sh: $PY has no torch/transformers (pip install torch transformers)" >&2; exit 2; }

dtrain_args() { # SHAPE
  case "$1" in
    small) echo "--V 256 --T 256 --L 4 --C 256 --H 4 --B 8" ;;
    wide) echo "--V 50257 --T 256 --L 6 --C 384 --H 6 --B 4" ;;
    smollm2) echo "--smollm2" ;;
    finetune) echo "--V 1025 --T 32 --L 2 --C 64 --H 4 --B 32" ;;
    *) echo "cpu_vs_torch.sh: unknown shape $1 (small, wide, smollm2, finetune)" >&2; exit 2 ;;
  esac
}
torch_cmd() { # SHAPE STEPS
  local g="" l=""
  [ "$BF16" = 1 ] && g=--cpu-bf16 l=--bf16
  case "$1" in
    small) echo "bench/torch_gpt2.py --device cpu --vocab 256 --seq 256 --layers 4 --embd 256 --heads 4 --batch 8 --warmup 2 --steps $2 $g" ;;
    wide) echo "bench/torch_gpt2.py --device cpu --vocab 50257 --seq 256 --layers 6 --embd 384 --heads 6 --batch 4 --warmup 2 --steps $2 $g" ;;
    smollm2) echo "bench/torch_llama.py --threads $THREADS --warmup 2 --steps $2 $l" ;;
    finetune) echo "bench/torch_gpt2.py --device cpu --vocab 1025 --seq 32 --layers 2 --embd 64 --heads 4 --batch 32 --warmup 20 --steps $2 $g" ;;
  esac
}
steps_for() { case "$1" in finetune) echo $((STEPS * 20)) ;; *) echo "$STEPS" ;; esac; } # a 10 ms step: more of them

RES=$(mktemp)
trap 'rm -f "$RES"' EXIT
for r in $(seq "$ROUNDS"); do
  for s in $SHAPES; do
    n=$(steps_for "$s")
    # shellcheck disable=SC2046
    f='{}'
    if [ "$BF16" = 1 ]; then # our fp32 in the same round, for fp32 / bf16
      # shellcheck disable=SC2046
      f=$(OMP_NUM_THREADS=$THREADS "$BIN/bench_cpu_step" $(dtrain_args "$s") --threads "$THREADS" --steps "$n" --bf16 0 | tail -1)
      echo "round $r $s: dtrain fp32 $f"
    fi
    # shellcheck disable=SC2046
    a=$(OMP_NUM_THREADS=$THREADS "$BIN/bench_cpu_step" $(dtrain_args "$s") --threads "$THREADS" --steps "$n" --bf16 "$BF16" | tail -1)
    # shellcheck disable=SC2046
    b=$(OMP_NUM_THREADS=$THREADS "$PY" $(torch_cmd "$s" "$n") 2>/dev/null | tail -1)
    echo "round $r $s: dtrain $a"
    echo "round $r $s: torch  $b"
    printf '%s\t%s\t%s\t%s\n' "$s" "$a" "$b" "$f" >>"$RES"
  done
done
# shellcheck disable=SC2086  # SHAPES: one word a shape
python3 - "$RES" "$BF16" $SHAPES <<'PY'
import json, statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
bf16 = sys.argv[2] == "1"
extra = (" dtrain fp32 (ms) | fp32 / bf16 |", " --- | --- |") if bf16 else ("", "")
print("\n| shape | dtrain median step (ms) | share of sgemm peak | sgemm peak (GFLOP/s) | share of dtrain's products' peak | that peak (GFLOP/s) | torch %s (ms) | torch / dtrain |" % ("autocast bf16" if bf16 else "eager") + extra[0])
print("| --- | --- | --- | --- | --- | --- | --- | --- |" + extra[1])
for s in sys.argv[3:]:
    d = [json.loads(a) for n, a, b, f in rows if n == s]
    t = [json.loads(b)["ms_per_step"] for n, a, b, f in rows if n == s]
    md, mt = statistics.median(x["ms_per_step"] for x in d), statistics.median(t)
    line = "| %s | %.1f (%s) | %.0f%% | %.0f | %.0f%% | %.0f | %.1f (%s) | %.2fx |" % (
        s, md, ", ".join("%.1f" % x["ms_per_step"] for x in d),
        100 * statistics.median(x["peak_share"] for x in d), statistics.median(x["peak_gflops"] for x in d),
        100 * statistics.median(x["products_peak_share"] for x in d),
        statistics.median(x["products_peak_gflops"] for x in d),
        mt, ", ".join("%.1f" % x for x in t), mt / md)
    if bf16:  # each round's fp32 over its bf16, then the median of those ratios
        f = [json.loads(f)["ms_per_step"] for n, a, b, f in rows if n == s]
        q = [x / y["ms_per_step"] for x, y in zip(f, d)]
        line += " %.1f (%s) | %.2f (%s) |" % (statistics.median(f), ", ".join("%.1f" % x for x in f),
                                            statistics.median(q), ", ".join("%.2f" % x for x in q))
    print(line)
PY
