#!/usr/bin/env bash
# The serving features' cost on the GPU machine (issue #32): a shared 1,000-token prompt prefix
# with the prefix cache on and off (time to first token, throughput), structured output on a
# 10-field JSON schema against free text at 64 clients, sampling (a temperature alone, and with
# top_p 0.9) against greedy at 64 clients, and one request of n = 8 choices against one of n = 1
# (at temperature 0.8: greedy choices are copies of one text).
# Usage, from the repository root: bash scripts/gpu_serve_features.sh SMOLRT MODEL
# JSON lines go to $OUT/serve_features.jsonl (one per measurement, with a "variant" key).
set -uo pipefail
. "$(dirname "$0")/gpu_lib.sh"
S=${1:?smolrt binary}
M=${2:?model}
OUT=${OUT:-/tmp/serve_features_out}
mkdir -p "$OUT"
J="$OUT/serve_features.jsonl"

# serve VARIANT [serve flags...] -- [bench_serve flags...]
serve() {
  local variant=$1
  shift
  serve_levels "$J" "{\"variant\": \"$variant\"}" "$S" "$M" --parallel 256 --ctx 2048 "$@"
}

serve prefix_cache_on -- --concurrency 64 --shared-prefix 1000 --prompt-ids 50
serve prefix_cache_off --no-prefix-cache -- --concurrency 64 --shared-prefix 1000 --prompt-ids 50
serve free_text -- --concurrency 64
serve json_schema_10 -- --concurrency 64 --response-format bench/schema_10_fields.json
serve sampled -- --concurrency 64 --temperature 0.8
serve sampled_top_p -- --concurrency 64 --temperature 0.8 --top-p 0.9
serve n1 -- --concurrency 1 --gen-tokens 128 --temperature 0.8
serve n8 -- --concurrency 1 --n 8 --gen-tokens 128 --temperature 0.8
