#!/usr/bin/env bash
# Served throughput of two smolrt builds, interleaved in one call on the GPU machine (A, B, A, B
# ...), so that both see the same GPU, clocks and client. Usage, from the repository root:
#   bash scripts/gpu_serve_ab.sh MODEL REPEATS NAME=BINARY[:FLAGS] ...
# e.g. old=/tmp/g/smolrt_old new=/tmp/g/smolrt "new-nof16=/tmp/g/smolrt:--no-f16-weights".
# Each variant serves with --parallel 256 --ctx 2048 and takes scripts/bench_serve.py at LEVELS
# (default 64,256); JSON lines go to $OUT/serve_ab.jsonl with a "variant" and a "repeat" key.
set -uo pipefail
. "$(dirname "$0")/gpu_lib.sh"
M=${1:?model}
R=${2:?repeats}
shift 2
OUT=${OUT:-/tmp/serve_ab_out}
mkdir -p "$OUT"
for rep in $(seq 1 "$R"); do
  for v in "$@"; do
    name=${v%%=*}
    spec=${v#*=}
    flags=()
    [[ "$spec" == *:* ]] && read -r -a flags <<< "${spec#*:}"
    serve_levels "$OUT/serve_ab.jsonl" "{\"variant\": \"$name\", \"repeat\": $rep}" \
      "${spec%%:*}" "$M" --parallel 256 --ctx 2048 "${flags[@]}" -- --concurrency "${LEVELS:-64,256}"
  done
done
