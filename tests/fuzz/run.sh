#!/usr/bin/env bash
# run.sh [SECONDS] [TARGET...] — runs the fuzz targets of tests/fuzz (README.md there), each for
# SECONDS (default 60), all of them when none is named (config data safetensors ckpt ...).
#
# Builds them first (clang, libFuzzer, ASan + UBSan, every UB report fatal) in DTRAIN_FUZZ_BUILD
# (default build-fuzz), makes the generated seeds (gen_seeds.c), and fuzzes over a corpus in
# DTRAIN_FUZZ_BUILD/corpus/TARGET that starts from those seeds, the shipped configs (config)
# and tests/fuzz/seeds/TARGET; the tree is never written. Fails when a target reports a crash,
# a leak, undefined behaviour, a timeout or running out of memory: the input is in
# DTRAIN_FUZZ_BUILD/artifacts/TARGET/. FUZZ_ARGS adds libFuzzer flags (e.g. "-fork=8").
# Exit 77 (skipped) when clang or its libFuzzer runtime is missing.
set -euo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
SECS=${1:-60}
[ $# -gt 0 ] && shift
BUILD=${DTRAIN_FUZZ_BUILD:-$SRC/build-fuzz}
CC=${DTRAIN_FUZZ_CC:-clang}
if [ $# -gt 0 ]; then TARGETS=("$@"); else
  TARGETS=()
  for f in "$SRC"/tests/fuzz/fuzz_*.c; do t=${f##*/fuzz_}; TARGETS+=("${t%.c}"); done
fi
for t in "${TARGETS[@]}"; do
  [ -f "$SRC/tests/fuzz/fuzz_$t.c" ] || { echo "run.sh: no target $t (tests/fuzz/fuzz_$t.c)" >&2; exit 2; }
done

mkdir -p "$BUILD"
BUILD=$(cd "$BUILD" && pwd)
skip() { echo "run.sh: skipped: $1 (install it: DTRAIN_TEST_TOOLS=1 scripts/setup.sh)"; exit 77; }
command -v "$CC" >/dev/null || skip "no $CC"
printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' >"$BUILD/probe.c"
"$CC" -fsanitize=fuzzer,address,undefined "$BUILD/probe.c" -o "$BUILD/probe" >"$BUILD/probe.log" 2>&1 \
  || skip "$CC cannot link -fsanitize=fuzzer,address,undefined (no libFuzzer runtime: libclang-rt-dev)"

log="$BUILD/build.log"
if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  cmake -S "$SRC" -B "$BUILD" -DCMAKE_C_COMPILER="$CC" -DDTRAIN_FUZZ=ON -DDTRAIN_CUDA=OFF -DDTRAIN_MPI=OFF \
    -DCMAKE_BUILD_TYPE=Debug >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
fi
cmake --build "$BUILD" --target fuzz -j "$(nproc)" >"$log" 2>&1 || { tail -50 "$log" >&2; exit 1; }

gen="$BUILD/seeds-gen"
rm -rf "$gen"
"$BUILD/fuzz_gen_seeds" "$SRC" "$gen" || { echo "run.sh: gen_seeds failed" >&2; exit 1; }
mkdir -p "$gen/config"
for f in "$SRC"/configs/*.yaml "$SRC"/tests/configs/*.yaml; do n=${f#"$SRC"/}; cp "$f" "$gen/config/${n//\//-}"; done

# the targets' scratch files (fuzz_util.h): in memory when /dev/shm is there, removed at the end
# even after a crash
tmp_base=/dev/shm
[ -w "$tmp_base" ] || tmp_base="$BUILD"
DTRAIN_FUZZ_TMP=$(mktemp -d "$tmp_base/dtrain-fuzz-run.XXXXXX")
export DTRAIN_FUZZ_TMP
trap 'rm -rf "$DTRAIN_FUZZ_TMP"' EXIT
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=()
for t in "${TARGETS[@]}"; do
  corpus="$BUILD/corpus/$t" art="$BUILD/artifacts/$t" tlog="$BUILD/logs/$t.log"
  mkdir -p "$corpus" "$art" "$BUILD/logs"
  for d in "$gen/$t" "$SRC/tests/fuzz/seeds/$t"; do
    [ -d "$d" ] && find "$d" -maxdepth 1 -type f ! -name 'README*' -exec cp {} "$corpus/" \;
  done
  dict=()
  [ -f "$gen/$t.dict" ] && dict=(-dict="$gen/$t.dict")
  before=$(find "$art" -type f | wc -l)
  rc=0
  # shellcheck disable=SC2086 # FUZZ_ARGS is a list of flags
  (cd "$BUILD/logs" && "$BUILD/fuzz_$t" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$art/" "${dict[@]}" ${FUZZ_ARGS:-} "$corpus") >"$tlog" 2>&1 || rc=$?
  after=$(find "$art" -type f | wc -l)
  if [ "$rc" != 0 ] || [ "$after" != "$before" ]; then
    echo "run.sh: $t: FAILED (exit $rc): the end of $tlog:"
    tail -60 "$tlog"
    echo "run.sh: $t: the input is in $art/ (once fixed, add it to tests/fuzz/seeds/$t/)"
    failed+=("$t")
  else
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$tlog" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$tlog" | tail -1 || true)
    echo "run.sh: $t: ok, ${runs:-?} inputs in ${SECS}s, ${cov:-cov: ?}, corpus $(find "$corpus" -type f | wc -l) files"
  fi
done
[ ${#failed[@]} -eq 0 ] || { echo "run.sh: failed: ${failed[*]}"; exit 1; }
