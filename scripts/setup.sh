#!/usr/bin/env bash
# setup.sh — installs what dtrain needs (Debian/Ubuntu: apt-get) and builds it into build/
# (the build also tokenizes the shipped language-modelling corpus into data/tinytext/*.bin).
# Safe to run again: it only does what is missing. Environment: BUILD_DIR (default build), DTRAIN_CUDA (AUTO|ON|OFF,
# default AUTO: the CUDA backend is built when nvcc, cuBLAS, cuDNN and NCCL are installed; its
# cuDNN frontend headers are then unpacked into BUILD_DIR/_deps from the pinned PyPI wheel, taken
# from third_party/debs (or DTRAIN_WHEELS) when scripts/fetch-debs.sh put it there, else downloaded),
# DTRAIN_TEST_TOOLS=1 (what the tests need besides: python3 with venv, the tensorboard
# package in BUILD_DIR/venv for reading event files back, tokenizers, the BPE tokenizer's
# oracle, transformers (without PyTorch), which loads what export --format hf writes, autograd
# (the Llama training step's reference), gguf and jinja2 (the GGUF converter's test); Open MPI's mpirun and development
# files, so that the mpi collective is built and tested; Slurm and munge; iproute2; clang with
# its libFuzzer and sanitizer runtimes and libomp, for the fuzz targets of tests/fuzz;
# dpkg-dev and file, with which CPack makes the .deb that test_package installs).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
DTRAIN_CUDA=${DTRAIN_CUDA:-AUTO}

# package -> a file that proves it is installed
declare -A need=(
  [cmake]=/usr/bin/cmake
  [gcc]=/usr/bin/gcc
  [make]=/usr/bin/make
  [pkg-config]=/usr/bin/pkg-config
  [libyaml-dev]=/usr/include/yaml.h
  [zlib1g-dev]=/usr/include/zlib.h
  [libjansson-dev]=/usr/include/jansson.h
  [libopenblas-openmp-dev]=/usr/include/x86_64-linux-gnu/openblas-openmp/cblas.h
  [libssl-dev]=/usr/include/openssl/hmac.h  # HMAC-SHA256 for the rendezvous secret (libcrypto)
  [libpcre2-dev]=/usr/include/pcre2.h      # the BPE tokenizer's pre-tokenization (Unicode categories)
  [libutf8proc-dev]=/usr/include/utf8proc.h # ... and a tokenizer.json's Unicode normalizer (NFC)
  [libdnnl-dev]=/usr/include/oneapi/dnnl/dnnl.h # oneDNN: training.precision bf16 on CPUs with AVX512-BF16/AMX
)
if [ "${DTRAIN_TEST_TOOLS:-0}" = 1 ]; then
  need[python3]=/usr/bin/python3
  need[openmpi-bin]=/usr/bin/mpirun   # mpirun starts dtrain in tests/test_extlaunch.c
  need[libopenmpi-dev]=/usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h  # the mpi collective is built and tested
  need[slurm-wlm]=/usr/sbin/slurmctld  # tests/test_slurm.c starts a single-host Slurm
  need[munge]=/usr/sbin/munged
  need[iproute2]=/usr/sbin/ip          # tests/test_netns.c: two hosts as network namespaces
  need[clang]=/usr/bin/clang           # tests/fuzz: the fuzz targets (run.sh; test_fuzz)
  need[libclang-rt-dev]=/usr/share/doc/libclang-rt-dev  # clang's libFuzzer, ASan and UBSan runtimes
  need[libomp-dev]=/usr/share/doc/libomp-dev            # OpenMP for clang (the fuzz build's CPU ops)
  need[dpkg-dev]=/usr/bin/dpkg-shlibdeps  # test_package: CPack's .deb takes its Depends from dpkg-shlibdeps
  need[file]=/usr/bin/file                # ... which CPack runs on the files to find the ELF ones
  # venv needs ensurepip, which Debian ships separately
  python3 -c "import ensurepip" >/dev/null 2>&1 || need[python3-venv]=/nonexistent
fi
# the CUDA backend's build (nvcc installed, DTRAIN_CUDA not OFF) also needs the cuDNN frontend's
# headers, from a PyPI wheel (scripts/cudnn-frontend.sh): python3 and pip
HAVE_NVCC=0
if [ "$DTRAIN_CUDA" != OFF ] && { command -v nvcc >/dev/null || [ -x "${CUDACXX:-/usr/local/cuda/bin/nvcc}" ]; }; then
  HAVE_NVCC=1
  need[python3]=/usr/bin/python3
  python3 -m pip --version >/dev/null 2>&1 || need[python3-pip]=/nonexistent
fi
missing=()
for pkg in "${!need[@]}"; do
  if [ ! -e "${need[$pkg]}" ] && ! dpkg -s "$pkg" >/dev/null 2>&1; then missing+=("$pkg"); fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  if [ "$(id -u)" = 0 ]; then SUDO=""; elif command -v sudo >/dev/null; then SUDO="sudo"; else
    echo "setup: error: need root or sudo to install: ${missing[*]}" >&2; exit 1
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ "$HAVE_NVCC" = 1 ]; then
  scripts/cudnn-frontend.sh unpack "$BUILD_DIR" "${DTRAIN_WHEELS:-third_party/debs}" \
    || { [ "$DTRAIN_CUDA" = ON ] && exit 1; echo "setup: no cuDNN frontend: the CUDA backend will not be built" >&2; }
fi
cmake -S . -B "$BUILD_DIR" -DDTRAIN_CUDA="$DTRAIN_CUDA" -DCMAKE_BUILD_TYPE=Release >"$BUILD_DIR.cmake.log" 2>&1 \
  || { cat "$BUILD_DIR.cmake.log" >&2; exit 1; }
rm -f "$BUILD_DIR.cmake.log"
cmake --build "$BUILD_DIR" -j "$(nproc)" >/dev/null || cmake --build "$BUILD_DIR" -j 1

echo "setup: built $BUILD_DIR/dtrain"

if [ "${DTRAIN_TEST_TOOLS:-0}" = 1 ]; then
  VENV="$BUILD_DIR/venv"
  if ! "$VENV/bin/python" -c "import tensorboard, tokenizers, transformers, autograd, gguf, jinja2" >/dev/null 2>&1; then
    echo "setup: installing tensorboard, tokenizers, transformers, autograd, gguf and jinja2 into $VENV (pip; the" \
         "TensorBoard read-back, tokenizer, Hugging Face export and Llama tests' oracles, the GGUF converter's test)"
    [ -x "$VENV/bin/pip" ] || python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check tensorboard==2.21.0 tokenizers==0.23.3 \
      transformers==5.23.0 autograd==1.9.1 gguf==0.19.0 jinja2==3.1.6 \
      || { echo "setup: error: pip could not install the test tools (PyPI unreachable?); the tests need them" >&2; exit 1; }
  fi
fi
