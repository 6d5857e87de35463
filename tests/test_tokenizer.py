#!/usr/bin/env python3
"""test_tokenizer.py DTRAIN SRC TMP — dtrain's byte-level BPE (src/io/tokenizer.c) against the
`tokenizers` library, the oracle (installed into build/venv by scripts/test.sh).

Tokenizers are trained here with `tokenizers` (ByteLevel pre-tokenizer, BPE model, the
<|endoftext|> special token; with and without add_prefix_space; merges written as pairs, as
`tokenizers` does now, and as "a b" strings, as GPT-2's file has them). `dtrain data tokenize`
must give the same ids, token for token, as Tokenizer.encode(text, add_special_tokens=False)
after its leading end-of-text token: on the shipped corpus, the sentiment texts, an adversarial
set (mixed scripts, emoji and ZWJ sequences, combining marks and NFC/NFD pairs, runs of spaces,
tabs, newlines and \r\n, contractions in both cases, digit runs of 1 to 7 digits and of several
scripts, Unicode spaces and U+180E, special tokens inside words, letters, digits and marks of
Unicode versions past PCRE2's and past the normalizers' tables), 3000 random lines drawn from
those kinds of characters, every code point of planes 0 to 3 and two words of 100 000+ letters.
`dtrain data detokenize` must give what tokenizers' decode gives (the text itself, byte for
byte, where nothing normalizes it).

The families people fine-tune, each with its tokenizer.json's exact normalizer, pre_tokenizer,
decoder, post_processor, model options and added tokens, a BPE trained here through them:
SmolLM2 (Digits then ByteLevel with GPT-2's regex), Llama 3 (its Split regex, ByteLevel without
regex, ignore_merges, TemplateProcessing, 11 special tokens after the vocabulary) and Qwen 2.5 (NFC,
its Split regex, special and non-special added tokens). Then every Split behaviour with and
without invert, Digits, String patterns, the NFD/NFKC/NFKD normalizers and added tokens with
lstrip, rstrip, single_word and normalized set, added tokens numbered as tokenizers numbers them,
and U+180E through merges that join it to a space. Every option dtrain does not read is refused
with exit 2 naming the file, the part and the option. A vocabulary past 65536 ids writes a
uint32 (version 7) shard. Bad input exits 2 naming what is wrong. With data.tokenizer,
classification texts are cut where tokenizers' ids pass data.seq_len. Exit 77 without the
tokenizers package.
"""
import json
import os
import random
import struct
import subprocess
import sys

try:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
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
    # digit runs of 1 to 7 digits (Llama 3 cuts them in threes, Qwen and SmolLM2 in ones)
    "1 12 123 1234 12345 123456 1234567 x1234567y a1b22c333d4444 -7 +65 0.5 3,1415926 1e10 0x1F ²³ ⅷⅸ ٣٤٥ 12345678901",
    # contractions in upper and mixed case ((?i:'s|...) in Llama 3 and Qwen; 'ſ folds to 's)
    "HE'S THEY'LL I'M WE'VE YOU'RE SHE'D DON'T IT'S 'S 'LL 'Ll 'lL 'Re 'VE 'D 'M it'ſ O'NEIL",
    # \r\n mixes
    "line1\r\nline2\n\rline3\r\r\n\nx \r\n\ty\r \r\n  \r\n\r\nend\r",
    # NFC / NFD pairs, Hangul syllables and jamo, singletons, compatibility forms
    "café cafe\u0301 Ångström A\u030angstro\u0308m \u1e9b\u0323 \uac00 \u1100\u1161\u11a8 \u212b \u2126 \ufb01x "
    "x\u0301\u0308 \u0344 \u0f73 e\u0327\u0301 \uff21\uff22 \u2460 \u00bd \u1e0b\u0323",
    # special tokens glued to words and to combining marks
    "word<|endoftext|>word <|endoftext|>\u0301x a<|im_start|>user\nhi<|im_end|>\n<tool_call>{}</tool_call>b"
    "<|fim_prefix|>x<|fim_suffix|>y<|fim_middle|> <|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    # marks Unicode assigned after 9.0, whose tables tokenizers' normalizers have: there they have no
    # combining class, decomposition or composition
    "a\u0898\u0301 e\u1df6\u0316\u0301 \U00011935\U00011930 o\U0001e130\u0301 \U00010d24x \u1ac1a\u0301 \uffff\u0301 "
    "\u08d4\u0301a \U0001e944\u0316",
    # letters and digits of Unicode 15 and 16 (tokenizers' Oniguruma has them, PCRE2 10.42 does not)
    # and 17's digits (Rust's is_numeric, tokenizers' Digits, has them)
    "Kawi \U00011f04\U00011f05 Han \U00031350\U00031351x Garay \U00010d4a\U00010d4b \U00011f50\U00011f51\U00011f52\U00011f53 "
    "a\U00010d40b 7\U00016ff4\U00011de08",
    # U+180E: not \s in Oniguruma (tokenizers), \s in PCRE2
    "a \u180eb  \u180e\u180e c\u180e \u180e",
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


def check(name, tok, tok_path, text, prefix=False, eot="<|endoftext|>", roundtrip=None):
    """dtrain's ids for text equal tokenizers' (after the leading end-of-text token, when the
    tokenizer has one); detokenize gives what tokenizers' decode gives, and the text itself when
    roundtrip (default: without a prefix space)."""
    src = os.path.join(TMP, name.replace("/", "-") + ".txt")
    with open(src, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    r = dtrain("data", "tokenize", "--tokenizer", tok_path, src, src + ".bin")
    if r.returncode != 0:
        failures.append("%s: dtrain data tokenize exited %d: %s" % (name, r.returncode, r.stderr.strip()))
        return None
    _, got = read_shard(src + ".bin")
    want = tok.encode(text, add_special_tokens=False).ids
    lead = [tok.token_to_id(eot)] if eot else []
    if got[:len(lead)] != lead:
        failures.append("%s: the shard does not start with %s (%s)" % (name, eot, got[:3]))
    got = got[len(lead):]
    if got != want:
        i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        failures.append("%s: differs from tokenizers at token %d of %d/%d: dtrain %s, tokenizers %s (text %r)" % (
            name, i, len(got), len(want), [tok.id_to_token(x) for x in got[i:i + 5]],
            [tok.id_to_token(x) for x in want[i:i + 5]], tok.decode(want[max(0, i - 3):i + 5])))
    # decoding: what tokenizers' decoder gives for the same ids; without a prefix space or a
    # normalizer that is the text itself, byte for byte
    r = dtrain("data", "detokenize", "--tokenizer", tok_path, src + ".bin", src + ".back")
    back = open(src + ".back", "rb").read() if r.returncode == 0 else b""
    head = eot or ""
    oracle = head + tok.decode(want, skip_special_tokens=False)  # a String: invalid UTF-8 replaced by U+FFFD
    if roundtrip is None:
        roundtrip = not prefix
    if back.decode("utf-8", "replace") != oracle or (roundtrip and back != (head + text).encode("utf-8")):
        failures.append("%s: detokenize differs from %s (exit %d %s)" % (
            name, "the text" if back.decode("utf-8", "replace") == oracle else "tokenizers' decode", r.returncode,
            r.stderr.strip()))
    print("%-28s %7d tokens %s" % (name, len(want), "same" if got == want else "DIFFER"))
    return want


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
    # every code point of planes 0 to 3 (surrogates aside), shuffled, in runs of 1 to 8 between
    # spaces, digits, letters and newlines: each character class of each pattern, whole
    cps = [chr(c) for c in range(0x32400) if not 0xD800 <= c < 0xE000]
    rnd.shuffle(cps)
    out, i = [], 0
    while i < len(cps):
        k = rnd.randint(1, 8)
        out.append("".join(cps[i:i + k]) + rnd.choice([" ", "1", "a", "\n", " 12", "'s "]))
        i += k
    texts["all-code-points"] = "".join(out)
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
    }
    variants.update(refusals())
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


# ---- the families people fine-tune, and every option of the parts they are made of ----

# Llama 3's and Qwen 2's Split patterns, as their tokenizer.json files have them
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")
SMOLLM2_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>", "<file_sep>",
                   "<filename>", "<gh_stars>", "<issue_start>", "<issue_comment>", "<issue_closed>", "<jupyter_start>",
                   "<jupyter_text>", "<jupyter_code>", "<jupyter_output>", "<jupyter_script>", "<empty_output>"]
LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
                  "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
QWEN2_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                 "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
                 "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
QWEN2_PLAIN = ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
               "<|repo_name|>", "<|file_sep|>"]
# words Llama 3's vocabulary gets whole, with no merge that makes them: ignore_merges gives them as one token
LLAMA3_WHOLE = [" zyzzyva", " quixotry", "Xylophone", " ØREsund"]


def byte_level(text):
    return "".join(BYTE_CHARS[b] for b in text.encode("utf-8"))


def gpt2_byte_chars():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE_CHARS = gpt2_byte_chars()


def family_train(vocab, normalizer, pre, specials, texts):
    """A BPE of `vocab` ids trained through the family's normalizer and pre-tokenizer on the
    corpus and the given texts, its special tokens first (SmolLM2) or none (added after)."""
    tok = Tokenizer(models.BPE())
    if normalizer:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tr = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    extra = os.path.join(TMP, "family-extra.txt")
    open(extra, "w", encoding="utf-8").write("\n".join(texts))
    tok.train([os.path.join(SRC, "data/tinytext/corpus.txt"), extra], tr)
    return tok


def family_smollm2(path, texts):
    pre = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    tok = family_train(1200, None, pre, SMOLLM2_SPECIAL, texts)
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tok.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    tok.save(path)
    return "<|endoftext|>"


def family_llama3(path, texts):
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok = family_train(1200, None, pre, [], texts)
    tok.model.ignore_merges = True
    tok.save(path)
    d = json.load(open(path, encoding="utf-8"))  # whole words no merge makes, at the vocabulary's end
    for w in LLAMA3_WHOLE:
        d["model"]["vocab"][byte_level(w)] = len(d["model"]["vocab"])
    json.dump(d, open(path, "w", encoding="utf-8"), ensure_ascii=False)
    tok = Tokenizer.from_file(path)
    tok.add_special_tokens([AddedToken(s, normalized=False, special=True) for s in LLAMA3_SPECIAL])
    bot = tok.token_to_id("<|begin_of_text|>")
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bot)])])
    tok.save(path)
    return None  # no <|endoftext|> and 11 special tokens: no end-of-text token


def family_qwen25(path, texts):
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok = family_train(1200, normalizers.NFC(), pre, [], texts)
    tok.add_special_tokens([AddedToken(s, normalized=False, special=True) for s in QWEN2_SPECIAL])
    tok.add_tokens([AddedToken(s, normalized=False, special=False) for s in QWEN2_PLAIN])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.save(path)
    return "<|endoftext|>"


def check_families(texts):
    """SmolLM2, Llama 3 and Qwen 2.5: dtrain's ids equal tokenizers' on the adversarial set, the
    random lines, the validation text, every code point, text that starts with spaces and words
    that only ignore_merges makes one token (Llama 3)."""
    cases = {k: texts[k] for k in ("adversarial", "random-3000-lines", "val", "all-code-points")}
    cases["leading-spaces"] = "  \t leading spaces, then<|im_end|> 12 and 1234567\n"
    cases["ignore-merges"] = "Xylophone zyzzyva quixotry ØREsund zyzzyvas\n"
    for label, make in (("smollm2", family_smollm2), ("llama3", family_llama3), ("qwen2.5", family_qwen25)):
        path = os.path.join(TMP, label + ".json")
        eot = make(path, [texts["adversarial"]])
        tok = Tokenizer.from_file(path)
        print("== %s: vocabulary %d, %d added tokens" % (label, tok.get_vocab_size(), len(tok.get_added_tokens_decoder())))
        for name, text in cases.items():
            want = check(label + "/" + name, tok, path, text, eot=eot, roundtrip=label != "qwen2.5")
            if label == "llama3" and name == "ignore-merges" and want is not None:
                whole = [tok.token_to_id(byte_level(w)) for w in LLAMA3_WHOLE]
                if not all(w in want for w in whole):  # the test must exercise ignore_merges
                    failures.append("llama3/ignore-merges: tokenizers did not give the whole words %s: %s" % (
                        whole, want))


def check_white_space():
    """U+180E is no \\s to Oniguruma (tokenizers) but is one to PCRE2's \\s: with merges that join
    it to the space before it (a vocabulary trained on such text), GPT-2's pattern and Llama 3's
    must still cut the text where tokenizers does."""
    text = "".join("a \u180eb \u180e\u180e c\u180e x  \u180ey\u3000\u180e.\n" for _ in range(50))
    print("== U+180E (MONGOLIAN VOWEL SEPARATOR)")
    for label, pre in (("gpt2", pre_tokenizers.ByteLevel(add_prefix_space=False)),
                       ("llama3", pre_tokenizers.Sequence([
                           pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
                           pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]))):
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                             show_progress=False,
                                                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        path = os.path.join(TMP, "u180e-%s.json" % label)
        tok.save(path)
        check("u180e/" + label, tok, path, text)


def check_added_ids(tok_path):
    """Added tokens take the ids tokenizers gives them reading the file, whatever their "id" says:
    the vocabulary's id of their content, else the next after the vocabulary, in file order; a
    content listed twice is one token with the later flags."""
    d = json.load(open(tok_path, encoding="utf-8"))
    flags = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": False}
    d["added_tokens"] += [dict(flags, id=5000, content="<|x|>"), dict(flags, id=3, content="the"),
                          dict(flags, id=4000, content="<|y|>"), dict(flags, id=5000, content="<|x|>", lstrip=True)]
    path = os.path.join(TMP, "added-ids.json")
    json.dump(d, open(path, "w", encoding="utf-8"), ensure_ascii=False)
    tok = Tokenizer.from_file(path)
    print("== added tokens numbered as tokenizers numbers them")
    want = check("added-ids", tok, path, "a <|x|> b  <|x|>c<|y|>the other\n", roundtrip=False)
    if want is not None and tok.token_to_id("<|x|>") not in want:
        failures.append("added-ids: the text does not exercise <|x|>")


def split_variants():
    """Every Split behaviour, with and without invert, a String pattern, Digits both ways, and the
    normalizers, on a trained GPT-2-like vocabulary: name -> (normalizer, pre_tokenizer)."""
    v = {}
    bl = lambda regex: pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=regex)  # noqa: E731
    for behavior in ("removed", "isolated", "merged_with_previous", "merged_with_next", "contiguous"):
        for invert in (False, True):
            v["split-%s%s" % (behavior, "-invert" if invert else "")] = (None, pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(r"\s+|[,.!?]|[0-9]"), behavior=behavior, invert=invert), bl(invert)]))
    v["split-string"] = (None, pre_tokenizers.Sequence([pre_tokenizers.Split("e", behavior="merged_with_next"),
                                                        bl(False)]))
    v["split-dot"] = (None, pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r"(?i:A.)|\x{00e9}|\u00fc+"),
                                                                          behavior="isolated"), bl(True)]))
    v["split-not-letters"] = (None, pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r"\P{L}+|\pN|\p{^N}\p{L}"),
                                                                                  behavior="isolated"), bl(False)]))
    v["digits-contiguous"] = (None, pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=False), bl(True)]))
    v["digits-prefix-space"] = (None, pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)]))
    v["split-prefix-space"] = (None, pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=False)]))
    for name, norm in (("nfd", normalizers.NFD()), ("nfkc", normalizers.NFKC()), ("nfkd", normalizers.NFKD()),
                       ("nfd-nfc", normalizers.Sequence([normalizers.NFD(), normalizers.NFC()]))):
        v["normalizer-" + name] = (norm, pre_tokenizers.ByteLevel(add_prefix_space=False))
    return v


def check_variants(base_path, texts):
    """The pre-tokenizer and normalizer variants on the adversarial set and the random lines."""
    print("== pre-tokenizer and normalizer variants")
    for name, (norm, pre) in split_variants().items():
        tok = Tokenizer.from_file(base_path)
        tok.normalizer = norm
        tok.pre_tokenizer = pre
        path = os.path.join(TMP, name + ".json")
        tok.save(path)
        for text_name in ("adversarial", "random-3000-lines"):
            check(name + "/" + text_name, tok, path, texts[text_name], roundtrip=norm is None and
                  "prefix-space" not in name and "removed" not in name)


def check_added_flags(base_path):
    """Added tokens with lstrip, rstrip, single_word and normalized (NFKC): where tokenizers
    matches them, what it takes with them and what decoding gives back."""
    tok = Tokenizer.from_file(base_path)
    tok.normalizer = normalizers.NFKC()
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, normalized=False, special=True)])
    tok.add_tokens([AddedToken("[R]", rstrip=True, normalized=False), AddedToken(" sp", lstrip=True, normalized=False),
                    AddedToken("word", single_word=True, normalized=True), AddedToken("\ufb01x", normalized=True),
                    AddedToken("\u00c5", normalized=True), AddedToken("both", lstrip=True, rstrip=True, normalized=True),
                    AddedToken("<w>", single_word=True, normalized=False)])
    path = os.path.join(TMP, "added-flags.json")
    tok.save(path)
    text = ("a <mask> b  \t<mask>c<mask> [R]   d [R] sp keyword word words sword word. (word) _word word_ \u00e9word "
            "\ufb01x fix A\u030a \u00c5 <|endoftext|>word  both  x both\n<mask>  [R]\u3000 e<w>f <w> \u0301<w> "
            "wordword word\u0301 \u3000word\u2028")
    print("== added tokens with lstrip, rstrip, single_word, normalized (NFKC)")
    check("added-flags/stress", tok, path, text, roundtrip=False)
    check("added-flags/adversarial", tok, path, "\n".join(ADVERSARIAL), roundtrip=False)


def refusals():
    """What dtrain does not read, each refused naming the part and the option: name -> (edit of
    the tokenizer.json, expected message after the file's name)."""
    def split(pattern, behavior="Isolated"):
        return {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": behavior, "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    seq = lambda *steps: {"type": "Sequence", "pretokenizers": list(steps)}  # noqa: E731
    bytelevel = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    pre = lambda p: (lambda x: x.update(pre_tokenizer=p))  # noqa: E731
    return {
        "normalizer-lowercase": (lambda x: x.update(normalizer={"type": "Lowercase"}),
                                 "normalizer Lowercase: dtrain reads NFC, NFD, NFKC and NFKD"),
        "normalizer-in-sequence": (lambda x: x.update(normalizer={"type": "Sequence", "normalizers": [
            {"type": "NFC"}, {"type": "Replace", "pattern": {"String": " "}, "content": "_"}]}), "normalizer Replace: "),
        "metaspace": (pre({"type": "Metaspace"}), "pre_tokenizer Metaspace: dtrain reads Split, Digits and ByteLevel"),
        "whitespace-in-sequence": (pre(seq({"type": "Whitespace"}, bytelevel)), "pre_tokenizer Whitespace: dtrain reads"),
        "step-after-bytelevel": (pre(seq(bytelevel, {"type": "Digits", "individual_digits": True})),
                                 "pre_tokenizer Sequence: Digits after ByteLevel"),
        "no-bytelevel": (pre(seq({"type": "Digits", "individual_digits": True})),
                         "pre_tokenizer Sequence has no ByteLevel step"),
        "no-pre-tokenizer": (pre(None), "pre_tokenizer null: dtrain reads byte-level BPE"),
        "split-behavior": (pre(split("x", "Splitted")), "pre_tokenizer Split: behavior Splitted: expected Removed"),
        "split-w": (pre(split(r"\w+|\s")), r'pre_tokenizer Split: pattern "\w+|\s": \w: dtrain refuses it'),
        "split-d": (pre(split(r"[\d]")), r'pre_tokenizer Split: pattern "[\d]": \d: dtrain refuses it'),
        "split-b": (pre(split(r"\bx")), r'pre_tokenizer Split: pattern "\bx": \b: dtrain refuses it'),
        "split-h": (pre(split(r"\h+")), r'pre_tokenizer Split: pattern "\h+": \h: dtrain refuses it'),
        "split-anchor": (pre(split(r"^ +")), 'pre_tokenizer Split: pattern "^ +": the anchor ^: dtrain refuses it'),
        "split-anchor-end": (pre(split(r"x$")), 'pre_tokenizer Split: pattern "x$": the anchor $: dtrain refuses it'),
        "split-option": (pre(split(r"(?m:a.b)")),
                         'pre_tokenizer Split: pattern "(?m:a.b)": a group option other than i: dtrain refuses it'),
        "split-posix": (pre(split(r"[[:alpha:]]+")),
                        'pre_tokenizer Split: pattern "[[:alpha:]]+": [ in a class: dtrain refuses it'),
        "split-intersection": (pre(split(r"[a-z&&b]+")),
                               'pre_tokenizer Split: pattern "[a-z&&b]+": && in a class: dtrain refuses it'),
        "split-not-space-in-class": (pre(split(r"[\S,]+")),
                                     r'pre_tokenizer Split: pattern "[\S,]+": \S in a class: dtrain refuses it'),
        "split-negated-letter-in-class": (pre(split(r"[\P{L}x]+")), r'pre_tokenizer Split: pattern "[\P{L}x]+": a '
                                                                      r'negated \p{L} or \p{N} in a class: dtrain refuses'),
        "split-empty-match": (pre(split(r"x*")), 'pre_tokenizer Split: pattern "x*" can match the empty string'),
        "split-bad-regex": (pre(split(r"(ab")), 'pre_tokenizer Split: pattern "(ab" does not compile'),
        "post-roberta": (lambda x: x.update(post_processor={"type": "RobertaProcessing", "sep": ["</s>", 2],
                                                           "cls": ["<s>", 0], "trim_offsets": True,
                                                           "add_prefix_space": False}),
                         "post_processor RobertaProcessing is not supported"),
        "dropout": (lambda x: x["model"].update(dropout=0.1), "model.dropout 0.1 is not supported"),
    }


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
            if name != "all-code-points" or label == "bpe2048":  # GPT-2's pattern once is enough
                check(label + "/" + name, tok, path, text, prefix)
        if label == "bpe2048":
            check_errors(path)
            check_wide(path, tok)
            check_classification(path, tok)
            check_variants(path, texts)
            check_added_flags(path)
            check_added_ids(path)
    check_families(texts)
    check_white_space()
    for f in failures:
        print("FAIL:", f)
    if failures:
        return 1
    print("test_tokenizer: all equal to tokenizers %s" % __import__("tokenizers").__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
