#!/usr/bin/env python3
"""gguf-py (ggml's own Python package) as the oracle for smolrt's Q4_0 / Q4_1 / Q8_0 / F16 encoders.

Makes F32 sources (a seeded `smolrt synth --type f32` model and, when present, the stories260K
fixture), requantizes each with `smolrt quantize --type q4_0|q4_1|q8_0`, and requires every
quantized tensor to be byte-identical to gguf.quants.quantize() of the F32 source.
Exit 0: all equal; 1: a mismatch or a smolrt failure; 77: skipped (gguf/numpy not installed).
"""
import argparse
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import gguf
    from gguf import quants
    from gguf import GGMLQuantizationType as Q
except ImportError as e:  # the oracle is optional: scripts/test-requirements.txt installs it
    print(f"skipped: python package missing ({e}); pip install gguf", file=sys.stderr)
    sys.exit(77)


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"FAILED: {' '.join(cmd)}\n{r.stdout}{r.stderr}", file=sys.stderr)
        sys.exit(1)


def compare(src_path, quantized):
    src = {t.name: t for t in gguf.GGUFReader(src_path).tensors}
    checked = bad = 0
    for path in quantized:
        for t in gguf.GGUFReader(path).tensors:
            if t.tensor_type not in (Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.F16):
                continue
            s = src[t.name]
            if s.tensor_type != Q.F32:
                continue
            x = np.asarray(s.data, dtype=np.float32).reshape(-1, int(t.shape[0]))
            want = quants.quantize(x, t.tensor_type).tobytes()
            got = np.asarray(t.data).tobytes()
            checked += 1
            if want != got:
                bad += 1
                a, b = np.frombuffer(want, np.uint8), np.frombuffer(got, np.uint8)
                n = int((a != b).sum()) if a.size == b.size else -1
                print(f"MISMATCH {path} {t.name} {t.tensor_type.name}: {n} bytes differ",
                      file=sys.stderr)
    return checked, bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smolrt", required=True)
    ap.add_argument("--fixtures", default=os.environ.get("SMOLRT_FIXTURES", ""))
    a = ap.parse_args()
    total = failed = 0
    with tempfile.TemporaryDirectory(prefix="smolrt_quant_oracle_") as d:
        sources = [os.path.join(d, "synth_f32.gguf")]
        run([a.smolrt, "synth", "--preset", "tiny", "--type", "f32", "--seed", "11", "-o",
             sources[0]])
        stories = os.path.join(a.fixtures, "models", "stories260K.gguf") if a.fixtures else ""
        if stories and os.path.exists(stories):
            sources.append(stories)
        for i, src in enumerate(sources):
            outs = []
            for t in ("q4_0", "q4_1", "q8_0"):
                out = os.path.join(d, f"{i}_{t}.gguf")
                run([a.smolrt, "quantize", src, out, "--type", t, "--quiet"])
                outs.append(out)
            c, b = compare(src, outs)
            print(f"{os.path.basename(src)}: {c} tensors compared, {b} mismatched")
            total += c
            failed += b
    if total == 0:
        print("FAILED: nothing was compared", file=sys.stderr)
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
