#!/usr/bin/env bash
# cudnn-frontend.sh — the cuDNN frontend headers (header-only C++: the graphs of cuDNN's fused
# attention, src/ops/cudnn_att.cpp) into a build tree, from the PyPI wheel nvidia-cudnn-frontend
# at the version and checksum pinned below. Nothing of it is committed.
#
# usage: scripts/cudnn-frontend.sh download DIR    the wheel into DIR (pip download; a connected
#                                                  machine: scripts/fetch-debs.sh calls this)
#        scripts/cudnn-frontend.sh unpack BUILD_DIR [WHEEL_DIR]
#                                                  BUILD_DIR/_deps/cudnn-frontend/include from the
#                                                  wheel in WHEEL_DIR, else downloaded (what
#                                                  scripts/setup.sh and scripts/gpu-check.sh call)
# Either checks the wheel's SHA-256 first. Needs python3 (zipfile) and, to download, pip.
set -euo pipefail
VERSION=1.32.0
WHEEL=nvidia_cudnn_frontend-$VERSION-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
SHA256=c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0

die() { echo "cudnn-frontend: error: $*" >&2; exit 1; }

download() {  # DIR: the pinned wheel into DIR, checked
  mkdir -p "$1"
  if [ ! -f "$1/$WHEEL" ]; then
    python3 -m pip --version >/dev/null 2>&1 || die "pip is not installed (apt-get install python3-pip)"
    # headers only: any wheel of the version would do, this one is pinned by its checksum
    python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.11 \
      --implementation cp --abi cp311 --platform manylinux_2_28_x86_64 -d "$1" "nvidia-cudnn-frontend==$VERSION" \
      || die "pip could not download nvidia-cudnn-frontend==$VERSION (PyPI unreachable? On a machine without a" \
             "network, copy the wheel from one with: scripts/fetch-debs.sh, see docs/gpu.md)"
  fi
  check "$1/$WHEEL"
}

check() {  # WHEEL: its SHA-256 is the pinned one
  [ -f "$1" ] || die "$1 not found"
  local got
  got=$(sha256sum "$1" | cut -d' ' -f1)
  [ "$got" = "$SHA256" ] || die "$1: SHA-256 $got, expected $SHA256 (a damaged or different download: delete it)"
}

unpack() {  # BUILD_DIR [WHEEL_DIR]
  local dest=$1/_deps/cudnn-frontend wheels=${2:-}
  if [ -f "$dest/include/cudnn_frontend.h" ] && [ "$(cat "$dest/VERSION" 2>/dev/null)" = "$VERSION" ]; then return 0; fi
  if [ -n "$wheels" ] && [ -f "$wheels/$WHEEL" ]; then check "$wheels/$WHEEL"
  else wheels=$1/_deps/wheels; download "$wheels"
  fi
  rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
  python3 - "$wheels/$WHEEL" "$dest.tmp" <<'EOF' || die "cannot unpack $wheels/$WHEEL"
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    names = [n for n in z.namelist() if n.startswith("include/") or n.endswith("LICENSE.txt")]
    if not any(n.endswith("/cudnn_frontend.h") for n in names):
        sys.exit("no include/cudnn_frontend.h in the wheel")
    z.extractall(sys.argv[2], names)
EOF
  echo "$VERSION" >"$dest.tmp/VERSION"
  rm -rf "$dest" && mv "$dest.tmp" "$dest"
  echo "cudnn-frontend: $VERSION headers in $dest/include"
}

case "${1:-}" in
  download) [ $# -eq 2 ] || die "usage: $0 download DIR"; download "$2"; echo "cudnn-frontend: $2/$WHEEL" ;;
  unpack) [ $# -ge 2 ] && [ $# -le 3 ] || die "usage: $0 unpack BUILD_DIR [WHEEL_DIR]"; unpack "$2" "${3:-}" ;;
  wheel) echo "$WHEEL" ;;
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
  *) die "usage: $0 download DIR | unpack BUILD_DIR [WHEEL_DIR] (see --help)" ;;
esac
