#!/usr/bin/env python3
"""gguf-py (ggml's own Python package) as the oracle for smolrt's encoders and decoders.

1. Quantize, byte-identical: makes F32 sources (a seeded `smolrt synth --type f32` model and, when
   present, the stories260K fixture), requantizes each with `smolrt quantize --type T` for every
   type gguf-py can quantize (q4_0, q4_1, q5_0, q5_1, q8_0, bf16; f16 tensors appear as
   fall-backs) and requires every such tensor to equal gguf.quants.quantize() of the F32 source.
   gguf-py 0.19 has no K-quant quantizer (Q4_K/Q5_K/Q6_K raise NotImplementedError): those are
   checked in tests/test_quantize_formats.cpp (golden digests from ggml's C reference, bounds).
2. Dequantize, bit-exact, for all 11 types: writes a GGUF of random raw blocks (random bytes with
   finite fp16/bf16 scale fields) of every type, converts it with `smolrt quantize --type f32`, and
   requires every F32 value to have the bits of gguf.quants.dequantize() of the raw blocks.
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


# Types gguf-py 0.19 quantizes itself (the K-quants raise NotImplementedError).
QUANTIZABLE = (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.F16, Q.BF16)
TARGETS = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "bf16")
# Every type smolrt decodes, with the byte offsets of its fp16 scale fields in a block.
DECODABLE = {Q.F32: None, Q.F16: None, Q.BF16: None, Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,),
             Q.Q5_1: (0, 2), Q.Q8_0: (0,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}


def random_raw(qtype, rows, cols, rng):
    """rows x cols elements of qtype as raw bytes: random, with finite scales and values."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    if qtype == Q.F32:
        return rng.standard_normal((rows, cols)).astype(np.float32)
    if qtype in (Q.F16, Q.BF16):
        x = rng.standard_normal((rows, cols)).astype(np.float32) * 4
        return quants.quantize(x, qtype)
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    for off in DECODABLE[qtype]:
        # |scale| in [2^-14, 2^3], either sign: normal fp16 values
        mag = np.exp2(rng.uniform(-14, 3, size=(rows, cols // block))).astype(np.float16)
        sign = np.where(rng.integers(0, 2, size=mag.shape) == 1, -1, 1).astype(np.float16)
        raw[:, :, off:off + 2] = (mag * sign).view(np.uint8).reshape(rows, cols // block, 2)
    return raw.reshape(rows, -1)


def check_dequantize(smolrt, d):
    """Writes raw random blocks of every type, has smolrt convert them to F32, compares bits."""
    rng = np.random.default_rng(7)
    src = os.path.join(d, "raw_blocks.gguf")
    w = gguf.GGUFWriter(src, "llama")
    raws = {}
    for qtype in DECODABLE:
        rows, cols = 6, 512
        raw = random_raw(qtype, rows, cols, rng)
        name = f"raw_{qtype.name.lower()}.weight"
        raws[name] = (qtype, raw)
        if qtype == Q.F32:
            w.add_tensor(name, raw)
        else:
            w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out = os.path.join(d, "raw_blocks_f32.gguf")
    run([smolrt, "quantize", src, out, "--type", "f32", "--quiet"])
    got = {t.name: t for t in gguf.GGUFReader(out).tensors}
    checked = bad = 0
    for name, (qtype, raw) in raws.items():
        t = got[name]
        want = quants.dequantize(raw, qtype).astype(np.float32).reshape(-1)
        have = np.asarray(t.data, dtype=np.float32).reshape(-1)
        checked += 1
        if t.tensor_type != Q.F32 or want.shape != have.shape or \
                not np.array_equal(want.view(np.uint32), have.view(np.uint32)):
            bad += 1
            n = int((want.view(np.uint32) != have.view(np.uint32)).sum()) \
                if want.shape == have.shape else -1
            print(f"DEQUANT MISMATCH {qtype.name}: {n} values differ", file=sys.stderr)
    print(f"dequantize: {checked} types compared bit for bit ("
          f"{', '.join(q.name for q in DECODABLE)}), {bad} mismatched")
    return checked, bad


def compare(src_path, quantized):
    src = {t.name: t for t in gguf.GGUFReader(src_path).tensors}
    checked = bad = 0
    for path in quantized:
        for t in gguf.GGUFReader(path).tensors:
            if t.tensor_type not in QUANTIZABLE:
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
            for t in TARGETS:
                out = os.path.join(d, f"{i}_{t}.gguf")
                run([a.smolrt, "quantize", src, out, "--type", t, "--quiet"])
                outs.append(out)
            c, b = compare(src, outs)
            print(f"{os.path.basename(src)}: {c} tensors compared, {b} mismatched")
            total += c
            failed += b
        c, b = check_dequantize(a.smolrt, d)
        total += c
        failed += b
    if total == 0:
        print("FAILED: nothing was compared", file=sys.stderr)
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
