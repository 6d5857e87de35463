#!/usr/bin/env python3
"""make-bpe.py — trains the shipped byte-level BPE tokenizer, data/bpe/tokenizer.json, with the
`tokenizers` library (scripts/test.sh installs it into build/venv):

    build/venv/bin/python scripts/make-bpe.py [--vocab 1024] [--out data/bpe/tokenizer.json]

It learns from the shipped English corpus (data/tinytext/corpus.txt) and the texts of the
sentiment training set (data/sentiment/train.tsv, labels dropped; never the validation set):
GPT-2's pipeline (ByteLevel pre-tokenization without a prefix space, the 256 byte characters
as the initial alphabet, BPE merges up to --vocab ids), then <|endoftext|> as the last id, as in
GPT-2 (id 50256 there, 1024 here). The same inputs give the same file (checked by running it
twice). The file is shipped, so training and the main job need neither this script nor the
network; run it again only when the data changes, then rebuild (the shards under data/bpe/ are
made from it by CMake) and pretrain again (configs/pretrain-bpe.yaml, README "Pretraining").
"""
import argparse
import os
import sys

try:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
except ImportError:
    sys.exit("make-bpe.py: needs the tokenizers package (pip install tokenizers, or run it with build/venv/bin/python "
             "after scripts/test.sh)")

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def texts():
    with open(os.path.join(ROOT, "data/tinytext/corpus.txt"), encoding="utf-8") as f:
        for line in f:
            yield line
    with open(os.path.join(ROOT, "data/sentiment/train.tsv"), encoding="utf-8") as f:
        for line in f:
            yield line.split("\t", 1)[1]


def main(argv=None):
    ap = argparse.ArgumentParser(description="train the shipped byte-level BPE tokenizer")
    ap.add_argument("--vocab", type=int, default=1024, help="ids before <|endoftext|> (default 1024)")
    ap.add_argument("--out", default=os.path.join(ROOT, "data/bpe/tokenizer.json"))
    a = ap.parse_args(argv)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=a.vocab, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts(), trainer)
    tok.add_special_tokens(["<|endoftext|>"])
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    tok.save(a.out)
    eot = tok.token_to_id("<|endoftext|>")
    print("make-bpe.py: %s: %d ids (<|endoftext|> = %d)" % (a.out, tok.get_vocab_size(), eot))


if __name__ == "__main__":
    main()
