#!/usr/bin/env bash
# A/B decode measurement on the GPU machine: bash scripts/ab_decode.sh DIR TAG
# DIR holds smolrt.xz (+ libprometheus); synth models are made once into /tmp (kept while the
# machine stays warm), then `bench-decode` runs on each; JSON lines and logs go to $OUT.
set -uo pipefail
DIR=$1 TAG=$2
B=/tmp/bin-$TAG
mkdir -p "$B" && cp -r "$DIR"/* "$B"/ && (cd "$B" && xz -df smolrt.xz && chmod +x smolrt)
export LD_LIBRARY_PATH=$B
S=$B/smolrt
declare -A PRESET=([m17]="smollm2-1.7b q4_k_m" [gm]="gemma3-270m q4_k_m" [s135]="smollm-135m q4_0"
  [l1b]="llama-3.2-1b q4_k_m")
for m in ${MODELS:-m17 gm s135 l1b}; do
  set -- ${PRESET[$m]}
  [ -f /tmp/$m.gguf ] || "$S" synth --preset "$1" --type "$2" -o /tmp/$m.gguf > /dev/null
  "$S" bench-decode -m /tmp/$m.gguf --json "$OUT/$TAG.jsonl" > "$OUT/${TAG}_$m.log" 2>&1
  grep -m1 "graph+pdl (default)" "$OUT/${TAG}_$m.log" | sed "s/^/$TAG $m /"
done
