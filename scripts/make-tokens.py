#!/usr/bin/env python3
"""make-tokens.py — writes a synthetic llm.c token shard (version 1) of random tokens.

Format (what dtrain's data loader reads, src/io/data.c): a header of 256 little-endian int32
([0] = 20240520 magic, [1] = 1 version, [2] = number of tokens, the rest 0), then the tokens as
little-endian uint16. Tokens are uniform in [0, vocab) from a fixed seed, so the same command
always writes the same bytes.

    python3 scripts/make-tokens.py OUT.bin [--tokens N] [--vocab V] [--seed S]

The default size is what the GPT-2 124M benchmark needs for 60 steps of 16 x 1024 tokens
(plus the one extra token a language-model target window reads): 60 * 16 * 1024 + 1.
Python standard library only.
"""
import argparse
import os
import random
import struct
import sys
from array import array

MAGIC, VERSION, HEADER_INTS = 20240520, 1, 256
CHUNK = 1 << 20  # tokens generated and written per chunk


def main(argv=None):
    ap = argparse.ArgumentParser(description="write a synthetic llm.c token shard (uint16 tokens)")
    ap.add_argument("out", help="output file (folders are created)")
    ap.add_argument("--tokens", type=int, default=60 * 16 * 1024 + 1,
                    help="number of tokens (default 60*16*1024+1 = 983041)")
    ap.add_argument("--vocab", type=int, default=50257, help="tokens are in [0, vocab) (default 50257)")
    ap.add_argument("--seed", type=int, default=1337, help="random seed (default 1337)")
    a = ap.parse_args(argv)
    if not 1 <= a.vocab <= 65536:
        ap.error("--vocab must be in 1..65536 (version-1 shards hold uint16 tokens)")
    if not 1 <= a.tokens <= 2**31 - 1:
        ap.error("--tokens must be in 1..2^31-1 (the header holds an int32 count)")

    rng = random.Random(a.seed)
    header = [0] * HEADER_INTS
    header[0], header[1], header[2] = MAGIC, VERSION, a.tokens
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    tmp = a.out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<%di" % HEADER_INTS, *header))
        left = a.tokens
        while left:
            n = min(left, CHUNK)
            buf = array("H", (rng.randrange(a.vocab) for _ in range(n)))
            if sys.byteorder != "little":
                buf.byteswap()
            buf.tofile(f)
            left -= n
    os.replace(tmp, a.out)
    print("%s: %d tokens in [0, %d), seed %d, %d bytes" % (a.out, a.tokens, a.vocab, a.seed,
                                                           4 * HEADER_INTS + 2 * a.tokens))
    return 0


if __name__ == "__main__":
    sys.exit(main())
