#!/usr/bin/env bash
# Prefill knob sweep at one prompt length (default 32): for each environment setting in $SWEEP
# (';'-separated), bench_prefill's whole-prefill time and `smolrt bench` prefill tok/s.
#   SWEEP="SMOLRT_GEMM_STAGE_KB=4096;SMOLRT_GEMM_NT=2" bash scripts/gpu_sweep.sh DIR [tokens]
set -uo pipefail
D=${1:?folder made by gpu_stage.sh}
T=${2:-32}
. "$(dirname "$0")/gpu_lib.sh"
gpu_setup "$D"
IFS=';' read -ra CONFIGS <<< "${SWEEP:-X=1}"
for rep in 1 2; do
  for c in "${CONFIGS[@]}"; do
    g=$(env $c timeout 30 "$D/bench_prefill" --reps 20 --tokens "$T" | grep -E "^ +$T +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9]+ " | awk '{print $2}')
    b=$(env $c timeout 30 "$D/smolrt" bench -m "$SYNTH" --backend cuda --prompt-lengths "$T" \
      --gen-length 16 --iterations 7 --json 2>/dev/null |
      python3 -c "import json,sys; print(round(json.loads(sys.stdin.readline())['prefill_tok_s']['median']))")
    echo "rep $rep | $c | bench_prefill ${g} ms | smolrt bench ${b} tok/s"
  done
done
