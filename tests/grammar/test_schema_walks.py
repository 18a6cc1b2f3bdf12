#!/usr/bin/env python3
"""The jsonschema oracle for structured output: random walks through each schema's grammar
over the real SmolLM2 vocabulary (grammar_walk) must give JSON that validates against the
schema. Exit 77 (skipped) without the jsonschema package or the tokenizer fixture."""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--walker", required=True)
    ap.add_argument("--walks", type=int, default=12)
    args = ap.parse_args()
    try:
        import jsonschema
    except ImportError:
        print("skipped: the jsonschema package is missing (pip install -r scripts/test-requirements.txt)")
        return 77
    fixtures = os.environ.get("SMOLRT_FIXTURES", os.path.join(HERE, "..", "..", "..", "shared"))
    tokenizer = os.path.join(fixtures, "tokenizers", "smollm2-135m", "tokenizer.json")
    if not os.path.exists(tokenizer):
        print(f"skipped: fixture {tokenizer} not found; set SMOLRT_FIXTURES")
        return 77
    schemas_path = os.path.join(HERE, "schemas.json")
    with open(schemas_path, encoding="utf-8") as f:
        schemas = {s["name"]: s["schema"] for s in json.load(f)}
    out = subprocess.run([args.walker, "--tokenizer", tokenizer, "--schemas", schemas_path,
                          "--walks", str(args.walks)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        print(f"grammar_walk failed ({out.returncode}): {out.stderr.strip()}")
        return 1
    failures, counted = 0, {}
    for line in out.stdout.splitlines():
        rec = json.loads(line)
        name, text = rec["name"], rec["text"]
        counted[name] = counted.get(name, 0) + 1
        schema = schemas[name]
        try:
            instance = json.loads(text)
            cls = jsonschema.validators.validator_for(schema)
            cls.check_schema(schema)
            cls(schema).validate(instance)
        except (ValueError, jsonschema.ValidationError) as e:
            failures += 1
            print(f"FAIL {name} walk {rec['walk']}: {str(e).splitlines()[0]}\n  text: {text!r}")
    missing = [n for n in schemas if counted.get(n, 0) != args.walks]
    if missing:
        print(f"FAIL: no or too few walks for {missing}")
        return 1
    total = sum(counted.values())
    print(f"{total - failures}/{total} walks over {len(schemas)} schemas validate")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
