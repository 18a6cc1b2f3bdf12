#!/usr/bin/env bash
# Benchmark-only GPU run (after a full scripts/gpu_check.sh passed on the same kernels): every
# GPU test, `smolrt bench-decode`, `smolrt bench` on the synth model and, with SMOLRT_REAL_MODEL,
# on the real one. JSON lines in $OUT/bench.jsonl.
#   bash scripts/gpu_bench.sh DIR
set -uo pipefail
D=${1:?folder made by gpu_stage.sh}
OUT=${OUT:-/tmp/gpu_bench_out}
mkdir -p "$OUT"
. "$(dirname "$0")/gpu_lib.sh"
gpu_setup "$D"
SMOLRT_MODEL=${SMOLRT_REAL_MODEL:-} timeout 240 "$D/smolrt_cuda_tests" > "$OUT/tests.log" 2>&1
grep -E "^\[  (FAILED|PASSED|SKIPPED) |tests ran" "$OUT/tests.log"
timeout 90 "$D/smolrt" bench-decode -m "$SYNTH" --json "$OUT/bench.jsonl" | head -4
B="--backend cuda --prompt-lengths 32,128,512 --gen-length 128 --iterations 5 --json"
timeout 120 "$D/smolrt" bench -m "$SYNTH" $B >> "$OUT/bench.jsonl"
if [ -n "${SMOLRT_REAL_MODEL:-}" ]; then
  timeout 120 "$D/smolrt" bench -m "$SMOLRT_REAL_MODEL" $B >> "$OUT/bench.jsonl"
fi
bench_summary "$OUT/bench.jsonl"
