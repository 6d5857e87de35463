#!/usr/bin/env bash
# gpu-check.sh — the one command to run on a GPU machine (docs/gpu.md). In under 8 minutes
# (the 390 s budget plus ~15 s to finish: about 7 at most) it checks the environment, makes the build
# dependencies available (from third_party/debs when the system lacks them, see
# scripts/fetch-debs.sh), builds dtrain with CUDA, runs the GPU tests, a CPU-vs-GPU fine-tune
# loss comparison, `dtrain doctor --device cuda`, a GPT-2 124M throughput benchmark against
# PyTorch eager, an ncu profile of one steady step, compute-sanitizer memcheck and racecheck on
# the op tests (our kernels) and, when >= 120 s are left, the PyTorch torch.compile reference
# (essential checks first, the slow optional ones last).
#
# usage: scripts/gpu-check.sh [OUT_DIR]
#   OUT_DIR: $1, else $GPU_CHECK_OUT, else $OUT, else ./gpu-check-out. It gets one log per step
#   (NN-STEP.log, with the step's start and end time), summary.txt (PASS/FAIL/SKIP and seconds
#   per step) and bench.md (the benchmark table). Every step runs, whatever the others did
#   (a step whose input is missing, e.g. a binary the build did not make, says SKIP or FAIL
#   with the reason); the summary and the table are printed last. Exit 1 when any step failed.
#
# environment (all optional):
#   GPU_CHECK_BUDGET_S   whole-run time budget in seconds (default 390): each step's time limit
#                        is its own cap or what is left of the budget, whichever is less; a step
#                        whose limit would be under its minimum (the run_step lines below) is not
#                        run: SKIP "out of time: N s left, needs M". Packing (GPU_CHECK_PACK)
#                        and the summary always happen, whatever is left.
#   GPU_CHECK_BUILD_DIR  build folder (default build-gpu; reused, so a second run is incremental)
#   GPU_CHECK_WORK       run folders, token shard, intermediate files
#                        (default BUILD_DIR/gpu-check-runs; wiped at start)
#   GPU_CHECK_JOBS       build parallelism (default: nproc)
#   GPU_CHECK_CUDA_ARCH  CMAKE_CUDA_ARCHITECTURES (default: the GPU's compute capability, else 90)
#   GPU_CHECK_FAST_PATH  1: gpu-tests, bench-dtrain and bench-smollm2 run with DTRAIN_REQUIRE_FAST_PATH=1,
#                        so that a slow fallback (attention on dtrain's kernels where cuDNN supports
#                        the head size, a bf16 product in fp32) fails them, naming it; 0: only
#                        noted (default: 1 on a GPU of compute capability 9.0, sm_90, else 0)
#   GPU_CHECK_DEBS       folder of .deb files (default third_party/debs)
#   GPU_CHECK_PACK=1     at the end, pack the step logs and the runs' metrics.jsonl into
#                        OUT_DIR/gpu-check-logs.tar.gz and remove the loose logs (OUT_DIR then
#                        holds 3 files: summary.txt, bench.md, gpu-check-logs.tar.gz; if tar
#                        fails, the logs are joined into all-steps.log instead). Default 1 when
#                        OUT_DIR came from $OUT, else 0.
#   GPU_CHECK_FT_STEPS   fine-tune steps per run (default 200)
#   GPU_CHECK_BENCH_STEPS dtrain benchmark steps (default 40; the first 10 are left out)
#   GPU_CHECK_PROFILE_STEP the training step ncu records (default 6: past the first steps' plans)
#   GPU_CHECK_STEPS      the steps to run, by name, comma-separated (default: all): the others say
#                        SKIP "not selected"; env and deps always run (seconds; what the later
#                        steps stand on). For a second run after a fix: e.g.
#                        GPU_CHECK_STEPS=build,finetune (the build is incremental). Names: env
#                        deps build gpu-tests finetune doctor nccl-alone bench-dtrain
#                        bench-smollm2 torch-eager profile sanitizer racecheck torch-compile; one that is not
#                        a step, or none: exit 2 at once
#   testing aids (not for real checks):
#   GPU_CHECK_SKIP_BUILD=1   reuse an existing build in BUILD_DIR (the build step says SKIP)
#   GPU_CHECK_FORCE_PREFIX=1 use the third_party/debs prefix even when the system has the libraries
#   GPU_CHECK_BENCH_CONFIG   the benchmark's and the profile's config (default
#                            configs/gpt2-124m-bench.yaml; the rehearsal on the mock GPU,
#                            tests/mockgpu/gpucheck/rehearse.sh, gives a small one; bench.md's
#                            MFU and model line still assume GPT-2 124M)
#   GPU_CHECK_SMOLLM2_CONFIG the SmolLM2-shaped benchmark's config (default configs/smollm2-bench.yaml;
#                            the rehearsal gives a small Llama)
#   GPU_CHECK_FT_SET         more --set KEY=VALUE words for both fine-tune runs (the rehearsal:
#                            a shorter evaluation on the slow mock GPU)
set -uo pipefail
T0=$(date +%s)  # the budget counts from here
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1

PACK_DEFAULT=0
if [ -n "${1:-}" ]; then OUT_DIR=$1
elif [ -n "${GPU_CHECK_OUT:-}" ]; then OUT_DIR=$GPU_CHECK_OUT
elif [ -n "${OUT:-}" ]; then OUT_DIR=$OUT; PACK_DEFAULT=1
else OUT_DIR=gpu-check-out
fi
abspath() { case "$1" in /*) printf '%s\n' "$1" ;; *) printf '%s/%s\n' "$ROOT" "$1" ;; esac; }
OUT_DIR=$(abspath "$OUT_DIR")
BUILD=$(abspath "${GPU_CHECK_BUILD_DIR:-build-gpu}")
WORK=$(abspath "${GPU_CHECK_WORK:-$BUILD/gpu-check-runs}")
DEBS=$(abspath "${GPU_CHECK_DEBS:-third_party/debs}")
BUDGET=${GPU_CHECK_BUDGET_S:-390}
JOBS=${GPU_CHECK_JOBS:-$(nproc 2>/dev/null || echo 4)}
PACK=${GPU_CHECK_PACK:-$PACK_DEFAULT}
FT_STEPS=${GPU_CHECK_FT_STEPS:-200}
BENCH_STEPS=${GPU_CHECK_BENCH_STEPS:-40}
PROFILE_STEP=${GPU_CHECK_PROFILE_STEP:-6}
SKIP_BUILD=${GPU_CHECK_SKIP_BUILD:-0}
FORCE_PREFIX=${GPU_CHECK_FORCE_PREFIX:-0}
BENCH_CONFIG=${GPU_CHECK_BENCH_CONFIG:-configs/gpt2-124m-bench.yaml}
SMOLLM2_CONFIG=${GPU_CHECK_SMOLLM2_CONFIG:-configs/smollm2-bench.yaml}
FT_SET=${GPU_CHECK_FT_SET:-}
ALL_STEPS="env deps build gpu-tests finetune doctor nccl-alone bench-dtrain bench-smollm2 torch-eager profile sanitizer racecheck torch-compile"
# GPU_CHECK_STEPS: names split at commas and blanks, each checked, then joined by single commas;
# env and deps always run (a few seconds: what every later step stands on, deps.env included)
STEPS=""
if [ -n "${GPU_CHECK_STEPS:-}" ]; then  # unset or empty: all
  set -f  # a * in it is not a file name
  for st in $(printf '%s' "$GPU_CHECK_STEPS" | tr ',' ' '); do
    case " $ALL_STEPS " in *" $st "*) ;; *) echo "gpu-check: GPU_CHECK_STEPS: no step '$st' (steps: $ALL_STEPS)" >&2; exit 2 ;; esac
    case ",$STEPS," in *",$st,"*) ;; *) STEPS=${STEPS:+$STEPS,}$st ;; esac
  done
  set +f
  [ -n "$STEPS" ] || { echo "gpu-check: GPU_CHECK_STEPS='$GPU_CHECK_STEPS' names no step (steps: $ALL_STEPS)" >&2; exit 2; }
  case ",$STEPS," in *,deps,*) ;; *) STEPS=deps,$STEPS ;; esac
  case ",$STEPS," in *,env,*) ;; *) STEPS=env,$STEPS ;; esac
fi
PREFIX=$BUILD/prefix
ENV_FILE=$WORK/deps.env
NOTE_FILE=$WORK/.step-note
ORIG_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}

case "$WORK" in /|"$ROOT"|"$ROOT"/|"${HOME:-/}"|"$OUT_DIR") echo "gpu-check: refusing to wipe GPU_CHECK_WORK=$WORK" >&2; exit 2 ;; esac
mkdir -p "$OUT_DIR" "$BUILD" || exit 1
rm -rf "$WORK" && mkdir -p "$WORK" || exit 1
rm -f "$OUT_DIR"/[0-9][0-9]-*.log "$OUT_DIR/summary.txt" "$OUT_DIR/bench.md" "$OUT_DIR/gpu-check-logs.tar.gz"

# ---- tools that every step may use ---------------------------------------------------------
PATH=$PATH:/sbin:/usr/sbin  # ldconfig, for non-root users too
if ! command -v nvcc >/dev/null; then
  for d in ${CUDA_HOME:+"$CUDA_HOME"} ${CUDA_PATH:+"$CUDA_PATH"} /usr/local/cuda; do
    if [ -x "$d/bin/nvcc" ]; then PATH=$d/bin:$PATH; break; fi
  done
fi
CUDA_HOME=""
if command -v nvcc >/dev/null; then CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")"); fi
NVSMI=$(command -v nvidia-smi || true)
[ -z "$NVSMI" ] && [ -x /usr/local/nvidia/bin/nvidia-smi ] && NVSMI=/usr/local/nvidia/bin/nvidia-smi
GPU_NAME=""
GPU_CC=""
if [ -n "$NVSMI" ]; then
  GPU_NAME=$(timeout 15 "$NVSMI" --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  GPU_CC=$(timeout 15 "$NVSMI" --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')
fi
case "$GPU_CC" in [0-9][0-9]|[0-9][0-9][0-9]) ;; *) GPU_CC="" ;; esac
CUDA_ARCH=${GPU_CHECK_CUDA_ARCH:-${GPU_CC:-90}}
FAST_PATH=${GPU_CHECK_FAST_PATH:-$([ "$GPU_CC" = 90 ] && echo 1 || echo 0)}
export PATH ROOT OUT_DIR BUILD WORK DEBS JOBS FT_STEPS BENCH_STEPS PROFILE_STEP SKIP_BUILD FORCE_PREFIX BENCH_CONFIG SMOLLM2_CONFIG FT_SET PREFIX ENV_FILE \
  NOTE_FILE ORIG_LD_LIBRARY_PATH CUDA_HOME NVSMI GPU_NAME CUDA_ARCH FAST_PATH PYTHONUNBUFFERED=1

# ---- helpers for the steps (exported: each step runs in `timeout ... bash -c STEP`) ----------
note() { printf '%s\n' "$*" >"$NOTE_FILE"; echo "note: $*"; }
# check_lib NAME PKGCONFIG-MODULE HEADER CALL [CFLAGS]: compiles and links a program that includes
# HEADER and calls CALL against the library, with the flags pkg-config gives (zlib: plain -lz
# when pkg-config has no zlib module; CMake finds zlib with FindZLIB, not pkg-config)
check_lib() {
  local name=$1 mod=$2 hdr=$3 call=$4 extra=${5:-} flags
  if [ "$mod" = zlib ] && ! pkg-config --exists zlib 2>/dev/null; then flags="-lz"
  else
    command -v pkg-config >/dev/null || { echo "  $name: no pkg-config"; return 1; }
    flags=$(pkg-config --cflags --libs "$mod" 2>&1) || { echo "  $name: pkg-config: $flags"; return 1; }
  fi
  printf '#include <%s>\nint main(void) { return !(%s); }\n' "$hdr" "$call" >"$WORK/conftest.c"
  # shellcheck disable=SC2086  # flags are pkg-config words
  if out=$(${CC:-cc} $extra "$WORK/conftest.c" -o "$WORK/conftest" $flags 2>&1); then
    echo "  $name: ok ($mod: ${flags})"
  else
    echo "  $name: missing: $(printf '%s\n' "$out" | grep -m1 -E 'error|cannot find' || printf '%s' "$out" | head -1)"
    return 1
  fi
}
check_all_libs() {
  local bad=()
  command -v pkg-config >/dev/null || bad+=(pkg-config)
  check_lib libyaml yaml-0.1 yaml.h 'yaml_get_version_string() != 0' || bad+=(libyaml)
  check_lib jansson jansson jansson.h 'json_object() != 0' || bad+=(jansson)
  check_lib zlib zlib zlib.h 'zlibVersion() != 0' || bad+=(zlib)
  check_lib openblas openblas cblas.h 'openblas_get_config() != 0' || bad+=(openblas)
  check_lib libcrypto libcrypto openssl/crypto.h 'OpenSSL_version_num() != 0' || bad+=(libcrypto)
  check_lib pcre2 libpcre2-8 pcre2.h 'pcre2_config_8(PCRE2_CONFIG_UNICODE, 0) >= 0' -DPCRE2_CODE_UNIT_WIDTH=8 \
    || bad+=(pcre2)
  check_lib utf8proc libutf8proc utf8proc.h 'utf8proc_version() != 0' || bad+=(utf8proc)
  MISSING="${bad[*]}"
  [ ${#bad[@]} -eq 0 ]
}
deb_extract() {  # DEB DIR: dpkg-deb -x, or ar + tar where dpkg is not installed
  if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$1" "$2"; return; fi
  local t rc
  t=$(mktemp -d) && (cd "$t" && ar x "$1") && tar -xf "$t"/data.tar.* -C "$2"
  rc=$?
  rm -rf "$t"
  return $rc
}
deb_package() {  # the Package field, or the file name up to the first _
  if command -v dpkg-deb >/dev/null; then dpkg-deb -f "$1" Package; else basename "$1" | cut -d_ -f1; fi
}
in_ld_cache() { ldconfig -p 2>/dev/null | grep -q "[[:space:]]$1 "; }
first_error() {  # FILE: its first line that mentions an error, else its last line (for notes)
  { grep -m1 -i 'error' "$1" || grep -v '^[[:space:]]*$' "$1" | tail -1; } 2>/dev/null | cut -c1-160
}
# no_gpu: true when neither nvidia-smi nor the driver's device files show a GPU; the steps that
# need one then SKIP with that reason instead of failing (a machine without a GPU "stops cleanly")
no_gpu() {
  local n=0
  [ -n "$NVSMI" ] && n=$(timeout 15 "$NVSMI" -L 2>/dev/null | grep -c '^GPU ')
  [ "$n" -eq 0 ] && ! ls /proc/driver/nvidia/gpus/* >/dev/null 2>&1 && ! ls /dev/nvidia[0-9]* >/dev/null 2>&1
}
# find_tool NAME: the CUDA tool NAME (compute-sanitizer, ncu) from PATH, CUDA_HOME/bin,
# /usr/local/cuda/bin or /opt/nvidia/nsight-compute/*; nothing when there is none
find_tool() {
  local t d
  t=$(command -v "$1") && { echo "$t"; return; }
  for d in ${CUDA_HOME:+"$CUDA_HOME/bin"} /usr/local/cuda/bin /opt/nvidia/nsight-compute/*; do
    [ -x "$d/$1" ] && { echo "$d/$1"; return; }
  done
}
skip_without_gpu() { note "no GPU here (nvidia-smi lists none, no /dev/nvidia0): nothing to run it on"; return 77; }
# require_fast_path: with FAST_PATH=1, dtrain and the op tests fail on a slow fallback, naming it
# (DTRAIN_REQUIRE_FAST_PATH, src/ops/ops_cuda.c); fallback_error FILE: that line, else first_error
require_fast_path() {
  if [ "$FAST_PATH" = 1 ]; then
    export DTRAIN_REQUIRE_FAST_PATH=1
    echo "--- DTRAIN_REQUIRE_FAST_PATH=1 (GPU_CHECK_FAST_PATH=1): a slow fallback is an error"
  fi
}
fallback_error() { grep -m1 -o 'the fast path did not run: .*' "$1" 2>/dev/null | cut -c1-240 | grep . || first_error "$1"; }
export -f note check_lib check_all_libs deb_extract deb_package in_ld_cache first_error no_gpu find_tool skip_without_gpu \
  require_fast_path fallback_error

# ---- the steps -----------------------------------------------------------------------------
step_env() {
  echo "date: $(date -Is)   host: $(hostname)   out: $OUT_DIR   build: $BUILD   work: $WORK"
  uname -a
  grep -E '^(PRETTY_NAME)=' /etc/os-release 2>/dev/null
  echo "cpus: $(nproc)"; free -g 2>/dev/null | head -2; df -h "$ROOT" 2>/dev/null | tail -1
  echo "--- nvidia-smi (${NVSMI:-not found})"
  if [ -n "$NVSMI" ]; then
    timeout 30 "$NVSMI"
    timeout 30 "$NVSMI" --query-gpu=name,driver_version,memory.total,compute_cap,clocks.max.sm --format=csv
  fi
  echo "--- GPU device nodes (dtrain counts GPUs from /proc/driver/nvidia/gpus, else /dev/nvidia[0-9]*)"
  ls -l /proc/driver/nvidia/gpus /dev/nvidia* 2>&1
  echo "--- nvcc (${CUDA_HOME:-not found})"
  command -v nvcc >/dev/null && nvcc --version
  echo "--- tools"
  for t in cc gcc cmake ctest make ninja pkg-config python3 compute-sanitizer ncu dpkg-deb ar; do
    printf '  %-18s %s\n' "$t" "$(find_tool "$t" | grep . || echo -)"
  done
  cmake --version 2>/dev/null | head -1; ${CC:-cc} --version 2>/dev/null | head -1; ldd --version 2>/dev/null | head -1
  [ -f "$DEBS/MANIFEST.txt" ] && grep '^# needs glibc' "$DEBS/MANIFEST.txt"
  echo "--- python"
  python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1 | tail -1
  echo "--- shared libraries in the ld cache"
  for l in libyaml-0.so.2 libjansson.so.4 libz.so.1 libopenblas.so.0 libgfortran.so.5 libgomp.so.1 libcuda.so.1 \
           libcudart.so libcublasLt.so libcudnn.so libnccl.so; do
    ldconfig -p 2>/dev/null | grep -m1 "[[:space:]]$l" || echo "  $l: not in the ld cache"
  done
  echo "--- headers (cc -E)"
  for h in yaml.h jansson.h zlib.h cblas.h cudnn.h nccl.h; do
    if echo "#include <$h>" | ${CC:-cc} -E -x c - >/dev/null 2>&1; then echo "  $h: found"; else echo "  $h: not in the default include path"; fi
  done
  echo "--- CUDA libraries from pip (nvidia.*)"
  python3 -c 'import nvidia, os; [print("  " + os.path.join(p, d)) for p in nvidia.__path__ for d in sorted(os.listdir(p)) if d in ("cudnn", "nccl", "cublas", "cuda_runtime")]' 2>/dev/null || echo "  none"
  local drv
  drv=$([ -n "$NVSMI" ] && timeout 30 "$NVSMI" --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
  local nv
  nv=$(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' | cut -d' ' -f2)
  if [ -z "$nv" ]; then note "no nvcc (CUDA toolkit) found: PATH, CUDA_HOME, /usr/local/cuda"; return 1; fi
  # the driver must run what this toolkit builds: its CUDA version (nvidia-smi's header) >= nvcc's
  # major (a lower minor of the same major runs it under minor version compatibility: said, not failed)
  local dcuda warn=""
  dcuda=$([ -n "$NVSMI" ] && timeout 30 "$NVSMI" 2>/dev/null | grep -o 'CUDA Version: *[0-9.]*' | head -1 | grep -o '[0-9.]*$')
  echo "--- CUDA versions: the driver supports ${dcuda:-? (no nvidia-smi)}, the toolkit (nvcc) is $nv"
  if [ -n "$dcuda" ]; then
    if [ "${dcuda%%.*}" -lt "${nv%%.*}" ]; then
      note "the driver ${drv:-?} supports CUDA $dcuda, older than the toolkit's $nv: dtrain's kernels would not load (hint: a driver for CUDA $nv or newer, or the CUDA ${dcuda%%.*} toolkit)"
      return 1
    elif [ "$(printf '%s\n%s\n' "$dcuda" "$nv" | sort -V | head -1)" != "$nv" ]; then
      warn="; driver CUDA $dcuda < toolkit $nv: minor version compatibility"
      echo "warning: the driver supports CUDA $dcuda, the toolkit is $nv: runs under minor version compatibility (no PTX JIT)"
    fi
  fi
  # the libraries GPU workers open (dtrain, cuDNN's frontend, cuDNN itself): each must resolve in the
  # dynamic loader, also from the folders step deps adds (the toolkit's, pip's nvidia-* wheels');
  # a missing one fails here, before the build, naming the package that provides it
  local major=${nv%%.*} minor=${nv#*.} sfx="" dirs=() d
  minor=${minor%%.*}
  [ "$major" -lt 13 ] && sfx=-cu$major  # CUDA 13's pip wheels dropped the -cuNN suffix (nvidia/cu13/lib)
  for d in ${CUDA_HOME:+"$CUDA_HOME/lib64" "$CUDA_HOME/lib"}; do [ -d "$d" ] && dirs+=("$d"); done
  while IFS= read -r d; do [ -n "$d" ] && dirs+=("$d"); done < <(python3 -c 'import nvidia, glob, os
for p in nvidia.__path__:
    print("\n".join(sorted(glob.glob(os.path.join(p, "*", "lib")))))' 2>/dev/null)
  local ldp
  ldp=$(IFS=:; echo "${ORIG_LD_LIBRARY_PATH:+$ORIG_LD_LIBRARY_PATH:}${dirs[*]}")
  echo "--- CUDA libraries GPU workers open (the ld cache, LD_LIBRARY_PATH, ${dirs[*]:-no toolkit or pip folders})"
  local missing
  missing=$(LD_LIBRARY_PATH=$ldp python3 -c '
import ctypes, sys
missing = []
for arg in sys.argv[1:]:
    so, pkg = arg.split("=", 1)
    try:
        ctypes.CDLL(so)
        where = next((l.split()[-1] for l in open("/proc/self/maps") if l.rstrip().endswith("/" + so)), "loaded")
        print("  %-40s %s" % (so, where), file=sys.stderr)
    except OSError as e:
        print("  %-40s MISSING: %s (from %s)" % (so, e, pkg), file=sys.stderr)
        missing.append("%s (%s)" % (so, pkg))
print("; ".join(missing))' \
    "libcudart.so.$major=apt cuda-cudart-$major-$minor, or pip nvidia-cuda-runtime$sfx" \
    "libnvrtc.so.$major=apt cuda-nvrtc-$major-$minor, or pip nvidia-cuda-nvrtc$sfx" \
    "libcublasLt.so.$major=apt libcublas-$major-$minor, or pip nvidia-cublas$sfx" \
    "libcudnn.so.9=apt libcudnn9-cuda-$major, or pip nvidia-cudnn-cu$major" \
    "libcudnn_graph.so.9=apt libcudnn9-cuda-$major, or pip nvidia-cudnn-cu$major" \
    "libcudnn_heuristic.so.9=apt libcudnn9-cuda-$major, or pip nvidia-cudnn-cu$major" \
    "libcudnn_engines_precompiled.so.9=apt libcudnn9-cuda-$major, or pip nvidia-cudnn-cu$major" \
    "libcudnn_engines_runtime_compiled.so.9=apt libcudnn9-cuda-$major, or pip nvidia-cudnn-cu$major" \
    "libnccl.so.2=apt libnccl2, or pip nvidia-nccl-cu$major")
  if [ -n "$missing" ]; then note "missing: $missing"; return 1; fi
  note "GPU: ${GPU_NAME:-none visible}${drv:+, driver $drv}${dcuda:+ (CUDA $dcuda)}, nvcc $nv, CUDA arch $CUDA_ARCH, the CUDA libraries resolve$warn"
}

step_deps() {
  local args=() ldp=() pcp=() path_add=() used_prefix=0 before="forced by GPU_CHECK_FORCE_PREFIX=1"
  echo "--- host libraries on the system"
  if [ "$FORCE_PREFIX" = 1 ]; then
    echo "GPU_CHECK_FORCE_PREFIX=1: using the .deb prefix regardless of the system"
    check_all_libs
  elif check_all_libs; then
    echo "all found on the system"
  else
    before=$MISSING
    echo "missing: $MISSING"
  fi
  if [ "$FORCE_PREFIX" = 1 ] || [ -n "$MISSING" ]; then
    local debs=("$DEBS"/*.deb)
    if [ ! -e "${debs[0]}" ]; then
      note "${MISSING:+missing $MISSING and }no .deb files in $DEBS (run scripts/fetch-debs.sh on a connected machine and copy that folder here)"
      return 1
    fi
    if [ -f "$DEBS/SHA256SUMS" ]; then
      (cd "$DEBS" && sha256sum -c --quiet SHA256SUMS) || { note "$DEBS: SHA256SUMS check failed"; return 1; }
      echo "$DEBS: SHA256SUMS ok"
    else
      echo "warning: $DEBS has no SHA256SUMS: not verified"
    fi
    # what the system already has is not unpacked (it would shadow the system's newer copy)
    local skip=()
    in_ld_cache libgfortran.so.5 && skip+=(libgfortran5)
    in_ld_cache libquadmath.so.0 && skip+=(libquadmath0)
    command -v pkg-config >/dev/null && skip+=(pkgconf pkgconf-bin libpkgconf3)
    local stamp
    stamp="$( (cat "$DEBS/SHA256SUMS" 2>/dev/null || ls -l "${debs[@]}"; echo "skip: ${skip[*]}") | sha256sum | cut -d' ' -f1)"
    if [ -f "$PREFIX/.stamp" ] && [ "$(cat "$PREFIX/.stamp")" = "$stamp" ]; then
      echo "$PREFIX: already unpacked from these packages"
    else
      rm -rf "$PREFIX" && mkdir -p "$PREFIX" || return 1
      local deb pkg
      for deb in "${debs[@]}"; do
        pkg=$(deb_package "$deb")
        if [[ " ${skip[*]} " == *" $pkg "* ]]; then echo "  $pkg: the system has it, not unpacked"; continue; fi
        deb_extract "$deb" "$PREFIX" || { note "cannot unpack $deb"; return 1; }
        echo "  $pkg: unpacked"
      done
      # absolute links (zlib1g-dev: libz.so -> /lib/.../libz.so.1.2.13) point into the prefix
      local l t
      while IFS= read -r l; do
        t=$(readlink "$l")
        case "$t" in /*) ln -sfn "$PREFIX$t" "$l" ;; esac
      done < <(find "$PREFIX" -type l)
      # .pc files say prefix=/usr: make them say the prefix
      while IFS= read -r l; do
        sed -i -E "s#^((prefix|exec_prefix|libdir|includedir|sharedlibdir)=)/#\\1$PREFIX/#" "$l"
      done < <(find "$PREFIX" -name '*.pc')
      echo "$stamp" >"$PREFIX/.stamp"
    fi
    local ma=x86_64-linux-gnu d
    for d in "$PREFIX"/usr/lib/*-linux-gnu; do [ -d "$d" ] && ma=$(basename "$d"); done
    pcp=("$PREFIX/usr/lib/$ma/pkgconfig" "$PREFIX/usr/lib/$ma/openblas-openmp/pkgconfig" "$PREFIX/usr/share/pkgconfig")
    ldp=("$PREFIX/usr/lib/$ma" "$PREFIX/usr/lib/$ma/openblas-openmp")
    in_ld_cache libz.so.1 || ldp+=("$PREFIX/lib/$ma")
    args+=("-DCMAKE_PREFIX_PATH=$PREFIX/usr")
    if ! command -v pkg-config >/dev/null && [ -x "$PREFIX/usr/bin/pkgconf" ]; then
      path_add=("$PREFIX/usr/bin")
      args+=("-DPKG_CONFIG_EXECUTABLE=$PREFIX/usr/bin/pkgconf")
    fi
    used_prefix=1
  fi

  echo "--- CUDA libraries (cuDNN, NCCL headers and libraries for CMake; cuBLASLt, cuDNN, NCCL for dlopen)"
  local links=$PREFIX/cuda-links lib name inc libdir so
  for name in cudnn nccl; do
    lib=""; inc=""; libdir=""; so=""
    for d in ${CUDA_HOME:+"$CUDA_HOME/lib64" "$CUDA_HOME/lib"} /usr/lib/x86_64-linux-gnu /usr/local/lib /usr/lib; do
      [ -e "$d/lib$name.so" ] && { lib=$d/lib$name.so; break; }
    done
    for d in ${CUDA_HOME:+"$CUDA_HOME/include"} /usr/include /usr/include/x86_64-linux-gnu /usr/local/include; do
      [ -f "$d/$name.h" ] && { inc=$d; break; }
    done
    if [ -n "$lib" ] && [ -n "$inc" ]; then echo "  $name: $lib, $inc/$name.h"; continue; fi
    # pip wheels (nvidia-cudnn-cu13, nvidia-nccl-cu13) ship lib$name.so.N and include/, no lib$name.so
    read -r inc libdir so < <(python3 - "$name" 2>/dev/null <<'EOF'
import glob, importlib, os, sys
name = sys.argv[1]
try:
    mod = importlib.import_module("nvidia." + name)
except Exception:
    sys.exit(0)
for base in list(getattr(mod, "__path__", [])):
    inc, lib = os.path.join(base, "include"), os.path.join(base, "lib")
    sos = sorted(glob.glob(os.path.join(lib, "lib%s.so.[0-9]*" % name)), key=len)
    if os.path.isfile(os.path.join(inc, name + ".h")) and sos:
        print(inc, lib, sos[0])
        break
EOF
)
    if [ -n "${so:-}" ]; then
      mkdir -p "$links" && ln -sfn "$so" "$links/lib$name.so"
      local up
      up=$(echo "$name" | tr '[:lower:]' '[:upper:]')
      args+=("-D${up}_LIB=$links/lib$name.so" "-D${up}_INCLUDE=$inc")
      ldp+=("$libdir")
      echo "  $name: from pip: $so, $inc/$name.h"
    else
      echo "  $name: not found (CMake will say so)"
    fi
  done
  if ! ldconfig -p 2>/dev/null | grep -q 'libcublasLt\.so\.'; then
    local found_lt=""
    for d in ${CUDA_HOME:+"$CUDA_HOME/lib64" "$CUDA_HOME/lib"}; do
      ls "$d"/libcublasLt.so.* >/dev/null 2>&1 && { ldp+=("$d"); found_lt=$d; echo "  cublasLt: $d (not in the ld cache: added to LD_LIBRARY_PATH)"; break; }
    done
    if [ -z "$found_lt" ]; then
      # as cuDNN and NCCL, from pip: CUDA 13's nvidia-cublas wheel puts it in nvidia/cu13/lib, CUDA 12's
      # nvidia-cublas-cu12 in nvidia/cublas/lib; the major dtrain is built with (nvcc's) is the one it opens
      local major
      major=$(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9]*\)\..*/\1/p' | head -1)
      found_lt=$(python3 - "${major:-13}" 2>/dev/null <<'EOF' || true
import glob, os, sys
import nvidia
for base in nvidia.__path__:
    for sub in ("cu" + sys.argv[1], "cublas"):
        lib = os.path.join(base, sub, "lib")
        if glob.glob(os.path.join(lib, "libcublasLt.so." + sys.argv[1])):
            print(lib)
            sys.exit(0)
EOF
)
      if [ -n "$found_lt" ]; then ldp+=("$found_lt"); echo "  cublasLt: from pip: $found_lt (added to LD_LIBRARY_PATH)"
      else echo "  cublasLt: not in the ld cache, CUDA_HOME or a pip wheel (GPU workers will say so)"; fi
    fi
  fi

  local IFS=:
  {
    echo "# written by scripts/gpu-check.sh (step deps)"
    [ ${#pcp[@]} -gt 0 ] && printf 'export PKG_CONFIG_PATH=%q\n' "${pcp[*]}${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
    [ ${#ldp[@]} -gt 0 ] && printf 'export LD_LIBRARY_PATH=%q\n' "${ldp[*]}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    [ ${#path_add[@]} -gt 0 ] && printf 'export PATH=%q\n' "${path_add[*]}:$PATH"
    printf 'export GPU_CHECK_CMAKE_ARGS=%q\n' "$(printf '%s\n' "${args[@]}")"
  } >"$ENV_FILE"
  unset IFS
  echo "--- $ENV_FILE"; cat "$ENV_FILE"
  if [ "$used_prefix" = 1 ]; then
    # shellcheck source=/dev/null
    . "$ENV_FILE"
    echo "--- host libraries with the prefix"
    check_all_libs || { note "still missing with the prefix $PREFIX: $MISSING"; return 1; }
    note "private prefix $PREFIX from $(basename "$DEBS") (system lacked: $before)"
  else
    note "system libraries"
  fi
}

step_build() {
  if [ "$SKIP_BUILD" = 1 ] && [ -x "$BUILD/dtrain" ]; then
    note "reused the existing build in $BUILD (GPU_CHECK_SKIP_BUILD=1)"
    "$BUILD/dtrain" --version
    return 77
  fi
  local extra=() a
  while IFS= read -r a; do [ -n "$a" ] && extra+=("$a"); done <<<"${GPU_CHECK_CMAKE_ARGS:-}"
  # the cuDNN frontend's headers (cuDNN attention): from the wheel fetch-debs.sh put next to the
  # .debs, else downloaded where there is a network
  echo "--- scripts/cudnn-frontend.sh unpack $BUILD $DEBS"
  if ! "$ROOT/scripts/cudnn-frontend.sh" unpack "$BUILD" "$DEBS"; then
    note "no cuDNN frontend headers: put $("$ROOT/scripts/cudnn-frontend.sh" wheel) in $DEBS (scripts/fetch-debs.sh)"
    return 1
  fi
  echo "--- configure: cmake -S $ROOT -B $BUILD -DDTRAIN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH -DCMAKE_BUILD_TYPE=Release ${extra[*]}"
  cmake -S "$ROOT" -B "$BUILD" -DDTRAIN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" -DCMAKE_BUILD_TYPE=Release "${extra[@]}" \
    2>&1 | tee "$WORK/configure.out"
  if [ "${PIPESTATUS[0]}" -ne 0 ]; then
    note "cmake configure failed: $(grep -m1 -E 'Error|error' "$WORK/configure.out")"
    return 1
  fi
  # keep going past a failing target, so that everything that can be built is (and tested)
  local keep=(-- -k)
  [ -f "$BUILD/build.ninja" ] && keep=(-- -k 0)
  echo "--- build: cmake --build $BUILD -j $JOBS ${keep[*]}"
  cmake --build "$BUILD" -j "$JOBS" "${keep[@]}" 2>&1 | tee "$WORK/build.out"
  local rc=${PIPESTATUS[0]}
  echo "--- libraries dtrain loads"
  ldd "$BUILD/dtrain" 2>&1 | grep -E 'yaml|jansson|openblas|libz|gfortran|gomp|cuda|not found'
  "$BUILD/dtrain" --version 2>&1
  if [ "$rc" -ne 0 ]; then
    note "build failed: $(grep -m1 -E 'error|Error' "$WORK/build.out" | cut -c1-200)"
    return 1
  fi
  note "built with $JOBS jobs, CUDA arch $CUDA_ARCH"
}

step_gpu_tests() {
  [ -f "$BUILD/CTestTestfile.cmake" ] || { note "no configured build in $BUILD"; return 1; }
  export NCCL_DEBUG=${NCCL_DEBUG:-WARN}  # a failing NCCL init says why, in this one run
  require_fast_path  # test_ops_backends: attention fused where cuDNN supports the head size, bf16 products in bf16
  # the label exactly: -L is a regular expression, and "gpu" alone also matches "mockgpu"
  # (test_cuda_mock: two full rebuilds, which ran into the step's limit); -V keeps the output of
  # skipped tests too, which say why they skipped
  echo "--- NCCL_DEBUG=$NCCL_DEBUG ctest -L '^gpu\$' -V --no-tests=error --timeout $((STEP_LIMIT - 10))"
  (cd "$BUILD" && ctest -L '^gpu$' -V --no-tests=error --timeout $((STEP_LIMIT - 10))) 2>&1 | tee "$WORK/ctest.out"
  local rc=${PIPESTATUS[0]} total passed skipped gpus why
  total=$(grep -cE 'Test +#[0-9]+: ' "$WORK/ctest.out")
  passed=$(grep -E 'Test +#[0-9]+: ' "$WORK/ctest.out" | grep -c ' Passed ')
  skipped=$(grep -E 'Test +#[0-9]+: ' "$WORK/ctest.out" | grep -c 'Skipped')
  if [ "$rc" -ne 0 ]; then
    note "$((total - passed - skipped)) of $total failed: $(sed -n '/The following tests FAILED/,$p' "$WORK/ctest.out" | grep -oE 'test_[a-z0-9_]+ \([^)]*\)' | tr '\n' ' ')$(grep -m1 -o 'the fast path did not run: .*' "$WORK/ctest.out" | cut -c1-240 | sed 's/^/; /')"
    return 1
  fi
  if [ "$skipped" -gt 0 ]; then
    gpus=0
    [ -n "$NVSMI" ] && gpus=$(timeout 15 "$NVSMI" -L 2>/dev/null | grep -c '^GPU ')
    # each test's own reason: the lines of its output that say skipped, with ctest's "N: " prefix cut
    why=$(grep -iE 'skipped|no usable GPU|no GPU' "$WORK/ctest.out" | grep -vE 'Test +#[0-9]+: |did not run|^[[:space:]]*[0-9]+ - ' |
      sed -E 's/^[0-9]+: //' | sort -u | head -4 | tr '\n' ';')
    # a GPU test skips only when it sees no usable GPU: with one listed, that is what to find out
    if [ "$gpus" -gt 0 ]; then
      note "FAIL: $([ "$passed" -eq 0 ] && echo "all $skipped" || echo "$skipped of $total") GPU tests skipped while nvidia-smi lists $gpus GPU(s): ${why:-no reason printed}"
      return 1
    fi
    if [ "$passed" -eq 0 ]; then
      note "all $skipped skipped, and nvidia-smi lists no GPU: ${why:-no reason printed}"
      return 77
    fi
  fi
  note "$passed passed, $skipped skipped: $(grep -E 'Test +#[0-9]+: ' "$WORK/ctest.out" | awk '{print $4}' | paste -sd ' ')"
}

step_sanitizer() {
  local cs
  cs=$(find_tool compute-sanitizer)
  [ -n "$cs" ] || { note "compute-sanitizer not found (PATH, CUDA_HOME/bin, /usr/local/cuda/bin, /opt/nvidia/nsight-compute/*)"; return 77; }
  [ -x "$BUILD/test_ops_backends" ] || { note "$BUILD/test_ops_backends was not built"; return 77; }
  local lim=$((STEP_LIMIT - 15)) tool=${1:-memcheck} out  # + 5 s to kill it: done 10 s before the step's own limit
  out=$WORK/sanitizer-$tool.out
  # our kernels only (all named dtk_..., kernels/dtk_common.cuh): cuBLASLt's and cuDNN's are not
  # ours to check, and instrumenting them is most of the time
  echo "--- timeout $lim $cs --tool $tool --kernel-name kns=dtk_ --error-exitcode 1 $BUILD/test_ops_backends --quick"
  timeout -k 5 "$lim" "$cs" --tool "$tool" --kernel-name kns=dtk_ --error-exitcode 1 "$BUILD/test_ops_backends" --quick 2>&1 |
    tee "$out"
  local rc=${PIPESTATUS[0]} summary found
  summary=$(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out" | sed 's/^=* *//')
  if [ "$rc" -eq 77 ]; then note "test_ops_backends skipped (exit 77: no GPU?)"; return 77; fi
  if [ "$rc" -ne 0 ] && grep -qi 'device not supported' "$out"; then
    note "compute-sanitizer does not support this device or runtime ('Device not supported')"
    return 77
  fi
  # the first error the tool reported in our kernels, if any
  found=$(grep -m1 -E '^=+ +(Invalid|Program hit|Out-of-range|Misaligned|Malloc/Free error|Leaked|Uninitialized|Error: Race|Warning: Race|Barrier error)' \
    "$out" | sed 's/^=* *//' | cut -c1-120)
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    # a sanitizer can be very slow (virtualised machines): running out of time is not an error
    # it found. Errors it reported before it was stopped still are.
    if [ -n "$found" ]; then note "timed out after $lim s, having reported a $tool error: $found"; return 1; fi
    note "$tool timed out after $lim s (exit $rc) with no error reported so far: not a result"
    return 77
  fi
  # The tool itself can fail: on an H200 (2026-12-04, CUDA 13.0) racecheck stopped with "Internal
  # Sanitizer Error: The Sanitizer failed to handle a hardware exception" at a cuDNN or cuBLASLt
  # product (kernels it does not instrument here), the program then saw cudaErrorIllegalAddress;
  # memcheck ran the same cases clean and racecheck ran every op alone without it. That is no
  # finding of the tool in our kernels, and not a result either: SKIP, saying how far it got.
  if [ "$rc" -ne 0 ] && [ -z "$found" ] && grep -q 'Internal Sanitizer Error' "$out"; then
    local why last
    why=$(grep -m1 'Internal Sanitizer Error' "$out" | sed 's/^=* *Internal Sanitizer Error: *//' | cut -c1-80)
    last=$(grep -E '^  [a-z_]+ [A-Z].*:$' "$out" | tail -1 | sed 's/^ *//; s/:$//' | cut -c1-60)
    note "compute-sanitizer $tool failed internally ('$why') in or after case ${last:-?}; no $tool error reported before it: not a result"
    return 77
  fi
  # cuBLASLt's kernels write through pointers and leading dimensions we compute (the GELU
  # epilogue's aux matrix, BGRADA's bias gradient): memcheck over them too, on the product cases
  # only, in what time is left (memcheck, and when the filtered run passed)
  local left=$((STEP_LIMIT - 15 - $(date +%s) + STEP_T0)) out2=$WORK/sanitizer-$tool-products.out
  if [ "$tool" = memcheck ] && [ "$rc" -eq 0 ] && [ "$left" -ge 20 ]; then
    echo "--- timeout $left $cs --tool memcheck --error-exitcode 1 $BUILD/test_ops_backends --quick --op matmul,matmul_gelu (every kernel)"
    timeout -k 5 "$left" "$cs" --tool memcheck --error-exitcode 1 "$BUILD/test_ops_backends" --quick --op matmul,matmul_gelu 2>&1 |
      tee "$out2"
    local rc2=${PIPESTATUS[0]} summary2
    summary2=$(grep -m1 'ERROR SUMMARY' "$out2" | sed 's/^=* *//')
    case $rc2 in
      0) summary="$summary; products with cuBLASLt's kernels: ${summary2:-no ERROR SUMMARY line}" ;;
      124|137) summary="$summary; products with cuBLASLt's kernels: timed out after $left s" ;;
      *) note "our kernels: ${summary:-?}; products with cuBLASLt's kernels: ${summary2:-no ERROR SUMMARY line} (exit $rc2)"
         return 1 ;;
    esac
  fi
  note "${summary:-no ERROR SUMMARY line} (exit $rc)"
  return "$rc"
}

step_racecheck() { step_sanitizer racecheck; }  # shared-memory hazards in our reductions and softmaxes

step_finetune() {
  no_gpu && { skip_without_gpu; return; }
  [ -x "$BUILD/dtrain" ] || { note "$BUILD/dtrain was not built"; return 1; }
  local common=(--config configs/finetune.yaml --set "training.max_steps=$FT_STEPS" --set checkpoint.resume=never
                --set fault_tolerance.max_restarts=0 --set logging.tensorboard=false --progress never) kv extra
  read -r -a extra <<<"$FT_SET"  # words, no file-name expansion
  for kv in "${extra[@]}"; do common+=(--set "$kv"); done
  local each=$(((STEP_LIMIT - 14) / 2)) rc_cpu rc_gpu rc  # 2 x (each + 2 s to kill) + 10 s to compare
  echo "--- CPU fp32 (reference, limit $each s): dtrain ${common[*]} --set run.dir=$WORK/ft-cpu --set training.device=cpu"
  timeout -k 2 "$each" "$BUILD/dtrain" "${common[@]}" --set "run.dir=$WORK/ft-cpu" --set training.device=cpu 2>&1
  rc_cpu=$?
  echo "--- CUDA bf16 (limit $each s): dtrain ${common[*]} --set run.dir=$WORK/ft-cuda --set training.device=cuda --set training.precision=bf16"
  timeout -k 2 "$each" "$BUILD/dtrain" "${common[@]}" --set "run.dir=$WORK/ft-cuda" --set training.device=cuda \
    --set training.precision=bf16 --set logging.monitor_every_s=1 2>&1 | tee "$WORK/ft-cuda.out"
  rc_gpu=${PIPESTATUS[0]}
  echo "--- loss, step by step (pass: |cuda - cpu| <= 0.05 |cpu| + 0.02 at every step)"
  python3 "$ROOT/scripts/compare-loss.py" "$WORK/ft-cpu" "$WORK/ft-cuda" --ref-name cpu-fp32 --test-name cuda-bf16 \
    2>&1 | tee "$WORK/compare.out"
  rc=${PIPESTATUS[0]}
  if [ "$rc_cpu" -ne 0 ]; then note "the CPU run failed (exit $rc_cpu)"; return 1; fi
  if [ "$rc_gpu" -ne 0 ]; then
    note "the CUDA run failed (exit $rc_gpu): $(first_error "$WORK/ft-cuda.out")"
    return 1
  fi
  # and the launcher's NVML samples of the GPU (README "Seeing what a run does"): informational
  local gpu
  gpu=$(grep -o '"gpu":[0-9]*,"gpu_util_pct":[^,]*,"gpu_mem_mb":[^,]*' "$WORK/ft-cuda/metrics.jsonl" 2>/dev/null | tail -1)
  note "$(grep -m1 '^max deviation' "$WORK/compare.out"); $(grep -E '^(PASS|FAIL)' "$WORK/compare.out" | head -1);" \
    "NVML: ${gpu:-$(grep -m1 -o 'no GPU samples.*' "$WORK/ft-cuda.out" || echo 'no GPU samples taken')}"
  return "$rc"
}

step_doctor() {
  no_gpu && { skip_without_gpu; return; }
  [ -x "$BUILD/dtrain" ] || { note "$BUILD/dtrain was not built"; return 1; }
  export NCCL_DEBUG=${NCCL_DEBUG:-WARN}  # a failing NCCL init says why, in this one run
  echo "--- NCCL_DEBUG=$NCCL_DEBUG dtrain doctor --device cuda"
  timeout -k 2 $((STEP_LIMIT - 5)) "$BUILD/dtrain" doctor --device cuda 2>&1 | tee "$WORK/doctor.out"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then note "exit $rc: $(first_error "$WORK/doctor.out")"
  else note "$(grep -v '^[[:space:]]*$' "$WORK/doctor.out" | tail -1 | cut -c1-160)"; fi
  return "$rc"
}

# One worker through the real NCCL (DTRAIN_TEST_DEVICE_COMM, fault.h): the gradient buckets, and
# with zero_stage 1 the reduce-scatter and the weights' all-gather, plus bf16 gradients, run
# through comm_nccl.c on this one GPU. The plain run and the NCCL run must give the same losses.
step_nccl_alone() {
  no_gpu && { skip_without_gpu; return; }
  [ -x "$BUILD/dtrain" ] || { note "$BUILD/dtrain was not built"; return 1; }
  local common=(--config configs/ci-smoke.yaml --set checkpoint.resume=never --set fault_tolerance.max_restarts=0
                --set logging.tensorboard=false --progress never --set training.device=cuda --set training.precision=bf16)
  local each=$(((STEP_LIMIT - 6) / 3)) name extra
  for name in plain alone zero-bf16; do
    extra=()
    [ "$name" = zero-bf16 ] && extra=(--set training.zero_stage=1 --set training.grad_comm_dtype=bf16)
    echo "--- $name (limit $each s): dtrain ${common[*]} ${extra[*]} --set run.dir=$WORK/nccl-$name"
    if [ "$name" = plain ]; then
      timeout -k 2 "$each" "$BUILD/dtrain" "${common[@]}" --set "run.dir=$WORK/nccl-$name" 2>&1 | tee "$WORK/nccl-$name.out"
    else
      NCCL_DEBUG=${NCCL_DEBUG:-WARN} DTRAIN_TEST_DEVICE_COMM=1 timeout -k 2 "$each" "$BUILD/dtrain" "${common[@]}" \
        "${extra[@]}" --set "run.dir=$WORK/nccl-$name" 2>&1 | tee "$WORK/nccl-$name.out"
    fi
    [ "${PIPESTATUS[0]}" -eq 0 ] || { note "the $name run failed: $(first_error "$WORK/nccl-$name.out")"; return 1; }
  done
  grep -q "1 worker x 1 GPU, nccl " "$WORK/nccl-alone.out" || { note "the test switch did not put the run on nccl"; return 1; }
  local out rc
  out=$(python3 - "$WORK" 2>&1 <<'PY'
import json, sys
w = sys.argv[1]
def losses(name):
    return [json.loads(l)["loss"] for l in open(f"{w}/nccl-{name}/metrics.jsonl") if '"type":"train"' in l]
plain, alone, zb = losses("plain"), losses("alone"), losses("zero-bf16")
worst = max(abs(a - b) / abs(a) for a, b in zip(plain, zb))
print(f"plain vs nccl: {'identical' if plain == alone else 'DIFFERENT'} over {len(plain)} steps; "
      f"nccl with zero_stage 1 and bf16 gradients: worst rel diff {worst:.2e}")
sys.exit(0 if plain == alone and len(plain) == len(zb) and worst < 0.05 else 1)
PY
)
  rc=$?
  echo "$out"
  note "$(echo "$out" | tail -1 | cut -c1-160)"
  return "$rc"
}

step_bench_dtrain() {
  no_gpu && { skip_without_gpu; return; }
  [ -x "$BUILD/dtrain" ] || { note "$BUILD/dtrain was not built"; return 1; }
  python3 "$ROOT/scripts/make-tokens.py" "$WORK/bench-data/train.bin" || { note "make-tokens.py failed"; return 1; }
  # nvidia-smi dmon through the run, a line a second: power, utilisation, clocks, memory
  local dmon_pid=""
  if [ -n "$NVSMI" ]; then
    "$NVSMI" dmon -s pucm -d 1 >"$WORK/dmon.txt" 2>&1 &
    dmon_pid=$!
  fi
  require_fast_path
  echo "--- DTRAIN_LOG_GEMM_PLANS=1 dtrain --config $BENCH_CONFIG, $BENCH_STEPS steps (each cuBLASLt plan logged once)"
  DTRAIN_LOG_GEMM_PLANS=1 timeout -k 5 $((STEP_LIMIT - 15)) "$BUILD/dtrain" --config "$BENCH_CONFIG" --set "run.dir=$WORK/bench-dtrain" \
    --set "data.train_path=$WORK/bench-data/train.bin" --set "training.max_steps=$BENCH_STEPS" \
    --set logging.phase_times=true --set checkpoint.resume=never --progress never 2>&1 | tee "$WORK/bench-dtrain.out"
  local rc=${PIPESTATUS[0]}
  if [ -n "$dmon_pid" ]; then
    kill "$dmon_pid" 2>/dev/null
    wait "$dmon_pid" 2>/dev/null
    echo "--- nvidia-smi dmon -s pucm -d 1 during the run ($WORK/dmon.txt):"
    cat "$WORK/dmon.txt"
    python3 "$ROOT/scripts/dmon-summary.py" "$WORK/dmon.txt" | tee "$WORK/dmon-summary.txt"
  fi
  # the plans in a few lines for bench.md: how many cuBLASLt made and refused, cuDNN's workspace
  # against the estimate's, or why attention ran on dtrain's kernels
  local out="$WORK/bench-dtrain.out"
  {
    echo "plans: $(grep -c 'cuBLASLt plan:' "$out") cuBLASLt plans, $(grep -c 'cuBLASLt: no algorithm' "$out") refused"
    grep -m 5 'cuBLASLt: no algorithm' "$out"
    grep 'cuDNN attention plan:' "$out"
    grep -m 1 "attention runs on dtrain's kernels" "$out"
  } | sed 's/^dtrain: //' >"$WORK/plans.txt"
  cat "$WORK/plans.txt"
  rm -rf "$WORK/bench-dtrain/checkpoints" "$WORK/bench-dtrain/model.safetensors"  # ~2 GB, not needed
  python3 "$ROOT/scripts/bench-table.py" --dtrain "$WORK/bench-dtrain" --gpu "$GPU_NAME" | tee "$WORK/bench-dtrain.md"
  if [ "$rc" -ne 0 ]; then
    note "exit $rc: $(fallback_error "$WORK/bench-dtrain.out")"
    return 1
  fi
  # at init, on uniform random tokens, the loss must be ln(V): anything else is a wrong forward or loss
  local lncheck
  lncheck=$(python3 - "$WORK/bench-dtrain" <<'EOF'
import json, math, re, sys
run = sys.argv[1]
v = int(re.search(r"^\s*vocab_size:\s*(\d+)", open(run + "/config.yaml").read(), re.M).group(1))
first = next(json.loads(l) for l in open(run + "/metrics.jsonl") if '"type":"train"' in l)
ok = abs(first["loss"] - math.log(v)) < 0.5  # at init about ln(V) + 0.15 (logits of std ~0.02 sqrt(C))
print(("ok" if ok else "BAD") + " loss at step 1 %.4f, ln(vocab_size %d) = %.4f" % (first["loss"], v, math.log(v)))
EOF
) || lncheck="BAD: could not read the loss at step 1"
  echo "--- $lncheck"
  case "$lncheck" in ok*) ;; *) note "$lncheck (at init on uniform tokens they must agree within 0.5)"; return 1 ;; esac
  note "$(awk -F'|' 'NR == 3 {gsub(/ /, "", $3); gsub(/ /, "", $4); gsub(/ /, "", $5); print $3 " ms/step, " $4 " tokens/s, MFU " $5}' "$WORK/bench-dtrain.md")"
}

# the same benchmark at SmolLM2-135M's shape (configs/smollm2-bench.yaml: the Llama family, bf16,
# 16 x 1024 tokens), its row of bench.md with its MFU; the loss at step 1 must be about ln(V)
step_bench_smollm2() {
  no_gpu && { skip_without_gpu; return; }
  [ -x "$BUILD/dtrain" ] || { note "$BUILD/dtrain was not built"; return 1; }
  python3 "$ROOT/scripts/make-tokens.py" "$WORK/bench-data/smollm2.bin" --vocab 49152 || { note "make-tokens.py failed"; return 1; }
  require_fast_path
  echo "--- dtrain --config $SMOLLM2_CONFIG, $BENCH_STEPS steps"
  timeout -k 5 $((STEP_LIMIT - 15)) "$BUILD/dtrain" --config "$SMOLLM2_CONFIG" --set "run.dir=$WORK/bench-smollm2" \
    --set "data.train_path=$WORK/bench-data/smollm2.bin" --set "training.max_steps=$BENCH_STEPS" \
    --set logging.phase_times=true --set checkpoint.resume=never --progress never 2>&1 | tee "$WORK/bench-smollm2.out"
  local rc=${PIPESTATUS[0]}
  rm -rf "$WORK/bench-smollm2/checkpoints" "$WORK/bench-smollm2/model.safetensors"
  python3 "$ROOT/scripts/bench-table.py" --model smollm2 --dtrain "$WORK/bench-smollm2" --dtrain-name "dtrain SmolLM2 (bf16)" \
    --gpu "$GPU_NAME" | tee "$WORK/bench-smollm2.md"
  [ "$rc" -ne 0 ] && { note "exit $rc: $(fallback_error "$WORK/bench-smollm2.out")"; return 1; }
  local first
  first=$(python3 -c 'import json, math, sys
r = next(json.loads(l) for l in open(sys.argv[1]) if "\"type\":\"train\"" in l)
print(("ok" if abs(r["loss"] - math.log(49152)) < 0.5 else "BAD") + " loss at step 1 %.4f, ln(49152) = %.4f" % (r["loss"], math.log(49152)))' \
    "$WORK/bench-smollm2/metrics.jsonl") || first="BAD: could not read the loss at step 1"
  echo "--- $first"
  case "$first" in ok*) ;; *) note "$first"; return 1 ;; esac
  note "$(awk -F'|' 'NR == 3 {gsub(/ /, "", $3); gsub(/ /, "", $4); gsub(/ /, "", $5); print $3 " ms/step, " $4 " tokens/s, MFU " $5}' "$WORK/bench-smollm2.md")"
}

# ncu over one steady training step (logging.profile_step: dtrain waits for the device, then
# cudaProfilerStart / Stop around that step, and ncu starts recording only there), with the clocks
# left alone (--clock-control none, METHOD.md): every kernel's time, summed by name; the top 20
# go to profile.md, which ends bench.md
step_profile() {
  no_gpu && { skip_without_gpu; return; }
  [ -x "$BUILD/dtrain" ] || { note "$BUILD/dtrain was not built"; return 1; }
  local ncu
  ncu=$(find_tool ncu)
  [ -n "$ncu" ] || { note "ncu not found (PATH, CUDA_HOME/bin, /usr/local/cuda/bin, /opt/nvidia/nsight-compute/*)"; return 77; }
  [ -f "$WORK/bench-data/train.bin" ] || python3 "$ROOT/scripts/make-tokens.py" "$WORK/bench-data/train.bin" ||
    { note "make-tokens.py failed"; return 1; }
  local step=$PROFILE_STEP
  case "$step" in ''|*[!0-9]*|0) note "GPU_CHECK_PROFILE_STEP=$step: expected a step number >= 1"; return 1 ;; esac
  echo "--- $ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv dtrain ... logging.profile_step=$step"
  timeout -k 5 $((STEP_LIMIT - 10)) "$ncu" --profile-from-start off --clock-control none --metrics gpu__time_duration.sum \
    --csv --print-units base --print-kernel-base function --log-file "$WORK/ncu.csv" \
    "$BUILD/dtrain" --config "$BENCH_CONFIG" --set "run.dir=$WORK/profile" \
    --set "data.train_path=$WORK/bench-data/train.bin" --set "training.max_steps=$step" --set "logging.profile_step=$step" \
    --set checkpoint.every_steps=0 --set checkpoint.resume=never --progress never 2>&1 | tee "$WORK/profile.out"
  local rc=${PIPESTATUS[0]}
  rm -rf "$WORK/profile/checkpoints" "$WORK/profile/model.safetensors"
  echo "--- ncu's own log (first 40 lines that are not CSV)"
  grep -v '^"' "$WORK/ncu.csv" 2>/dev/null | head -40
  if grep -qiE 'LibraryNotLoaded|ERR_NVGPUCTRPERM|not supported|Failed to initialize the profiler' "$WORK/ncu.csv" "$WORK/profile.out" 2>/dev/null; then
    note "ncu cannot profile here: $(grep -m1 -hiE 'LibraryNotLoaded|ERR_NVGPUCTRPERM|not supported|Failed to initialize' "$WORK/ncu.csv" "$WORK/profile.out" | cut -c1-140)"
    return 77
  fi
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then  # replaying a step kernel by kernel is slow: not a result
    note "ncu timed out after $((STEP_LIMIT - 10)) s (exit $rc): not a result"
    return 77
  fi
  [ "$rc" -eq 0 ] || { note "exit $rc: $(first_error "$WORK/profile.out")"; return 1; }
  local csv=$WORK/ncu.csv  # where --log-file put the report; else it went with the program's output
  grep -q '"Kernel Name"' "$csv" 2>/dev/null || csv=$WORK/profile.out
  python3 "$ROOT/scripts/ncu-top.py" "$csv" --step "$step" --top 20 --out "$WORK/profile.md" || {
    note "ncu-top.py could not read ncu's report ($csv)"; return 1; }
  cat "$WORK/profile.md"
  note "$(sed -n 's/^Profiled: //p' "$WORK/profile.md")"
}

step_torch() {  # MODE
  local mode=$1
  if ! python3 -c 'import torch' >/dev/null 2>&1; then
    echo "{\"mode\": \"$mode\", \"skipped\": \"no torch\"}" >"$WORK/torch-$mode.json"
    note "no torch (python3 -c 'import torch' fails)"
    return 77
  fi
  echo "--- python3 bench/torch_gpt2.py --mode $mode --warmup 5 --steps 20"
  LD_LIBRARY_PATH=$ORIG_LD_LIBRARY_PATH timeout -k 3 $((STEP_LIMIT - 8)) python3 "$ROOT/bench/torch_gpt2.py" --mode "$mode" \
    --warmup 5 --steps 20 | tee "$WORK/torch-$mode.json"
  local rc=${PIPESTATUS[0]}
  # a reference that runs out of time is not a failure of dtrain: SKIP, saying so
  { [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; } && { note "timed out after $((STEP_LIMIT - 8)) s (reference only)"; return 77; }
  [ "$rc" -ne 0 ] && { note "exit $rc"; return 1; }
  grep -q '"skipped"' "$WORK/torch-$mode.json" && { note "$(cat "$WORK/torch-$mode.json")"; return 77; }
  note "$(python3 -c 'import json, sys; r = json.loads(open(sys.argv[1]).read().splitlines()[-1]); print("%.1f ms/step, %.0f tokens/s, torch %s" % (r["ms_per_step"], r["tokens_per_s"], r["torch"]))' "$WORK/torch-$mode.json")"
}
step_torch_eager() { step_torch eager; }
step_torch_compile() { step_torch compile; }
export -f step_env step_deps step_build step_gpu_tests step_sanitizer step_racecheck step_finetune step_doctor step_nccl_alone \
  step_bench_dtrain step_bench_smollm2 step_profile step_torch step_torch_eager step_torch_compile

# ---- the runner ------------------------------------------------------------------------------
N=0
FAILED=0
SUMMARY=()
# run_step NAME CAP MIN FUNCTION [ON_TIMEOUT]: runs FUNCTION with a limit of CAP seconds or what
# is left of the budget, whichever is less. Below MIN (what the step needs to be of any use)
# it is not run: SKIP "out of time: N s left, needs MIN". ON_TIMEOUT (FAIL, or SKIP for the
# steps whose running out of time is not a result) is the verdict when the step's own limit
# kills it.
run_step() {
  local name=$1 cap=$2 min=$3 fn=$4 on_timeout=${5:-FAIL} log now left limit start start_h end secs rc res note
  N=$((N + 1))
  log=$(printf '%s/%02d-%s.log' "$OUT_DIR" "$N" "$name")
  now=$(date +%s)
  left=$((T0 + BUDGET - now))
  limit=$cap
  [ "$left" -lt "$limit" ] && limit=$left
  start_h=$(date +%H:%M:%S)
  rm -f "$NOTE_FILE"
  note=""
  if [ -n "$STEPS" ] && [[ ",$STEPS," != *",$name,"* ]]; then
    note="not selected (GPU_CHECK_STEPS=$STEPS)"
  elif [ "$limit" -lt "$min" ]; then
    [ "$left" -lt 0 ] && left=0
    note="out of time: $left s left, needs $min (GPU_CHECK_BUDGET_S=$BUDGET)"
  fi
  if [ -n "$note" ]; then  # not run
    echo "== $name: not run at $(date -Is): $note" >"$log"
    SUMMARY+=("$(printf '%-14s %-5s %5s  %s  %s  %s' "$name" SKIP 0 "$start_h" "$start_h" "$note")")
    echo "[gpu-check] $start_h $name: SKIP - $note"
    return
  fi
  echo "[gpu-check] $start_h $name: start (limit ${limit} s)"
  echo "== $name: start $(date -Is), limit ${limit} s" >"$log"
  start=$(date +%s)
  STEP_T0=$start STEP_LIMIT=$limit timeout -k 5 "$limit" bash -c "set -o pipefail; $fn" >>"$log" 2>&1 </dev/null
  rc=$?
  end=$(date +%s)
  secs=$((end - start))
  note=$(cat "$NOTE_FILE" 2>/dev/null)
  case $rc in
    0) res=PASS ;;
    77) res=SKIP ;;
    124|137) res=$on_timeout; note="timed out after ${limit} s${note:+; $note}" ;;
    *) res=FAIL; note=${note:-exit $rc} ;;
  esac
  [ "$res" = FAIL ] && FAILED=$((FAILED + 1))
  echo "== $name: end $(date -Is), $res (exit $rc) in ${secs} s" >>"$log"
  SUMMARY+=("$(printf '%-14s %-5s %5s  %s  %s  %s' "$name" "$res" "$secs" "$start_h" "$(date +%H:%M:%S)" "$note")")
  echo "[gpu-check] $(date +%H:%M:%S) $name: $res (${secs} s)${note:+ - $note}"
}

echo "[gpu-check] out: $OUT_DIR  build: $BUILD  work: $WORK  budget: ${BUDGET} s  GPU: ${GPU_NAME:-none}"
# the order is what matters most first: with a short budget, the later steps are the ones
# skipped. NAME CAP MIN (seconds). Sum of the caps > budget: the budget is what bounds the run.
run_step env 45 10 step_env
run_step deps 90 20 step_deps
# what step deps found (prefix, CUDA libraries from pip) holds for every later step
if [ -f "$ENV_FILE" ]; then
  # shellcheck source=/dev/null
  . "$ENV_FILE"
fi
export GPU_CHECK_CMAKE_ARGS=${GPU_CHECK_CMAKE_ARGS:-}
BUILD_MIN=60
[ "$SKIP_BUILD" = 1 ] && [ -x "$BUILD/dtrain" ] && BUILD_MIN=10  # it only reuses the build
run_step build 300 "$BUILD_MIN" step_build
run_step gpu-tests 90 40 step_gpu_tests            # ctest --timeout limit-10 per test: >= 30 s
run_step finetune 120 50 step_finetune             # two runs of >= 18 s each (CPU run: ~8 s on 2 cores)
run_step doctor 45 15 step_doctor
run_step nccl-alone 60 40 step_nccl_alone          # three ci-smoke runs: CUDA, cuBLASLt and NCCL start-up each
run_step bench-dtrain 120 45 step_bench_dtrain     # dtrain limit-15: >= 30 s
run_step bench-smollm2 120 45 step_bench_smollm2   # the same at SmolLM2's shape
run_step torch-eager 150 60 step_torch_eager SKIP  # a reference, not a check
run_step profile 90 45 step_profile SKIP           # ncu: start-up, $PROFILE_STEP-1 plain steps, one replayed kernel by kernel
run_step sanitizer 90 40 step_sanitizer SKIP       # slow under memcheck; a timeout is not an error
run_step racecheck 60 30 step_racecheck SKIP       # as slow
run_step torch-compile 150 120 step_torch_compile SKIP  # compiling alone takes a minute or more

# ---- summary and benchmark table -----------------------------------------------------------
TOTAL=$(($(date +%s) - T0))
# from here on nothing looks at the budget: the table, the summary and the packing always happen
if command -v python3 >/dev/null; then
  timeout -k 2 30 python3 "$ROOT/scripts/bench-table.py" --dtrain "$WORK/bench-dtrain" --torch "torch eager=$WORK/torch-eager.json" \
    --torch "torch compile=$WORK/torch-compile.json" --gpu "$GPU_NAME" --out "$OUT_DIR/bench.md" >/dev/null
else
  echo "no python3: no benchmark table" >"$OUT_DIR/bench.md"
fi
# the benchmark's GPU samples and plans, the profiled step's top kernels
for f in bench-smollm2.md dmon-summary.txt plans.txt profile.md; do
  [ -s "$WORK/$f" ] && { echo; cat "$WORK/$f"; } >>"$OUT_DIR/bench.md"
done
{
  commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null) && { git -C "$ROOT" diff --quiet HEAD 2>/dev/null || commit="$commit + local changes"; }
  echo "gpu-check $(date -Is) on $(hostname): GPU ${GPU_NAME:-none}, commit ${commit:-unknown}"
  printf '%-14s %-5s %5s  %-8s  %-8s  %s\n' step result secs start end note
  printf '%s\n' "${SUMMARY[@]}"
  n_pass=$(printf '%s\n' "${SUMMARY[@]}" | awk '$2 == "PASS"' | wc -l)
  n_skip=$(printf '%s\n' "${SUMMARY[@]}" | awk '$2 == "SKIP"' | wc -l)
  echo "overall: $([ "$FAILED" -eq 0 ] && echo PASS || echo FAIL) ($n_pass passed, $FAILED failed, $n_skip skipped) in $TOTAL s; logs: $OUT_DIR, runs: $WORK"
} >"$OUT_DIR/summary.txt"
if [ "$PACK" = 1 ]; then
  logs=()
  for f in "$OUT_DIR"/[0-9][0-9]-*.log; do [ -e "$f" ] && logs+=("$(basename "$f")"); done
  extras=()
  for f in ft-cpu/metrics.jsonl ft-cuda/metrics.jsonl bench-dtrain/metrics.jsonl bench-dtrain/train.log \
           torch-eager.json torch-compile.json deps.env dmon.txt ncu.csv profile.md; do
    [ -e "$WORK/$f" ] && extras+=("$f")
  done
  if [ ${#logs[@]} -gt 0 ]; then
    if timeout 60 tar -czf "$OUT_DIR/gpu-check-logs.tar.gz" -C "$OUT_DIR" "${logs[@]}" -C "$WORK" "${extras[@]}"; then
      echo "logs and run metrics packed into $OUT_DIR/gpu-check-logs.tar.gz" >>"$OUT_DIR/summary.txt"
    elif timeout 60 tar -czf "$OUT_DIR/gpu-check-logs.tar.gz" -C "$OUT_DIR" "${logs[@]}"; then
      echo "logs packed into $OUT_DIR/gpu-check-logs.tar.gz (the run metrics could not be added)" >>"$OUT_DIR/summary.txt"
    else  # no working tar or gzip: one file instead of one per step
      rm -f "$OUT_DIR/gpu-check-logs.tar.gz"
      for f in "${logs[@]}"; do echo "######## $f"; cat "$OUT_DIR/$f"; done >"$OUT_DIR/all-steps.log"
      echo "tar failed: logs joined into $OUT_DIR/all-steps.log" >>"$OUT_DIR/summary.txt"
    fi
    for f in "${logs[@]}"; do rm -f "$OUT_DIR/$f"; done
  fi
  n_files=$(find "$OUT_DIR" -type f 2>/dev/null | wc -l)
  if [ "$n_files" -le 8 ]; then echo "$OUT_DIR holds $n_files files" >>"$OUT_DIR/summary.txt"
  else echo "warning: $OUT_DIR holds $n_files files (more than 8; it was not empty at the start?)" >>"$OUT_DIR/summary.txt"; fi
fi
rm -f "$NOTE_FILE"
echo
cat "$OUT_DIR/summary.txt"
echo
cat "$OUT_DIR/bench.md"
[ "$FAILED" -eq 0 ]
