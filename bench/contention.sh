#!/usr/bin/env bash
# contention.sh — the shipped fine-tune's step time alone and next to one busy process, for
# dtrain (training.adapt_cpu_threads on: the default; and off: a fixed cores/workers threads,
# as before it existed) and for PyTorch eager on the same model shape (bench/torch_gpt2.py
# --task cls), side by side in one run.
#
#   bench/contention.sh [--steps N] [--busy K] [--python PY] [--dtrain BIN]
#                                         (defaults: 800 steps, 1 busy process, python3, build/dtrain)
#
# The three run one after the other alone, then again next to K competing processes (shell
# busy loops, as `yes > /dev/null` would be), started before and stopped after those three.
# Per run: the median and 90th percentile of the step times after the first 20 steps (dtrain:
# step_ms of every train record of metrics.jsonl; PyTorch: its timed steps), and the slowdown
# next to the busy process (its median over the same program's median alone). Without an
# importable torch (e.g. `pip install torch` into a venv given by --python) its rows say so.
# Run it on an otherwise idle machine: nothing else may keep a core busy meanwhile.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=800
BUSY=1
PY=python3
BIN=build/dtrain
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) STEPS=$2; shift 2 ;;
    --busy) BUSY=$2; shift 2 ;;
    --python) PY=$2; shift 2 ;;
    --dtrain) BIN=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "contention: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -x "$BIN" ] || { echo "contention: $BIN not found (scripts/setup.sh builds it)" >&2; exit 1; }
OUT=$(mktemp -d /tmp/dtrain-contention.XXXXXX)
busy=()
trap 'kill "${busy[@]}" 2>/dev/null || true; rm -rf "$OUT"' EXIT

# median and p90 (ms) of the numbers on stdin after the first 20
# (p90: the value at 0-based rank int(0.9 n) of the sorted times, as bench/torch_gpt2.py takes it)
stats() { tail -n +21 | sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) { print "- -"; exit }
  m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; k = int(0.9 * NR) + 1; if (k > NR) k = NR
  printf "%.2f %.2f\n", m, v[k] }'; }

dtrain_run() { # NAME ADAPT: median p90
  local dir=$OUT/$1
  "$BIN" --config configs/finetune-bytes.yaml --quiet --progress never --set run.dir="$dir" --set training.max_steps="$STEPS" \
    --set eval.every_steps=0 --set eval.max_batches=1 --set checkpoint.every_steps=0 --set logging.every_steps=1 \
    --set logging.tensorboard=false --set training.adapt_cpu_threads="$2" >"$dir.log" 2>&1 \
    || { echo "- -"; echo "contention: $1 failed: $(tail -1 "$dir.log")" >&2; return; }
  sed -n 's/.*"type":"train".*"step_ms":\([0-9.e+-]*\).*/\1/p' "$dir/metrics.jsonl" | stats
}

torch_run() { # median p90
  local j
  j=$("$PY" bench/torch_gpt2.py --device cpu --task cls --batch 32 --seq 64 --layers 2 --embd 64 --heads 4 --vocab 257 \
      --warmup 20 --steps "$STEPS" 2>/dev/null || true)
  case "$j" in
    *ms_per_step*) "$PY" -c 'import json,sys; d=json.loads(sys.argv[1]); print("%.2f %.2f" % (d["ms_per_step"], d["ms_p90"]))' "$j" ;;
    *) echo "- -" ;;
  esac
}

run_all() { # TAG: one line per program
  echo "dtrain-adaptive $(dtrain_run "adaptive-$1" true)"
  echo "dtrain-fixed $(dtrain_run "fixed-$1" false)"
  echo "pytorch-eager $(torch_run)"
}

echo "contention: $STEPS steps of configs/finetune-bytes.yaml per run, $(nproc) cores; alone first ..." >&2
run_all alone >"$OUT/alone"
for _ in $(seq "$BUSY"); do
  sh -c 'while :; do :; done' &
  busy+=($!)
done
echo "contention: ... then next to $BUSY busy process(es) (pid ${busy[*]})" >&2
run_all busy >"$OUT/busy"
kill "${busy[@]}"
busy=()

printf "\n%-16s %11s %11s %12s %12s %10s %8s\n" program "alone med" "alone p90" "$BUSY busy med" "$BUSY busy p90" slowdown "p90/med"
# a row whose run failed (or without torch) shows "-" and no ratios
join "$OUT/alone" "$OUT/busy" | awk 'function ok(x) { return x ~ /^[0-9.]+$/ && x + 0 > 0 }
  { if (!ok($2) || !ok($4)) { printf "%-16s %11s %11s %12s %12s %10s %8s\n", $1, $2, $3, $4, $5, "-", "-"; next }
    printf "%-16s %9.2f ms %9.2f ms %10.2f ms %10.2f ms %9.2fx %7.2fx\n", $1, $2, $3, $4, $5, $4 / $2, $5 / $4 }'
awk 'function ok(x) { return x ~ /^[0-9.]+$/ && x + 0 > 0 }
  NR == FNR { a[$1] = $2; next } { b[$1] = $2 } END {
  if (ok(a["dtrain-fixed"]) && ok(a["dtrain-adaptive"])) printf "\ndtrain alone, adaptive / fixed threads: %.3f (1.0 = no slower than without adaptation)\n", a["dtrain-adaptive"] / a["dtrain-fixed"]
  if (ok(b["pytorch-eager"]) && ok(b["dtrain-adaptive"])) printf "next to %d busy process(es), PyTorch eager / dtrain median step: %.2fx\n", busy, b["pytorch-eager"] / b["dtrain-adaptive"] }' \
  busy="$BUSY" "$OUT/alone" "$OUT/busy"
