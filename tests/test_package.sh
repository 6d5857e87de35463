#!/usr/bin/env bash
# test_package.sh SOURCE_DIR BUILD_DIR — dtrain as a user installs it (ctest: test_package).
#  1. `cmake --install BUILD --prefix P`: the binary, the example configs with their data, the docs;
#     the installed binary trains the smoke config from P/share/dtrain.
#  2. CPack's .deb: its control fields (Depends taken from the linked libraries, none of NVIDIA's),
#     installed by dpkg into a temporary root (its own dpkg database), its dependencies resolvable
#     by apt on this machine (a simulation), then run from there: --version and a short CPU training
#     of the smoke config, the language model (the shards are in the package) and the shipped
#     fine-tune (from the packaged pretrained weights and BPE tokenizer).
#  3. A CUDA build starts where no CUDA library is installed: no NVIDIA library among the binary's
#     NEEDED entries, and (as root, on a machine without the NVIDIA driver: a private mount
#     namespace in which every CUDA library file is hidden) --version and a `device: auto` training
#     still work.
# Exit 77 (skip) without dpkg-deb/dpkg-shlibdeps (not a Debian system).
set -uo pipefail
SRC=$1
BUILD=$2
T=$BUILD/test-tmp/package
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
ok() { echo "ok: $*"; }
for tool in dpkg-deb dpkg-shlibdeps dpkg cpack file; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool not found (scripts/setup.sh with DTRAIN_TEST_TOOLS=1 installs dpkg-dev and file)"; exit 77; }
done
rm -rf "$T"
mkdir -p "$T"

# a short training with the installed binary, from the installed examples; $1: the dtrain, $2: a name
train() {
  local bin=$1 name=$2
  shift 2
  (cd "$(dirname "$bin")/../share/dtrain" &&
    "$bin" --config configs/ci-smoke.yaml --quiet --set run.dir="$T/$name" "$@") >"$T/$name.log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ] || [ ! -s "$T/$name/model.safetensors" ]; then
    fail "$name: the installed dtrain did not train (rc $rc; $T/$name.log):"
    tail -5 "$T/$name.log"
    return 1
  fi
  ok "$name: trained ($(grep -m1 '^final:' "$T/$name.log"))"
}

# ---- 1. cmake --install ----
if cmake --install "$BUILD" --prefix "$T/prefix" >"$T/install.log" 2>&1; then
  for f in bin/dtrain share/dtrain/configs/finetune.yaml share/dtrain/configs/pretrain.yaml \
           share/dtrain/data/sentiment/train.tsv share/dtrain/data/tinytext/corpus.bin \
           share/dtrain/data/bpe/tokenizer.json share/dtrain/data/bpe/train-reviews.bin \
           share/dtrain/data/pretrained/config.json share/dtrain/data/pretrained/model.safetensors \
           share/doc/dtrain/README.md share/doc/dtrain/LICENSE share/doc/dtrain/docs/troubleshooting.md; do
    [ -e "$T/prefix/$f" ] || fail "cmake --install: PREFIX/$f is missing"
  done
  [ -x "$T/prefix/bin/dtrain" ] && train "$T/prefix/bin/dtrain" install-run
else
  fail "cmake --install failed:"; tail -5 "$T/install.log"
fi

# ---- 2. the .deb ----
if (cd "$BUILD" && cpack -G DEB -B "$T/deb") >"$T/cpack.log" 2>&1; then
  deb=$(ls "$T"/deb/dtrain_*.deb 2>/dev/null | head -1)
else
  deb=""
  fail "cpack -G DEB failed:"; tail -5 "$T/cpack.log"
fi
if [ -n "$deb" ]; then
  ok "built $(basename "$deb") ($(stat -c %s "$deb") bytes)"
  [ "$(dpkg-deb -f "$deb" Package)" = dtrain ] || fail "the package is not named dtrain"
  depends=$(dpkg-deb -f "$deb" Depends)
  for lib in libyaml libjansson zlib1g libopenblas libssl; do
    case "$depends" in *"$lib"*) ;; *) fail "Depends lacks $lib: $depends" ;; esac
  done
  case "$depends" in *cuda*|*cublas*|*nccl*|*cudnn*) fail "Depends names an NVIDIA package: $depends" ;; esac
  ok "Depends: $depends"
  # dpkg itself installs it into a temporary root with its own database
  root=$T/root
  mkdir -p "$root/var/lib/dpkg/updates" "$root/var/lib/dpkg/info"
  touch "$root/var/lib/dpkg/status" "$root/var/lib/dpkg/available"
  if dpkg --force-not-root --force-depends --force-script-chrootless --root="$root" \
       --instdir="$root" --admindir="$root/var/lib/dpkg" -i "$deb" >"$T/dpkg.log" 2>&1; then
    status=$(dpkg --admindir="$root/var/lib/dpkg" -s dtrain 2>&1 | sed -n 's/^Status: //p')
    if [ "$status" = "install ok installed" ]; then ok "dpkg installed it into $root ($status)"
    else fail "dpkg says the package is '$status'"; fi
  else
    fail "dpkg -i into a temporary root failed:"; tail -5 "$T/dpkg.log"
  fi
  # every dependency is installable here (apt resolves them; nothing is changed)
  if command -v apt-get >/dev/null; then
    if apt-get install -s -qq "$deb" >"$T/apt.log" 2>&1; then ok "apt-get install -s resolves its dependencies"
    else fail "apt-get cannot resolve the package's dependencies:"; tail -5 "$T/apt.log"; fi
  fi
  bin=$root/usr/bin/dtrain
  if [ -x "$bin" ]; then
    if "$bin" --version >"$T/version.log" 2>&1; then ok "$(head -1 "$T/version.log"): --version exits 0"
    else fail "the packaged dtrain --version failed:"; cat "$T/version.log"; fi
    train "$bin" deb-finetune
    (cd "$root/usr/share/dtrain" && "$bin" --config configs/pretrain.yaml --quiet --set run.dir="$T/deb-lm" \
       --set training.max_steps=3 --set eval.max_batches=2 --set model.n_layer=1) >"$T/deb-lm.log" 2>&1 \
      && [ -s "$T/deb-lm/model.safetensors" ] && ok "deb-lm: the packaged shards train a language model" \
      || { fail "deb-lm: the packaged pretrain config did not train ($T/deb-lm.log):"; tail -5 "$T/deb-lm.log"; }
    (cd "$root/usr/share/dtrain" && "$bin" --config configs/finetune.yaml --quiet --set run.dir="$T/deb-ft" \
       --set training.max_steps=3 --set eval.max_batches=2) >"$T/deb-ft.log" 2>&1 \
      && grep -q "init_from data/pretrained/model.safetensors" "$T/deb-ft/train.log" \
      && ok "deb-ft: the packaged fine-tune starts from the packaged pretrained weights and BPE tokenizer" \
      || { fail "deb-ft: the packaged finetune config did not train ($T/deb-ft.log):"; tail -5 "$T/deb-ft.log"; }
  fi
fi

# ---- 3. a CUDA build without the CUDA libraries ----
bin=$BUILD/dtrain
if "$bin" --version 2>/dev/null | grep -q cuBLASLt; then
  needed=$(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
  case "$needed" in
    *cudart*|*cublas*|*nccl*|*cudnn*|*libcuda.so*) fail "the CUDA build links an NVIDIA library dynamically: $needed" ;;
    *) ok "CUDA build: NEEDED has no NVIDIA library ($needed)" ;;
  esac
  if [ -e /proc/driver/nvidia ]; then
    echo "note: this machine has the NVIDIA driver: the run without CUDA libraries is tried on machines without one"
  elif [ "$(id -u)" = 0 ] && command -v unshare >/dev/null && unshare -m true 2>/dev/null; then
    # hide every CUDA library file (not the folders, which may hold the C library too), as on a
    # machine with nothing of NVIDIA installed; nothing is found through LD_LIBRARY_PATH either
    hide=$(for l in libcudart.so libcublasLt.so libcublas.so libnccl.so libcudnn libcuda.so; do
             ldconfig -p | sed -n "s/.*[[:space:]]$l[^ ]* .*=> \(.*\)/\1/p"
             ls /usr/local/cuda*/lib*/$l* 2>/dev/null
           done | xargs -r -n1 readlink -f | sort -u)
    unshare -m bash -c '
      set -e; T=$1; bin=$2; src=$3; shift 3
      for f in "$@"; do mount --bind /dev/null "$f"; done
      unset LD_LIBRARY_PATH
      "$bin" --version > "$T/nolibs-version.log" 2>&1
      cd "$src" && "$bin" --config configs/ci-smoke.yaml --quiet --set training.device=auto \
        --set run.dir="$T/nolibs-run" > "$T/nolibs-run.log" 2>&1' _ "$T" "$bin" "$SRC" $hide
    rc=$?
    nhide=$(printf '%s\n' $hide | grep -c .)
    if [ $rc -eq 0 ] && grep -q "not found (only GPU workers need it)" "$T/nolibs-version.log" && [ -s "$T/nolibs-run/model.safetensors" ]; then
      ok "with the $nhide CUDA library files hidden: --version exits 0 naming the missing libraries, and a device: auto run trains on CPU"
    else
      fail "with the CUDA library files hidden ($hide): rc $rc"; cat "$T/nolibs-version.log"; tail -5 "$T/nolibs-run.log"
    fi
  else
    echo "note: not root (or no unshare): the run without CUDA libraries is not tried"
  fi
else
  echo "note: not a CUDA build: part 3 does not apply"
fi

if [ $fails -gt 0 ]; then echo "test_package: $fails failure(s)"; exit 1; fi
echo "test_package: all passed"
