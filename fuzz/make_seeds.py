#!/usr/bin/env python3
"""Writes small valid GGUF seeds for fuzz_gguf into the given directory: a tiny llama model
(f32 norms, q8_0 / q4_0 / f16 matrices, tied and untied), a file with every metadata value type
(nested arrays included) and a custom alignment, the largest alignment smolrt accepts, and a
vocab-only file. Standard library only."""
import os
import random
import struct
import sys

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<B",
       U64: "<Q", I64: "<q", F64: "<d"}
TYPES = {"f32": (0, 1, 4), "f16": (1, 1, 2), "q4_0": (2, 32, 18), "q8_0": (8, 32, 34)}


def s(x):
    b = x.encode()
    return struct.pack("<Q", len(b)) + b


def val(t, v):
    if t == STR:
        return s(v)
    if t == ARR:
        et, items = v
        return struct.pack("<IQ", et, len(items)) + b"".join(val(et, i) for i in items)
    return struct.pack(FMT[t], v)


def gguf(kv, tensors, align=32):
    rng = random.Random(len(tensors))
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv))
    for k, t, v in kv:
        out += s(k) + struct.pack("<I", t) + val(t, v)
    infos, data, off = b"", b"", 0
    for name, ne, ty in tensors:
        tid, bs, bb = TYPES[ty]
        n = ne[0] // bs * bb
        for d in ne[1:]:
            n *= d
        off = (off + align - 1) // align * align
        data = data.ljust(off, b"\0") + bytes(rng.randrange(1, 256) for _ in range(n))
        infos += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        infos += struct.pack("<IQ", tid, off)
        off += n
    out += infos
    out = out.ljust((len(out) + align - 1) // align * align, b"\0")
    return out + data


def llama(tied, mat):
    dim, hid, vocab, heads, kv_heads = 32, 64, 8, 2, 1
    kv_dim = dim // heads * kv_heads
    kv = [("general.architecture", STR, "llama"), ("llama.context_length", U32, 64),
          ("llama.embedding_length", U32, dim), ("llama.block_count", U32, 1),
          ("llama.feed_forward_length", U32, hid), ("llama.attention.head_count", U32, heads),
          ("llama.attention.head_count_kv", U32, kv_heads),
          ("llama.attention.layer_norm_rms_epsilon", F32, 1e-5),
          ("llama.rope.freq_base", F32, 10000.0),
          ("tokenizer.ggml.model", STR, "gpt2"),
          ("tokenizer.ggml.tokens", ARR, (STR, ["a", "b", "c", "ab", "<s>", "</s>", " ", "\n"])),
          ("tokenizer.ggml.merges", ARR, (STR, ["a b"])),
          ("tokenizer.ggml.bos_token_id", U32, 4)]
    t = [("token_embd.weight", [dim, vocab], mat), ("output_norm.weight", [dim], "f32")]
    if not tied:
        t.append(("output.weight", [dim, vocab], mat))
    for name, ne in [("attn_norm", [dim]), ("attn_q", [dim, dim]), ("attn_k", [dim, kv_dim]),
                     ("attn_v", [dim, kv_dim]), ("attn_output", [dim, dim]), ("ffn_norm", [dim]),
                     ("ffn_gate", [dim, hid]), ("ffn_up", [dim, hid]), ("ffn_down", [hid, dim])]:
        t.append((f"blk.0.{name}.weight", ne, "f32" if len(ne) == 1 else mat))
    return gguf(kv, t)


def every_type():
    kv = [("general.alignment", U32, 64), ("u8", U8, 7), ("i8", I8, -7), ("u16", U16, 700),
          ("i16", I16, -700), ("u32", U32, 70000), ("i32", I32, -70000), ("f32", F32, 0.5),
          ("bool", BOOL, 1), ("str", STR, "héllo"), ("u64", U64, 1 << 40), ("i64", I64, -(1 << 40)),
          ("f64", F64, 0.25), ("arr", ARR, (ARR, [(I32, [1, 2]), (STR, ["x", ""]), (U8, [])]))]
    return gguf(kv, [("x", [64, 2], "q8_0"), ("y", [3, 2, 2, 1], "f16")], align=64)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    seeds = {"llama_tied_q8_0.gguf": llama(True, "q8_0"),
             "llama_untied_q4_0.gguf": llama(False, "q4_0"),
             "llama_f16.gguf": llama(True, "f16"),
             "every_type.gguf": every_type(),
             # The largest alignment smolrt accepts, no tensors and no padding (the data section starts
             # past the end, as llama.cpp allows): one mutation from the 2^30 file
             # that once made the write-back allocate 1 GiB.
             "max_alignment.gguf": gguf([("general.architecture", STR, "llama"),
                                         ("general.alignment", U32, 1 << 16)], []),
             "vocab_only.gguf": gguf([("tokenizer.ggml.model", STR, "llama"),
                                      ("tokenizer.ggml.scores", ARR, (F32, [0.0, -1.5]))], [])}
    for name, data in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
