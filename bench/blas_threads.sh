#!/usr/bin/env bash
# blas_threads.sh — OpenBLAS against BLIS on the model's sgemm shapes: speed with 1 and 2 threads
# and whether the thread count changes the bits (bench/blas_threads.c), both libraries built
# into their own binary, run alternately for ROUNDS rounds (default 2).
#   bench/blas_threads.sh [ROUNDS]
# Needs Debian's libopenblas-openmp-dev (dtrain's own) and libblis-openmp-dev (not a dtrain
# dependency: apt-get install libblis-openmp-dev).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-2}
OUT=$(mktemp -d /tmp/blas-threads.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
A=/usr/lib/x86_64-linux-gnu
[ -f /usr/include/x86_64-linux-gnu/blis-openmp/cblas.h ] ||
  { echo "blas_threads.sh: BLIS is not installed (apt-get install libblis-openmp-dev)" >&2; exit 2; }
cc -O2 -o "$OUT/openblas" bench/blas_threads.c -I/usr/include/x86_64-linux-gnu/openblas-openmp \
  -L$A/openblas-openmp -lopenblas -Wl,-rpath,$A/openblas-openmp
cc -O2 -DUSE_BLIS -o "$OUT/blis" bench/blas_threads.c -I/usr/include/x86_64-linux-gnu/blis-openmp \
  -L$A/blis-openmp -lblis -Wl,-rpath,$A/blis-openmp
for r in $(seq 1 "$ROUNDS"); do
  "$OUT/openblas"
  "$OUT/blis"
done
