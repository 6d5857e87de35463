#!/usr/bin/env python3
"""test_troubleshooting.py SRC — docs/troubleshooting.md and the tests agree.

Every table row of the page names, in its first column, what dtrain prints (backticked
fragments, up to the first parenthesis outside backticks) and, in its last column, the test
that produces it. Each fragment must appear, as text, in that test: in a C test inside its
string literals (adjacent literals joined, escapes undone), in a shell test anywhere. So a
message changed in the program fails its test, and a message changed in its test fails here
until the page says the same. The page must also keep all five symptoms of the article's table.
"""
import re
import sys

SYMPTOMS = ["只有一张GPU被使用", "训练卡在启动阶段", "显存溢出", "多卡比单卡还慢", "各worker指标不一致"]


def cells(row):
    """The cells of a markdown table row: split at | outside backticks (\\| is a literal bar)."""
    out, cur, tick, i = [], "", False, 0
    row = row.strip().strip("|")
    while i < len(row):
        ch = row[i]
        if ch == "\\" and i + 1 < len(row) and row[i + 1] == "|":
            cur += "|"
            i += 2
            continue
        if ch == "`":
            tick = not tick
        if ch == "|" and not tick:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
        i += 1
    out.append(cur.strip())
    return out


def fragments(cell):
    """Backticked spans before the first '(' outside backticks."""
    spans, cur, tick = [], None, False
    for ch in cell:
        if ch == "`":
            if tick:
                spans.append(cur)
            tick, cur = not tick, ""
        elif tick:
            cur += ch
        elif ch == "(":
            break
    return spans


def c_text(source):
    """The text of a C file's string literals, adjacent ones joined, escapes undone."""
    lits = re.findall(r'"((?:[^"\\\n]|\\.)*)"', source)
    joined = "".join(lits)
    return joined.encode().decode("unicode_escape").encode("latin-1").decode("utf-8")


def main():
    src = sys.argv[1]
    page = open(f"{src}/docs/troubleshooting.md", encoding="utf-8").read()
    bad = [s for s in SYMPTOMS if s not in page]
    rows = 0
    texts = {}
    for line in page.splitlines():
        if not line.startswith("| `"):
            continue
        c = cells(line)
        tests = re.findall(r"`(tests/[^`]+)`", c[-1])
        frags = fragments(c[0])
        if not tests or not frags:
            bad.append(f"row without a message or a test: {line[:80]}")
            continue
        rows += 1
        for t in tests:
            if t not in texts:
                try:
                    raw = open(f"{src}/{t}", encoding="utf-8").read()
                except OSError as e:
                    bad.append(f"{t}: {e}")
                    continue
                # a C test's messages are in its literals (split over lines); a script's in its
                # lines of code (not in comments)
                texts[t] = c_text(raw) if t.endswith(".c") else "\n".join(
                    line for line in raw.splitlines() if not line.lstrip().startswith("#"))
            for f in frags:
                if t in texts and f not in texts[t]:
                    bad.append(f"{t} does not check the text `{f}`")
    if rows < 5:
        bad.append(f"only {rows} message rows")
    for b in bad:
        print("FAIL:", b)
    if bad:
        return 1
    print(f"test_troubleshooting: {rows} messages, each checked by its test")
    return 0


if __name__ == "__main__":
    sys.exit(main())
