#!/usr/bin/env bash
# run-test.sh SRC BUILD [FE_INC] — ctest's test_cuda_mock: dtrain's CUDA backend (src/ops/ops_cuda.c,
# kernels/*.cu) run on the CPU mocks of tests/mockgpu (README.md there), no GPU needed.
# Builds from the current sources of the repository SRC (make, incremental) into BUILD/opt and
# BUILD/asan, then runs, stopping at the first failure with its log:
#   1. tests/test_ops_backends.c --quick, then in full: every CUDA op against the CPU op
#   2. --quick again with AddressSanitizer + UBSan: out-of-bounds accesses in the kernels
#   3. --quick again with the blocks and threads of every kernel in reverse order, and without
#      cuBLASLt's bias epilogue (ops_cuda.c's fallback kernel); the epilogues refused with
#      INVALID_VALUE instead of NOT_SUPPORTED (the same fallbacks); without a bf16 algorithm
#      (MOCK_LT_NO_BF16: the fp32 fallback, which must not write a padded output's padding), also
#      with every fallback product in pieces of 4 KiB (DTRAIN_TEST_FP32_SLOT_BYTES); and
#      --quick with mock_att.c, a CPU reference of cuDNN's fused attention (cudnn_att.h), linked
#      in place of cudnn_att.cpp (test_ops_backends_fused, also with ASan + UBSan): the backend's
#      fused attention path (its buffers, statistics, workspace) on the shapes cuDNN plans, its
#      own kernels on the others
#   4. tests/test_comm_nccl.c, the nccl collective backend (src/comm/comm_nccl.c) with one rank,
#      against the NCCL stand-in (mock_nccl.c, as libnccl.so.2), then with ASan + UBSan; and
#      tests/mockgpu/test_nccl_ranks.c, the same backend with 2, 3 and 4 ranks, one process each on
#      its own mock GPU (MOCK_DEVICE_COUNT=4): exact results of every collective, a missing rank
#      (timeout), a killed one (NCCL's asynchronous error), the mock NCCL's datatypes and ops; also
#      with ASan + UBSan
#   5. dtrain itself, the CUDA op table against the CPU one: configs/ci-smoke.yaml for 20 steps
#      with bf16 products (every loss within 1e-2 relative; the mock's cuDNN cannot make a handle,
#      mock_cudnn.c, so attention runs on dtrain's kernels, with one note saying why); the same with bf16 asked for where
#      cuBLASLt has no bf16 algorithm (MOCK_LT_NO_BF16): fp32 products instead, with one note,
#      within 1e-2 of the cpu run (the activations stay bf16); one worker through the nccl collective (DTRAIN_TEST_DEVICE_COMM),
#      plain and with zero_stage 1: the plain run's losses; the bf16 run again with mock_att.c as
#      cuDNN (dtrain_fused): attention through the fused path, no note, within 1e-2 of the cpu run;
#      --dry-run's GPU memory (its parts summed) within 16 kB of the most the worker allocated on the
#      mock GPU (GPT-2 in bf16 and fp32, LoRA in bf16, a Llama language model; fused attention; on
#      2 mock GPUs with bf16 gradients and ZeRO-1, the data-parallel collective's buffers too; and
#      on 4 at P2 x T2, the share that needs the most: model parallelism below);
#      no cudaMalloc or cudaFree once step 1 begins (the mock's count after the profiler range
#      opens) in five runs: plain, no bf16 algorithm, nccl with bf16 gradients (every bucket's
#      all-reduce in bf16, the embeddings' too: the mock NCCL's log), the same with
#      zero_stage 1, the fallback in pieces; packed prompt/completion rows (data.packing, GPT-2's
#      learned positions, attention masked within each example) in fp32 and bf16 against the cpu
#      run (1e-5, 1e-2), and in bf16 through the fused attention (dtrain_fused: the mask per
#      example cuDNN adds) within 1e-2; the LoRA fine-tune (model.lora on GPT-2's four products, the base frozen)
#      in fp32 and bf16 against the cpu run (1e-5, 1e-2), and with the base in bf16
#      (model.lora.base_dtype; bf16 products: 1e-2; fp32 ones refused by name); and configs/pretrain.yaml shrunk to 4
#      steps in fp32 (within 1e-5); a step waits for the device at most 3 times (the profiler's
#      range's two included): a classifier, a language model with 3 micro-batches (the cpu
#      run's losses, also with 1 KiB of upload staging), zero_stage 1 (one sumsq, one scale)
#   6. the launcher's GPU samples through a fake NVML (fake_nvml.c as libnvidia-ml.so.1): the
#      workers records, the workers: line, TensorBoard and the summary; and the note without it
#   7. the GPU messages of docs/troubleshooting.md: GPUs left unused, more workers than GPUs,
#      out of GPU memory (MOCK_DEVICE_MEM_MB); and a GPU worker without cuBLASLt (hide_libs.c
#      hides it): exit 2, naming the library and the fix, and no restart
#   8. dtrain generate (the key/value cache, attention_cached) on the mock GPU: the same greedy
#      and seeded-sampled text as on the CPU from the same weights; and with cuDNN attention
#      (dtrain_fused, bf16): only the forward planned
#   9. dtrain doctor --device cuda: no CUDA call in the parent before it forks the workers (the
#      mock refuses CUDA in a child forked after its parent used it, as CUDA does)
#  10. scripts/gpu-check.sh rehearsed on the mock GPU (gpucheck/rehearse.sh): every step it runs
#      on a GPU but the build (reused) and the PyTorch references, with stand-ins for nvidia-smi,
#      ncu and compute-sanitizer, must pass, and bench.md and the packed logs hold what they should
set -euo pipefail
[ $# -eq 2 ] || [ $# -eq 3 ] || { echo "usage: $0 SRC BUILD [CUDNN_FRONTEND_INCLUDE]" >&2; exit 2; }
SRC=$(cd "$1" && pwd)
mkdir -p "$2"
B=$(cd "$2" && pwd)
# the cuDNN frontend's headers: the third argument (CMake passes its CUDNN_FRONTEND_INCLUDE), else
# where scripts/setup.sh puts them for the build folder above BUILD
FE_INC=${3:-$B/../_deps/cudnn-frontend/include}
[ -f "$FE_INC/cudnn_frontend.h" ] || { echo "$0: no cudnn_frontend.h in $FE_INC (scripts/cudnn-frontend.sh)" >&2; exit 2; }
export FE_INC
M=$SRC/tests/mockgpu
OPT=$B/opt ASAN=$B/asan LOGS=$B/logs
mkdir -p "$LOGS"
# an outer make (ctest under make) must not steer ours; the mock device must be visible
unset MAKEFLAGS MFLAGS MAKELEVEL CUDA_VISIBLE_DEVICES
export ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1
T0=$(date +%s.%N)

elapsed() { echo "$(date +%s.%N) $1" | awk '{ printf "%5.1f s", $1 - $2 }'; }
# step NAME LOG CMD...: runs CMD with its output in LOG; prints the time, or the log and fails
step() {
    local name=$1 log=$LOGS/$2 t rc=0
    shift 2
    t=$(date +%s.%N)
    "$@" >"$log" 2>&1 || rc=$?
    if [ $rc -eq 0 ]; then
        echo "ok    $(elapsed "$t")  $name"
    else
        echo "FAIL  $(elapsed "$t")  $name (exit $rc); the errors, then the end of $log:"
        grep -m 20 -e 'MOCK ERROR' -e FAIL -e 'failed' -e 'ERROR: ' -e 'error:' "$log" || true
        echo "..."
        tail -n 40 "$log"
        exit 1
    fi
}
# the mocks' libcublasLt.so.13 and libcudnn.so.9 before any real ones on LD_LIBRARY_PATH
with_libs() { local d=$1; shift; LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$@"; }

# an object whose source has moved (its .d names a file that is gone) is built afresh
for d in "$OPT"/obj/*.d "$ASAN"/obj/*.d; do
    [ -e "$d" ] || continue
    src=$(sed -n '1s/^[^:]*: *\([^ \\]*\).*/\1/p' "$d")
    [ -e "$src" ] || rm -f "$d" "${d%.d}.o"
done
step "build $OPT" build-opt.log make -f "$M/Makefile" -j2 OUT="$OPT"
step "build $ASAN (ASan + UBSan)" build-asan.log make -f "$M/Makefile" -j2 OUT="$ASAN" SAN=1 test_ops_backends \
    test_comm_nccl test_nccl_ranks

# fake_gpus.c: the mock programs see one GPU (the registry counts /proc/driver/nvidia/gpus)
mkdir -p "$B/fake_gpus/0000:00:00.0" "$B/data"
export MOCK_GPUS_DIR=$B/fake_gpus
step "test_ops_backends --quick" quick.log with_libs "$OPT" "$OPT/test_ops_backends" --quick
step "test_ops_backends" full.log with_libs "$OPT" "$OPT/test_ops_backends"
step "test_ops_backends --quick, ASan + UBSan" asan.log with_libs "$ASAN" "$ASAN/test_ops_backends" --quick
step "test_ops_backends --quick, reversed block/thread order, no bias, GELU or BGRADA epilogue" rev.log \
    with_libs "$OPT" env MOCK_ORDER=rev MOCK_LT_NO_BIAS_EPILOGUE=1 MOCK_LT_NO_GELU_EPILOGUE=1 MOCK_LT_NO_BGRAD_EPILOGUE=1 \
    "$OPT/test_ops_backends" --quick
# the same refusals as INVALID_VALUE (what cuBLASLt may answer for a combination it lacks): the
# unfused paths again, not a stopped run
step "test_ops_backends --quick, epilogues refused with INVALID_VALUE" invalid.log \
    with_libs "$OPT" env MOCK_LT_NO_BIAS_EPILOGUE=invalid MOCK_LT_NO_GELU_EPILOGUE=invalid \
    MOCK_LT_NO_BGRAD_EPILOGUE=invalid "$OPT/test_ops_backends" --quick
step "test_ops_backends --quick, no bf16 algorithm (fp32 products on widened copies)" nobf16.log \
    with_libs "$OPT" env MOCK_LT_NO_BF16=1 "$OPT/test_ops_backends" --quick
# the same with fp32 slots of 4 KiB (DTRAIN_TEST_FP32_SLOT_BYTES): every fallback product runs in
# pieces, along n (forward, input gradients) or k (weight gradients), as one too large for the
# 64 MiB slots would
step "test_ops_backends --quick, no bf16 algorithm, the fp32 products in pieces" nobf16-pieces.log \
    with_libs "$OPT" env MOCK_LT_NO_BF16=1 DTRAIN_TEST_FP32_SLOT_BYTES=4096 "$OPT/test_ops_backends" --quick
# cuDNN's fused attention as mock_att.c (a CPU reference, on the mock's streams) in place of
# cudnn_att.cpp: the attention cases whose head size cuDNN plans (a multiple of 8) must run fused;
# those of head size 1 or 2 fall back to dtrain's kernels, as on a GPU
fused_quick() { # DIR NAME
    local out=$LOGS/fused-$2.out rc=0
    with_libs "$1" "$1/test_ops_backends_fused" --quick >"$out" 2>&1 || rc=$?
    cat "$out"
    [ $rc -eq 0 ] || return $rc
    grep -q '(fused, statistics kept)' "$out" ||
        { echo "expected an attention case through cuDNN's fused attention (mock_att.c)"; return 1; }
}
step "test_ops_backends --quick, cuDNN attention (mock_att.c)" fused.log fused_quick "$OPT" opt
step "test_ops_backends --quick, cuDNN attention (mock_att.c), ASan + UBSan" fused-asan.log fused_quick "$ASAN" asan

# ---- the nccl collective with one rank; exit 77 (skipped: no GPU seen) is a failure here ----
step "test_comm_nccl (one rank, mock NCCL)" nccl.log with_libs "$OPT" "$OPT/test_comm_nccl"
step "test_comm_nccl, ASan + UBSan" nccl-asan.log with_libs "$ASAN" "$ASAN/test_comm_nccl"
# ---- and with 2, 3 and 4 ranks, a process and a mock GPU each ----
step "test_nccl_ranks (2, 3, 4 ranks, mock NCCL)" nccl-ranks.log \
    with_libs "$OPT" env MOCK_DEVICE_COUNT=4 "$OPT/test_nccl_ranks"
step "test_nccl_ranks, ASan + UBSan" nccl-ranks-asan.log \
    with_libs "$ASAN" env MOCK_DEVICE_COUNT=4 "$ASAN/test_nccl_ranks"

# ---- training: the same run on cpu and on the mock cuda device ----
train() { # NAME CONFIG [--set ...]: a fresh run in $B/runs/NAME, from SRC (the configs' data paths)
    local name=$1 config=$2 rc=0 bin=${DTRAIN_BIN:-$OPT/dtrain} # DTRAIN_BIN: another mock dtrain
    shift 2
    rm -rf "$B/runs/$name"
    (cd "$SRC" && with_libs "$OPT" "$bin" train --config "$config" --set run.dir="$B/runs/$name" \
        --set fault_tolerance.max_restarts=0 --progress never "$@") || rc=$?
    [ $rc -eq 0 ] || tail -n 30 "$B/runs/$name"/rank-*.log # the workers' stderr: MOCK ERROR lines
    return $rc
}
losses() { # "step loss" per train step, "val@step loss" per evaluation
    sed -n -e 's/^{"time":"[^"]*","type":"train","step":\([0-9]*\),.*"loss":\([^,}]*\).*/\1 \2/p' \
        -e 's/^{"time":"[^"]*","type":"eval","step":\([0-9]*\),"val_loss":\([^,}]*\).*/val@\1 \2/p' "$B/runs/$1/metrics.jsonl"
}
same_losses() { # CPU_RUN CUDA_RUN TOL: the same steps, every loss within TOL relative
    paste <(losses "$1") <(losses "$2") | awk -v tol="$3" '
        { n++; if ($1 != $3 || $2 == "" || $4 == "") { print "step mismatch: " $0; bad = 1; next }
          r = ($2 - $4) / ($2 < 0 ? -$2 : $2); if (r < 0) r = -r
          printf "  %-8s cpu %.7f cuda %.7f rel %.2e%s\n", $1, $2, $4, r, (r > tol ? "  FAIL" : "")
          if (r > tol) bad = 1 }
        END { if (n < 2) { print "too few losses: " n; bad = 1 }; exit bad }'
}
SMOKE=(--set training.max_steps=20 --set eval.every_steps=10 --set eval.max_batches=2)
step "dtrain ci-smoke on cpu" smoke-cpu.log train smoke-cpu configs/ci-smoke.yaml "${SMOKE[@]}" \
    --set training.device=cpu
# bf16 products: attention would be cuDNN's, but the mock's cuDNN cannot make a handle
# (mock_cudnn.c): dtrain's kernels instead, said once per worker, with cuDNN's reason
bf16_run() {
    local rc=0
    train smoke-cuda configs/ci-smoke.yaml "${SMOKE[@]}" --set training.device=cuda --set training.precision=bf16 \
        2>"$B/smoke-cuda.err" || rc=$?
    cat "$B/smoke-cuda.err"
    [ $rc -eq 0 ] || return $rc
    [ "$(grep -c "attention runs on dtrain's kernels, not cuDNN's fused attention (cudnnCreate: CUDNN_STATUS_NOT_SUPPORTED" \
        "$B/smoke-cuda.err")" = 1 ] || { echo "expected one note about cuDNN attention"; return 1; }
}
step "dtrain ci-smoke on cuda (bf16 products; no cuDNN: attention on dtrain's kernels)" smoke-cuda.log bf16_run
echo "ci-smoke losses, cuda (bf16 products) against cpu, at most 1e-2 relative:"
same_losses smoke-cpu smoke-cuda 1e-2 || { echo "FAIL  ci-smoke losses differ"; exit 1; }
# the same with mock_att.c as cuDNN (dtrain_fused): ci-smoke's head size, 32 / 2 = 16, is one cuDNN
# plans, so attention takes the backend's fused path (bf16 buffers, statistics kept, the
# workspace slot): no note, and the queued forward and backward show in the trace (MOCK_ATT_TRACE)
fused_run() {
    local rc=0
    DTRAIN_BIN=$OPT/dtrain_fused MOCK_ATT_TRACE=1 train smoke-fused configs/ci-smoke.yaml "${SMOKE[@]}" \
        --set training.device=cuda --set training.precision=bf16 2>"$B/smoke-fused.err" || rc=$?
    grep -v '^MOCK ATT: ' "$B/smoke-fused.err" || true
    [ $rc -eq 0 ] || return $rc
    echo "$(grep -c '^MOCK ATT: forward' "$B/smoke-fused.err") fused forwards, $(grep -c '^MOCK ATT: backward' \
        "$B/smoke-fused.err") fused backwards"
    ! grep -q "attention runs on dtrain's kernels" "$B/smoke-fused.err" "$B/runs/smoke-fused"/*.log ||
        { echo "expected no note about cuDNN attention: mock_att.c plans ci-smoke's shapes"; return 1; }
    grep -q '^MOCK ATT: backward' "$B/smoke-fused.err" || { echo "expected attention through mock_att.c"; return 1; }
}
step "dtrain ci-smoke on cuda (bf16 products; cuDNN attention: mock_att.c)" smoke-fused.log fused_run
echo "ci-smoke losses, cuda (bf16 products, fused attention) against cpu, at most 1e-2 relative:"
same_losses smoke-cpu smoke-fused 1e-2 || { echo "FAIL  ci-smoke losses (fused attention) differ"; exit 1; }
# --dry-run's estimate of a GPU worker's memory (its "# on cuda" line, in parts) against the most each
# worker had allocated on the mock GPU at once (MOCK_DEVICE_PEAK_FILE), with cuDNN's attention
# (dtrain_fused: what the estimate assumes): the largest peak (model parallelism: the share that
# needs the most; the others below it) within 16 kB, beside the parts' own rounding (each printed
# to 3 digits: half its last digit)
dry_run_bytes() { # CONFIG [--set ...]: the estimate's parts summed, in bytes, and their rounding
    (cd "$SRC" && with_libs "$OPT" "$OPT/dtrain_fused" train --config "$@" --dry-run) |
        sed -n 's/^# on cuda ([^)]*): ~[0-9.]* GiB of GPU memory per worker (\(.*\))$/\1/p' | grep -oE '[0-9.]+[kMG]?B' |
        awk '{ u = substr($1, length($1) - 1, 1); m = (u == "k" ? 1e3 : u == "M" ? 1e6 : u == "G" ? 1e9 : 1)
               s += ($1 + 0) * m; r += (u == "k" ? 0.05 : u == "M" || u == "G" ? 0.005 : 0) * m }
             END { if (NR) printf "%.0f %.0f\n", s, r }'
}
memory_run() { # NAME WORKERS CONFIG [--set ...]
    local name=$1 workers=$2 config=$3 est round peak
    shift 3
    read -r est round < <(dry_run_bytes "$config" "$@")
    rm -f "$B/$name.peak".*
    MOCK_DEVICE_PEAK_FILE=$B/$name.peak DTRAIN_BIN=$OPT/dtrain_fused train "$name" "$config" "$@" || return 1
    peak=$(cat "$B/$name.peak".* 2>/dev/null | sort -n | tr '\n' ' ')
    echo "$name: --dry-run ${est:-(no estimate)} bytes (rounding ${round:-?}), the workers' peaks ${peak:-(none)}bytes"
    [ -n "$est" ] && [ "$(echo "$peak" | wc -w)" = "$workers" ] &&
        echo "$peak" | awk -v e="$est" -v t="$round" '{ t += 16000; d = $NF - e; if (d < 0) d = -d
                                                         exit !(d <= t && $NF <= e + t) }' ||
        { echo "FAIL: expected $workers peaks, the largest within 16 kB (and the rounding) of the estimate"; return 1; }
}
memory_runs() { # GPT-2 in bf16 and fp32, its LoRA fine-tune in bf16, a Llama language model with its own head
    local a=(--set training.device=cuda --set training.max_steps=2 --set eval.max_batches=1)
    local llama=(--set model.type=llama --set model.n_head=8 --set model.num_key_value_heads=4 --set model.n_embd=64
                 --set model.intermediate_size=96 --set model.n_layer=2)
    memory_run mem-bf16 1 configs/ci-smoke.yaml "${a[@]}" --set training.precision=bf16 &&
        memory_run mem-fp32 1 configs/ci-smoke.yaml "${a[@]}" --set training.precision=fp32 &&
        memory_run mem-lora 1 configs/finetune.yaml "${a[@]}" --set training.precision=bf16 --set model.lora.rank=4 &&
        memory_run mem-llama 1 configs/pretrain.yaml "${a[@]}" --set training.precision=bf16 "${llama[@]}" \
            --set data.batch_size_per_worker=4 --set model.tie_word_embeddings=false
}
step "--dry-run's GPU memory against the worker's peak on the mock GPU" memory.log memory_runs
# bf16 asked for, but cuBLASLt has no bf16 algorithm (MOCK_LT_NO_BF16): every product falls back to
# fp32 (on widened copies of the bf16 activations) with one note; the activations stay bf16, so the
# losses are the bf16 run's kind: within 1e-2 of the cpu run
nobf16_run() {
    export MOCK_LT_NO_BF16=1
    local rc=0
    train smoke-nobf16 configs/ci-smoke.yaml "${SMOKE[@]}" --set training.device=cuda --set training.precision=bf16 \
        2>"$B/smoke-nobf16.err" || rc=$?
    unset MOCK_LT_NO_BF16
    cat "$B/smoke-nobf16.err"
    [ $rc -eq 0 ] || return $rc
    [ "$(grep -c 'cuBLASLt has no bf16 algorithm for a .* products without one run in fp32' "$B/smoke-nobf16.err")" = 1 ] ||
        { echo "expected one note about the fp32 fallback"; return 1; }
}
fp32_run() { # with the plan log (DTRAIN_LOG_GEMM_PLANS): every plan once, as it is made; and step 3 in
    # a profiler's range (logging.profile_step): one start, one stop, the step's work between them
    local rc=0
    DTRAIN_LOG_GEMM_PLANS=1 train smoke-fp32 configs/ci-smoke.yaml "${SMOKE[@]}" --set training.device=cuda \
        --set training.precision=fp32 --set logging.profile_step=3 2>"$B/smoke-fp32.err" || rc=$?
    cat "$B/smoke-fp32.err"
    [ $rc -eq 0 ] || return $rc
    local n u
    n=$(grep -c 'cuBLASLt plan: m ' "$B/smoke-fp32.err")
    u=$(grep 'cuBLASLt plan: m ' "$B/smoke-fp32.err" | sort -u | wc -l)
    echo "$n plans logged, $u different"
    [ "$n" -gt 0 ] && [ "$n" -eq "$u" ] || { echo "expected each plan logged once"; return 1; }
    [ "$(grep -c '^MOCK PROFILER: start$' "$B/smoke-fp32.err")" = 1 ] &&
        [ "$(grep -c '^MOCK PROFILER: stop: [1-9][0-9]* kernel launches and [1-9][0-9]* library calls' "$B/smoke-fp32.err")" = 1 ] ||
        { echo "expected one profiler range (logging.profile_step=3) holding kernels and library calls"; return 1; }
}
step "dtrain ci-smoke on cuda (fp32), the cuBLASLt plans logged, step 3 profiled" smoke-fp32.log fp32_run
step "dtrain ci-smoke on cuda, bf16 without a bf16 algorithm: fp32 instead" smoke-nobf16.log nobf16_run
echo "ci-smoke losses, bf16 products without a bf16 algorithm against cpu, at most 1e-2 relative:"
same_losses smoke-cpu smoke-nobf16 1e-2 || { echo "FAIL  the fp32 fallback's losses differ"; exit 1; }
# packed rows (data.packing): 48 prompt/completion lines, several to a row, on data/pretrained's
# GPT-2 (its learned positions by each token's position in its example): attention on dtrain's
# kernels, the softmax masked within each example (in bf16 the mock's cuDNN makes no handle: one
# note says so), the embedding gradients summed by position; the cpu run's losses, fp32 within
# 1e-5, bf16 within 1e-2; and bf16 again with mock_att.c as cuDNN (dtrain_fused): the fused path
# with each packed row's mask per example, no note, within 1e-2 of the cpu run
packed_yaml() {
    local words=(the cat sat on a mat and dog ran far away from home bird sang song all day long) i
    mkdir -p "$B/data"
    : >"$B/data/packed.jsonl"
    for i in $(seq 0 47); do
        printf '{"prompt": "%s %s %s", "completion": " %s %s%s"}\n' "${words[i % 19]}" "${words[(3 * i) % 19]}" \
            "${words[(5 * i + 1) % 19]}" "${words[(7 * i) % 19]}" "${words[(2 * i + 3) % 19]}" \
            "$([ $((i % 3)) -eq 0 ] && echo " ${words[(i + 4) % 19]} ${words[(i + 9) % 19]}")" >>"$B/data/packed.jsonl"
    done
    printf '%s\n' "training:" "  max_steps: 6" "  seed: 5" "optimizer:" "  lr: 1.0e-3" "  warmup_steps: 0" "data:" \
        "  format: completion" "  train_path: $B/data/packed.jsonl" "  packing: true" "  seq_len: 64" \
        "  batch_size_per_worker: 2" "  shuffle: false" "model:" "  init_from: data/pretrained" "eval:" \
        "  every_steps: 0" "checkpoint:" "  every_steps: 0" >"$B/packed.yaml"
}
packed_run() { # NAME PRECISION [fused]
    local name=$1 rc=0
    if [ "${3:-}" = fused ]; then
        DTRAIN_BIN=$OPT/dtrain_fused MOCK_ATT_TRACE=1 train "$name" "$B/packed.yaml" --set training.device=cuda \
            --set training.precision="$2" >"$B/$name.out" 2>"$B/$name.err" || rc=$?
        grep -v '^MOCK ATT: ' "$B/$name.err" || true
        cat "$B/$name.out"
        [ $rc -eq 0 ] || return $rc
        echo "$(grep -c '^MOCK ATT: forward .* packed' "$B/$name.err") fused forwards of packed rows," \
            "$(grep -c '^MOCK ATT: backward .* packed' "$B/$name.err") backwards"
        grep -q '^MOCK ATT: backward .* packed' "$B/$name.err" ||
            { echo "expected packed rows' attention through mock_att.c, with their mask"; return 1; }
        ! grep -q "attention runs on dtrain's kernels" "$B/$name.err" "$B/runs/$name"/*.log ||
            { echo "expected no note: packed rows run on cuDNN's fused attention"; return 1; }
    else
        train "$name" "$B/packed.yaml" --set training.device=cuda --set training.precision="$2" >"$B/$name.out" \
            2>"$B/$name.err" || rc=$?
        cat "$B/$name.out" "$B/$name.err"
        [ $rc -eq 0 ] || return $rc
        [ "$2" != bf16 ] || grep -q "attention runs on dtrain's kernels, not cuDNN's fused attention (cudnnCreate" \
            "$B/$name.err" || { echo "expected the note that attention runs on dtrain's kernels (no cuDNN handle)"; return 1; }
    fi
    grep -q "data.packing: 48 train examples packed into [0-9]* rows of 64" "$B/$name.out" ||
        { echo "expected the start-up line saying how the examples were packed"; return 1; }
}
packed_yaml
step "dtrain packed completions on cpu" packed-cpu.log train packed-cpu "$B/packed.yaml" --set training.device=cpu
step "dtrain packed completions on cuda (fp32)" packed-fp32.log packed_run packed-fp32 fp32
echo "packed completions' losses, cuda (fp32) against cpu, at most 1e-5 relative:"
same_losses packed-cpu packed-fp32 1e-5 || { echo "FAIL  packed losses (fp32) differ"; exit 1; }
step "dtrain packed completions on cuda (bf16 products)" packed-bf16.log packed_run packed-bf16 bf16
echo "packed completions' losses, cuda (bf16 products) against cpu, at most 1e-2 relative:"
same_losses packed-cpu packed-bf16 1e-2 || { echo "FAIL  packed losses (bf16) differ"; exit 1; }
step "dtrain packed completions on cuda (bf16; cuDNN attention: mock_att.c)" packed-fused.log packed_run packed-fused \
    bf16 fused
echo "packed completions' losses, cuDNN's fused attention (mock_att.c) against cpu, at most 1e-2 relative:"
same_losses packed-cpu packed-fused 1e-2 || { echo "FAIL  packed losses (fused attention) differ"; exit 1; }
# LoRA (model.lora): the fine-tune's pretrained GPT-2 frozen (the norms' and embeddings' gradients
# skipped), rank-4 adapters on its four products (c_fc's under GELU, unfused) and the score head
# trained; the cpu run's losses, fp32 within 1e-5, bf16 within 1e-2
LORA=(--set training.max_steps=6 --set eval.every_steps=0 --set eval.max_batches=2 --set checkpoint.every_steps=0
      --set model.lora.rank=4 --set "model.lora.targets=[c_attn, attn.c_proj, c_fc, mlp.c_proj]"
      --set optimizer.warmup_steps=0 --set optimizer.lr=2e-3)
step "dtrain LoRA fine-tune on cpu" lora-cpu.log train lora-cpu configs/finetune.yaml "${LORA[@]}" --set training.device=cpu
step "dtrain LoRA fine-tune on cuda (fp32)" lora-fp32.log train lora-fp32 configs/finetune.yaml "${LORA[@]}" \
    --set training.device=cuda --set training.precision=fp32
echo "LoRA fine-tune losses, cuda (fp32) against cpu, at most 1e-5 relative:"
same_losses lora-cpu lora-fp32 1e-5 || { echo "FAIL  LoRA losses (fp32) differ"; exit 1; }
step "dtrain LoRA fine-tune on cuda (bf16 products)" lora-bf16.log train lora-bf16 configs/finetune.yaml "${LORA[@]}" \
    --set training.device=cuda --set training.precision=bf16
echo "LoRA fine-tune losses, cuda (bf16 products) against cpu, at most 1e-2 relative:"
same_losses lora-cpu lora-bf16 1e-2 || { echo "FAIL  LoRA losses (bf16) differ"; exit 1; }
# the frozen base in bf16 (model.lora.base_dtype): cuBLASLt reads its matrices as they are, the
# cpu widens them; with fp32 products the cuda run is refused by name
step "dtrain LoRA fine-tune on cpu, the base in bf16" lora16-cpu.log train lora16-cpu configs/finetune.yaml "${LORA[@]}" \
    --set training.device=cpu --set model.lora.base_dtype=bf16
step "dtrain LoRA fine-tune on cuda (bf16 products), the base in bf16" lora16-bf16.log train lora16-bf16 \
    configs/finetune.yaml "${LORA[@]}" --set training.device=cuda --set training.precision=bf16 \
    --set model.lora.base_dtype=bf16
echo "LoRA fine-tune losses with the base in bf16, cuda (bf16 products) against cpu, at most 1e-2 relative:"
same_losses lora16-cpu lora16-bf16 1e-2 || { echo "FAIL  LoRA losses (the base in bf16) differ"; exit 1; }
lora16_fp32_refused() {
    ! train lora16-fp32 configs/finetune.yaml "${LORA[@]}" --set training.device=cuda --set training.precision=fp32 \
        --set model.lora.base_dtype=bf16 >"$B/lora16-fp32.out" 2>&1 &&
        grep -q 'model.lora.base_dtype: is bf16, which needs bf16 products on cuda, but training.precision is fp32' \
            "$B/lora16-fp32.out" "$B/runs/lora16-fp32"/*.log 2>/dev/null ||
        { echo "FAIL: fp32 products with the base in bf16 were not refused by name:"; cat "$B/lora16-fp32.out"; return 1; }
    echo "ok: refused by name"
}
step "dtrain LoRA fine-tune on cuda (fp32) with the base in bf16: refused" lora16-fp32.log lora16_fp32_refused
# no allocation and no free once step 1 begins (a cudaFree waits for the whole device, NCCL's buckets
# too): logging.profile_step=1 opens the mock's profiler range just before step 1, its stop line
# counts the allocations and frees of step 1, and every allocation after it says "MOCK
# ALLOCATION"; with dtrain's attention kernels, with the fp32 fallback's slots (MOCK_LT_NO_BF16),
# with bf16 gradients through nccl (its wire buffer), plain and with zero_stage 1, and with LoRA
# adapters (their fp32 h and dh read as bf16 operands; without a bf16 algorithm, the bf16 outputs
# they add onto widened into the fallback's slot)
no_alloc_run() { # NAME [VAR=VALUE ...] -- BIN [--set ...]
    local name=$1 vars=() rc=0
    shift
    while [ "$1" != -- ]; do vars+=("$1"); shift; done
    shift
    local bin=$1
    shift
    (export "${vars[@]}" DTRAIN_BIN="$bin"
     train "$name" configs/ci-smoke.yaml --set training.max_steps=4 --set eval.every_steps=2 --set eval.max_batches=2 \
         --set training.device=cuda --set training.precision=bf16 --set logging.profile_step=1 "$@") \
        >"$B/$name.out" 2>&1 || rc=$?
    grep -e '^MOCK' -e 'note:' "$B/$name.out"
    [ $rc -eq 0 ] || { cat "$B/$name.out"; return $rc; }
    grep -q '^MOCK PROFILER: stop: .*; 0 allocations and 0 frees$' "$B/$name.out" &&
        ! grep -q '^MOCK ALLOCATION' "$B/$name.out" || { echo "FAIL: $name allocated or freed after step 1 began"; return 1; }
    echo "ok: $name: no allocation or free from step 1 on"
}
# training.grad_comm_dtype bf16 through nccl (the mock NCCL's MOCK_NCCL_LOG lists its calls): every
# gradient bucket's all-reduce travels as bf16, the embeddings' too (ci-smoke: wte 257 x 32 + wpe
# 64 x 32 = 10272 floats, ready last in each of the 4 steps); the one fp32 all-reduce allowed is a
# barrier's single float
bf16_buckets() { # CALLS
    local calls=$1 embed
    embed=$(grep -c '^ncclAllReduce ncclBfloat16 10272 ' "$calls" || true)
    [ "$embed" -eq 4 ] || { echo "FAIL: $embed bf16 all-reduces of the embedding bucket (10272 floats), expected 4:"; cat "$calls"; return 1; }
    if grep '^ncclAllReduce ' "$calls" | grep -v -e ' ncclBfloat16 ' -e '^ncclAllReduce ncclFloat32 1 '; then
        echo "FAIL: the gradient all-reduces above went in fp32 with training.grad_comm_dtype=bf16"
        return 1
    fi
    echo "ok: every gradient bucket went as bf16 ($(grep -c ' ncclBfloat16 ' "$calls") all-reduces), the embeddings' in each step;" \
        "at most $(awk '{ if ($4 > m) m = $4 } END { print m + 0 }' "$calls") queued at once"
}
no_alloc() {
    rm -f "$B/alloc-nccl.calls"
    no_alloc_run alloc-plain -- "$OPT/dtrain" &&
        no_alloc_run alloc-nobf16 MOCK_LT_NO_BF16=1 -- "$OPT/dtrain_fused" &&
        no_alloc_run alloc-nccl DTRAIN_TEST_DEVICE_COMM=1 MOCK_NCCL_LOG="$B/alloc-nccl.calls" -- "$OPT/dtrain_fused" \
            --set training.grad_comm_dtype=bf16 &&
        bf16_buckets "$B/alloc-nccl.calls" &&
        no_alloc_run alloc-nccl-zero DTRAIN_TEST_DEVICE_COMM=1 -- "$OPT/dtrain_fused" --set training.grad_comm_dtype=bf16 \
            --set training.zero_stage=1 &&
        no_alloc_run alloc-pieces MOCK_LT_NO_BF16=1 DTRAIN_TEST_FP32_SLOT_BYTES=4096 -- "$OPT/dtrain_fused" &&
        no_alloc_run alloc-lora -- "$OPT/dtrain" --set model.lora.rank=4 \
            --set "model.lora.targets=[c_attn, attn.c_proj, c_fc, mlp.c_proj]" &&
        no_alloc_run alloc-lora-nobf16 MOCK_LT_NO_BF16=1 -- "$OPT/dtrain" --set model.lora.rank=4 \
            --set "model.lora.targets=[c_attn, attn.c_proj, c_fc, mlp.c_proj]" &&
        no_alloc_run alloc-lora16 -- "$OPT/dtrain" --set model.lora.rank=4 \
            --set "model.lora.targets=[c_attn, attn.c_proj, c_fc, mlp.c_proj]" --set model.lora.base_dtype=bf16 || return
    echo "the fp32 fallback in pieces of 4 KiB against the whole products, the same losses:"
    same_losses alloc-nobf16 alloc-pieces 0
}
step "no allocation or free once step 1 begins (fp32 fallback slots, nccl's bf16 buffer, AdamW's table)" no-alloc.log \
    no_alloc
# one worker through the nccl collective (DTRAIN_TEST_DEVICE_COMM: gpu-check's way to run the
# bucket path on one GPU): the gradient buckets and, with zero_stage 1, the reduce-scatter and the
# weights' all-gather go through comm_nccl.c and the mock NCCL; the losses stay those of the plain run
device_comm_run() { # NAME [--set ...]
    local name=$1 rc=0
    shift
    export DTRAIN_TEST_DEVICE_COMM=1
    train "$name" configs/ci-smoke.yaml "${SMOKE[@]}" --set training.device=cuda --set training.precision=bf16 "$@" \
        >"$B/$name.out" 2>&1 || rc=$?
    unset DTRAIN_TEST_DEVICE_COMM
    cat "$B/$name.out"
    [ $rc -eq 0 ] || return $rc
    grep -q "1 worker x 1 GPU, nccl " "$B/$name.out" || { echo "expected the nccl collective in the start-up line"; return 1; }
}
step "dtrain ci-smoke on cuda, one worker through nccl (DTRAIN_TEST_DEVICE_COMM)" smoke-nccl.log device_comm_run smoke-nccl
echo "ci-smoke losses, one worker through nccl against the plain run, the same:"
same_losses smoke-cuda smoke-nccl 0 || { echo "FAIL  the nccl bucket path changed the losses"; exit 1; }
step "the same with training.zero_stage 1 (reduce-scatter, all-gather of parts)" smoke-nccl-zero.log \
    device_comm_run smoke-nccl-zero --set training.zero_stage=1
echo "ci-smoke losses, one sharded worker through nccl against the plain run (the norm summed per bucket: 1e-6):"
same_losses smoke-cuda smoke-nccl-zero 1e-6 || { echo "FAIL  the nccl zero_stage 1 path changed the losses"; exit 1; }

# ---- GPU monitoring: the launcher samples the worker's GPU through NVML (the fake one) ----
monitor_run() {
    FAKE_NVML_GPUS="00000000:3B:00.0=87/30720/143771/61/412" with_libs "$OPT/nvml" \
        train monitor configs/ci-smoke.yaml "${SMOKE[@]}" --set training.device=cuda --set logging.monitor_every_s=0.1 \
        || return
    local d=$B/runs/monitor
    grep -q '"type":"workers".*"gpu":0,"gpu_util_pct":87.0,"gpu_mem_mb":30720.0,"gpu_mem_total_mb":143771.0,"gpu_temp_c":61.0,"gpu_power_w":412.0,"gpu_peak_mem_mb":30720.0' "$d/metrics.jsonl" \
        || { echo "FAIL: no workers record with the GPU's sample in metrics.jsonl"; return 1; }
    grep -q '"type":"summary".*"peak_gpu_mem_mb":\[30720.0\]' "$d/metrics.jsonl" \
        || { echo "FAIL: the summary record lacks peak_gpu_mem_mb"; return 1; }
    grep -q 'workers: rank 0: cpu [0-9]*%, rss [0-9]* MB, gpu 0: 87% busy, 30.0/140.4 GiB, 61 C, 412 W' "$d/train.log" \
        || { echo "FAIL: the workers: line lacks the GPU"; return 1; }
    grep -q 'peak memory: [0-9]* MB | GPU (NVML samples): 30.0 GiB' "$d/train.log" \
        || { echo "FAIL: the summary line lacks the peak GPU memory"; return 1; }
    grep -a -q 'worker/rank0/gpu_util' "$d"/events.out.tfevents.* || { echo "FAIL: no worker/rank0/gpu_util in TensorBoard"; return 1; }
    # without the driver's library (where the machine has none): one note, and CPU samples as before
    if ! ldconfig -p 2>/dev/null | grep -q 'libnvidia-ml.so.1 '; then
        grep -q 'note: no GPU samples (utilisation, memory, temperature, power): cannot load libnvidia-ml.so.1' \
            "$B/runs/smoke-cuda/train.log" || { echo "FAIL: the run without NVML did not say so"; return 1; }
    fi
}
step "dtrain ci-smoke on cuda, GPU samples from a fake NVML" monitor.log monitor_run

# ---- the GPU messages of docs/troubleshooting.md ----
expect() { # NAME RC TEXT CMD...: CMD exits RC and its output (console and the run's logs) has TEXT
    local name=$1 want=$2 text=$3 rc=0 out=$LOGS/expect-$1.out
    shift 3
    "$@" >"$out" 2>&1 || rc=$?
    [ $rc -eq "$want" ] || { echo "FAIL: $name exited $rc, expected $want"; tail -5 "$out"; return 1; }
    cat "$B/runs/$name"/*.log >>"$out" 2>/dev/null || true
    grep -qF -- "$text" "$out" || { echo "FAIL: $name: no \"$text\" in:"; tail -8 "$out"; return 1; }
    echo "ok: $name: $text"
}
# train without cuBLASLt: the mock's is next to dtrain and a real one may be in the ld cache, so
# hide_libs.c makes dlopen fail as for a library that is not installed
no_cublaslt() { MOCK_HIDE_LIBS=libcublasLt.so.13 LD_PRELOAD=$OPT/libhidelibs.so train "$@"; }
gpu_messages() {
    mkdir -p "$B/fake_gpus2/0000:00:00.0" "$B/fake_gpus2/0000:01:00.0"
    local short=(--set training.max_steps=2 --set eval.max_batches=1 --set training.device=cuda)
    MOCK_GPUS_DIR=$B/fake_gpus2 expect unused 0 "note: 2 GPUs are visible but training.num_workers is 1: 1 GPU stays unused" \
        train unused configs/ci-smoke.yaml "${short[@]}" || return
    expect toomany 2 "training.num_workers: 2 workers need 2 GPUs, but 1 is visible" \
        train toomany configs/ci-smoke.yaml "${short[@]}" --set training.num_workers=2 || return
    MOCK_DEVICE_MEM_MB=1 expect oom 2 "out of GPU memory allocating" \
        train oom configs/ci-smoke.yaml "${short[@]}" || return
    grep -qF "(hint: lower data.batch_size_per_worker and raise training.grad_accum_steps to keep the global batch, or use a shorter data.seq_len)" \
        "$LOGS/expect-oom.out" || { echo "FAIL: oom: the hint is missing"; return 1; }
    # no cuBLASLt: permanent, so exit 2 and no restart, although fault_tolerance.max_restarts allows 2
    expect nolt 2 "cannot load libcublasLt.so.13: libcublasLt.so.13: cannot open shared object file: No such file or directory (hint: install the CUDA 13 cuBLAS libraries, or add their directory to LD_LIBRARY_PATH)" \
        no_cublaslt nolt configs/ci-smoke.yaml "${short[@]}" --set fault_tolerance.max_restarts=2 \
        --set fault_tolerance.backoff_s=0.1 || return
    ! grep -n -e 'restart [0-9]* of' -e '(restarted)' "$LOGS/expect-nolt.out" || { echo "FAIL: nolt: restarted"; return 1; }
}
step "the GPU messages of docs/troubleshooting.md (unused GPUs, too many workers, out of memory); no cuBLASLt" \
    gpu-messages.log gpu_messages

tokenize() { # the shards of configs/pretrain.yaml, into $B/data (scripts/setup.sh may not have run)
    local f
    for f in corpus val; do
        with_libs "$OPT" "$OPT/dtrain" data tokenize --tokenizer bytes "$SRC/data/tinytext/$f.txt" "$B/data/$f.bin" || return
    done
}
step "tokenize data/tinytext" tokenize.log tokenize
PRE=(--set data.train_path="$B/data/corpus.bin" --set data.val_path="$B/data/val.bin" --set training.max_steps=4
     --set optimizer.warmup_steps=2 --set data.batch_size_per_worker=2 --set data.seq_len=64 --set model.n_layer=2
     --set eval.every_steps=4 --set eval.max_batches=1)
step "dtrain pretrain (shrunk) on cpu" pre-cpu.log train pre-cpu configs/pretrain.yaml "${PRE[@]}" \
    --set training.device=cpu
step "dtrain pretrain (shrunk) on cuda (fp32)" pre-cuda.log train pre-cuda configs/pretrain.yaml "${PRE[@]}" \
    --set training.device=cuda --set training.precision=fp32
echo "pretrain losses, cuda (fp32) against cpu, at most 1e-5 relative:"
same_losses pre-cpu pre-cuda 1e-5 || { echo "FAIL  pretrain losses differ"; exit 1; }
# data parallelism on 2 mock GPUs (the mock NCCL of several ranks): the shrunk pretrain.yaml on 2
# workers against the same on cpu, fp32 within 1e-5, and bf16 activations with bf16 gradients on
# the wire and zero_stage 1 within 1e-2; and a GPU worker killed before step 3 (checkpoints every
# 2 steps): the launcher restarts both from step 2's checkpoint and the weights are the
# uninterrupted fp32 run's, byte for byte; and packed prompt/completion rows (packed.yaml), and
# model.lora, on 2 pipeline stages, fp32 within 1e-5 of the same layout on cpu
data_parallel() ( # a subshell: the two GPUs stay its own
    mkdir -p "$B/fake_gpus2x/0000:00:00.0" "$B/fake_gpus2x/0000:01:00.0"
    export MOCK_GPUS_DIR=$B/fake_gpus2x MOCK_DEVICE_COUNT=2
    local d2=(--set training.num_workers=2 --set checkpoint.every_steps=2)
    train dp-cpu configs/pretrain.yaml "${PRE[@]}" "${d2[@]}" --set training.device=cpu || return
    train dp-fp32 configs/pretrain.yaml "${PRE[@]}" "${d2[@]}" --set training.device=cuda \
        --set training.precision=fp32 || return
    grep -q 'gradients and weights over nccl' "$B/runs/dp-fp32/train.log" ||
        { echo "FAIL: dp-fp32: expected the gradients over nccl (train.log)"; return 1; }
    echo "2 workers, cuda (fp32) against cpu, at most 1e-5 relative:"
    same_losses dp-cpu dp-fp32 1e-5 || return
    train dp-bf16 configs/pretrain.yaml "${PRE[@]}" "${d2[@]}" --set training.device=cuda --set training.precision=bf16 \
        --set training.grad_comm_dtype=bf16 --set training.zero_stage=1 || return
    echo "2 workers, cuda (bf16, bf16 gradients, zero_stage 1) against cpu, at most 1e-2 relative:"
    same_losses dp-cpu dp-bf16 1e-2 || return
    # --dry-run's GPU memory on 2 workers: the data-parallel collective's staging buffer and the bf16
    # buffer of the largest bucket counted too (both workers' peaks within 16 kB of it)
    memory_run dp-mem 2 configs/pretrain.yaml "${PRE[@]}" "${d2[@]}" --set training.device=cuda \
        --set training.precision=bf16 --set training.grad_comm_dtype=bf16 --set training.zero_stage=1 || return
    DTRAIN_FAULT=rank=1,step=3,kind=kill train dp-killed configs/pretrain.yaml "${PRE[@]}" "${d2[@]}" \
        --set training.device=cuda --set training.precision=fp32 --set fault_tolerance.max_restarts=1 \
        --set fault_tolerance.backoff_s=0.1 || return
    grep -q 'restart 1 of 1' "$B/runs/dp-killed/train.log" ||
        { echo "FAIL: dp-killed: expected one restart (train.log)"; return 1; }
    cmp "$B/runs/dp-fp32/model.safetensors" "$B/runs/dp-killed/model.safetensors" ||
        { echo "FAIL: dp-killed: the restarted run's weights differ from the uninterrupted run's"; return 1; }
    echo "dp-killed: rank 1 killed before step 3, one restart from step 2's checkpoint, the same weights"
    # packed rows through 2 pipeline stages (1F1B, 2 micro-batches: each one's positions kept with
    # its activations) against the same on cpu
    local p2=(--set training.num_workers=2 --set training.pipeline_parallel=2 --set training.grad_accum_steps=2)
    train pp-packed-cpu "$B/packed.yaml" "${p2[@]}" --set training.device=cpu || return
    train pp-packed-fp32 "$B/packed.yaml" "${p2[@]}" --set training.device=cuda --set training.precision=fp32 || return
    echo "packed rows on 2 pipeline stages, cuda (fp32) against cpu, at most 1e-5 relative:"
    same_losses pp-packed-cpu pp-packed-fp32 1e-5 || return
    # model.lora through 2 pipeline stages (the head tied to the frozen embedding) against the same on cpu
    local lora=(--set model.lora.rank=4 --set "model.lora.targets=[c_attn, attn.c_proj, c_fc, mlp.c_proj]")
    train pp-lora-cpu configs/pretrain.yaml "${PRE[@]}" "${p2[@]}" "${lora[@]}" --set training.device=cpu || return
    train pp-lora-fp32 configs/pretrain.yaml "${PRE[@]}" "${p2[@]}" "${lora[@]}" --set training.device=cuda \
        --set training.precision=fp32 || return
    echo "model.lora on 2 pipeline stages, cuda (fp32) against cpu, at most 1e-5 relative:"
    same_losses pp-lora-cpu pp-lora-fp32 1e-5 || return
)
step "data parallelism on 2 mock GPUs (fp32; bf16 + zero_stage 1; a killed worker restarts); packed rows and LoRA on 2 stages" \
    data-parallel.log data_parallel
# model parallelism on several mock GPUs (MOCK_DEVICE_COUNT, the mock NCCL of several ranks): each
# group its own NCCL communicator; the shares' sums, the vocabulary's shares, the stage boundaries
# and their exchanges, the gradient norm's ranges on the device. Against the same layout on cpu:
# fp32 within 1e-5, bf16 activations (summed as bf16) within 1e-2; GPT-2 and a Llama with
# grouped-query attention, also with LoRA on its seven projections (P2 x T2 in fp32, its sample
# generated by the stages and shares together; T2 with the base in bf16); and dtrain doctor's
# group checks over NCCL
model_parallel() ( # a subshell: the four GPUs stay its own
    mkdir -p "$B/fake_gpus4/0000:00:00.0" "$B/fake_gpus4/0000:01:00.0" "$B/fake_gpus4/0000:02:00.0" \
        "$B/fake_gpus4/0000:03:00.0"
    export MOCK_GPUS_DIR=$B/fake_gpus4 MOCK_DEVICE_COUNT=4
    local llama=(--set model.type=llama --set model.num_key_value_heads=2 --set model.intermediate_size=256)
    local t2=(--set training.num_workers=2 --set training.tensor_parallel=2)
    local dt=(--set training.num_workers=4 --set training.tensor_parallel=2 --set training.zero_stage=1)
    local pt=(--set training.num_workers=4 --set training.pipeline_parallel=2 --set training.tensor_parallel=2
              --set training.grad_accum_steps=2)
    local lora=(--set model.lora.rank=4 --set "model.lora.targets=[q, k, v, o, gate, up, down]")
    local name args
    for name in t2 dt pt pt-llama pt-lora; do
        case $name in
        t2) args=("${t2[@]}") ;;
        dt) args=("${dt[@]}") ;;
        pt) args=("${pt[@]}") ;;
        pt-llama) args=("${pt[@]}" "${llama[@]}") ;;
        pt-lora) args=("${pt[@]}" "${llama[@]}" "${lora[@]}" --set logging.sample_every_steps=4
                       --set logging.sample_prompt=The) ;; # the adapters split with their products; a sample
        esac
        train "mp-$name-cpu" configs/pretrain.yaml "${PRE[@]}" "${args[@]}" --set training.device=cpu || return
        train "mp-$name-fp32" configs/pretrain.yaml "${PRE[@]}" "${args[@]}" --set training.device=cuda \
            --set training.precision=fp32 || return
        grep -q -e 'sums its activations twice forward and twice backward over nccl' "$B/runs/mp-$name-fp32/train.log" &&
            { [ "$name" = t2 ] || [ "$name" = dt ] ||
                grep -q 'the stage boundaries pass to its neighbours over nccl' "$B/runs/mp-$name-fp32/train.log"; } ||
            { echo "FAIL: mp-$name: expected the groups' collectives over nccl (train.log)"; return 1; }
        echo "$name, cuda (fp32) against cpu, at most 1e-5 relative:"
        same_losses "mp-$name-cpu" "mp-$name-fp32" 1e-5 || return
    done
    # the stages and shares of pt-lora generate its sample together: the cpu run's text
    local s_cpu s_gpu
    s_cpu=$(grep -a 'sample at step 4' "$B/runs/mp-pt-lora-cpu/train.log" | sed 's/^[^ ]* //')
    s_gpu=$(grep -a 'sample at step 4' "$B/runs/mp-pt-lora-fp32/train.log" | sed 's/^[^ ]* //')
    [ -n "$s_cpu" ] && [ "$s_cpu" = "$s_gpu" ] ||
        { echo "FAIL: pt-lora: the sample at step 4 differs from the cpu run's: [$s_gpu] against [$s_cpu]"; return 1; }
    echo "pt-lora: the sample at step 4 on 2 stages x 2 shares is the cpu run's"
    # a stage's share killed before step 3: every worker restarts from step 2's checkpoint (gathered
    # whole, split again on load), to the uninterrupted run's weights byte for byte
    DTRAIN_FAULT=rank=3,step=3,kind=kill train mp-pt-killed configs/pretrain.yaml "${PRE[@]}" "${pt[@]}" \
        --set training.device=cuda --set training.precision=fp32 --set checkpoint.every_steps=2 \
        --set fault_tolerance.max_restarts=1 --set fault_tolerance.backoff_s=0.1 || return
    grep -q 'restart 1 of 1' "$B/runs/mp-pt-killed/train.log" ||
        { echo "FAIL: mp-pt-killed: expected one restart (train.log)"; return 1; }
    cmp "$B/runs/mp-pt-fp32/model.safetensors" "$B/runs/mp-pt-killed/model.safetensors" ||
        { echo "FAIL: mp-pt-killed: the restarted run's weights differ from the uninterrupted run's"; return 1; }
    echo "mp-pt-killed: rank 3 killed before step 3, one restart from step 2's checkpoint, the same weights"
    train mp-pt-bf16 configs/pretrain.yaml "${PRE[@]}" "${pt[@]}" --set training.device=cuda \
        --set training.precision=bf16 || return
    # --dry-run's GPU memory at P2 x T2: the share that needs the most (shares of the vocabulary
    # differ by a row), each group's collective, the stage boundaries' staging
    memory_run mp-mem-pt 4 configs/pretrain.yaml "${PRE[@]}" "${pt[@]}" --set training.device=cuda \
        --set training.precision=bf16 || return
    echo "pt, cuda (bf16 activations, summed as bf16) against cpu, at most 1e-2 relative:"
    same_losses mp-pt-cpu mp-pt-bf16 1e-2 || return
    # LoRA's base in bf16 on 2 shares: each embeds its rows of the bf16 table, multiplies its part
    # of every bf16 matrix as it is
    local b16=(--set model.lora.base_dtype=bf16)
    train mp-t2-lora16-cpu configs/pretrain.yaml "${PRE[@]}" "${t2[@]}" "${llama[@]}" "${lora[@]}" "${b16[@]}" \
        --set training.device=cpu || return
    train mp-t2-lora16-bf16 configs/pretrain.yaml "${PRE[@]}" "${t2[@]}" "${llama[@]}" "${lora[@]}" "${b16[@]}" \
        --set training.device=cuda --set training.precision=bf16 || return
    echo "t2, LoRA with the base in bf16, cuda (bf16) against cpu, at most 1e-2 relative:"
    same_losses mp-t2-lora16-cpu mp-t2-lora16-bf16 1e-2 || return
    with_libs "$OPT" "$OPT/dtrain" doctor --device cuda --num-workers 4 --tensor-parallel 2 --pipeline-parallel 2 \
        >"$B/mp-doctor.out" 2>&1 || { cat "$B/mp-doctor.out"; return 1; }
    grep -e 'group self-test' -e ', nccl:' -e 'doctor:' "$B/mp-doctor.out"
    [ "$(grep -c ', 2 workers, nccl:' "$B/mp-doctor.out")" = 2 ] ||
        { echo "FAIL: doctor: expected the tensor-parallel group's and the pair's tables over nccl"; return 1; }
)
step "model parallelism on 4 mock GPUs (T2, D2 x T2 + ZeRO-1, P2 x T2, a Llama, LoRA; a restart; bf16; doctor)" \
    model-parallel.log \
    model_parallel

# one wait for the device a step, not one per upload, loss or norm: logging.profile_step=2 opens the
# mock's profiler range before step 2 and closes it after; its stop line counts the host's waits
# (cudaStreamSynchronize, cudaEventSynchronize, cudaMemcpy, a copy to or from pageable memory...).
# At most 3: the step's own check (the loss, the gradient norm and a device failure, read at once)
# and the range's two (profile_range waits for the device after opening it and before closing it).
# Inputs go through pinned staging, the loss stays on the device until that check. With zero_stage
# 1 (one worker through nccl, the clip forced by a tiny optimizer.grad_clip) the norm and the clip
# are one sum of squares (two kernels) and one scale launch over every owned range, not one each
# per bucket (MOCK_PROFILER_LOG names the kernels). A language model with 3 micro-batches a step
# keeps the cpu run's losses (the staged inputs of one micro-batch are not the next one's), also
# with a staging so small that every micro-batch wraps around it (DTRAIN_TEST_STAGE_BYTES)
sync_run() { # NAME CONFIG [VAR=VALUE ...] -- BIN [--set ...]
    local name=$1 config=$2 vars=() rc=0 syncs
    shift 2
    while [ "$1" != -- ]; do vars+=("$1"); shift; done
    shift
    local bin=$1
    shift
    rm -f "$B/$name.prof"
    (export "${vars[@]}" DTRAIN_BIN="$bin" MOCK_PROFILER_LOG="$B/$name.prof"
     train "$name" "$config" --set training.max_steps=3 --set eval.every_steps=3 --set eval.max_batches=1 \
         --set training.device=cuda --set logging.profile_step=2 "$@") >"$B/$name.out" 2>&1 || rc=$?
    grep -e '^MOCK' -e 'note:' "$B/$name.out"
    [ $rc -eq 0 ] || { cat "$B/$name.out"; return $rc; }
    syncs=$(sed -n 's/^MOCK PROFILER: stop: .*; \([0-9]*\) synchronisations;.*/\1/p' "$B/$name.out")
    echo "$name: step 2 waited for the device ${syncs:-?} times (the range's own 2 included), launched" \
        "$(grep -c '^kernel ' "$B/$name.prof") kernels and made $(grep -c '^library ' "$B/$name.prof") library calls"
    [ -n "$syncs" ] && [ "$syncs" -le 3 ] ||
        { echo "FAIL: $name: step 2 waited for the device ${syncs:-?} times, at most 3 expected"; return 1; }
}
sync_counts() {
    sync_run sync-cls configs/ci-smoke.yaml -- "$OPT/dtrain" --set training.precision=bf16 \
        --set training.grad_accum_steps=2 || return
    sync_run sync-lm configs/pretrain.yaml -- "$OPT/dtrain_fused" "${PRE[@]}" --set training.precision=fp32 \
        --set training.grad_accum_steps=3 || return
    train sync-lm-cpu configs/pretrain.yaml --set training.max_steps=3 --set eval.every_steps=3 --set eval.max_batches=1 \
        "${PRE[@]}" --set training.device=cpu --set training.grad_accum_steps=3 || return
    echo "3 micro-batches a step, cuda (fp32) against cpu, at most 1e-5 relative:"
    same_losses sync-lm-cpu sync-lm 1e-5 || return
    DTRAIN_BIN=$OPT/dtrain_fused DTRAIN_TEST_STAGE_BYTES=1024 train sync-lm-wrap configs/pretrain.yaml \
        --set training.max_steps=3 --set eval.every_steps=3 --set eval.max_batches=1 "${PRE[@]}" \
        --set training.device=cuda --set training.precision=fp32 --set training.grad_accum_steps=3 || return
    echo "the same with staging halves of 1 KiB (DTRAIN_TEST_STAGE_BYTES: an upload waits for the copies out of the"
    echo "other half), the same losses:"
    same_losses sync-lm sync-lm-wrap 0 || return
    sync_run sync-zero configs/ci-smoke.yaml DTRAIN_TEST_DEVICE_COMM=1 -- "$OPT/dtrain_fused" \
        --set training.precision=bf16 --set training.zero_stage=1 --set training.grad_comm_dtype=bf16 \
        --set model.n_layer=2 --set optimizer.grad_clip=1e-4 || return
    local sq sc
    sq=$(grep -c '^kernel dtk_sumsq' "$B/sync-zero.prof")
    sc=$(grep -c '^kernel dtk_scale' "$B/sync-zero.prof")
    echo "sync-zero: the norm took $sq kernels, the clip $sc (4 owned ranges: the buckets)"
    [ "$sq" -le 2 ] && [ "$sc" -eq 1 ] ||
        { echo "FAIL: sync-zero: expected one sum of squares (2 kernels) and one scale over the 4 ranges"; return 1; }
}
step "one wait for the device a step (pinned uploads, the loss read once, zero_stage 1's norm in one launch)" \
    sync-counts.log sync_counts

gen() { # DEVICE OUT OPTIONS...: text from the cpu-trained weights, on DEVICE (fp32)
    local dev=$1 out=$2
    shift 2
    (cd "$SRC" && with_libs "$OPT" "$OPT/dtrain" generate --checkpoint "$B/runs/pre-cpu" --prompt "The " \
        --max-new-tokens 60 --set training.device="$dev" --set training.precision=fp32 "$@") >"$out"
}
same_text() { # greedy, and sampled with a seed (every logit counts: a near-uniform 4-step model)
    local k
    for k in greedy sampled; do
        local o=(--temperature 0)
        [ $k = sampled ] && o=(--seed 5)
        gen cpu "$LOGS/gen-$k-cpu.txt" "${o[@]}" && gen cuda "$LOGS/gen-$k-cuda.txt" "${o[@]}" || return
        echo "$k, cpu:  $(tr -c '[:print:]\n' '?' <"$LOGS/gen-$k-cpu.txt")"
        echo "$k, cuda: $(tr -c '[:print:]\n' '?' <"$LOGS/gen-$k-cuda.txt")"
        cmp "$LOGS/gen-$k-cpu.txt" "$LOGS/gen-$k-cuda.txt" || { echo "FAIL: the $k texts differ"; return 1; }
    done
}
step "dtrain generate (key/value cache): the same greedy and seeded text on cuda as on cpu" generate.log same_text
# inference plans cuDNN's forward only (no backward plan, no backward workspace): mock_att.c says
# which directions each plan has
fused_generate() {
    local err=$LOGS/gen-fused.err
    (cd "$SRC" && MOCK_ATT_TRACE=1 with_libs "$OPT" "$OPT/dtrain_fused" generate --checkpoint "$B/runs/pre-cpu" \
        --prompt "The " --max-new-tokens 8 --set training.device=cuda --set training.precision=bf16) \
        >"$LOGS/gen-fused.txt" 2>"$err" || { cat "$err"; return 1; }
    grep '^MOCK ATT: plan' "$err"
    grep -q '^MOCK ATT: plan .*, forward only' "$err" || { echo "expected a forward-only cuDNN plan"; return 1; }
    ! grep -q '^MOCK ATT: plan .*, forward and backward' "$err" || { echo "expected no backward plan"; return 1; }
    [ -s "$LOGS/gen-fused.txt" ] || { echo "expected generated text"; return 1; }
}
step "dtrain generate with cuDNN attention (mock_att.c): the forward planned only" generate-fused.log fused_generate

# ---- dtrain doctor --device cuda: its parent reports the CUDA versions and then forks the workers;
# the mock, as CUDA, refuses CUDA in a child forked after its parent used it (seen on an H200) ----
step "dtrain doctor --device cuda (no CUDA in the parent before the workers fork)" doctor.log \
    with_libs "$OPT" "$OPT/dtrain" doctor --device cuda

# ---- scripts/gpu-check.sh, its steps for a GPU run through on the mock one (about 90 s) ----
step "scripts/gpu-check.sh rehearsed on the mock GPU (gpucheck/rehearse.sh)" gpucheck.log \
    bash "$M/gpucheck/rehearse.sh" "$SRC" "$OPT" "$B/gpucheck"

echo "test_cuda_mock: all passed in $(elapsed "$T0")"
