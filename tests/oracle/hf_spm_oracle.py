#!/usr/bin/env python3
"""Hugging Face `tokenizers` as the oracle for smolrt's SentencePiece (SPM) tokenizer on the real
Gemma 3 vocabulary (262,144 pieces, read from the GGUF: no download).

The oracle is built the way transformers' convert_slow_tokenizer turns a SentencePiece BPE model
into a tokenizer.json (GemmaConverter: what Gemma's own tokenizer.json is): a `BPE` model over
the GGUF's pieces with byte_fallback, merges derived from the piece scores (every split of a
piece into two pieces of the vocab is a merge, ranked by the piece's score), control
(token_type 3) and user-defined (4) pieces as added tokens that are split out of the raw text,
normalizer Replace(" ", "▁") (after Prepend("▁"), which applies to each run of text between
added tokens, only when tokenizer.ggml.add_space_prefix says so), and <bos> / <eos> added as
tokenizer.ggml.add_bos_token / add_eos_token say.

The corpus is hf_tokenizer_oracle.py's (prose, code, edge cases, seeded random mixes) with
Gemma's control tokens in the random pool, plus Gemma edge cases. All of it goes through one
`smolrt tokenize -m GGUF --jsonl` process (control tokens in the text parsed, BOS as the file
says) and one with --no-special (control tokens as plain text: the oracle's
encode_special_tokens); every id must equal the oracle's, and smolrt's decode (control tokens
rendered) must give the input back between the added BOS / EOS. Exit 77 (ctest: skipped) when
`tokenizers` or `gguf` is missing or the model file is not there.
"""
import argparse
import os
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree from the import below
from hf_tokenizer_oracle import POOLS, build_corpus, count_mismatches, run_smolrt_jsonl  # noqa: E402,E501

SPACE = "\u2581"  # "▁", SentencePiece's escaped space

GEMMA_SPECIAL = ["<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>", "<pad>", "<unk>",
                 "<mask>", "<unused0>", "<start_of_image>", "[multimodal]", "<table>", "</td>",
                 "<s>", "</s>", "<start_of_", "<end_of_turn", "<0x41>", "<"]
GEMMA_POOLS = dict(POOLS, special=GEMMA_SPECIAL,
                   space=POOLS["space"] + [SPACE, SPACE + SPACE, "\t\t\t", "     "])
GEMMA_EDGE = [
    "<start_of_turn>user\nWhy is the sky blue?<end_of_turn>\n<start_of_turn>model\n",
    "<bos>", "<eos>", "<pad>", "<bos><bos>", "a<eos>b", " <eos> ", "<bos> x", "<start_of_turn>",
    "<start_of_turn", "<end_of_turn>>", "<<bos>>", "<bo<bos>s>", "<unused0><unused6241>",
    "<mask>", "[multimodal]", "<start_of_image><end_of_image>",
    "<table><tr><td>1</td></tr></table>", "<s>x</s>", "<div class=x>", "<0x41>", "<0x0A>",
    SPACE, SPACE + "x " + SPACE + SPACE + "y", " x", "  x", "x  ", "a" + " " * 40 + "b",
    "\t" * 40, "\n" * 40, "\t \n \t", "  \n\n\n\n  ", " leading space",
    "\x00\x01\x1f\x7f", "\U00020000\U0002a6d6", "\ue000\U000f0000", "\U0010fffd", "\ufffd",
    "Ｈｅｌｌｏ", "ﬁ ﬂ", "Å Å", "ǅ ǆ", "İstanbul ısı", "straße STRASSE",
    "1234567890 12345678901234567890", "3.14159265358979", "١٢٣٤٥",
]


def read_vocab(path):
    """The GGUF's tokenizer.ggml.* metadata (GGUFReader)."""
    import gguf
    r = gguf.GGUFReader(path)

    def get(key, default=None):
        f = r.fields.get(key)
        if f is None:
            if default is None:
                raise KeyError(f"{path}: metadata '{key}' missing")
            return default
        return f.contents()

    v = {
        "model": get("tokenizer.ggml.model"),
        "tokens": get("tokenizer.ggml.tokens"),
        "scores": get("tokenizer.ggml.scores"),
        "types": get("tokenizer.ggml.token_type"),
        "bos": int(get("tokenizer.ggml.bos_token_id", -1)),
        "eos": int(get("tokenizer.ggml.eos_token_id", -1)),
        "unk": int(get("tokenizer.ggml.unknown_token_id", -1)),
        # llama.cpp's defaults for an SPM vocab when a key is absent.
        "add_bos": bool(get("tokenizer.ggml.add_bos_token", True)),
        "add_eos": bool(get("tokenizer.ggml.add_eos_token", False)),
        "add_space_prefix": bool(get("tokenizer.ggml.add_space_prefix", True)),
    }
    if v["model"] != "llama":
        raise ValueError(f"{path}: tokenizer.ggml.model is {v['model']!r}, not an SPM ('llama')")
    return v


def spm_merges(tokens, scores):
    """Merges from SentencePiece scores as transformers' generate_merges derives them: for every
    piece, each split into two pieces that are both in the vocab (ordered by the halves' ids);
    then all of them by the piece's score, highest first (ties: longer left half, then longer
    right half, then the order above). SPM merges the pair whose concatenation scores highest,
    so the merge rank of a pair is that of the piece it makes."""
    vocab = {p: i for i, p in enumerate(tokens)}
    merges = []
    for piece, score in zip(tokens, scores):
        local = []
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                local.append((vocab[left], vocab[right], left, right, score))
        local.sort()
        merges += local
    merges.sort(key=lambda m: (m[4], len(m[2]), len(m[3])), reverse=True)
    return vocab, [(m[2], m[3]) for m in merges]


def build_oracle(v):
    from tokenizers import AddedToken, Tokenizer, normalizers, processors
    from tokenizers.models import BPE

    tokens, types = v["tokens"], v["types"]
    vocab, merges = spm_merges(tokens, v["scores"])
    unk = tokens[v["unk"]] if v["unk"] >= 0 else None
    tok = Tokenizer(BPE(vocab, merges, unk_token=unk, fuse_unk=True, byte_fallback=True,
                        dropout=None))
    # Control pieces are special, user-defined ones are not; both are matched in the raw text
    # (normalized=False) and split out before the model, as in convert_slow_tokenizer.
    tok.add_tokens([AddedToken(p, normalized=False, special=t == 3)
                    for p, t in zip(tokens, types) if t in (3, 4)])
    # No decoder: smolrt's decode is checked against the input itself (see compare).
    norm = [normalizers.Replace(" ", SPACE)]
    if v["add_space_prefix"]:
        norm.insert(0, normalizers.Prepend(SPACE))
    tok.normalizer = normalizers.Sequence(norm)
    template, specials = ["$A:0"], []
    if v["add_bos"] and v["bos"] >= 0:
        template.insert(0, f"{tokens[v['bos']]}:0")
        specials.append((tokens[v["bos"]], v["bos"]))
    if v["add_eos"] and v["eos"] >= 0:
        template.append(f"{tokens[v['eos']]}:0")
        specials.append((tokens[v["eos"]], v["eos"]))
    tok.post_processor = processors.TemplateProcessing(single=" ".join(template),
                                                       special_tokens=specials)
    return tok, len(merges)


def default_model():
    return os.environ.get("SMOLRT_GEMMA_MODEL", os.path.expanduser(
        "~/.cache/smolrt/gemma-3-270m-q4_k_m.gguf"))


def compare(args, oracle, v, corpus, no_special):
    """One `smolrt tokenize --jsonl` process over the corpus against the oracle; the number of
    strings that fail. --no-special: control tokens written in the text are plain text
    (user-defined ones are still split out), as the oracle's encode_special_tokens."""
    cmd = [args.smolrt, "tokenize", "-m", args.model, "--jsonl"]
    if no_special:
        cmd.append("--no-special")
    results = run_smolrt_jsonl(cmd, corpus)
    if results is None:
        return len(corpus)
    oracle.encode_special_tokens = no_special
    tokens = v["tokens"]
    bos = tokens[v["bos"]] if v["add_bos"] and v["bos"] >= 0 else ""
    eos = tokens[v["eos"]] if v["add_eos"] and v["eos"] >= 0 else ""
    # The decode (control tokens rendered) gives the input back between the added BOS / EOS; a
    # "▁" written in the text is a space once escaped, and decodes as one.
    return count_mismatches(corpus, results, lambda s: oracle.encode(s).ids,
                            lambda s: bos + s.replace(SPACE, " ") + eos,
                            " (--no-special)" if no_special else "", tokens)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--smolrt", required=True, help="path of the smolrt binary")
    ap.add_argument("--model", default=default_model(),
                    help="SPM GGUF (default: $SMOLRT_GEMMA_MODEL or the cached Gemma 3 270M)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--random", type=int, default=600, help="random strings in the corpus")
    args = ap.parse_args()
    try:
        import gguf  # noqa: F401
        import tokenizers
    except ImportError as e:
        print(f"skipped: python package missing ({e}); "
              "pip install -r scripts/test-requirements.txt")
        return 77
    if not os.path.exists(args.model):
        print(f"skipped: {args.model} not found; run scripts/fetch_model.sh gemma3-270m "
              "(or set SMOLRT_GEMMA_MODEL)")
        return 77

    t0 = time.time()
    v = read_vocab(args.model)
    oracle, n_merges = build_oracle(v)
    t1 = time.time()
    corpus = build_corpus(args.seed, args.random, GEMMA_POOLS) + GEMMA_EDGE
    failed = {mode: compare(args, oracle, v, corpus, mode == "no-special")
              for mode in ("special", "no-special")}
    print(f"hf spm oracle (tokenizers {tokenizers.__version__}, {len(v['tokens'])} pieces, "
          f"{n_merges} merges, add_space_prefix {v['add_space_prefix']}, oracle built in "
          f"{t1 - t0:.1f}s): " + ", ".join(f"{mode}: {len(corpus) - n} passed, {n} failed"
                                         for mode, n in failed.items()))
    return 1 if any(failed.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
