#!/usr/bin/env python3
"""Benchmark the CPU backends on a shared machine: waits for a quiet moment (the CPUs at least
--min-idle idle over the last 3 seconds), then runs `smolrt bench --json --backend B` for each
--backend (default: cpu, the fast path; add cpu-ref for the oracle) and llama.cpp's llama-bench on
the same files when given, several times, and appends one JSON line per
run and prompt length to OUT with the machine, the idle fraction before, the 1-minute load average
before and after, and the repeat index. Report medians over the repeats.

  scripts/cpu_bench.py --smolrt build/smolrt -m MODEL [-m MODEL...]
      --out bench/results/DATE-cpu-TOPIC.jsonl
      [--repeats 5] [--min-idle 0.9] [--wait 600] [--threads 2] [--backend cpu --backend cpu-ref]
      [--llama-bench /work/llama.cpp/build-native/bin/llama-bench --llama-label native ...]
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time


def load1():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def cpu_times():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return v[3] + v[4], sum(v)  # idle + iowait, total


def idle_fraction(seconds=3.0):
    i0, t0 = cpu_times()
    time.sleep(seconds)
    i1, t1 = cpu_times()
    return (i1 - i0) / max(1, t1 - t0)


def wait_quiet(min_idle, wait_s):
    """Idle fraction of the last 3 s once it reaches min_idle (or wait_s has passed)."""
    end = time.time() + wait_s
    while True:
        idle = idle_fraction()
        if idle >= min_idle or time.time() > end:
            return idle


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smolrt", required=True)
    ap.add_argument("-m", "--model", action="append", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--min-idle", type=float, default=0.9)
    ap.add_argument("--wait", type=float, default=600, help="seconds to wait for --min-idle")
    ap.add_argument("--threads", type=int, default=0, help="0: smolrt's default (physical cores)")
    ap.add_argument("--prompt-lengths", default="32,128")
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--backend", action="append", default=[],
                    help="smolrt backend to run (repeatable; default: cpu)")
    ap.add_argument("--llama-bench", action="append", default=[],
                    help="a llama-bench binary to run on the same files (repeatable)")
    ap.add_argument("--llama-label", action="append", default=[],
                    help="a label per --llama-bench (e.g. native, portable)")
    a = ap.parse_args()
    machine = {"host": platform.node(), "cpu": cpu_model(), "cores": os.cpu_count()}
    threads = a.threads or os.cpu_count()
    with open(a.out, "a") as out:
        for rep in range(a.repeats):
            for model, backend in ((m, b) for m in a.model for b in a.backend or ["cpu"]):
                idle = wait_quiet(a.min_idle, a.wait)
                before = load1()
                cmd = [a.smolrt, "bench", "-m", model, "--backend", backend, "--json",
                       "--prompt-lengths", a.prompt_lengths, "--gen-length", str(a.gen),
                       "--iterations", "3"]
                if a.threads:
                    cmd += ["--threads", str(a.threads)]
                r = subprocess.run(cmd, capture_output=True, text=True, check=True)
                after = load1()
                for line in r.stdout.splitlines():
                    j = json.loads(line)
                    j.update({"engine": "smolrt", "machine": machine, "repeat": rep,
                              "idle_before": idle, "load_1m_before": before,
                              "load_1m_after": after})
                    out.write(json.dumps(j) + "\n")
                    print(f"smolrt[{backend}] {os.path.basename(model)} "
                          f"pp{j['prompt_length']}: prefill "
                          f"{j['prefill_tok_s']['median']:.0f} decode "
                          f"{j['decode_tok_s']['median']:.1f} tok/s (idle {idle:.2f}, load "
                          f"{before:.2f} -> {after:.2f})", flush=True)
                if backend != (a.backend or ["cpu"])[0]:
                    continue  # llama.cpp once per model
                for lb, label in zip(a.llama_bench, a.llama_label or a.llama_bench):
                    idle = wait_quiet(a.min_idle, a.wait)
                    before = load1()
                    cmd = [lb, "-m", model, "-p", a.prompt_lengths, "-n", str(a.gen), "-r", "3",
                           "-t", str(threads), "-o", "jsonl"]
                    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
                    after = load1()
                    for line in r.stdout.splitlines():
                        if not line.startswith("{"):
                            continue
                        j = json.loads(line)
                        rec = {"engine": "llama.cpp", "build": label, "model":
                               os.path.basename(model), "machine": machine, "repeat": rep,
                               "idle_before": idle, "load_1m_before": before,
                               "load_1m_after": after,
                               "n_prompt": j.get("n_prompt"), "n_gen": j.get("n_gen"),
                               "avg_ts": j.get("avg_ts"), "stddev_ts": j.get("stddev_ts"),
                               "llama_build_commit": j.get("build_commit"),
                               "cpu_info": j.get("cpu_info"), "n_threads": j.get("n_threads")}
                        out.write(json.dumps(rec) + "\n")
                        what = f"pp{rec['n_prompt']}" if rec["n_prompt"] else f"tg{rec['n_gen']}"
                        print(f"llama.cpp[{label}] {rec['model']} {what}: {rec['avg_ts']:.1f} "
                              f"tok/s (idle {idle:.2f}, load {before:.2f} -> {after:.2f})",
                              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
