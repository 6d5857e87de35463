#!/usr/bin/env bash
# test.sh — sets everything up (scripts/setup.sh, with the test tools: python3 and tensorboard in
# BUILD_DIR/venv) and runs the whole test suite with ctest.
# GPU tests (label gpu) skip without a device. Extra arguments go to ctest (e.g. -L unit).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
DTRAIN_TEST_TOOLS=1 scripts/setup.sh
cd "$BUILD_DIR"
ctest --output-on-failure --timeout 1200 "$@"
