#!/usr/bin/env bash
# generate_speed.sh [DTRAIN] — what the key/value cache buys `dtrain generate`: new tokens per
# second after a short (16-byte) and a long (896-byte) prompt, with the cache and without it
# (--no-cache: a forward over the whole text for every token), on a byte-level model of the
# shipped pretrain shape with 1024 positions (weights from one training step: speed does not
# depend on what they hold). Each number is the median of 3 runs. Don't run it on a busy machine.
set -euo pipefail
DTRAIN=${1:-build/dtrain}
RUN=${TMPDIR:-/tmp}/dtrain-genbench
"$DTRAIN" --config configs/pretrain.yaml --set run.dir="$RUN" --set checkpoint.resume=never --quiet \
    --set training.max_steps=1 --set data.seq_len=1024 --set model.n_positions=1024 \
    --set data.batch_size_per_worker=1 --set eval.max_batches=1 >/dev/null
short=$(head -c 16 data/tinytext/val.txt | tr '\n' ' ')
long=$(head -c 896 data/tinytext/val.txt | tr '\n' ' ')
rate() { # PROMPT [OPTIONS]: median tokens/s of 3 runs of 96 new tokens
    local p=$1 r
    shift
    for r in 1 2 3; do
        "$DTRAIN" generate --checkpoint "$RUN" --prompt "$p" --max-new-tokens 96 --seed 1 "$@" 2>&1 >/dev/null |
            sed -n 's/.*(\([0-9.]*\) tokens\/s.*/\1/p'
    done | sort -g | sed -n 2p
}
printf '%-28s %14s %14s %8s\n' "prompt" "cache tok/s" "no cache tok/s" "ratio"
for name in short long; do
    p=${!name}
    c=$(rate "$p") n=$(rate "$p" --no-cache)
    printf '%-28s %14s %14s %7.1fx\n' "$name (${#p} bytes)" "$c" "$n" "$(echo "$c / $n" | bc -l)"
done
