# Shared by the GPU-machine scripts (source it): gpu_prefill.sh, gpu_bench.sh,
# gpu_serve_ab.sh, gpu_serve_features.sh.

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

# serve_levels OUT TAGS BIN MODEL [serve flags...] -- [bench_serve.py flags...]
# Starts `BIN serve -m MODEL --port 0 --no-log` with the flags, runs scripts/bench_serve.py
# against it (from the repository root), appends its JSON lines to OUT with the keys of the JSON
# object TAGS added (e.g. '{"variant": "old"}'), prints one line per level, and stops the server
# (SIGTERM: it drains and exits). Returns 1 when the server does not start.
serve_levels() {
  local out=$1 tags=$2 bin=$3 model=$4
  shift 4
  local sflags=() port="" sp log=/tmp/serve_levels.log lines=/tmp/serve_levels.jsonl
  while [ $# -gt 0 ] && [ "$1" != -- ]; do sflags+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  "$bin" serve -m "$model" --port 0 --no-log "${sflags[@]}" 2> "$log" &
  sp=$!
  for _ in $(seq 1 300); do
    port=$(grep -o "listening on http://[^ ]*" "$log" | sed 's/.*://')
    [ -n "$port" ] && break
    sleep 0.2
  done
  if [ -z "$port" ]; then
    echo "serve did not start ($tags)"; tail -5 "$log"; kill "$sp"; return 1
  fi
  rm -f "$lines"
  python3 scripts/bench_serve.py --port "$port" "$@" --out "$lines" > /dev/null
  python3 - "$tags" "$lines" "$out" << 'PY'
import json, sys
tags = json.loads(sys.argv[1])
with open(sys.argv[3], "a") as f:
    for line in open(sys.argv[2]):
        d = json.loads(line)
        d.update(tags)
        f.write(json.dumps(d) + "\n")
        ttft = "-" if d["ttft_p50_s"] is None else "%.2f / %.2f ms" % (1e3 * d["ttft_p50_s"],
                                                                         1e3 * d["ttft_p99_s"])
        print(" ".join(str(v) for v in tags.values()), "C=%d:" % d["concurrency"],
              "%.0f tok/s, TTFT p50 / p99 %s, errors %d" % (d["gen_tok_s"] or 0, ttft, d["errors"]),
              "server", d.get("server"), flush=True)
PY
  kill -TERM "$sp"
  wait "$sp"
}
