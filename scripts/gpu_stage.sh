#!/usr/bin/env bash
# Stages what scripts/gpu_check.sh needs into a carry folder of the coordinator's checkout:
#   scripts/gpu_stage.sh BUILD_DIR DEST   (e.g. build /work/main/.gpuz)
# The binaries are stripped and xz-compressed. Built without PTX (-DCMAKE_CUDA_ARCHITECTURES=
# 90-real, ~19 MB each) everything fits one folder, DEST, carried by one call. With PTX they are
# split over two folders, each carried by its own back-to-back call (the carried tree must stay
# under 64 MiB): DEST.b holds the smolrt binary and the fixtures, DEST the test binary.
# On the GPU machine copy each to /tmp/g at once, then unpack:
#   mkdir -p /tmp/g && cp -r DEST/* /tmp/g/          (and DEST.b/* when there is one)
#   for f in /tmp/g/*.xz; do xz -d "$f"; done; chmod +x /tmp/g/smolrt*; bash scripts/gpu_check.sh /tmp/g
set -euo pipefail
BUILD=${1:-build}
DEST=${2:?destination folder}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SHARED=${SMOLRT_FIXTURES:-$ROOT/../shared}
rm -rf "$DEST" "$DEST.b"
mkdir -p "$DEST" "$DEST.b/fixtures/models" "$DEST.b/fixtures/tokenizers/smollm2-135m"
strip -o "$DEST/smolrt_cuda_tests" "$BUILD/smolrt_cuda_tests"
strip -o "$DEST.b/smolrt" "$BUILD/smolrt"
xz -T0 -6 "$DEST/smolrt_cuda_tests" "$DEST.b/smolrt"
cp "$ROOT/scripts/gemma_prompts.txt" "$DEST.b/fixtures/"
cp "$SHARED/models/stories260K.gguf" "$DEST.b/fixtures/models/"
cp "$SHARED/tokenizers/smollm2-135m/tokenizer.json" "$SHARED/tokenizers/smollm2-135m/config.json" \
  "$DEST.b/fixtures/tokenizers/smollm2-135m/"
# prometheus-cpp core (`smolrt serve`'s metrics) has no static build in Debian: it goes next to
# smolrt, which looks there first (RPATH $ORIGIN).
prom=$(ldd "$BUILD/smolrt" | awk '/libprometheus-cpp-core/ {print $3}')
if [ -n "$prom" ]; then cp -L "$prom" "$DEST.b/"; fi
# A build without PTX (-DCMAKE_CUDA_ARCHITECTURES=90-real) is small enough for one carry: then
# everything goes in DEST and one call runs the whole check.
if [ "$(du -sb "$DEST" "$DEST.b" | awk '{s += $1} END {print s}')" -lt $((60 * 1024 * 1024)) ]; then
  mv "$DEST.b"/* "$DEST"/ && rmdir "$DEST.b"
  du -sh "$DEST"
else
  du -sh "$DEST" "$DEST.b"
fi
