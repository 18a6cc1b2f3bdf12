#!/usr/bin/env bash
# The serving features' cost on the GPU machine (issue #32): a shared 1,000-token prompt prefix
# with the prefix cache on and off (time to first token, throughput), structured output on a
# 10-field JSON schema against free text at 64 clients, sampling (a temperature alone, and with
# top_p 0.9) against greedy at 64 clients, and one request of n = 8 choices against one of n = 1
# (at temperature 0.8: greedy choices are copies of one text).
# Usage, from the repository root: bash scripts/gpu_serve_features.sh SMOLRT MODEL
#   PREFIX_GEN="32 128"  answer lengths of the prefix-cache comparison (default 128)
#   PREFIX_FLAGS=...     more bench_serve.py flags for it (e.g. --requests-per-client 8)
#   PARTS="prefix"       only the prefix-cache comparison (default: prefix features)
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

if [[ " ${PARTS:-prefix features} " == *" prefix "* ]]; then
  # The prefix cache at each answer length of PREFIX_GEN (generated tokens per request; what a
  # request decodes after its prompt decides how much of the work the cached prefill was).
  for g in ${PREFIX_GEN:-128}; do
    P=(--concurrency 64 --shared-prefix 1000 --prompt-ids 50 --gen-tokens "$g")
    serve prefix_cache_on -- "${P[@]}" ${PREFIX_FLAGS:-}
    serve prefix_cache_off --no-prefix-cache -- "${P[@]}" ${PREFIX_FLAGS:-}
  done
fi
[[ " ${PARTS:-prefix features} " == *" features "* ]] || exit 0
serve free_text -- --concurrency 64
serve json_schema_10 -- --concurrency 64 --response-format bench/schema_10_fields.json
serve sampled -- --concurrency 64 --temperature 0.8
serve sampled_top_p -- --concurrency 64 --temperature 0.8 --top-p 0.9
serve n1 -- --concurrency 1 --gen-tokens 128 --temperature 0.8
serve n8 -- --concurrency 1 --n 8 --gen-tokens 128 --temperature 0.8
