#!/usr/bin/env bash
# fetch-debs.sh — run on a CONNECTED Debian/Ubuntu machine: downloads (apt-get download, no root
# needed) the .deb files of the libraries dtrain builds and runs against that GPU servers often
# lack, into third_party/debs/ (git-ignored), with SHA256SUMS and MANIFEST.txt. Copy the repo
# with that folder to an offline GPU server; scripts/gpu-check.sh unpacks the packages with
# `dpkg -x` into a private prefix when the system lacks the headers (docs/gpu.md).
#
# usage: scripts/fetch-debs.sh [--update] [DEST]        (DEST default: third_party/debs)
#   --update   read the package lists into a private folder first (apt-get update without root;
#              needed when this machine's lists are missing or stale, or ARCH is not its own)
# environment: ARCH (default amd64: the GPU server's architecture, not necessarily this machine's)
#
# The packages (the set scripts/setup.sh installs, minus compiler and cmake):
#   libyaml-dev libyaml-0-2              YAML configs (pkg-config yaml-0.1)
#   libjansson-dev libjansson4           metrics.jsonl, safetensors headers (pkg-config jansson)
#   zlib1g-dev zlib1g                    .gz data, CRC32 (CMake FindZLIB)
#   libopenblas-openmp-dev libopenblas0-openmp
#                                        CPU matmuls (pkg-config openblas); the OpenMP variant, as
#                                        setup.sh uses (libopenblas-dev would pick pthread/serial)
#   libssl-dev libssl3                   HMAC-SHA256 of the rendezvous secret (pkg-config libcrypto)
#   libpcre2-dev libpcre2-8-0 (+ -16, -32, -posix3, which libpcre2-dev's links name)
#                                        the BPE tokenizer's pre-tokenization (pkg-config libpcre2-8)
#   libutf8proc-dev libutf8proc2         a tokenizer.json's Unicode normalizer (pkg-config libutf8proc)
#   libgfortran5 libquadmath0            what libopenblas0-openmp loads (unpacked only where the
#                                        server lacks them)
#   pkgconf pkgconf-bin libpkgconf3      pkg-config, which CMake needs (used only where missing)
# and the wheel nvidia-cudnn-frontend (pip download, a pinned version and checksum: the header-only
# cuDNN frontend that cuDNN attention is built with; gpu-check.sh unpacks it into its build tree)
# The result is tied to this machine's release (glibc): MANIFEST.txt says which glibc the
# libraries need at least; the server's must be that or newer.
set -euo pipefail
cd "$(dirname "$0")/.."

UPDATE=0
DEST=third_party/debs
for arg in "$@"; do
  case "$arg" in
    --update) UPDATE=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fetch-debs: unknown option $arg (see --help)" >&2; exit 2 ;;
    *) DEST=$arg ;;
  esac
done
ARCH=${ARCH:-amd64}
PACKAGES=(
  libyaml-dev libyaml-0-2
  libjansson-dev libjansson4
  zlib1g-dev zlib1g
  libopenblas-openmp-dev libopenblas0-openmp
  libssl-dev libssl3
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
  libutf8proc-dev libutf8proc2
  libgfortran5 libquadmath0
  pkgconf pkgconf-bin libpkgconf3
)

for tool in apt-get apt-cache dpkg-deb sha256sum; do
  command -v "$tool" >/dev/null || { echo "fetch-debs: error: $tool not found (run this on Debian or Ubuntu)" >&2; exit 1; }
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
APT=(apt-get)
CACHE=(apt-cache)
if [ "$UPDATE" = 1 ] || [ "$ARCH" != "$(dpkg --print-architecture)" ]; then
  # private package lists: works without root, and for another architecture than this machine's
  mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial"
  opts=(-o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache=$tmp/cache" -o Debug::NoLocking=1
        -o "APT::Architecture=$ARCH" -o "APT::Architectures=$ARCH")
  APT+=("${opts[@]}")
  CACHE+=("${opts[@]}")
  echo "fetch-debs: reading the package lists ($ARCH) into a private folder"
  "${APT[@]}" update -qq >"$tmp/update.log" 2>&1 || { cat "$tmp/update.log" >&2; exit 1; }
fi

# every package must be known before anything is downloaded: one clear message, not a half folder
unknown=()
for p in "${PACKAGES[@]}"; do
  "${CACHE[@]}" show "$p:$ARCH" >/dev/null 2>&1 || unknown+=("$p")
done
if [ ${#unknown[@]} -gt 0 ]; then
  echo "fetch-debs: error: apt does not know ${unknown[*]} for $ARCH (stale or missing package lists? try --update)" >&2
  exit 1
fi

mkdir -p "$tmp/debs"
specs=()
for p in "${PACKAGES[@]}"; do specs+=("$p:$ARCH"); done
echo "fetch-debs: downloading ${#PACKAGES[@]} packages for $ARCH"
# apt-get download writes into the current folder; as root it warns that _apt cannot write
# there (it then downloads unsandboxed): harmless, filtered out
(cd "$tmp/debs" && "${APT[@]}" download "${specs[@]}" 2>&1) | { grep -v "unsandboxed as root\|^Get:\|^Fetched" || true; }
n=$(find "$tmp/debs" -maxdepth 1 -name '*.deb' | wc -l)
if [ "$n" -ne ${#PACKAGES[@]} ]; then
  echo "fetch-debs: error: expected ${#PACKAGES[@]} .deb files, got $n" >&2
  exit 1
fi

# the newest glibc symbol version the shipped libraries and programs need
glibc="unknown (objdump not installed)"
if command -v objdump >/dev/null; then
  mkdir -p "$tmp/x"
  for f in "$tmp"/debs/*.deb; do dpkg-deb -x "$f" "$tmp/x"; done
  # objdump exits 1 on a file that is not ELF (a script in bin/): not an error here
  glibc=$( { find "$tmp/x" -type f \( -name '*.so*' -o -path '*/bin/*' \) -exec objdump -T {} + 2>/dev/null || true; } \
          | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)
fi

# replace the folder's packages (an older fetch may have other versions), keep anything else
mkdir -p "$DEST"
rm -f "$DEST"/*.deb "$DEST/SHA256SUMS" "$DEST/MANIFEST.txt"
mv "$tmp"/debs/*.deb "$DEST"/
# the cuDNN frontend's headers travel as their PyPI wheel (scripts/cudnn-frontend.sh: pinned, checked)
rm -f "$DEST"/nvidia_cudnn_frontend-*.whl
scripts/cudnn-frontend.sh download "$DEST" >/dev/null
(cd "$DEST" && sha256sum -- *.deb ./*.whl >SHA256SUMS)
{
  echo "# dtrain third_party/debs: written by scripts/fetch-debs.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  # shellcheck source=/dev/null
  echo "# from: $(. /etc/os-release && echo "$PRETTY_NAME"), architecture $ARCH"
  echo "# needs glibc >= $glibc on the machine that runs them"
  echo "# package version architecture file"
  for f in "$DEST"/*.deb; do
    echo "$(dpkg-deb -f "$f" Package) $(dpkg-deb -f "$f" Version) $(dpkg-deb -f "$f" Architecture) $(basename "$f")"
  done
  for f in "$DEST"/*.whl; do echo "nvidia-cudnn-frontend (PyPI) - - $(basename "$f")"; done
} >"$DEST/MANIFEST.txt"
size=$(du -sh "$DEST" | cut -f1)
echo "fetch-debs: $n packages ($size) in $DEST, with SHA256SUMS and MANIFEST.txt; they need glibc >= $glibc"
ignored=0
git check-ignore -q "$DEST/SHA256SUMS" 2>/dev/null || ignored=$?
if [ "$ignored" = 1 ]; then  # 1: inside the repo and not ignored (128: outside the repo)
  echo "fetch-debs: note: $DEST is not git-ignored (the repo ignores /third_party/debs/)"
fi
