# Shared by the GPU-machine scripts (source it): gpu_prefill.sh, gpu_bench.sh.

# gpu_setup DIR: prints the GPU's name and clocks; fixtures from DIR (made by gpu_stage.sh); the
# synth SmolLM-135M Q4_0 model generated on the machine (too big to carry) at $SYNTH, exported as
# SMOLRT_SYNTH_MODEL too.
gpu_setup() {
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
  export SMOLRT_FIXTURES="$1/fixtures"
  SYNTH=/tmp/synth-smollm-135m-q4_0.gguf
  "$1/smolrt" synth --preset smollm-135m --type q4_0 \
    --tokenizer "$1/fixtures/tokenizers/smollm2-135m/tokenizer.json" -o "$SYNTH" > /dev/null
  export SMOLRT_SYNTH_MODEL=$SYNTH
}

# bench_summary FILE: one line per `smolrt bench --json` line of FILE (other lines skipped).
bench_summary() {
  python3 - "$1" << 'PY'
import json, sys
for line in open(sys.argv[1]):
    j = json.loads(line)
    if 'prompt_length' in j:
        print(j.get('config', 'default'), j['model'][-30:], 'pp%d' % j['prompt_length'],
              'prefill %.0f tok/s' % j['prefill_tok_s']['median'],
              'decode %.1f tok/s' % j['decode_tok_s']['median'])
PY
}
