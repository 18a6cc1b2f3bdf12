#!/usr/bin/env bash
# Quick batched-prefill GPU check (faster than gpu_check.sh while iterating on prefill kernels):
#   bash scripts/gpu_prefill.sh DIR      (DIR from scripts/gpu_stage.sh; logs under $OUT)
# Runs the GEMM and prefill tests, bench_prefill (per-kernel and whole-prefill times) and
# `smolrt bench` on a synth model. With NCU=1 it also profiles each layer GEMM at 32 and 512
# tokens with Nsight Compute (speed of light, warp states, occupancy).
set -uo pipefail
D=${1:?folder made by gpu_stage.sh}
OUT=${OUT:-/tmp/gpu_prefill_out}
mkdir -p "$OUT"
. "$(dirname "$0")/gpu_lib.sh"
gpu_setup "$D"
timeout 240 "$D/smolrt_cuda_tests" --gtest_filter='*Gemm*:*Prefill*' > "$OUT/tests.log" 2>&1
grep -E "^\[  (FAILED|PASSED) |tests ran" "$OUT/tests.log" | head -30
timeout 90 "$D/bench_prefill" --reps 20 --tokens 1,8,16,32,33,64,128,512 \
  --json "$OUT/bench_prefill.jsonl" 2>&1 | tee "$OUT/bench_prefill.log"
timeout 100 "$D/smolrt" bench -m "$SYNTH" --backend cuda --prompt-lengths 32,128,512 \
  --gen-length 64 --iterations 3 --json > "$OUT/bench.jsonl" 2> "$OUT/bench.err"
bench_summary "$OUT/bench.jsonl" || tail -5 "$OUT/bench.err"
if [ "${NCU:-0}" = 1 ] && command -v ncu > /dev/null; then
  # bench_prefill's per-layer loop launches each GEMM 20 x (3 warm-up + reps) times, in the
  # order qkv, wo, gate_up, down.
  N="ncu --clock-control none -k regex:gemm_kernel --section SpeedOfLight --section Occupancy"
  N="$N --section LaunchStats --metrics smsp__inst_executed.sum,sm__cycles_active.avg,"
  N="${N}regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio"
  for T in 32 512; do
    for i in 0 1 2 3; do
      timeout 60 $N --launch-skip $((i * 80)) -c 1 "$D/bench_prefill" --reps 1 --tokens $T \
        > /tmp/ncu.txt 2>&1
      cat /tmp/ncu.txt >> "$OUT/ncu.txt"  # one file: at most 8 come back from $OUT
      grep -E "Duration|Achieved Occupancy|Grid Size|Block Size|inst_executed|cycles_active" \
        /tmp/ncu.txt | tr -s ' ' | paste -sd' ' | sed "s/^/T=$T gemm $i: /"
      grep -E "stalled" /tmp/ncu.txt | awk '$NF > 0.3 {print "   ", $1, $NF}' |
        sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//'
    done
  done
fi
