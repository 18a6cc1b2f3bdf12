#!/usr/bin/env python3
"""A float64 llama forward pass outside the engine, as the oracle for smolrt's logits.

numpy + gguf-py (gguf.GGUFReader, gguf.quants.dequantize) read a llama-family GGUF and run the
forward pass of docs/facts.md in float64: x = embed[token]; per layer
h = x + Wo·attn(rope(Wq·n), rope(Wk·n), Wv·n) with n = rmsnorm(x)·w_attn, then
x = h + Wdown·(silu(Wgate·m) * Wup·m) with m = rmsnorm(h)·w_ffn; logits = Wout·(rmsnorm(x)·w_out)
(Wout = token_embd when output.weight is absent). RMSNorm x / sqrt(mean(x^2) + eps); RoPE "normal"
style on adjacent pairs (2i, 2i+1) of the first rope_dim values of each head, angle
pos·base^(-2i/rope_dim) (the GGUF converter already permuted Q and K); causal attention with scale
1/sqrt(head_dim); query head h reads KV head h / (n_heads / n_kv_heads). Nothing is shared with
smolrt but the file: dequantization is gguf-py's, the arithmetic numpy's.

smolrt's logits come from `smolrt logits --json --all-positions` (CPU backend by default); every
position's row must be within a relative L2 error (||smolrt - f64|| / ||f64||) of TOL = 1e-3.
Why 1e-3: both sides dequantize to the same weights (a block's q·d is exact in fp32), so the only
difference is smolrt's fp32 arithmetic: rounding of 2^-24 per operation over dot products of a
few hundred terms and a softmax per layer, ~1e-7 to 1e-6 relative at the logits (measured on the
CPU backend: 1.6e-7 to 7.1e-7 for every case here). 1e-3 is three orders of magnitude above that,
so thread counts, summation orders, compilers and a mixed-precision GPU backend (--backend cuda)
stay well inside it, yet any convention error lands above it: the wrong RoPE pairing (NeoX halves
instead of adjacent pairs, which the script evaluates and prints as a sensitivity check) is off
by 2.8e-1 on stories260K and 8e-3 on the random tiny models, whose near-uniform attention makes
positions matter least; a wrong GQA mapping, eps, norm weight or nibble order moves them further.

Cases are CASES below: the stories260K fixture and a seeded `smolrt synth --preset tiny` model per
entry of SYNTH_TYPES (adding a type is one entry). A type the binary's `smolrt synth --type`
refuses is reported as skipped, not passed.

  f64_reference.py --smolrt BIN [--case NAME] [--fixtures DIR] [--backend cpu] [--list-cases]
                   [--logits-dir DIR]
--logits-dir checks logits made elsewhere (e.g. `--backend cuda` on a GPU machine): DIR/<case>.json
is read instead of running `smolrt logits`; it must come from the same ids (the script prints the
command for each case with --print-commands; synth models are byte-identical for the same seed).
Exit 0: every case run passed; 1: a case failed; 77: skipped (numpy/gguf missing, fixtures not
found, or the type unsupported; with --case only that case is considered).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

# Synthetic tiny-preset models, one per `smolrt synth --type` value. q4_k_m and q6_k are reported
# as skipped until the binary's synth accepts them.
SYNTH_TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q4_k_m", "q6_k"]
# The tiny preset's rows (64, 192) are not whole 256-weight super-blocks, so its K-quant models fall
# back to Q5_0 / Q8_0 everywhere (llama.cpp's rule); the SmolLM-135M shape's 1,536-wide ffn_down
# takes Q4_K and Q6_K for real.
BIG_TYPES = ["q4_k_m", "q6_k"]
CASES = (["stories260K"] + [f"synth-tiny-{t}" for t in SYNTH_TYPES] +
         [f"synth-smollm-135m-{t}" for t in BIG_TYPES])
TOL = 1e-3
N_TOKENS = 24
SYNTH_SEED = 1234
SKIP = 77


def skip(msg):
    print(f"skipped: {msg}")
    return SKIP


if "--list-cases" in sys.argv:  # used by CMake at configure time: no numpy needed
    print(";".join(CASES))
    sys.exit(0)

try:
    import numpy as np
    import gguf
    from gguf import quants
    from gguf import GGMLQuantizationType as Q
except ImportError as e:  # the oracle is optional: scripts/test-requirements.txt installs it
    print(f"skipped: python package missing ({e}); pip install numpy gguf==0.19.0")
    sys.exit(SKIP)


# --- the float64 model ---------------------------------------------------------------------------

def field(r, key, default=None):
    f = r.fields.get(key)
    if f is None:
        if default is None:
            raise KeyError(f"metadata '{key}' missing")
        return default
    return f.contents()


def load(path):
    """Config and float64 weights (numpy shape [rows, cols] = GGUF ne [cols, rows])."""
    r = gguf.GGUFReader(path)
    arch = field(r, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: architecture {arch!r}, expected llama")
    dim = int(field(r, "llama.embedding_length"))
    n_heads = int(field(r, "llama.attention.head_count"))
    cfg = {
        "dim": dim,
        "n_layers": int(field(r, "llama.block_count")),
        "n_heads": n_heads,
        "n_kv_heads": int(field(r, "llama.attention.head_count_kv", n_heads)),
        "head_dim": dim // n_heads,
        "rope_dim": int(field(r, "llama.rope.dimension_count", dim // n_heads)),
        "rope_base": float(field(r, "llama.rope.freq_base", 10000.0)),
        "eps": float(field(r, "llama.attention.layer_norm_rms_epsilon")),
    }
    w, types = {}, {}
    for t in r.tensors:
        ne0 = int(t.shape[0])
        if t.tensor_type == Q.F32:
            a = np.asarray(t.data, dtype=np.float32)
        else:
            a = quants.dequantize(np.asarray(t.data), t.tensor_type)
        a = np.asarray(a, dtype=np.float64).reshape(-1, ne0)
        w[t.name] = a[0] if len(t.shape) == 1 else a
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    if "output.weight" not in w:
        w["output.weight"] = w["token_embd.weight"]  # tied
    cfg["vocab_size"] = w["token_embd.weight"].shape[0]
    return cfg, w, types


def rmsnorm(x, g, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g


def rope(v, rope_dim, base, neox=False):
    """v: [T, heads, head_dim]; rotates the first rope_dim values of each head in place (copy)."""
    T = v.shape[0]
    v = v.copy()
    i = np.arange(rope_dim // 2, dtype=np.float64)
    theta = np.arange(T, dtype=np.float64)[:, None] * base ** (-2.0 * i / rope_dim)  # [T, rd/2]
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    if neox:  # the wrong convention, for the sensitivity check only: pairs (i, i + rope_dim/2)
        a, b = v[..., : rope_dim // 2].copy(), v[..., rope_dim // 2 : rope_dim].copy()
        v[..., : rope_dim // 2], v[..., rope_dim // 2 : rope_dim] = a * c - b * s, a * s + b * c
    else:
        a, b = v[..., 0:rope_dim:2].copy(), v[..., 1:rope_dim:2].copy()
        v[..., 0:rope_dim:2], v[..., 1:rope_dim:2] = a * c - b * s, a * s + b * c
    return v


def forward(cfg, w, ids, neox=False):
    """Logits [T, vocab] in float64 for the whole prompt (causal)."""
    T = len(ids)
    H, KV, hd = cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"]
    group = H // KV
    eps = cfg["eps"]
    x = w["token_embd.weight"][np.asarray(ids)]  # [T, dim]
    mask = np.triu(np.full((T, T), -np.inf), k=1)
    for l in range(cfg["n_layers"]):
        p = f"blk.{l}."
        n = rmsnorm(x, w[p + "attn_norm.weight"], eps)
        q = (n @ w[p + "attn_q.weight"].T).reshape(T, H, hd)
        k = (n @ w[p + "attn_k.weight"].T).reshape(T, KV, hd)
        v = (n @ w[p + "attn_v.weight"].T).reshape(T, KV, hd)
        q = rope(q, cfg["rope_dim"], cfg["rope_base"], neox)
        k = rope(k, cfg["rope_dim"], cfg["rope_base"], neox)
        kh = np.repeat(k, group, axis=1)  # query head h -> KV head h // group
        vh = np.repeat(v, group, axis=1)
        s = np.einsum("thd,uhd->htu", q, kh) / np.sqrt(hd) + mask  # [H, T, T]
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        att = np.einsum("htu,uhd->thd", s, vh).reshape(T, H * hd)
        x = x + att @ w[p + "attn_output.weight"].T
        m = rmsnorm(x, w[p + "ffn_norm.weight"], eps)
        g = m @ w[p + "ffn_gate.weight"].T
        u = m @ w[p + "ffn_up.weight"].T
        x = x + (g / (1.0 + np.exp(-g)) * u) @ w[p + "ffn_down.weight"].T
    return rmsnorm(x, w["output_norm.weight"], eps) @ w["output.weight"].T


# --- running smolrt ------------------------------------------------------------------------------

def smolrt_logits(binary, model, ids, backend):
    cmd = [binary, "logits", "-m", model, "--ids", ",".join(map(str, ids)), "--backend", backend,
           "--threads", "2", "--all-positions", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}: {r.stderr.strip()}")
    j = json.loads(r.stdout)
    if j["ids"] != list(ids) or j["positions"] != list(range(len(ids))):
        raise RuntimeError(f"smolrt logits echoed ids {j['ids']} positions {j['positions']}")
    rows = [[np.nan if v is None else v for v in row] for row in j["logits"]]
    return np.asarray(rows, dtype=np.float64), j["backend"]


def rel_l2(got, want):
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def read_logits(path, ids):
    with open(path) as f:
        j = json.load(f)
    if j["ids"] != list(ids) or j["positions"] != list(range(len(ids))):
        raise RuntimeError(f"{path}: ids {j['ids']} positions {j['positions']} are not this case's")
    rows = [[np.nan if v is None else v for v in row] for row in j["logits"]]
    return np.asarray(rows, dtype=np.float64), j["backend"]


def check_model(a, path, ids, label):
    if a.print_commands:
        print(f"{label}: logits -m {path} --ids {','.join(map(str, ids))} --all-positions --json")
        return 0
    cfg, w, types = load(path)
    want = forward(cfg, w, ids)
    if a.logits_dir:
        got, be = read_logits(os.path.join(a.logits_dir, f"{label}.json"), ids)
    else:
        got, be = smolrt_logits(a.smolrt, path, ids, a.backend)
    if got.shape != want.shape:
        print(f"FAILED {label}: smolrt gave logits {got.shape}, the reference {want.shape}")
        return 1
    per_pos = [rel_l2(got[i], want[i]) for i in range(len(ids))]
    last, worst = per_pos[-1], max(per_pos)
    wrong = rel_l2(forward(cfg, w, ids, neox=True)[-1], want[-1])
    argmax_same = int(np.argmax(got[-1])) == int(np.argmax(want[-1]))
    tinfo = ", ".join(f"{k} x{v}" for k, v in sorted(types.items()))
    ok = np.isfinite(worst) and worst <= TOL
    print(f"{'ok' if ok else 'FAILED'} {label} ({be} backend; {tinfo}): {len(ids)} tokens, "
          f"relative L2 error last position {last:.3e}, worst position {worst:.3e} "
          f"(bound {TOL:g}); argmax {'agrees' if argmax_same else 'DIFFERS'}; "
          f"NeoX-RoPE reference would be off by {wrong:.3e}")
    if ok and not wrong > TOL:
        print(f"FAILED {label}: the sensitivity check cannot tell the RoPE conventions apart")
        return 1
    return 0 if ok else 1


def prompt_ids(vocab, first=()):
    rng = np.random.RandomState(7)
    ids = list(first)
    while len(ids) < N_TOKENS:
        ids.append(int(rng.randint(0, vocab)))
    return ids


def run_case(a, name, tmp):
    if name == "stories260K":
        path = os.path.join(a.fixtures, "models", "stories260K.gguf")
        if not os.path.exists(path):
            return skip(f"fixtures not found ({path}); set SMOLRT_FIXTURES")
        # "Once upon a time" and the model's greedy continuation, then random ids.
        first = [1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421]
        return check_model(a, path, prompt_ids(512, first), name)
    preset, t = name[len("synth-"):].rsplit("-", 1)
    path = os.path.join(tmp, f"synth_{preset}_{t}.gguf")
    cmd = [a.smolrt, "synth", "--preset", preset, "--type", t, "--seed", str(SYNTH_SEED), "-o",
           path]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        msg = (r.stderr or r.stdout).strip()
        if "--type" in msg and f"'{t}'" in msg:  # "unknown type 'q6_k' for --type; ..."
            return skip(f"{name}: this smolrt's `synth --type {t}` is refused ({msg})")
        print(f"FAILED {name}: {' '.join(cmd)} exited {r.returncode}: {msg}")
        return 1
    embd = [t for t in gguf.GGUFReader(path).tensors if t.name == "token_embd.weight"]
    vocab = int(embd[0].shape[1]) if embd else 256
    return check_model(a, path, prompt_ids(vocab, [1]), name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smolrt", required=True, help="the smolrt binary")
    ap.add_argument("--fixtures", default=os.environ.get(
        "SMOLRT_FIXTURES", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                        "..", "..", "..", "shared")))
    ap.add_argument("--case", action="append", choices=CASES,
                    help="run only this case (repeatable; default: all)")
    ap.add_argument("--backend", default="cpu", help="smolrt backend: cpu | cuda | auto")
    ap.add_argument("--logits-dir", help="read DIR/<case>.json instead of running smolrt logits")
    ap.add_argument("--print-commands", action="store_true",
                    help="print each case's `smolrt logits` arguments instead of checking")
    ap.add_argument("--keep", help="write the synth models to this folder (kept) instead of a "
                    "temporary one")
    a = ap.parse_args()
    if not os.path.exists(a.smolrt):
        print(f"FAILED: smolrt binary {a.smolrt} not found")
        return 1
    results = {}
    with tempfile.TemporaryDirectory(prefix="smolrt_f64_") as tmp:
        if a.keep:
            os.makedirs(a.keep, exist_ok=True)
            tmp = a.keep
        for name in a.case or CASES:
            try:
                results[name] = run_case(a, name, tmp)
            except Exception as e:  # a smolrt failure or an unreadable file: this case fails
                print(f"FAILED {name}: {e}")
                results[name] = 1
    failed = [n for n, rc in results.items() if rc == 1]
    skipped = [n for n, rc in results.items() if rc == SKIP]
    passed = [n for n, rc in results.items() if rc == 0]
    print(f"f64 reference: {len(passed)} passed, {len(failed)} failed, {len(skipped)} skipped"
          + (f" ({', '.join(skipped)})" if skipped else ""))
    if failed:
        return 1
    return SKIP if not passed else 0


if __name__ == "__main__":
    sys.exit(main())
