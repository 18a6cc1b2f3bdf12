#!/usr/bin/env bash
# Served throughput of two smolrt builds, interleaved in one call on the GPU machine (A, B, A, B
# ...), so that both see the same GPU, clocks and client. Usage, from the repository root:
#   bash scripts/gpu_serve_ab.sh MODEL REPEATS NAME=BINARY[:FLAGS] ...
# e.g. old=/tmp/g/smolrt_old new=/tmp/g/smolrt "new-nof16=/tmp/g/smolrt:--no-f16-weights".
# Each variant serves with --parallel 256 --ctx 2048 and takes scripts/bench_serve.py at LEVELS
# (default 64,256); JSON lines go to $OUT/serve_ab.jsonl with a "variant" and a "repeat" key.
set -uo pipefail
M=${1:?model}
R=${2:?repeats}
shift 2
OUT=${OUT:-/tmp/serve_ab_out}
mkdir -p "$OUT"
J="$OUT/serve_ab.jsonl"
for rep in $(seq 1 "$R"); do
  for v in "$@"; do
    name=${v%%=*}
    spec=${v#*=}
    bin=${spec%%:*}
    flags=()
    [[ "$spec" == *:* ]] && read -r -a flags <<< "${spec#*:}"
    "$bin" serve -m "$M" --backend cuda --port 0 --no-log --parallel 256 --ctx 2048 "${flags[@]}" \
      2> /tmp/ab.log &
    sp=$! port=""
    for _ in $(seq 1 300); do
      port=$(grep -o "listening on http://[^ ]*" /tmp/ab.log | sed 's/.*://')
      [ -n "$port" ] && break
      sleep 0.2
    done
    if [ -z "$port" ]; then
      echo "$name: serve did not start"; tail -5 /tmp/ab.log; kill "$sp"; continue
    fi
    python3 scripts/bench_serve.py --port "$port" --concurrency "${LEVELS:-64,256}" \
      --out /tmp/ab.jsonl | sed "s/^/$name #$rep: /"
    python3 - "$name" "$rep" /tmp/ab.jsonl "$J" <<'PY'
import json, sys
with open(sys.argv[4], "a") as f:
    for line in open(sys.argv[3]):
        d = json.loads(line)
        d["variant"], d["repeat"] = sys.argv[1], int(sys.argv[2])
        f.write(json.dumps(d) + "\n")
PY
    rm -f /tmp/ab.jsonl
    kill -TERM "$sp"
    wait "$sp"
  done
done
