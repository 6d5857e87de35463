#!/usr/bin/env python3
"""test_layers.py SRC — the layering rule of docs/architecture.md, checked on the tree SRC:

1. Every module lives in one layer folder of src/ (base < io < comm < ops < model < run, then
   src/main.c on top). A source file and a header may include the headers of modules in their
   own layer and the layers below, never above. A header belongs to the layer of its module's
   source (include/dtrain/NAME.h <-> src/LAYER/NAME.c); ops.h, the backend interface, to ops.
2. The CUDA backend is named only by its own files and the registry: outside
   src/ops/ops_cuda.c, src/comm/comm_nccl.c and src/ops/backend.c nothing in src/ or include/
   tests for a CUDA build, calls a CUDA, cuBLAS, cuDNN or NCCL function, includes their headers
   or the kernels' (kernels/dtk.h), or names the CUDA backend's own symbols.
3. No function in src/ is longer than 120 lines.
Prints every violation with file:line and exits 1 if there is one."""
import os
import re
import sys

LAYERS = ["base", "io", "comm", "ops", "model", "run"]  # lowest first; src/main.c is above all
HEADER_ONLY = {"ops": "ops"}  # headers without a source of their own: their layer
CUDA_FILES = {"src/ops/ops_cuda.c", "src/comm/comm_nccl.c", "src/ops/backend.c"}
CUDA_NAMES = re.compile(
    r"\bDTRAIN_HAVE_CUDA\b|\bdt_ops_cuda\w*|\bdt_cuda_\w+|#\s*include\s*[<\"](cuda|cublas|cudnn|nccl)\w*\.h|"
    r"#\s*include\s*\"dtk\.h\"|\bdtk_\w+\s*\(|\bcuda[A-Z]\w*\s*\(|\bcublasLt\w*\s*\(|\bnccl[A-Z]\w*\s*\(|"
    r"\bdt_comm_init_nccl\s*\(")
MAX_FUNCTION_LINES = 120
INCLUDE = re.compile(r'^\s*#\s*include\s*"dtrain/(\w+)\.h"')


def strip_comments(text):
    """the text with comments and string literals blanked (lines kept)"""
    def blank(m):
        return re.sub(r"[^\n]", " ", m.group(0))
    return re.sub(r'/\*.*?\*/|//[^\n]*|"(\\.|[^"\\\n])*"', blank, text, flags=re.S)


def function_lengths(text):
    """(name, first line, lines) of every function defined at file scope"""
    code = strip_comments(text)
    out, depth, start, name = [], 0, None, None
    lines = code.split("\n")
    for i, line in enumerate(lines):
        for j, ch in enumerate(line):
            if ch == "{":
                if depth == 0:
                    head = " ".join(lines[max(0, i - 4):i]) + " " + line[:j]
                    m = re.search(r"(\w+)\s*\([^;{}]*\)\s*(__attribute__\s*\(\(.*\)\))?\s*$", head)
                    is_fn = m is not None and not re.search(r"=\s*$|\b(struct|enum|union)\s+\w*\s*$", head)
                    start, name = (i, m.group(1)) if is_fn else (None, None)
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0 and start is not None:
                    out.append((name, start + 1, i - start + 1))
                    start = None
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    os.chdir(root)
    problems = []
    layer_of = {}  # module -> layer index (src/main.c: len(LAYERS))
    sources = []
    for layer in os.listdir("src"):
        path = os.path.join("src", layer)
        if os.path.isfile(path):
            if layer != "main.c":
                problems.append(f"{path}: a source outside the layer folders {', '.join(LAYERS)}")
            continue
        if layer not in LAYERS:
            problems.append(f"{path}/: not a layer of docs/architecture.md ({', '.join(LAYERS)})")
            continue
        for f in sorted(os.listdir(path)):
            if f.endswith(".c"):
                layer_of[f[:-2]] = LAYERS.index(layer)
                sources.append(os.path.join(path, f))
    for name, layer in HEADER_ONLY.items():
        layer_of[name] = LAYERS.index(layer)
    # comm_mpi.h, comm_plan.h ... have sources; a header whose module has none (and is not listed) is an error
    headers = sorted(os.path.join("include/dtrain", h) for h in os.listdir("include/dtrain") if h.endswith(".h"))
    for h in headers:
        if os.path.basename(h)[:-2] not in layer_of:
            problems.append(f"{h}: no module src/LAYER/{os.path.basename(h)[:-2]}.c, and not in HEADER_ONLY")
    for path in sources + ["src/main.c"] + headers:
        mod = os.path.basename(path)[:-2]
        own = len(LAYERS) if path == "src/main.c" else layer_of.get(mod)
        if own is None:
            continue
        text = open(path, encoding="utf-8").read()
        for n, line in enumerate(text.split("\n"), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            dep = m.group(1)
            if dep not in layer_of:
                problems.append(f"{path}:{n}: includes dtrain/{dep}.h, which is no module")
            elif layer_of[dep] > own:
                where = "src/main.c" if own == len(LAYERS) else LAYERS[own]
                problems.append(f"{path}:{n}: {where} includes dtrain/{dep}.h of the layer above it, "
                                f"{LAYERS[layer_of[dep]]} (docs/architecture.md)")
        if path not in CUDA_FILES:
            code = strip_comments(text) if path.endswith(".c") or path.endswith(".h") else text
            for n, line in enumerate(code.split("\n"), 1):
                m = CUDA_NAMES.search(line)
                if m and not (path == "include/dtrain/comm.h" and "dt_comm_init_nccl" in m.group(0)):
                    problems.append(f"{path}:{n}: names the CUDA backend ({m.group(0).strip()}): only "
                                    f"{', '.join(sorted(CUDA_FILES))} may")
        if path.endswith(".c"):
            for name, first, lines in function_lengths(text):
                if lines > MAX_FUNCTION_LINES:
                    problems.append(f"{path}:{first}: {name} is {lines} lines (at most {MAX_FUNCTION_LINES})")
    for p in problems:
        print(p)
    longest = max((fl for s in sources + ["src/main.c"] for fl in function_lengths(open(s).read())),
                  key=lambda t: t[2])
    print(f"{len(sources) + 1} sources, {len(headers)} headers in {len(LAYERS)} layers; "
          f"the longest function: {longest[0]} ({longest[2]} lines)")
    if problems:
        print(f"test_layers: {len(problems)} violation(s) of the layering rule")
        return 1
    print("test_layers: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
