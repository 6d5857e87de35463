#!/usr/bin/env python3
"""test_chat_templates.py DTRAIN SRC TMP — the chat templates dtrain knows by their whole text
(src/io/chat.c) against transformers' apply_chat_template, through chat training data.

For Qwen 2.5 Instruct's and Llama 3.1 and 3.2 Instruct's templates (tests/chat_templates/*.jinja,
byte for byte the chat_template of the models' tokenizer_config.json), a byte-level BPE with the
model's special tokens is trained here with `tokenizers`, beside a tokenizer_config.json holding the
template. For conversations with and without a system message, of one and several turns, with white
space that Llama's template trims, `dtrain data show --json` must give:
- as ids, transformers' apply_chat_template(messages, tokenize=True) (Llama 3.2: today's date, its
  strftime_now, in the system turn); the same ids mean the same rendered text (byte-level BPE);
- as the counted targets, exactly the tokens of transformers' assistant mask
  (return_assistant_tokens_mask) with the same template written with {% generation %} around each
  assistant's content and its end-of-turn token (<|im_end|>, <|eot_id|>).
tests/test_chat.c checks the rendered strings themselves, with the generation prompt too.
Exit 77 without tokenizers, transformers or jinja2 (scripts/test.sh installs them).
"""
import json
import os
import sys

try:
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import PreTrainedTokenizerFast
    import jinja2  # noqa: F401  (apply_chat_template renders with it)
except ImportError as e:
    print("SKIP: %s (scripts/test.sh installs tokenizers, transformers and jinja2 into build/venv)" % e)
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pyutil import check, dtrain, failures, start  # noqa: E402
DTRAIN, SRC, TMP = start("chat-templates")


def marked(text, turn, generation):
    """the template with its assistant turns' answers in {% generation %} blocks"""
    assert text.count(turn) == 1, "the template's turn line is not where expected"
    return text.replace(turn, generation)


# the message turn of each template, and the same with the assistant's answer marked
QWEN_TURN = "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
QWEN_MARKED = ("{%- if message.role == \"assistant\" %}{{- '<|im_start|>assistant\\n' }}{% generation %}"
               "{{- message.content + '<|im_end|>' }}{% endgeneration %}{{- '\\n' }}{%- else %}" + QWEN_TURN +
               "{%- endif %}")
LLAMA_TURN = ("{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
              "'<|eot_id|>' }}")
LLAMA_MARKED = ("{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
                "{%- if message.role == 'assistant' %}{% generation %}{{- message['content'] | trim + '<|eot_id|>' }}"
                "{% endgeneration %}{%- else %}{{- message['content'] | trim + '<|eot_id|>' }}{%- endif %}")
# as Llama 3's: no <|endoftext|> among several special tokens, so the end of turn pads the rows
LLAMA_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
TEMPLATES = [  # file, name, special tokens, bos, eos, turn, marked turn
    ("Qwen2.5-Instruct", "Qwen 2.5 Instruct", ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None, "<|im_end|>",
     QWEN_TURN, QWEN_MARKED),
    ("Llama-3.1-Instruct", "Llama 3.1 Instruct", LLAMA_SPECIALS, "<|begin_of_text|>", "<|eot_id|>", LLAMA_TURN,
     LLAMA_MARKED),
    ("Llama-3.2-Instruct", "Llama 3.2 Instruct", LLAMA_SPECIALS, "<|begin_of_text|>", "<|eot_id|>", LLAMA_TURN,
     LLAMA_MARKED),
]

convs = [
    [{"role": "user", "content": "What is the capital of France?"},
     {"role": "assistant", "content": "Paris."}],
    [{"role": "system", "content": "Answer in one word."},
     {"role": "user", "content": "Colour of the sky?"},
     {"role": "assistant", "content": "\n\nBlue"},
     {"role": "user", "content": "And grass?"},
     {"role": "assistant", "content": " green, mostly \u00e9t\u00e9 \U0001F600"}],
    [{"role": "system", "content": "  Be brief.\n"},
     {"role": "user", "content": " Hi \t"},
     {"role": "assistant", "content": "\u00a0Hello!\u3000\n"},
     {"role": "user", "content": "Again?"},
     {"role": "system", "content": " a system message later on "},
     {"role": "assistant", "content": "\u2003"}],
]
corpus = open(os.path.join(SRC, "data/tinytext/corpus.txt"), encoding="utf-8").read()[:200000].splitlines()
T = 192
chat = os.path.join(TMP, "chat.jsonl")
with open(chat, "w", encoding="utf-8") as f:
    for c in convs:
        f.write(json.dumps({"messages": c}, ensure_ascii=False) + "\n")

for file, name, specials, bos, eos, turn, marked_turn in TEMPLATES:
    text = open(os.path.join(SRC, "tests/chat_templates", file + ".jinja"), encoding="utf-8").read()
    tok_dir = os.path.join(TMP, file)
    os.makedirs(tok_dir)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=600, special_tokens=specials,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bpe.save(os.path.join(tok_dir, "tokenizer.json"))
    pad = "<|endoftext|>" if "<|endoftext|>" in specials else eos  # the id dtrain pads rows with
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos, "pad_token": pad,
              "chat_template": text}
    if bos:
        config["bos_token"] = bos
    with open(os.path.join(tok_dir, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    hf = PreTrainedTokenizerFast.from_pretrained(tok_dir)
    EOT = hf.convert_tokens_to_ids(pad)
    cfg = os.path.join(tok_dir, "sft.yaml")
    with open(cfg, "w") as f:
        f.write("data:\n  train_path: %s\n  format: chat\n  tokenizer: %s/tokenizer.json\n  seq_len: %d\n"
                "model:\n  vocab_size: %d\n  n_layer: 1\n  n_head: 2\n  n_embd: 32\n" % (chat, tok_dir, T, len(hf)))
    MARKED = marked(text, turn, marked_turn)
    got = [json.loads(line) for line in dtrain("data", "show", "--config", cfg, "--json", "--limit", "100")
           .stdout.splitlines()]
    check(len(got) == len(convs), "%s: data show: a row for each conversation (%d)" % (name, len(got)))
    for i, c in enumerate(convs):
        ids = hf.apply_chat_template(c, tokenize=True, return_dict=True)["input_ids"]
        m = hf.apply_chat_template(c, chat_template=MARKED, tokenize=True, return_dict=True,
                                   return_assistant_tokens_mask=True)
        check(m["input_ids"] == ids, "%s: conversation %d: the marked template renders the same tokens" % (name, i))
        mask = m["assistant_masks"]
        check(len(ids) <= T and sum(mask) > 0, "%s: conversation %d: %d tokens, %d of them the answers'"
              % (name, i, len(ids), sum(mask)))
        inputs = ids[:T] + [EOT] * (T - len(ids[:T]))
        targets = [ids[t + 1] if t + 1 < len(ids) and mask[t + 1] else -1 for t in range(T)]
        g = got[i] if i < len(got) else {"ids": [], "targets": []}
        check(g["ids"] == inputs, "%s: conversation %d: dtrain's ids are apply_chat_template's: %r" %
              (name, i, hf.decode(ids)[:160] if g["ids"] == inputs else (hf.decode(ids), hf.decode(
                  [t for t in g["ids"] if t != EOT]))))
        check(g["targets"] == targets, "%s: conversation %d: the counted targets are transformers' assistant mask: %r"
              % (name, i, hf.decode([t for t in targets if t >= 0])))
    # a template a byte off is refused by name
    with open(os.path.join(tok_dir, "tokenizer_config.json"), "w") as f:
        json.dump(dict(config, chat_template=text.rstrip("\n")), f)
    r = dtrain("data", "show", "--config", cfg, "--json", want=2)
    check("chat_template: not a template dtrain renders exactly" in r.stderr,
          "%s: the text without its trailing newline is refused (%s)" % (name, r.stderr.strip()[-160:]))

if failures:
    print("test_chat_templates: %d check(s) failed" % len(failures))
    sys.exit(1)
print("test_chat_templates: ok")
