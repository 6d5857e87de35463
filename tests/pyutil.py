"""pyutil.py — what the Python tests share: their arguments (DTRAIN SRC TMP: the binary, the
source tree, a scratch directory) with a fresh directory of their own under TMP, check() that
prints a result and counts a failure, and dtrain() that runs the binary in the source tree and
stops the test at an exit status it did not expect. A test ends with `if failures:` (exit 1)."""
import os
import shutil
import subprocess
import sys

failures = []
DTRAIN = SRC = TMP = None


def start(name):
    """The test's DTRAIN, SRC and its fresh directory TMP/name, from sys.argv."""
    global DTRAIN, SRC, TMP
    DTRAIN, SRC, TMP = sys.argv[1], sys.argv[2], os.path.join(sys.argv[3], name)
    shutil.rmtree(TMP, ignore_errors=True)
    os.makedirs(TMP)
    return DTRAIN, SRC, TMP


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def dtrain(*args, want=0):
    """Runs DTRAIN args in SRC; want None: any exit status."""
    r = subprocess.run([DTRAIN, *args], capture_output=True, text=True, errors="replace", cwd=SRC)
    if want is not None and r.returncode != want:
        print(r.stdout[-3000:], r.stderr[-3000:])
        raise SystemExit("FAIL: dtrain %s: exit %d, expected %d" % (" ".join(args), r.returncode, want))
    return r
