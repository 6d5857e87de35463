#!/usr/bin/env bash
# rehearse.sh SRC OPT DIR — scripts/gpu-check.sh run through on the mock GPU (test_cuda_mock's
# last step), so that its steps for a GPU, which a machine without one skips, have run before a
# GPU is lent for minutes. OPT: a mock build (tests/mockgpu/Makefile: dtrain_fused,
# test_ops_backends, test_comm_nccl and the mock libraries); DIR: where the rehearsal works
# (wiped). The GPU's tools are this folder's stand-ins, first on PATH: nvidia-smi (one H200 and
# its dmon samples), ncu (the mock runtime's list of what ran in the profiled step, as ncu's
# CSV, with made-up times) and compute-sanitizer (runs the program; the mock's own checks are
# the findings). The build step reuses "a build" of wrappers around the mock programs
# (GPU_CHECK_SKIP_BUILD=1); the benchmarks run small models (bench-mock.yaml, smollm2-mock.yaml); the PyTorch
# references are not selected (GPU_CHECK_STEPS). What it proves: every step's commands,
# arguments, parsing and verdicts, bench.md and the packed logs. What it cannot: anything a GPU,
# cuDNN, ncu or compute-sanitizer would say.
#   1. every step but the build (reused: SKIP) and the PyTorch references (not selected) PASSes,
#      the summary says PASS, exit 0;
#   2. bench.md: the dtrain row with a step time, the cuBLASLt plans and cuDNN's attention plan
#      against the estimate, the dmon samples, the profiled step's top kernels; and with PyTorch
#      results (made up, as bench/torch_gpt2.py prints them), the ratio of the speeds;
#   3. $OUT holds summary.txt, bench.md and gpu-check-logs.tar.gz with every step's log;
#   4. a GPU test that skips (sees no GPU) while nvidia-smi lists one: gpu-tests FAILs, saying why;
#   5. GPU_CHECK_STEPS naming no step: exit 2 before anything runs.
#   6. compute-sanitizer failing itself (as racecheck did on an H200): racecheck SKIPs, saying so;
#      a race it reports: racecheck FAILs.
#   7. a slow fallback on sm_90 (the stand-in's H200; DTRAIN_REQUIRE_FAST_PATH): attention on
#      dtrain's kernels (the mock programs without mock_att.c) fails gpu-tests and bench-dtrain, a
#      bf16 product in fp32 (MOCK_LT_NO_BF16) fails bench-dtrain, each note naming the fallback.
#   8. env: a driver older than the toolkit (MOCK_DRIVER_CUDA), a CUDA library that does not
#      resolve (hidden by hide_libs.c): env FAILs, naming the versions or the library's package.
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 SRC OPT DIR" >&2; exit 2; }
SRC=$(cd "$1" && pwd)
OPT=$(cd "$2" && pwd)
mkdir -p "$3"
D=$(cd "$3" && pwd)
TOOLS=$SRC/tests/mockgpu/gpucheck
rm -rf "$D/build" "$D/out" "$D/work" "$D/gpus" "$D/nogpus"
mkdir -p "$D/build" "$D/gpus/0000:00:00.0" "$D/nogpus"
fail() { echo "FAIL: $*"; exit 1; }

# "the build": wrappers that run the mock programs with the mock libraries first, one mock GPU
# (fake_gpus.c) and the driver's NVML as the fake one (the launcher's GPU samples); GPUS: that
# GPU's folder, or an empty one (no GPU seen)
wrap() { # NAME PROGRAM GPUS
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} MOCK_GPUS_DIR=%s %s exec %s "$@"\n' \
        "$OPT:$OPT/nvml" "$3" "FAKE_NVML_GPUS=00000000:3B:00.0=87/30720/143771/61/412" "$2" >"$D/build/$1"
    chmod +x "$D/build/$1"
}
build() { # GPUS [SUFFIX]: SUFFIX _fused (default) or empty: cuDNN's attention (mock_att.c), or none
    local f=${2-_fused}
    wrap dtrain "$OPT/dtrain$f" "$1"
    wrap test_ops_backends "$OPT/test_ops_backends$f" "$1"
    wrap test_comm_nccl "$OPT/test_comm_nccl" "$1"
}
build "$D/gpus"
# the GPU tests as CMake registers them (label gpu), and one of label mockgpu that fails if run:
# gpu-tests must select the label exactly
cat >"$D/build/CTestTestfile.cmake" <<EOF
add_test(test_ops_backends "$D/build/test_ops_backends" "--quick")
set_tests_properties(test_ops_backends PROPERTIES LABELS "gpu" SKIP_RETURN_CODE 77)
add_test(test_comm_nccl "$D/build/test_comm_nccl")
set_tests_properties(test_comm_nccl PROPERTIES LABELS "gpu" SKIP_RETURN_CODE 77)
add_test(test_cuda_mock "false")
set_tests_properties(test_cuda_mock PROPERTIES LABELS "unit;mockgpu")
EOF

check() { # OUT WORK [GPU_CHECK_... settings]: gpu-check.sh with the stand-ins
    local out=$1 work=$2
    shift 2
    # the caller's GPU_CHECK_* settings are not the rehearsal's
    local unset
    unset=$(env | sed -n 's/^\(GPU_CHECK_[A-Z_]*\)=.*/-u \1/p')
    # shellcheck disable=SC2086  # unset: -u NAME words
    (cd "$SRC" && env $unset PATH="$TOOLS:$PATH" GPU_CHECK_SKIP_BUILD=1 GPU_CHECK_BUILD_DIR="$D/build" GPU_CHECK_WORK="$work" \
        GPU_CHECK_FT_STEPS=10 GPU_CHECK_FT_SET=eval.max_batches=8 GPU_CHECK_BENCH_STEPS=12 GPU_CHECK_PROFILE_STEP=2 \
        GPU_CHECK_BENCH_CONFIG=tests/mockgpu/gpucheck/bench-mock.yaml GPU_CHECK_SMOLLM2_CONFIG=tests/mockgpu/gpucheck/smollm2-mock.yaml \
        GPU_CHECK_BUDGET_S=900 OUT="$out" "$@" \
        bash scripts/gpu-check.sh)
}
result() { awk -v s="$2" '$1 == s { print $2 }' "$1/summary.txt"; }

# ---- 1-3: the whole run ----
STEPS=env,deps,build,gpu-tests,finetune,doctor,nccl-alone,bench-dtrain,bench-smollm2,profile,sanitizer,racecheck
rc=0
check "$D/out" "$D/work" GPU_CHECK_STEPS=$STEPS || rc=$?
echo "--- the rehearsal's summary and bench.md are above; its checks:"
[ -f "$D/out/summary.txt" ] || fail "no summary.txt"
for s in ${STEPS//,/ }; do
    want=PASS
    [ "$s" = build ] && want=SKIP # reused (GPU_CHECK_SKIP_BUILD=1)
    got=$(result "$D/out" "$s")
    [ "$got" = "$want" ] || fail "step $s: $got, expected $want: $(grep "^$s " "$D/out/summary.txt")"
done
for s in torch-eager torch-compile; do
    grep -q "^$s .*SKIP .*not selected" "$D/out/summary.txt" || fail "step $s: expected SKIP, not selected"
done
grep -q '^overall: PASS' "$D/out/summary.txt" || fail "the summary does not say PASS"
[ $rc -eq 0 ] || fail "gpu-check.sh exited $rc"
echo "ok: every step passed"
grep -q '^finetune .*PASS: all 10 steps within the tolerance; NVML: "gpu":0,"gpu_util_pct":87.0,' "$D/out/summary.txt" ||
    fail "finetune: the note lacks the loss comparison or the GPU's NVML sample"
B=$D/out/bench.md
grep -qE '^\| dtrain[^|]*\| *[0-9.]+ \|' "$B" || fail "bench.md: no dtrain row with a step time"
grep -qE '^\| dtrain SmolLM2 \(bf16\) \| *[0-9.]+ \| *[0-9]+ \| *[0-9.]+%' "$B" && grep -q "^SmolLM2-135M's shape" "$B" ||
    fail "bench.md: no SmolLM2 row with a step time and an MFU"
grep -qE '^plans: [1-9][0-9]* cuBLASLt plans, 0 refused' "$B" || fail "bench.md: no cuBLASLt plans line"
grep -qE "cuDNN attention plan: .*workspace [0-9]+ bytes \(--dry-run assumes [0-9]+ for training\)" "$B" ||
    fail "bench.md: no cuDNN attention plan with its workspace"
grep -qE '^nvidia-smi dmon during the benchmark: [1-9][0-9]* samples' "$B" || fail "bench.md: no dmon samples"
grep -q 'dtk_' "$B" && grep -q 'cublasLtMatmul_mock_kernel' "$B" || fail "bench.md: no profiled kernels (ours and cuBLASLt's)"
echo "ok: bench.md has the benchmark row, the plans, the dmon samples and the profiled kernels"
# the PyTorch rows (not run here: no torch), from results as bench/torch_gpt2.py prints them:
# one that ran at a third of dtrain's tokens/s as the table rounds them (so 2.8x to 3.2x while
# dtrain's is over 8), one skipped; the table says the ratio
tps=$(sed -n 's/^| dtrain[^|]*| *[0-9.]* | *\([0-9.]*\) |.*/\1/p' "$B")
echo "{\"mode\": \"eager\", \"ms_per_step\": 1.0, \"tokens_per_s\": $(awk -v t="$tps" 'BEGIN { print t / 3 }'), \"steps\": 20, \"warmup\": 5}" \
    >"$D/torch-eager.json"
echo '{"mode": "compile", "skipped": "no CUDA device"}' >"$D/torch-compile.json"
python3 "$SRC/scripts/bench-table.py" --dtrain "$D/work/bench-dtrain" --torch "torch eager=$D/torch-eager.json" \
    --torch "torch compile=$D/torch-compile.json" --gpu "NVIDIA H200" >"$D/bench-torch.md"
grep -qE '^dtrain \(bf16\) / torch eager: (2\.[89][0-9]|3\.[01][0-9])x the tokens/s \(the same run, the same GPU\)$' \
    "$D/bench-torch.md" &&
    grep -q '^| torch compile | - | - | - | skipped: no CUDA device |' "$D/bench-torch.md" ||
    { cat "$D/bench-torch.md"; fail "bench-table.py: no ratio to torch eager, or the skipped reference not said"; }
echo "ok: with PyTorch results the table gives the ratio: $(grep -m1 ' / torch eager' "$D/bench-torch.md")"
n=$(find "$D/out" -type f | wc -l)
[ "$n" -eq 3 ] && [ -f "$D/out/gpu-check-logs.tar.gz" ] || fail "$D/out holds $n files, expected summary.txt, bench.md, gpu-check-logs.tar.gz"
logs=$(tar -tzf "$D/out/gpu-check-logs.tar.gz" | grep -c '^[0-9][0-9]-.*\.log$')
[ "$logs" -eq 14 ] || fail "gpu-check-logs.tar.gz holds $logs step logs, expected 14"
echo "ok: $D/out holds summary.txt, bench.md and the packed logs ($logs steps)"

# ---- 4: a GPU test that skips while nvidia-smi lists a GPU (test_ops_backends, which counts the
# GPUs as dtrain does, sees none; the mock's test_comm_nccl always sees its one) ----
build "$D/nogpus"
rc=0
check "$D/out-skip" "$D/work-skip" GPU_CHECK_STEPS=gpu-tests GPU_CHECK_PACK=0 >"$D/skip.log" 2>&1 || rc=$?
build "$D/gpus"
[ $rc -eq 1 ] && [ "$(result "$D/out-skip" gpu-tests)" = FAIL ] ||
    { cat "$D/skip.log"; fail "gpu-tests with a GPU test skipped: exit $rc, expected a FAIL"; }
grep -q "gpu-tests .*FAIL .*1 of 2 GPU tests skipped while nvidia-smi lists 1 GPU(s): .*no device visible" \
    "$D/out-skip/summary.txt" || { cat "$D/out-skip/summary.txt"; fail "gpu-tests: the FAIL does not say why"; }
echo "ok: $(grep '^gpu-tests' "$D/out-skip/summary.txt" | cut -c1-160)"

# ---- 5: a step that does not exist ----
rc=0
check "$D/out-bad" "$D/work-bad" GPU_CHECK_STEPS=env,benchmark >"$D/bad.log" 2>&1 || rc=$?
[ $rc -eq 2 ] && grep -q "GPU_CHECK_STEPS: no step 'benchmark'" "$D/bad.log" ||
    { cat "$D/bad.log"; fail "GPU_CHECK_STEPS=env,benchmark: exit $rc, expected 2 and the list of steps"; }
echo "ok: $(head -1 "$D/bad.log")"
# ---- 6: compute-sanitizer failing itself is no result (SKIP); a race it reports is a FAIL ----
rc=0
check "$D/out-san" "$D/work-san" GPU_CHECK_STEPS=racecheck GPU_CHECK_PACK=0 MOCK_SANITIZER_FAIL=internal >"$D/san.log" 2>&1 || rc=$?
[ $rc -eq 0 ] && grep -q "^racecheck .*SKIP .*failed internally ('The Sanitizer failed to handle a hardware exception.') in or after case attention B 2 T 13" \
    "$D/out-san/summary.txt" || { cat "$D/san.log"; fail "racecheck, the tool failing itself: exit $rc, expected a SKIP saying so"; }
echo "ok: $(grep '^racecheck' "$D/out-san/summary.txt" | cut -c1-160)"
rc=0
check "$D/out-race" "$D/work-race" GPU_CHECK_STEPS=racecheck GPU_CHECK_PACK=0 MOCK_SANITIZER_FAIL=race >"$D/race.log" 2>&1 || rc=$?
[ $rc -eq 1 ] && [ "$(result "$D/out-race" racecheck)" = FAIL ] ||
    { cat "$D/race.log"; fail "racecheck with a race reported: exit $rc, expected a FAIL"; }
echo "ok: $(grep '^racecheck' "$D/out-race/summary.txt" | cut -c1-160)"
# ---- 7: the fast path did not run ----
build "$D/gpus" ""
rc=0
check "$D/out-slow" "$D/work-slow" GPU_CHECK_STEPS=gpu-tests,bench-dtrain GPU_CHECK_PACK=0 >"$D/slow.log" 2>&1 || rc=$?
build "$D/gpus"
for s in gpu-tests bench-dtrain; do
    [ $rc -eq 1 ] && grep -q "^$s .*FAIL .*the fast path did not run: attention of head size [0-9]* would run on dtrain's kernels" \
        "$D/out-slow/summary.txt" || { cat "$D/out-slow/summary.txt"; fail "$s with attention on dtrain's kernels: exit $rc, expected a FAIL naming it"; }
    echo "ok: $(grep "^$s" "$D/out-slow/summary.txt" | cut -c1-200)"
done
rc=0
check "$D/out-fp32" "$D/work-fp32" GPU_CHECK_STEPS=bench-dtrain GPU_CHECK_PACK=0 MOCK_LT_NO_BF16=1 >"$D/fp32.log" 2>&1 || rc=$?
[ $rc -eq 1 ] && grep -q "^bench-dtrain .*FAIL .*the fast path did not run: cuBLASLt has no bf16 algorithm" "$D/out-fp32/summary.txt" ||
    { cat "$D/out-fp32/summary.txt"; fail "bench-dtrain with bf16 products in fp32: exit $rc, expected a FAIL naming it"; }
echo "ok: $(grep '^bench-dtrain' "$D/out-fp32/summary.txt" | cut -c1-200)"
# ---- 8: env: the driver against the toolkit, the CUDA libraries ----
rc=0
check "$D/out-drv" "$D/work-drv" GPU_CHECK_STEPS=env GPU_CHECK_PACK=0 MOCK_DRIVER_CUDA=12.4 >"$D/drv.log" 2>&1 || rc=$?
[ $rc -eq 1 ] && grep -q "^env .*FAIL .*supports CUDA 12.4, older than the toolkit's" "$D/out-drv/summary.txt" ||
    { cat "$D/drv.log"; fail "env with a driver for CUDA 12.4: exit $rc, expected a FAIL saying so"; }
echo "ok: $(grep '^env' "$D/out-drv/summary.txt" | cut -c1-200)"
rc=0
nvrtc=libnvrtc.so.$(nvcc --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
check "$D/out-lib" "$D/work-lib" GPU_CHECK_STEPS=env GPU_CHECK_PACK=0 LD_PRELOAD="$OPT/libhidelibs.so" MOCK_HIDE_LIBS="$nvrtc" \
    >"$D/lib.log" 2>&1 || rc=$?
[ $rc -eq 1 ] && grep -q "^env .*FAIL .*missing: $nvrtc (apt cuda-nvrtc-" "$D/out-lib/summary.txt" ||
    { cat "$D/lib.log"; fail "env without $nvrtc: exit $rc, expected a FAIL naming it and its package"; }
echo "ok: $(grep '^env' "$D/out-lib/summary.txt" | cut -c1-200)"
echo "rehearse.sh: gpu-check.sh passed its rehearsal on the mock GPU"
