#!/usr/bin/env python3
"""test_tokenizer.py DTRAIN SRC TMP — dtrain's byte-level BPE (src/io/tokenizer.c) against the
`tokenizers` library, the oracle (installed into build/venv by scripts/test.sh).

Tokenizers are trained here with `tokenizers` (ByteLevel pre-tokenizer, BPE model, the
<|endoftext|> special token; with and without add_prefix_space; merges written as pairs, as
`tokenizers` does now, and as "a b" strings, as GPT-2's file has them). `dtrain data tokenize`
must give the same ids, token for token, as Tokenizer.encode(text, add_special_tokens=False)
after its leading end-of-text token: on the shipped corpus, the sentiment texts, an adversarial
set (mixed scripts, emoji and ZWJ sequences, combining marks, runs of spaces, tabs and newlines,
contractions, digits of several scripts, Unicode spaces, special tokens inside the text),
3000 random lines drawn from those kinds of characters and two words of 100 000+ letters. `dtrain data detokenize` must give the
text back byte for byte. A vocabulary past 65536 ids writes a uint32 (version 7) shard. Bad
input exits 2 naming what is wrong. With data.tokenizer, classification texts are cut where
tokenizers' ids pass data.seq_len. Exit 77 without the tokenizers package.
"""
import json
import os
import random
import struct
import subprocess
import sys

try:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
except ImportError:
    print("SKIP: the tokenizers package is not installed (scripts/test.sh installs it into build/venv)")
    sys.exit(77)

DTRAIN, SRC, TMP = sys.argv[1], sys.argv[2], os.path.join(sys.argv[3], "tokenizer")
os.makedirs(TMP, exist_ok=True)
failures = []

ADVERSARIAL = [
    "Hello, world! It's a test; we'll see—isn't it? I'M DONE'S 'quoted' don't",
    "Ünïcödé façade naïve résumé Ångström — Ελληνικά Русский текст العربية עברית 中文字符 日本語のテキスト 한국어",
    "emoji 😀😃 👩\u200d👩\u200d👧\u200d👦 🇫🇷 flags 👍🏽 thumbs ❤️ heart",
    "combining e\u0301 a\u0308 n\u0303 Z\u0335\u0321\u0322a\u0336l\u0337g\u0338o",
    "spaces:  two   three    four\ttab\t\ttabs\n\nnewlines\n\n\n  \n \t \n",
    "digits 1234567890 3.14159 1,000,000 ١٢٣ ४५६ ⅷ ² ½",
    "NEL\u0085here nbsp\u00a0here ideographic\u3000space en\u2002space lsep\u2028psep\u2029 zwsp\u200bx",
    "<|endoftext|>after special<|endoftext|><|endoftext|> and <|endoftext| broken <|endof",
    "mixed1a2b3c under_score snake-case CamelCase x86_64 e.g. U.S.A. ...!!!???",
    "   leading spaces and trailing   ",
    "'s's 're've'm'll'd 'S 'T ''' '",
    "\x01\x02 control \x7f del \x1b[31m ansi \r\n crlf \r cr \x0b vt \x0c ff",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math 𝟙𝟚𝟛 gothic 𐌰𐌱",
]

POOL = ("abcxyz ABCXYZ 0123456789 éüñçÅ ΑΒΓαβγ абвгд 中文字 日本語 한국 عربي עברית ०१२ ١٢٣ "
        "😀👍🏽❤️\u200d\u0301\u0308 .,;:!?'\"()[]{}<>-_/\\@#$%^&*+=~`| \t\t\n\u00a0\u3000\u2028\u0085 's 't 're 'll")


def train(path, vocab, prefix, string_merges=False):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=prefix)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"], show_progress=False,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([os.path.join(SRC, "data/tinytext/corpus.txt")], tr)
    tok.save(path)
    if string_merges:  # GPT-2's own tokenizer.json writes each merge as "a b"
        d = json.load(open(path, encoding="utf-8"))
        d["model"]["merges"] = [m if isinstance(m, str) else " ".join(m) for m in d["model"]["merges"]]
        json.dump(d, open(path, "w", encoding="utf-8"), ensure_ascii=False)
    return Tokenizer.from_file(path)


def dtrain(*args):
    return subprocess.run([DTRAIN, *args], capture_output=True, text=True, errors="replace")


def read_shard(path):
    raw = open(path, "rb").read()
    magic, version, n = struct.unpack("<3i", raw[:12])
    fmt = "H" if version == 1 else "I"
    return version, list(struct.unpack("<%d%s" % (n, fmt), raw[1024:1024 + n * struct.calcsize(fmt)]))


def check(name, tok, tok_path, text, prefix=False):
    src = os.path.join(TMP, name.replace("/", "-") + ".txt")
    with open(src, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    r = dtrain("data", "tokenize", "--tokenizer", tok_path, src, src + ".bin")
    if r.returncode != 0:
        failures.append("%s: dtrain data tokenize exited %d: %s" % (name, r.returncode, r.stderr.strip()))
        return
    _, got = read_shard(src + ".bin")
    want = tok.encode(text, add_special_tokens=False).ids
    eot = tok.token_to_id("<|endoftext|>")
    if got[:1] != [eot]:
        failures.append("%s: the shard does not start with <|endoftext|> (%s)" % (name, got[:3]))
    got = got[1:]
    if got != want:
        i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        failures.append("%s: differs from tokenizers at token %d of %d/%d: dtrain %s, tokenizers %s (text %r)" % (
            name, i, len(got), len(want), [tok.id_to_token(x) for x in got[i:i + 5]],
            [tok.id_to_token(x) for x in want[i:i + 5]], tok.decode(want[max(0, i - 3):i + 5])))
    # decoding: what tokenizers' ByteLevel decoder gives for the same ids; without a prefix space
    # that is the text itself, byte for byte
    r = dtrain("data", "detokenize", "--tokenizer", tok_path, src + ".bin", src + ".back")
    back = open(src + ".back", "rb").read() if r.returncode == 0 else b""
    oracle = "<|endoftext|>" + tok.decode(want, skip_special_tokens=False)
    if back != oracle.encode("utf-8") or (not prefix and back != b"<|endoftext|>" + text.encode("utf-8")):
        failures.append("%s: detokenize differs from tokenizers' decode (exit %d %s)" % (name, r.returncode,
                                                                                        r.stderr.strip()))
    print("%-28s %7d tokens %s" % (name, len(want), "same" if got == want else "DIFFER"))


def corpus_texts():
    texts = {"corpus": open(os.path.join(SRC, "data/tinytext/corpus.txt"), encoding="utf-8").read(),
             "val": open(os.path.join(SRC, "data/tinytext/val.txt"), encoding="utf-8").read()}
    lines = open(os.path.join(SRC, "data/sentiment/train.tsv"), encoding="utf-8").read().splitlines()
    texts["sentiment"] = "\n".join(line.split("\t", 1)[1] for line in lines) + "\n"
    texts["adversarial"] = "\n".join(ADVERSARIAL) + "\n"
    rnd = random.Random(1337)
    texts["random-3000-lines"] = "".join(
        "".join(rnd.choice(POOL) for _ in range(rnd.randint(1, 60))) + "\n" for _ in range(3000))
    # words of 200 000 and 100 000 letters (base64 blobs, minified data): merging must not take
    # O(n^2) in a word's length (it would run for hours)
    texts["long-words"] = "".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(200000)) + " " + \
        "ab" * 50000 + "\n"
    return texts


def check_errors(tok_path):
    def expect(name, args, text):
        r = dtrain(*args)
        if r.returncode != 2 or text not in r.stderr:
            failures.append("%s: expected exit 2 with %r, got %d: %s" % (name, text, r.returncode, r.stderr.strip()))
        else:
            print("%-28s exit 2: %s" % (name, r.stderr.strip()[:110]))
    bad_utf8 = os.path.join(TMP, "bad-utf8.txt")
    open(bad_utf8, "wb").write(b"good text \xff\xfe bad")
    expect("invalid UTF-8", ["data", "tokenize", "--tokenizer", tok_path, bad_utf8, bad_utf8 + ".bin"],
           "bad-utf8.txt: invalid UTF-8 at byte offset 10 (byte 0xFF)")
    d = json.load(open(tok_path, encoding="utf-8"))
    variants = {
        "wordpiece": (lambda x: x["model"].update(type="WordPiece"), "model.type is WordPiece, not BPE"),
        "no-merges": (lambda x: x["model"].pop("merges"), "model.merges is missing"),
        "bad-merge": (lambda x: x["model"]["merges"].insert(0, ["no-such-token", "Ġ"]),
                      "model.merges[0] (no-such-token Ġ): the first part is not in model.vocab"),
        "normalizer": (lambda x: x.update(normalizer={"type": "NFKC"}), "normalizer NFKC is not supported"),
        "metaspace": (lambda x: x.update(pre_tokenizer={"type": "Metaspace"}), "pre_tokenizer Metaspace is not supported"),
    }
    src = os.path.join(SRC, "data/tinytext/val.txt")
    for name, (edit, text) in variants.items():
        v = json.loads(json.dumps(d))
        edit(v)
        path = os.path.join(TMP, name + ".json")
        json.dump(v, open(path, "w", encoding="utf-8"), ensure_ascii=False)
        expect(name, ["data", "tokenize", "--tokenizer", path, src, path + ".bin"], path + ": " + text)
    notjson = os.path.join(TMP, "not.json")
    open(notjson, "w").write("{\n  \"model\": [1, 2,\n")
    expect("not JSON", ["data", "tokenize", "--tokenizer", notjson, src, notjson + ".bin"], notjson + ":3: not a tokenizer.json")


def check_wide(tok_path, tok):
    """A vocabulary of 70002 ids (70000 tokens no merge makes, then an added token): a uint32
    (version 7) shard, the ids as tokenizers gives them."""
    d = json.load(open(tok_path, encoding="utf-8"))
    base = len(d["model"]["vocab"])
    for i in range(base, 70001):
        d["model"]["vocab"]["§%d" % i] = i
    d["added_tokens"].append({"id": 70001, "content": "<|big|>", "single_word": False, "lstrip": False,
                              "rstrip": False, "normalized": False, "special": True})
    path = os.path.join(TMP, "wide.json")
    json.dump(d, open(path, "w", encoding="utf-8"), ensure_ascii=False)
    wide = Tokenizer.from_file(path)
    text = "before <|big|> after<|endoftext|>end\n"
    src = os.path.join(TMP, "wide.txt")
    open(src, "w", encoding="utf-8").write(text)
    r = dtrain("data", "tokenize", "--tokenizer", path, src, src + ".bin")
    if r.returncode != 0:
        failures.append("wide: exit %d: %s" % (r.returncode, r.stderr.strip()))
        return
    version, got = read_shard(src + ".bin")
    want = [wide.token_to_id("<|endoftext|>")] + wide.encode(text, add_special_tokens=False).ids
    ok = version == 7 and got == want and 70001 in got
    print("%-28s version %d, %s" % ("vocabulary past 65536", version, "same" if ok else "DIFFER"))
    if not ok:
        failures.append("wide: version %d, dtrain %s, tokenizers %s" % (version, got, want))


def check_classification(tok_path, tok):
    """data.tokenizer on the sentiment TSV: the examples cut to data.seq_len are those tokenizers
    makes longer than it; a short training runs; model.vocab_size too small and a text holding
    the end-of-text token are refused naming them."""
    cfg = ["--config", "configs/ci-smoke.yaml", "--set", "data.tokenizer=" + tok_path, "--progress", "never",
           "--set", "checkpoint.resume=never"]
    r = subprocess.run([DTRAIN, *cfg, "--set", "model.vocab_size=%d" % tok.get_vocab_size(), "--set", "data.seq_len=8",
                        "--set", "run.dir=" + os.path.join(TMP, "cls")], capture_output=True, text=True, cwd=SRC)
    texts = [line.split("\t", 1)[1] for line in
             open(os.path.join(SRC, "data/sentiment/train.tsv"), encoding="utf-8").read().splitlines()]
    cut = sum(len(tok.encode(t, add_special_tokens=False).ids) > 8 for t in texts)
    want = "data: %d of %d train examples (%.1f%%) are longer than data.seq_len = 8 tokens" % (
        cut, len(texts), 100.0 * cut / len(texts))
    if r.returncode != 0 or want not in r.stdout:
        failures.append("classification: exit %d, expected %r in: %s %s" % (r.returncode, want, r.stdout[-400:],
                                                                            r.stderr[-400:]))
    else:
        print("%-28s %s" % ("classification (seq_len 8)", want))
    r = subprocess.run([DTRAIN, *cfg, "--set", "run.dir=" + os.path.join(TMP, "cls2")], capture_output=True, text=True,
                       cwd=SRC)
    want = "model.vocab_size: 257 is smaller than the %d ids of data.tokenizer %s" % (tok.get_vocab_size(), tok_path)
    if r.returncode != 2 or want not in r.stderr:
        failures.append("vocab_size: exit %d, expected %r in %s" % (r.returncode, want, r.stderr.strip()))
    else:
        print("%-28s exit 2: %s" % ("vocab_size too small", want[:90]))
    tsv = os.path.join(TMP, "eot.tsv")
    open(tsv, "w", encoding="utf-8").write("1\tfine text\n0\tsome <|endoftext|> inside\n")
    r = subprocess.run([DTRAIN, *cfg, "--set", "model.vocab_size=%d" % tok.get_vocab_size(), "--set",
                        "data.train_path=" + tsv, "--set", "data.val_path=", "--set", "data.batch_size_per_worker=1",
                        "--set", "run.dir=" + os.path.join(TMP, "cls3")], capture_output=True, text=True, cwd=SRC)
    want = tsv + ":2: the text holds the end-of-text token"
    if r.returncode != 2 or want not in r.stderr:
        failures.append("end-of-text in a text: exit %d, expected %r in %s" % (r.returncode, want, r.stderr.strip()))
    else:
        print("%-28s exit 2: %s" % ("end-of-text in a text", want))


def main():
    texts = corpus_texts()
    for label, vocab, prefix, strings in (("bpe2048", 2048, False, False), ("bpe2048-prefix", 2048, True, False),
                                          ("bpe300-string-merges", 300, False, True)):
        path = os.path.join(TMP, label + ".json")
        tok = train(path, vocab, prefix, strings)
        print("== %s: vocabulary %d, add_prefix_space %s, merges as %s" % (label, tok.get_vocab_size(), prefix,
                                                                          "strings" if strings else "pairs"))
        for name, text in texts.items():
            check(label + "/" + name, tok, path, text, prefix)
        if label == "bpe2048":
            check_errors(path)
            check_wide(path, tok)
            check_classification(path, tok)
    for f in failures:
        print("FAIL:", f)
    if failures:
        return 1
    print("test_tokenizer: all equal to tokenizers %s" % __import__("tokenizers").__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
