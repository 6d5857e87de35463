#!/usr/bin/env python3
"""make-sft-data.py [OUT_DIR] — the instruction-tuning example's data (configs/sft-smollm2.yaml):
conversations asking for the sum of two numbers below 100, answered with the number alone, as
JSON lines of {"messages": [...]} (data.format: chat).

OUT_DIR/train.jsonl holds 3000 conversations, OUT_DIR/val.jsonl 200 more whose pairs of numbers
never occur in training (the held-out split dtrain eval's exact match asks). Seeded: the same
files every time. SmolLM2-135M-Instruct gets few of them right as it is (it adds wrongly and
explains at length): what fine-tuning must change is both the arithmetic and the form."""
import json
import os
import random
import sys

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "sft")
os.makedirs(out, exist_ok=True)
rng = random.Random(20261204)
pairs = [(a, b) for a in range(100) for b in range(100)]
rng.shuffle(pairs)
forms = ["What is {a} + {b}?", "What is {a} plus {b}?", "Add {a} and {b}.", "{a} + {b} = ?", "Compute {a} + {b}."]


def line(a, b):
    q = rng.choice(forms).format(a=a, b=b)
    return json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": str(a + b)}]})


for name, chunk in [("val.jsonl", pairs[:200]), ("train.jsonl", pairs[200:3200])]:
    with open(os.path.join(out, name), "w") as f:
        for a, b in chunk:
            f.write(line(a, b) + "\n")
    print("wrote %d conversations to %s" % (len(chunk), os.path.join(out, name)))
