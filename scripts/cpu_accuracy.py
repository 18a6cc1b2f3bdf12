#!/usr/bin/env python3
"""The fast CPU path (--backend cpu) against the fp32 oracle (--backend cpu-ref) on real models.

For each model: both backends decode the same prompt greedily (`smolrt run --temp 0`); the oracle's
sequence (prompt + its continuation) is then fed to both with `smolrt logits --all-positions`, and
every position's logits are compared: relative L2 error ||fast - ref|| / ||ref|| and whether the
argmax agrees. Where the greedy texts part, the position is checked in float64
(tests/oracle/f64_reference.py's forward pass) to tell a near-tie from an error: the f64 logits'
top-2 gap at that position is printed beside both backends' choices.

  scripts/cpu_accuracy.py --smolrt build/smolrt -m MODEL [-m MODEL...] [--gen 64] [--json OUT]
      [--llama-completion BIN]
Prints one line per model; --json appends one JSON object per model to OUT (JSON lines). With
--llama-completion (llama.cpp's greedy completion tool) its text is set beside the oracle's too:
the length of the common prefix, in characters, for the fast path and for llama.cpp.
"""
import argparse
import json
import os
import platform
import subprocess
import sys

import numpy as np

PROMPT = ("<|im_start|>user\nWrite a short story about a robot who learns to paint.<|im_end|>\n"
          "<|im_start|>assistant\n")
GEMMA_PROMPT = "The history of the printing press begins"


def run(binary, model, backend, prompt, n):
    cmd = [binary, "run", "-m", model, "-p", prompt, "-n", str(n), "--temp", "0", "--json",
           "--backend", backend]
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    j = json.loads(r.stdout)
    return j["prompt_ids"], j["generated_ids"], j["text"]


def llama_text(binary, model, prompt, n):
    cmd = [binary, "-m", model, "-p", prompt, "-n", str(n), "--temp", "0", "-no-cnv",
           "--no-display-prompt", "-t", "2"]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def common_prefix(a, b):
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def logits(binary, model, backend, ids):
    cmd = [binary, "logits", "-m", model, "--ids", ",".join(map(str, ids)), "--all-positions",
           "--json", "--backend", backend]
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return np.asarray(json.loads(r.stdout)["logits"], dtype=np.float64)


def f64_at(model, ids):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                    "oracle"))
    import f64_reference as f64  # noqa: E402 (needs numpy + gguf, scripts/test-requirements.txt)
    cfg, w, _ = f64.load(model)
    return f64.forward(cfg, w, ids, last_only=True)[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smolrt", required=True)
    ap.add_argument("-m", "--model", action="append", required=True)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--json", help="append JSON lines here")
    ap.add_argument("--no-f64", action="store_true",
                    help="skip the float64 check where greedy parts")
    ap.add_argument("--llama-completion", help="llama.cpp's llama-completion, for its greedy text")
    a = ap.parse_args()
    for model in a.model:
        prompt = GEMMA_PROMPT if "gemma" in os.path.basename(model).lower() else PROMPT
        p_ids, ref_gen, ref_text = run(a.smolrt, model, "cpu-ref", prompt, a.gen)
        _, fast_gen, fast_text = run(a.smolrt, model, "cpu", prompt, a.gen)
        same = 0
        while same < len(ref_gen) and same < len(fast_gen) and ref_gen[same] == fast_gen[same]:
            same += 1
        ids = p_ids + ref_gen[:-1]
        ref = logits(a.smolrt, model, "cpu-ref", ids)
        fast = logits(a.smolrt, model, "cpu", ids)
        rel = np.linalg.norm(fast - ref, axis=1) / np.linalg.norm(ref, axis=1)
        top_same = float(np.mean(np.argmax(fast, axis=1) == np.argmax(ref, axis=1)))
        rec = {"model": os.path.basename(model), "machine": platform.node(),
               "prompt_tokens": len(p_ids), "gen": len(ref_gen),
               "greedy_identical_prefix": same, "positions": len(ids),
               "rel_l2_median": float(np.median(rel)), "rel_l2_max": float(np.max(rel)),
               "argmax_agreement": top_same}
        line = (f"{rec['model']}: greedy identical for {same}/{len(ref_gen)} tokens; "
                f"logits rel L2 median {rec['rel_l2_median']:.2e} max {rec['rel_l2_max']:.2e} "
                f"over {len(ids)} positions; argmax agrees at {100 * top_same:.1f}%")
        rec["text_chars"] = len(ref_text)
        rec["fast_text_common_chars"] = common_prefix(fast_text, ref_text)
        line += f"\n  text: fast = oracle for {rec['fast_text_common_chars']}/{len(ref_text)} chars"
        if a.llama_completion:
            lt = llama_text(a.llama_completion, model, prompt, a.gen)
            rec["llama_text_common_chars"] = common_prefix(lt, ref_text)
            line += f", llama.cpp = oracle for {rec['llama_text_common_chars']} chars"
        if same < len(ref_gen):
            pos = len(p_ids) + same - 1  # the position whose logits chose differently
            r_row, f_row = ref[pos], fast[pos]
            a_ref, a_fast = int(np.argmax(r_row)), int(np.argmax(f_row))
            rec["parted_at"] = same
            rec["ref_gap"] = float(r_row[a_ref] - r_row[a_fast])
            rec["fast_gap"] = float(f_row[a_fast] - f_row[a_ref])
            line += (f"\n  parted at generated token {same}: oracle {a_ref} by {rec['ref_gap']:.4f}"
                     f" over {a_fast}, fast {a_fast} by {rec['fast_gap']:.4f}")
            if not a.no_f64:
                want = f64_at(model, ids[:pos + 1])
                rec["f64_gap"] = float(want[a_ref] - want[a_fast])
                better = a_ref if rec["f64_gap"] > 0 else a_fast
                line += (f"; float64 logits: {a_ref} - {a_fast} = {rec['f64_gap']:.4f} "
                         f"(float64 picks {better})")
        print(line, flush=True)
        if a.json:
            with open(a.json, "a") as f:
                f.write(json.dumps(rec) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
