#!/usr/bin/env bash
# The serving features' cost on the GPU machine (issue #32): a shared 1,000-token prompt prefix
# with the prefix cache on and off (time to first token, throughput), structured output on a
# 10-field JSON schema against free text at 64 clients, and one request of n = 8 choices against
# one of n = 1. Usage, from the repository root: bash scripts/gpu_serve_features.sh SMOLRT MODEL
# JSON lines go to $OUT/serve_features.jsonl (one per measurement, with a "variant" key).
set -uo pipefail
S=${1:?smolrt binary}
M=${2:?model}
OUT=${OUT:-/tmp/serve_features_out}
mkdir -p "$OUT"
J="$OUT/serve_features.jsonl"

# serve VARIANT [serve flags...] -- [bench_serve flags...]
serve() {
  local variant=$1
  shift
  local sflags=() port="" sp
  while [ $# -gt 0 ] && [ "$1" != -- ]; do sflags+=("$1"); shift; done
  shift
  "$S" serve -m "$M" --port 0 --no-log --parallel 256 --ctx 2048 "${sflags[@]}" 2> /tmp/sf.log &
  sp=$!
  for _ in $(seq 1 300); do
    port=$(grep -o "listening on http://[^ ]*" /tmp/sf.log | sed 's/.*://')
    [ -n "$port" ] && break
    sleep 0.2
  done
  if [ -z "$port" ]; then
    echo "serve did not start ($variant)"; tail -5 /tmp/sf.log; kill "$sp"; return
  fi
  python3 scripts/bench_serve.py --port "$port" "$@" --out /tmp/sf.jsonl \
    | sed "s/^/$variant: /"
  python3 - "$variant" /tmp/sf.jsonl "$J" <<'PY'
import json, sys
with open(sys.argv[3], "a") as f:
    for line in open(sys.argv[2]):
        d = json.loads(line); d["variant"] = sys.argv[1]; f.write(json.dumps(d) + "\n")
PY
  rm -f /tmp/sf.jsonl
  kill -TERM "$sp"
  wait "$sp"
}

serve prefix_cache_on -- --concurrency 64 --shared-prefix 1000 --prompt-ids 50
serve prefix_cache_off --no-prefix-cache -- --concurrency 64 --shared-prefix 1000 --prompt-ids 50
serve free_text -- --concurrency 64
serve json_schema_10 -- --concurrency 64 --response-format bench/schema_10_fields.json
serve n1 -- --concurrency 1 --gen-tokens 128
serve n8 -- --concurrency 1 --n 8 --gen-tokens 128
