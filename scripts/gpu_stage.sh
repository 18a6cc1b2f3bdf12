#!/usr/bin/env bash
# Stages what scripts/gpu_check.sh needs into a carry folder of the coordinator's checkout:
#   scripts/gpu_stage.sh BUILD_DIR DEST   (e.g. build /work/main/.gpuz)
# The binaries are stripped and xz-compressed (the carried tree must stay under 64 MiB); on the
# GPU machine unpack them first:
#   mkdir -p /tmp/g && cp -r DEST/* /tmp/g/ && for f in /tmp/g/*.xz; do xz -d "$f"; done
#   chmod +x /tmp/g/smolrt*; bash /tmp/g/gpu_check.sh /tmp/g
set -euo pipefail
BUILD=${1:-build}
DEST=${2:?destination folder}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SHARED=${SMOLRT_FIXTURES:-$ROOT/../shared}
rm -rf "$DEST"
mkdir -p "$DEST/fixtures/models" "$DEST/fixtures/tokenizers/smollm2-135m"
for b in smolrt smolrt_cuda_tests; do
  strip -o "$DEST/$b" "$BUILD/$b"
  xz -T0 -6 "$DEST/$b"
done
cp "$ROOT/scripts/gpu_check.sh" "$DEST/"
cp "$SHARED/models/stories260K.gguf" "$DEST/fixtures/models/"
cp "$SHARED/tokenizers/smollm2-135m/tokenizer.json" "$SHARED/tokenizers/smollm2-135m/config.json" \
  "$DEST/fixtures/tokenizers/smollm2-135m/"
# prometheus-cpp core (`smolrt serve`'s metrics) has no static build in Debian: it goes next to
# smolrt, which looks there first (RPATH $ORIGIN).
prom=$(ldd "$BUILD/smolrt" | awk '/libprometheus-cpp-core/ {print $3}')
if [ -n "$prom" ]; then cp -L "$prom" "$DEST/"; fi
du -sh "$DEST"
