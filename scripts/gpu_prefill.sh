#!/usr/bin/env bash
# Batched-prefill GPU check: every prefill test, compute-sanitizer (memcheck + racecheck) on a
# subset, then bench_prefill. Run on the GPU machine from a carried folder holding the binaries:
#   bash .gpu-prefill/gpu_prefill.sh        (logs and JSON under $OUT, or ./gpu-out)
# Section for scripts/gpu_check.sh: the three steps below, with D = the folder of the binaries.
set -uo pipefail
D=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/nvsmi.txt"
rc=0
echo "== tests"
"$D/smolrt_cuda_tests" --gtest_brief=1 2>&1 | tee "$OUT/tests.log" | tail -40 || rc=1
grep -E "PASSED|FAILED|SKIPPED" "$OUT/tests.log" | tail -5
echo "== compute-sanitizer memcheck (subset)"
SUB='Batch/GemmTokens.*/1:Batch/AttnTokens.*/1:Prompt/PrefillForward.*/1:PrefillForwardCache.BadInputIsAnError'
timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 "$D/smolrt_cuda_tests" \
  --gtest_brief=1 --gtest_filter="$SUB" > "$OUT/memcheck.log" 2>&1; echo "memcheck rc=$?"
tail -4 "$OUT/memcheck.log"
echo "== compute-sanitizer racecheck (attention, tensor-core GEMM)"
timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 "$D/smolrt_cuda_tests" \
  --gtest_brief=1 --gtest_filter='Batch/AttnTokens.*/1:Batch/GemmTokens.SiluPair*/2' \
  > "$OUT/racecheck.log" 2>&1; echo "racecheck rc=$?"
tail -4 "$OUT/racecheck.log"
echo "== bench"
"$D/bench_prefill" --reps ${REPS:-50} --json "$OUT/bench_prefill.jsonl" 2>&1 | tee "$OUT/bench.log"
exit $rc
