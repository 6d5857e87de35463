#!/usr/bin/env python3
"""tokenizer_speed.py — byte-level BPE encoding speed: dtrain against the `tokenizers` library on
one thread, the same text and the same tokenizer.json, in one run.

    build/venv/bin/python bench/tokenizer_speed.py [--dtrain build/dtrain] [--repeat 20] [--vocab 8192] [--runs 5]

The text is the shipped corpus (data/tinytext/corpus.txt) repeated --repeat times (8 MB at 20);
the tokenizer is trained on it with `tokenizers` (ByteLevel, BPE, --vocab ids). Timed, best of
--runs each (the machine is shared; the best run is the least disturbed):
  - tokenizers, Tokenizer.encode(text) of the whole text at once;
  - tokenizers, Tokenizer.encode_batch(lines) over its lines (RAYON_NUM_THREADS=1 and
    TOKENIZERS_PARALLELISM=false: one thread);
  - dtrain, `dtrain data tokenize --tokenizer tok.json text.txt out.bin` as a whole process: it
    also reads the file and writes and fsyncs the shard, which the library's figures leave out.
The ids are checked equal before anything is timed. Prints MB/s and dtrain's speed over each.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402


def best_of(runs, fn):
    t = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        t.append(time.perf_counter() - t0)
    return min(t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtrain", default="build/dtrain")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "tinytext", "corpus.txt")
    corpus = open(src, encoding="utf-8").read()
    text = corpus * a.repeat
    mb = len(text.encode("utf-8")) / 1e6
    with tempfile.TemporaryDirectory() as d:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        tok.train([src], trainers.BpeTrainer(vocab_size=a.vocab, special_tokens=["<|endoftext|>"], show_progress=False,
                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        tj, txt, out = os.path.join(d, "tok.json"), os.path.join(d, "text.txt"), os.path.join(d, "out.bin")
        tok.save(tj)
        open(txt, "w", encoding="utf-8").write(text)
        lines = text.splitlines(keepends=True)
        cmd = [a.dtrain, "data", "tokenize", "--tokenizer", tj, txt, out]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        raw = open(out, "rb").read()
        n = int.from_bytes(raw[8:12], "little")
        want = tok.encode(text, add_special_tokens=False).ids
        got = [int.from_bytes(raw[1024 + 2 * i:1026 + 2 * i], "little") for i in range(1, n)]
        if got != want:
            print("tokenizer_speed: dtrain's ids differ from tokenizers'", file=sys.stderr)
            return 1
        whole = best_of(a.runs, lambda: tok.encode(text, add_special_tokens=False))
        batch = best_of(a.runs, lambda: tok.encode_batch(lines, add_special_tokens=False))
        ours = best_of(a.runs, lambda: subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL))
    print("text: %.1f MB (corpus x %d), %d tokens, vocabulary %d; best of %d runs, one thread"
          % (mb, a.repeat, len(want), tok.get_vocab_size(), a.runs))
    print("%-46s %8.3f s %8.2f MB/s" % ("tokenizers %s encode (whole text)" % __import__("tokenizers").__version__,
                                        whole, mb / whole))
    print("%-46s %8.3f s %8.2f MB/s" % ("tokenizers encode_batch (lines, 1 thread)", batch, mb / batch))
    print("%-46s %8.3f s %8.2f MB/s" % ("dtrain data tokenize (whole process)", ours, mb / ours))
    print("dtrain / tokenizers: %.1fx (whole text), %.1fx (batch of lines)" % (whole / ours, batch / ours))
    return 0


if __name__ == "__main__":
    sys.exit(main())
