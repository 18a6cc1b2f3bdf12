#!/usr/bin/env bash
# The main job (`make run`): generate with the default model, then benchmark it. Without the
# default model (offline), the synthetic SmolLM-135M-shaped model stands in.
set -euo pipefail
SMOLRT=${1:-build/smolrt}
MODEL_ARGS=()
if ! "$SMOLRT" info > /dev/null 2>&1; then
  echo "main job: default model missing; using the synthetic SmolLM-135M-shaped model" >&2
  SYNTH=${SMOLRT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/smolrt}/main-job-synth.gguf
  [ -f "$SYNTH" ] || "$SMOLRT" synth --preset smollm-135m --type q4_0 -o "$SYNTH"
  MODEL_ARGS=(-m "$SYNTH")
fi
"$SMOLRT" info "${MODEL_ARGS[@]}"
echo
PROMPT=$'<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n'
"$SMOLRT" run "${MODEL_ARGS[@]}" -p "$PROMPT" -n 48 --temp 0
echo
if command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; then
  "$SMOLRT" bench "${MODEL_ARGS[@]}" --prompt-lengths 32,128,512 --gen-length 128 --iterations 5
else
  # The fast CPU path (int8 SIMD kernels; docs/cpu.md): ~200 tok/s decode on 2 idle cores.
  "$SMOLRT" bench "${MODEL_ARGS[@]}" --backend cpu --prompt-lengths 32,128 --gen-length 64 \
    --iterations 3
fi
