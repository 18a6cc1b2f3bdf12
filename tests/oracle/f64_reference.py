#!/usr/bin/env python3
"""A float64 forward pass (llama, qwen2, gemma3) outside the engine, the oracle for smolrt's logits.

numpy + gguf-py (gguf.GGUFReader, gguf.quants.dequantize) read a llama-family GGUF and run the
forward pass of docs/facts.md in float64: x = embed[token]; per layer
h = x + Wo·attn(rope(Wq·n), rope(Wk·n), Wv·n) with n = rmsnorm(x)·w_attn, then
x = h + Wdown·(silu(Wgate·m) * Wup·m) with m = rmsnorm(h)·w_ffn; logits = Wout·(rmsnorm(x)·w_out)
(Wout = token_embd when output.weight is absent). RMSNorm x / sqrt(mean(x^2) + eps); RoPE "normal"
style on adjacent pairs (2i, 2i+1) of the first rope_dim values of each head, angle
pos·base^(-2i/rope_dim) (the GGUF converter already permuted Q and K); causal attention with scale
1/sqrt(head_dim); query head h reads KV head h / (n_heads / n_kv_heads). Nothing is shared with
smolrt but the file: dequantization is gguf-py's, the arithmetic numpy's.

smolrt's logits come from `smolrt logits --json --all-positions` (the fp32 oracle, cpu-ref, by
default); every position's row must be within a relative L2 error (||smolrt - f64|| / ||f64||)
of TOL = 1e-3. Why 1e-3: both sides dequantize to the same weights (a block's q·d is exact in
fp32), so the only difference is smolrt's fp32 arithmetic: rounding of 2^-24 per operation over
dot products of a few hundred terms and a softmax per layer, ~1e-7 to 1e-6 relative at the logits
(measured on the fp32 oracle: 1.6e-7 to 7.1e-7 for every case here). 1e-3 is three orders of
magnitude above that, so thread counts, summation orders, compilers and a mixed-precision GPU
backend (--backend cuda) stay well inside it, yet any convention error lands above it: the wrong RoPE pairing (NeoX halves
instead of adjacent pairs, which the script evaluates and prints as a sensitivity check) is off
by 2.8e-1 on stories260K and 8e-3 on the random tiny models, whose near-uniform attention makes
positions matter least; a wrong GQA mapping, eps, norm weight or nibble order moves them further.

The families' switches (biases, q/k norms, post norms, GELU, embedding scale, NeoX and
frequency-factor RoPE, the sliding window with its own RoPE base) are in load() and forward(),
each from the public llama.cpp / Hugging Face sources. For a model with a sliding window the script
also checks that dropping the window moves the reference by more than TOL.

Cases are CASES below: the stories260K fixture, a seeded `smolrt synth --preset tiny` model per
entry of SYNTH_TYPES (adding a type is one entry), the qwen2 / llama3 / gemma3 tiny presets in
several types (FAMILY_TYPES), and the real gemma-3-270m Q4_K_M file when fetched (3 prompts as ids,
one longer than its 512-token window; last position only; skipped when the file is absent). A type the binary's `smolrt synth --type`
refuses is reported as skipped, not passed.

  f64_reference.py --smolrt BIN [--case NAME] [--fixtures DIR] [--backend cpu-ref] [--list-cases]
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
# The other families' tiny presets (dim 256, hidden 512: whole 256-weight super-blocks, so q4_k is
# Q4_K in every matrix), each in f32, q8_0 and q4_k (+ q4_k_m, q5_0 for gemma3).
FAMILY_TYPES = {"tiny-qwen2": ["f32", "q8_0", "q4_k"], "tiny-llama3": ["f32", "q8_0", "q4_k"],
                "tiny-gemma3": ["f32", "q8_0", "q4_k", "q4_k_m", "q5_0"]}
# The real gemma-3-270m Q4_K_M file (scripts/fetch_model.sh gemma3-270m); skipped when absent.
REAL_GEMMA = "gemma3-270m-real"
CASES = (["stories260K"] + [f"synth-tiny-{t}" for t in SYNTH_TYPES] +
         [f"synth-smollm-135m-{t}" for t in BIG_TYPES] +
         [f"synth-{p}-{t}" for p, ts in FAMILY_TYPES.items() for t in ts] + [REAL_GEMMA])
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
    """Config and float64 weights (numpy shape [rows, cols] = GGUF ne [cols, rows]).

    The architecture facts, from the public sources (not from smolrt): llama (llama.cpp rope type
    NORM; Llama 3's frequency factors are the rope_freqs.weight tensor, theta_i /= factor_i),
    qwen2 (q/k/v biases, RoPE NeoX: HF rotate_half pairs (i, i + d/2)), gemma3 (HF
    modeling_gemma3 + llama.cpp: embeddings * sqrt(dim), per-head RMSNorm of q and k before
    RoPE NeoX, post-attention and post-FFN RMSNorms, GELU(tanh) gate, attention scale
    query_pre_attn_scalar^-0.5 = head_dim^-0.5, sliding window on layers l % 6 < 5 (or the
    file's per-layer pattern) with RoPE base 10000 there and rope.freq_base on the global
    layers; GGUF norms already hold Gemma's 1 + w)."""
    r = gguf.GGUFReader(path)
    arch = field(r, "general.architecture")
    if arch not in ("llama", "qwen2", "gemma3"):
        raise ValueError(f"{path}: architecture {arch!r}, expected llama, qwen2 or gemma3")
    p = arch + "."
    dim = int(field(r, p + "embedding_length"))
    n_heads = int(field(r, p + "attention.head_count"))
    n_layers = int(field(r, p + "block_count"))
    head_dim = int(field(r, p + "attention.key_length", dim // n_heads))
    cfg = {
        "arch": arch,
        "dim": dim,
        "n_layers": n_layers,
        "n_heads": n_heads,
        "n_kv_heads": int(field(r, p + "attention.head_count_kv", n_heads)),
        "head_dim": head_dim,
        "rope_dim": int(field(r, p + "rope.dimension_count", head_dim)),
        "rope_base": float(field(r, p + "rope.freq_base", 10000.0)),
        "eps": float(field(r, p + "attention.layer_norm_rms_epsilon")),
        "neox": arch in ("qwen2", "gemma3"),
        "bias": arch == "qwen2",
        "gemma": arch == "gemma3",
        "scale": 1.0 / np.sqrt(head_dim),
        "window": 0,
        "local": [False] * n_layers,
        "rope_base_local": 10000.0,
        "embed_scale": np.sqrt(dim) if arch == "gemma3" else 1.0,
    }
    if arch == "gemma3":
        cfg["window"] = int(field(r, p + "attention.sliding_window", 0))
        pat = r.fields.get(p + "attention.sliding_window_pattern")
        if cfg["window"] > 0:
            if pat is None:
                cfg["local"] = [l % 6 < 5 for l in range(n_layers)]
            else:
                v = pat.contents()
                cfg["local"] = ([bool(x) for x in v] if isinstance(v, list)
                                else [l % int(v) < int(v) - 1 for l in range(n_layers)])
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
    cfg["freq_factors"] = w.get("rope_freqs.weight")
    cfg["vocab_size"] = w["token_embd.weight"].shape[0]
    return cfg, w, types


def rmsnorm(x, g, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * g


def rope(v, rope_dim, base, neox=False, factors=None, pos0=0):
    """v: [T, heads, head_dim]; rotates the first rope_dim values of each head (a copy). Normal:
    pairs (2i, 2i+1); NeoX: pairs (i, i + rope_dim/2). Angle pos * base^(-2i/rope_dim) / factor_i."""
    T = v.shape[0]
    v = v.copy()
    i = np.arange(rope_dim // 2, dtype=np.float64)
    inv = base ** (-2.0 * i / rope_dim)
    if factors is not None:
        inv = inv / factors
    theta = (pos0 + np.arange(T, dtype=np.float64))[:, None] * inv  # [T, rd/2]
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    if neox:
        a, b = v[..., : rope_dim // 2].copy(), v[..., rope_dim // 2 : rope_dim].copy()
        v[..., : rope_dim // 2], v[..., rope_dim // 2 : rope_dim] = a * c - b * s, a * s + b * c
    else:
        a, b = v[..., 0:rope_dim:2].copy(), v[..., 1:rope_dim:2].copy()
        v[..., 0:rope_dim:2], v[..., 1:rope_dim:2] = a * c - b * s, a * s + b * c
    return v


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def forward(cfg, w, ids, flip_rope=False, last_only=False):
    """Logits [T, vocab] (or [1, vocab] with last_only) in float64 for the whole prompt (causal).
    flip_rope: the other RoPE pairing, for the sensitivity check only."""
    T = len(ids)
    H, KV, hd = cfg["n_heads"], cfg["n_kv_heads"], cfg["head_dim"]
    group = H // KV
    eps = cfg["eps"]
    neox = cfg["neox"] != flip_rope
    x = w["token_embd.weight"][np.asarray(ids)] * cfg["embed_scale"]  # [T, dim]
    tpos = np.arange(T)
    causal = np.where(tpos[None, :] > tpos[:, None], -np.inf, 0.0)  # [query, key]
    # Sliding window: a query at t sees keys u with t - window < u <= t.
    windowed = np.where(tpos[:, None] - tpos[None, :] >= cfg["window"], -np.inf, causal) \
        if cfg["window"] > 0 else causal
    for l in range(cfg["n_layers"]):
        p = f"blk.{l}."
        local = cfg["local"][l]
        base = cfg["rope_base_local"] if local else cfg["rope_base"]
        n = rmsnorm(x, w[p + "attn_norm.weight"], eps)
        q, k, v = (n @ w[p + "attn_q.weight"].T, n @ w[p + "attn_k.weight"].T,
                   n @ w[p + "attn_v.weight"].T)
        if cfg["bias"]:
            q, k, v = q + w[p + "attn_q.bias"], k + w[p + "attn_k.bias"], v + w[p + "attn_v.bias"]
        q, k, v = q.reshape(T, H, hd), k.reshape(T, KV, hd), v.reshape(T, KV, hd)
        if cfg["gemma"]:
            q = rmsnorm(q, w[p + "attn_q_norm.weight"], eps)
            k = rmsnorm(k, w[p + "attn_k_norm.weight"], eps)
        q = rope(q, cfg["rope_dim"], base, neox, cfg["freq_factors"])
        k = rope(k, cfg["rope_dim"], base, neox, cfg["freq_factors"])
        kh = np.repeat(k, group, axis=1)  # query head h -> KV head h // group
        vh = np.repeat(v, group, axis=1)
        mask = windowed if local else causal
        s = np.einsum("thd,uhd->htu", q, kh) * cfg["scale"] + mask  # [H, T, T]
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        s /= s.sum(axis=-1, keepdims=True)
        att = np.einsum("htu,uhd->thd", s, vh).reshape(T, H * hd)
        o = att @ w[p + "attn_output.weight"].T
        if cfg["gemma"]:
            o = rmsnorm(o, w[p + "post_attention_norm.weight"], eps)
        x = x + o
        m = rmsnorm(x, w[p + "ffn_norm.weight"], eps)
        g = m @ w[p + "ffn_gate.weight"].T
        u = m @ w[p + "ffn_up.weight"].T
        act = gelu_tanh(g) if cfg["gemma"] else g / (1.0 + np.exp(-g))
        f = (act * u) @ w[p + "ffn_down.weight"].T
        if cfg["gemma"]:
            f = rmsnorm(f, w[p + "post_ffw_norm.weight"], eps)
        x = x + f
    if last_only:
        x = x[-1:]
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
    wrong = rel_l2(forward(cfg, w, ids, flip_rope=True)[-1], want[-1])
    argmax_same = int(np.argmax(got[-1])) == int(np.argmax(want[-1]))
    tinfo = ", ".join(f"{k} x{v}" for k, v in sorted(types.items()))
    ok = np.isfinite(worst) and worst <= TOL
    print(f"{'ok' if ok else 'FAILED'} {label} ({be} backend; {tinfo}): {len(ids)} tokens, "
          f"relative L2 error last position {last:.3e}, worst position {worst:.3e} "
          f"(bound {TOL:g}); argmax {'agrees' if argmax_same else 'DIFFERS'}; "
          f"the other RoPE pairing would be off by {wrong:.3e}")
    if ok and not wrong > TOL:
        print(f"FAILED {label}: the sensitivity check cannot tell the RoPE conventions apart")
        return 1
    if ok and cfg["freq_factors"] is not None:
        # The llama3 frequency factors must matter: the reference without them is far off.
        plain = rel_l2(forward(dict(cfg, freq_factors=None), w, ids)[-1], want[-1])
        print(f"   {label}: without the RoPE frequency factors the reference moves by {plain:.3e}")
        if not plain > TOL:
            print(f"FAILED {label}: the sensitivity check cannot see the frequency factors")
            return 1
    if ok and cfg["window"] > 0 and len(ids) > cfg["window"]:
        # The window must matter: the same model with full attention everywhere is far off.
        full = rel_l2(forward(dict(cfg, window=0), w, ids)[-1], want[-1])
        print(f"   {label}: without the sliding window of {cfg['window']} the reference moves by "
              f"{full:.3e}")
        if not full > TOL:
            print(f"FAILED {label}: the sensitivity check cannot see the sliding window")
            return 1
        # And the local layers' own RoPE base must matter.
        one = rel_l2(forward(dict(cfg, rope_base_local=cfg["rope_base"]), w, ids)[-1], want[-1])
        print(f"   {label}: with the global RoPE base on the local layers too the reference moves "
              f"by {one:.3e}")
        if not one > TOL:
            print(f"FAILED {label}: the sensitivity check cannot see the local RoPE base")
            return 1
    return 0 if ok else 1


def gemma_prompts(path):
    """Token ids of a few plain-text prompts for the real gemma file, built from its own vocab
    (BOS 2, then one SentencePiece '\u2581word' piece per word: no tokenizer involved). The last is
    longer than the 512-token sliding window."""
    r = gguf.GGUFReader(path)
    toks = r.fields["tokenizer.ggml.tokens"].contents()
    index = {t: i for i, t in enumerate(toks)}
    bos = int(field(r, "tokenizer.ggml.bos_token_id"))

    def ids(text):
        out = [bos]
        for i, word in enumerate(text.split()):
            piece = ("\u2581" if i else "") + word
            if piece not in index:
                piece = "\u2581" + word
            if piece in index:
                out.append(index[piece])
        return out
    story = ("Once upon a time there was a little girl who lived in a village near the forest . "
             "Every day she walked to the river to fetch water for her mother and her brothers . "
             "One morning she saw a small bird sitting on a branch and singing a beautiful song . ")
    long_ids = ids(story * 12 + "The name of the little girl was")
    return [ids("The capital of France is"),
            ids("The first three planets of the solar system are Mercury , Venus and"),
            long_ids]


def check_real_gemma(a, path):
    """Last-position logits of the real file: relative L2 within TOL and the same top-10 ids
    (a swap inside the top 10 only where the f64 logits differ by less than TOL of their norm)."""
    prompts = gemma_prompts(path)
    if len(prompts[-1]) <= 512:
        print(f"FAILED {REAL_GEMMA}: the long prompt has {len(prompts[-1])} tokens, not > 512")
        return 1
    cfg, w, types = load(path)
    tinfo = ", ".join(f"{k} x{v}" for k, v in sorted(types.items()))
    rc = 0
    for n, ids in enumerate(prompts):
        want = forward(cfg, w, ids, last_only=True)[0]
        label = f"{REAL_GEMMA}.{n}"
        if a.logits_dir:
            got = read_last_logits(os.path.join(a.logits_dir, f"{label}.json"), ids)
        else:
            cmd = [a.smolrt, "logits", "-m", path, "--ids", ",".join(map(str, ids)),
                   "--backend", a.backend, "--threads", "2", "--json"]
            if a.print_commands:
                print(f"{label}: {' '.join(cmd[1:])}")
                continue
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd[:4])} ... exited {r.returncode}: "
                                   f"{r.stderr.strip()}")
            got = parse_last_logits(json.loads(r.stdout), ids, label)
        err = rel_l2(got, want)
        top_w = [int(i) for i in np.argsort(-want)[:10]]
        top_g = [int(i) for i in np.argsort(-got)[:10]]
        tie = TOL * float(np.linalg.norm(want)) / np.sqrt(len(want))
        top_ok = all(i in top_g or want[i] - want[top_w[-1]] < tie for i in top_w)
        ok = np.isfinite(err) and err <= TOL and top_ok
        print(f"{'ok' if ok else 'FAILED'} {label} ({tinfo}): {len(ids)} tokens, relative L2 "
              f"error of the last position {err:.3e} (bound {TOL:g}); top-10 f64 {top_w}, "
              f"smolrt {top_g}")
        rc |= 0 if ok else 1
        if len(ids) > cfg["window"] > 0:
            # The long prompt must depend on the window: full attention on every layer moves the
            # reference's last position by more than TOL.
            full = rel_l2(forward(dict(cfg, window=0), w, ids, last_only=True)[0], want)
            print(f"   {label}: without the sliding window of {cfg['window']} the reference "
                  f"moves by {full:.3e}")
            if not full > TOL:
                print(f"FAILED {label}: the sensitivity check cannot see the sliding window")
                rc = 1
    return rc


def parse_last_logits(j, ids, label):
    if j["ids"] != list(ids) or j["positions"] != [len(ids) - 1]:
        raise RuntimeError(f"{label}: smolrt logits echoed ids/positions {j['positions']}")
    return np.asarray([np.nan if v is None else v for v in j["logits"][0]], dtype=np.float64)


def read_last_logits(path, ids):
    with open(path) as f:
        return parse_last_logits(json.load(f), ids, path)


def prompt_ids(vocab, first=()):
    rng = np.random.RandomState(7)
    ids = list(first)
    while len(ids) < N_TOKENS:
        ids.append(int(rng.randint(0, vocab)))
    return ids


def run_case(a, name, tmp):
    if name == REAL_GEMMA:
        path = os.environ.get("SMOLRT_GEMMA_MODEL", os.path.expanduser(
            "~/.cache/smolrt/gemma-3-270m-q4_k_m.gguf"))
        if not os.path.exists(path):
            return skip(f"{path} not found; run scripts/fetch_model.sh gemma3-270m "
                        "(or set SMOLRT_GEMMA_MODEL)")
        return check_real_gemma(a, path)
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
    ap.add_argument("--backend", default="cpu-ref",
                    help="smolrt backend: cpu-ref (the fp32 oracle) | cpu | cuda | auto")
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
