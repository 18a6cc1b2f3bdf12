#!/usr/bin/env python3
"""Hugging Face `tokenizers` as the oracle for smolrt's byte-level BPE on SmolLM2's tokenizer.json.

Builds a seeded corpus of several hundred strings (prose, code, edge cases, random mixes of
scripts / whitespace / digits / emoji / special tokens), tokenizes all of them in one
`smolrt tokenize --tokenizer-json PATH --jsonl` process, and requires every id to equal the
oracle's, and smolrt's decode to give the input back. Exit 77 (ctest: skipped) when `tokenizers`
or the fixtures are missing.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

# The pre_tokenizer of Llama 3's and Qwen2's tokenizer.json (their Split patterns differ only in
# \p{N}{1,3} vs \p{N}); --pre puts one on SmolLM2's byte-level vocabulary and merges, so both
# smolrt and the oracle split words by that pattern before the same BPE.
SPLIT_PATTERNS = {
    "llama3": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}


def with_pre_tokenizer(path, pre, out_dir):
    """A copy of the tokenizer.json at path whose pre_tokenizer is `pre`'s Split + ByteLevel."""
    with open(path, encoding="utf-8") as f:
        j = json.load(f)
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": SPLIT_PATTERNS[pre]}, "behavior": "Isolated",
         "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
         "use_regex": False}]}
    # SmolLM2 splits digits singly, so its vocabulary has no digit pairs: add them (as the
    # lowest-priority merges) so that digit runs grouped by \p{N}{1,3} tokenize differently from
    # single digits, and the digit rule shows in the ids.
    model = j["model"]
    string_merges = bool(model["merges"]) and isinstance(model["merges"][0], str)
    next_id = max(model["vocab"].values()) + 1
    for a in "0123456789":
        for b in "0123456789":
            if a + b in model["vocab"]:
                continue
            model["vocab"][a + b] = next_id
            next_id += 1
            model["merges"].append(f"{a} {b}" if string_merges else [a, b])
    # Llama 3's tokenizer.json has ignore_merges (a word that is itself a token skips the
    # merges; smolrt: on for llama-bpe, as llama.cpp): two whole-word tokens no merge reaches, in
    # the corpus below, make it show in the ids (they split by the merges for qwen2).
    for w in ("zyzzyvaq", "\u0120zyzzyvaq"):
        model["vocab"][w] = next_id
        next_id += 1
    model["ignore_merges"] = pre == "llama3"
    out = os.path.join(out_dir, f"tokenizer-{pre}.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    return out

PROSE = [
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun.",
    "The quick brown fox jumps over the lazy dog.",
    "It's a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife.",
    "We'll see; they're sure I'd've known. You'VE got it, DON'T you? 'tis 'Twas",
    "In 1969, Apollo 11 landed on the Moon; 3.14159 is pi, and 1,000,000 is a million.",
    "Dr. Smith's e-mail: john.doe+test@example.com — call +1 (555) 123-4567!",
    "Привет, мир! Как дела?", "Γειά σου Κόσμε", "Ça va? Élève, naïve, façade, Führer.",
    "我想在apple工作1314151天～", "日本語のテキストです。カタカナとひらがな。", "안녕하세요 세계",
    "مرحبا بالعالم ١٢٣", "שלום עולם", "नमस्ते दुनिया १२३", "สวัสดีชาวโลก", "Cửa Việt",
]
CODE = [
    "def f(x):\n    return x ** 2  # square\n",
    "int main(int argc, char** argv) {\n\tprintf(\"%d\\n\", argc);\n\treturn 0;\n}\n",
    "for (let i = 0; i < 10; i++) { console.log(`i=${i}`); }",
    "SELECT * FROM users WHERE id = 42 AND name LIKE '%bob%';",
    "https://github.com/huggingface/tokenizers/blob/main/README.md?x=1&y=2#L10",
    "<div class=\"a\">&nbsp;<br/></div>", "x = [1, 2, 3]\r\ny = {'a': 1}\r\n",
    "    indented\n        more\n\n\n\tand tabs\t\there  ",
]
EDGE = [
    "", " ", "  ", "   ", "\t", "\n", "\n\n", "\n\n\n", "\t\n", " \n ", "\r\n", "\r\n\r\n",
    "a  b", "a   b", "a \tb", "a\t b", "a\n b", "a \n b", "  leading", "trailing  ",
    "3", "33", "333", "3333", "3.3", "3..3", " 3 33", "x1y22z333", "¹²³ ½ ⅓ Ⅻ ①", "１２３ ٣٤٥",
    "zyzzyvaq zyzzyvaq, zyzzyvaqs", "'s 't 're 've 'm 'll 'd", "'S 'T 'RE", "''''", "don't can't won't", "a's b'c",
    "!!!!!!", "??? ...", "------=======", "```````", "\"\"\"\"", "(((( ))))",
    "🦙", "🦙🦙", "😶‍🌫️", "👩‍👩‍👧‍👦", "👍🏽", "🇫🇷🇯🇵", "✅", "❤️", "🚀 (normal) 😶‍🌫️ (multiple)",
    "é", "é", "ñ", "क्षि", "ক্ষ", "e\u0301\u0302\u0303",
    "\u00a0nbsp", "ideo\u3000space", "line\u2028sep", "para\u2029sep", "nel\u0085x", "\x0b\x0c",
    "zero\u200bwidth", "bom\ufeffx", "soft\u00adhyphen", "<|im_start|>user\nHi<|im_end|>\n",
    "<|endoftext|>", "a<|endoftext|>b", "<|im_start|><|im_end|>", "<|im_start", "<|im_start|",
    "<repo_name>x<file_sep>y", "<reponame><filename><gh_stars>10", "<jupyter_code>print(1)",
]

POOLS = {
    "ascii": list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"),
    "digit": list("0123456789"),
    "punct": list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"),
    "space": [" ", " ", " ", "  ", "\t", "\n", "\n\n", "\r\n", "\u00a0", "\u3000", "\x0b", "\x0c"],
    "latin": list("àáâãäåæçèéêëìíîïðñòóôõöøùúûüýþÿßœŀ"),
    "cyrillic": list("абвгдежзийклмнопрстуфхцчшщъыьэюяЖЩ"),
    "greek": list("αβγδεζηθικλμνξοπρστυφχψωΩΣ"),
    "cjk": list("的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年"),
    "kana": list("あいうえおかきくけこアイウエオカキクケコ"),
    "arabic": list("ابتثجحخدذرزسشصضطظعغفقكلمنهوي١٢٣"),
    "hebrew": list("אבגדהוזחטיכלמנסעפצקרשת"),
    "devanagari": list("अआइईउऊकखगघचछजझटठडढणतथदधनपफबभमयरलवशषसह") + ["\u093e", "\u093f",
                                                                       "\u094d", "\u0902", "१"],
    "thai": list("กขคงจฉชซญดตถทนบปผพฟภมยรลวศษสหอฮ") + ["\u0e31", "\u0e34", "\u0e48"],
    "emoji": ["😀", "😁", "🦙", "🚀", "👍", "👍🏽", "❤️", "👩‍💻", "👨‍👩‍👧", "🇺🇸", "🇩🇪", "✅", "🎉"],
    "combining": ["\u0301", "\u0308", "\u0327", "\u20dd", "\u200d", "\ufe0f"],
    "number_other": list("²³¹¼½¾ⅠⅡⅫ①②⑩٣۴５"),
    "special": ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<file_sep>", "<|im_"],
    "word": ["the", " the", "The", " and", "ing", " tokenizer", "'s", "'ll", " don't", "http",
             "://", ".com", "    ", "\t\t", "def", "return", "1234", "3.14"],
}


def random_strings(rng, n, pools=POOLS):
    names = list(pools)
    out = []
    for _ in range(n):
        k = rng.randint(1, 40)
        focus = rng.sample(names, rng.randint(1, 4))
        out.append("".join(rng.choice(pools[rng.choice(focus)]) for _ in range(k)))
    return out


def build_corpus(seed, n_random, pools=POOLS):
    """The fixed strings, then n_random seeded mixes from `pools` (hf_spm_oracle.py passes its
    own, with the Gemma vocab's control tokens in place of SmolLM2's)."""
    rng = random.Random(seed)
    corpus = PROSE + CODE + EDGE
    corpus += [" " + s for s in PROSE] + ["\n".join(PROSE), "\n\n".join(CODE)]
    corpus += random_strings(rng, n_random, pools)
    return corpus


def run_smolrt_jsonl(cmd, corpus):
    """One `smolrt tokenize ... --jsonl` process over the corpus: its {"ids", "text"} results in
    order, or None (after saying why) when it failed or printed a wrong number of lines."""
    stdin = "".join(json.dumps(s) + "\n" for s in corpus)
    proc = subprocess.run(cmd, input=stdin.encode(), capture_output=True, timeout=300)
    if proc.returncode != 0:
        print(f"FAIL: {' '.join(cmd)} exited {proc.returncode}: "
              f"{proc.stderr.decode(errors='replace')}")
        return None
    # Only "\n" separates results (str.splitlines would also split at U+2028, U+0085, ...).
    lines = proc.stdout.decode().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) != len(corpus):
        print(f"FAIL: smolrt printed {len(lines)} results for {len(corpus)} strings")
        return None
    return [json.loads(line) for line in lines]


def count_mismatches(corpus, results, want_ids, want_text, label="", pieces=None):
    """Strings whose smolrt ids differ from want_ids(s), or whose decode is not want_text(s);
    the first 10 are printed (with their pieces when `pieces`, id -> piece, is given)."""
    failed = 0
    for s, got in zip(corpus, results):
        want = want_ids(s)
        if got["ids"] != want:
            failed += 1
            if failed <= 10:
                print(f"MISMATCH{label} {s!r}\n  oracle {want}\n  smolrt {got['ids']}")
                if pieces is not None:
                    print(f"  oracle pieces {[pieces[i] for i in want]}\n"
                          f"  smolrt pieces {[pieces[i] for i in got['ids']]}")
        elif got["text"] != want_text(s):
            failed += 1
            if failed <= 10:
                print(f"DECODE MISMATCH{label} {s!r} -> {got['text']!r}")
    return failed


def default_tokenizer_json():
    fx = os.environ.get("SMOLRT_FIXTURES") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared")
    return os.path.join(fx, "tokenizers", "smollm2-135m", "tokenizer.json")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--smolrt", required=True, help="path of the smolrt binary")
    ap.add_argument("--tokenizer", default=default_tokenizer_json(), help="tokenizer.json")
    ap.add_argument("--model", help="run smolrt on this GGUF (e.g. from `smolrt synth "
                    "--tokenizer`) instead of loading the tokenizer.json directly")
    ap.add_argument("--pre", choices=sorted(SPLIT_PATTERNS),
                    help="replace the tokenizer.json's pre_tokenizer by this family's pattern")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--random", type=int, default=600, help="random strings in the corpus")
    args = ap.parse_args()
    try:
        import tokenizers
    except ImportError:
        print("skipped: tokenizers not installed (pip install -r scripts/test-requirements.txt)")
        return 77
    if not os.path.exists(args.tokenizer):
        print(f"skipped: fixtures not found ({args.tokenizer}); set SMOLRT_FIXTURES")
        return 77

    tmp = tempfile.TemporaryDirectory()
    if args.pre:
        args.tokenizer = with_pre_tokenizer(args.tokenizer, args.pre, tmp.name)
    oracle = tokenizers.Tokenizer.from_file(args.tokenizer)
    corpus = build_corpus(args.seed, args.random)
    source = ["-m", args.model] if args.model else ["--tokenizer-json", args.tokenizer]
    results = run_smolrt_jsonl([args.smolrt, "tokenize", *source, "--jsonl"], corpus)
    if results is None:
        return 1
    failed = count_mismatches(corpus, results, lambda s: oracle.encode(s).ids, lambda s: s)
    print(f"hf oracle (tokenizers {tokenizers.__version__}, pre {args.pre or 'as in the file'}): "
          f"{len(corpus) - failed} passed, "
          f"{failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
