#!/usr/bin/env bash
# Builds every libFuzzer target (fuzz/fuzz_*.cpp) with clang + ASan/UBSan in build-fuzz and runs
# each for the given seconds. Exits non-zero on any crash, sanitizer report, leak, timeout or OOM.
#   [SMOLRT_FUZZ_BUILD=dir] scripts/fuzz.sh [seconds-per-target]   (default 30, dir build-fuzz)
# Crashing inputs land in build-fuzz/artifacts/; reproduce with ./build-fuzz/<target> <file>.
set -euo pipefail
SECONDS_EACH=${1:-30}
cd "$(dirname "$0")/.."
ROOT=$(pwd)
B=${SMOLRT_FUZZ_BUILD:-build-fuzz}  # build dir; set it to keep several checkouts apart
case "$B" in /*) ;; *) B=./$B ;; esac  # absolute or relative to the checkout; "$B/$t" runs a target
FIX=${SMOLRT_FIXTURES:-$ROOT/../shared}

if ! command -v clang++ >/dev/null; then
  echo "fuzz: clang++ not found; install clang to run the fuzzers" >&2
  exit 1
fi

GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
CC=clang CXX=clang++ cmake -S . -B "$B" "${GEN[@]}" -DSMOLRT_FUZZ=ON -DSMOLRT_CUDA=OFF \
  -DSMOLRT_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null

TARGETS=()
for src in fuzz/fuzz_*.cpp; do
  [ -e "$src" ] || continue
  TARGETS+=("$(basename "$src" .cpp)")
done
if [ ${#TARGETS[@]} -eq 0 ]; then
  echo "fuzz: no fuzz/fuzz_*.cpp targets" >&2
  exit 1
fi
cmake --build "$B" -j "${SMOLRT_JOBS:-2}" --target "${TARGETS[@]}"

mkdir -p "$B/artifacts"
status=0
for t in "${TARGETS[@]}"; do
  seeds="$B/seeds/$t"
  corpus="$B/corpus/$t"  # grows across runs
  rm -rf "$seeds"
  mkdir -p "$seeds" "$corpus"
  [ -d "fuzz/seeds/$t" ] && cp fuzz/seeds/"$t"/* "$seeds"/ 2>/dev/null || true
  extra=()
  case "$t" in
    fuzz_gguf)
      python3 fuzz/make_seeds.py "$seeds"
      # The real files, cut to their first 64 KiB (header, metadata start) to keep runs fast.
      for g in "$FIX"/models/*.gguf "$FIX"/vocab/*.gguf; do
        [ -f "$g" ] && head -c 65536 "$g" >"$seeds/$(basename "$g")"
      done
      extra=(-max_len=65536)
      ;;
    *)
      # Text targets: the tokenizer test strings, one seed per file.
      for inp in "$FIX"/vocab/*.inp; do
        [ -f "$inp" ] && cp "$inp" "$seeds/$(basename "$inp")"
      done
      ;;
  esac
  echo "fuzz: $t for ${SECONDS_EACH}s ($(ls "$seeds" | wc -l) seeds, $(ls "$corpus" | wc -l) corpus)"
  if ! SMOLRT_FIXTURES="$FIX" "$B/$t" "$corpus" "$seeds" -max_total_time="$SECONDS_EACH" \
      -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "${extra[@]}" \
      -artifact_prefix="$B/artifacts/$t-" 2>"$B/$t.log"; then
    echo "fuzz: $t FAILED; last lines of $B/$t.log:" >&2
    tail -n 40 "$B/$t.log" >&2
    status=1
  else
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$B/$t.log" | sed "s/^/fuzz: $t /"
  fi
done
exit $status
