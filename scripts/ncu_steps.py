#!/usr/bin/env python3
"""Per-kernel GPU time of the last steps of a run profiled by Nsight Compute.

    ncu --graph-profiling node --cache-control none --clock-control none \
        --metrics gpu__time_duration.sum --csv --page raw CMD > run.csv
    python3 scripts/ncu_steps.py run.csv --first embed_kernel --steps 2

A step starts at each launch of the kernel whose name contains --first; the last --steps steps
are averaged: time per kernel name (summed over its launches in a step), launches, share.
"""
import argparse
import csv
import collections
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--first", default="embed_kernel")
    ap.add_argument("--steps", type=int, default=2)
    a = ap.parse_args()
    rows = []
    with open(a.csv, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    rd = csv.reader(lines)
    head = next(rd)
    name_i = head.index("Kernel Name")
    t_i = head.index("gpu__time_duration.sum")
    grid_i = head.index("Grid Size") if "Grid Size" in head else None
    for r in rd:
        try:
            t = float(r[t_i].replace(",", ""))
        except ValueError:
            continue  # the units row
        rows.append((r[name_i], t, r[grid_i] if grid_i is not None else ""))
    starts = [i for i, r in enumerate(rows) if a.first in r[0]]
    if len(starts) < a.steps:
        sys.exit(f"only {len(starts)} steps found")
    seg = rows[starts[-a.steps]:]
    agg = collections.defaultdict(lambda: [0.0, 0, set()])
    for n, t, g in seg:
        short = n.split("(")[0][:90]
        agg[short][0] += t / a.steps
        agg[short][1] += 1
        agg[short][2].add(g)
    total = sum(v[0] for v in agg.values())
    print(f"{len(seg) / a.steps:.0f} launches per step, {total / 1000:.1f} us GPU time per step")
    for k, (t, n, grids) in sorted(agg.items(), key=lambda kv: -kv[1][0]):
        print(f"{t / 1000:9.1f} us {100 * t / total:5.1f}% {n // a.steps:5d}x  {k}  grids {sorted(grids)[:4]}")


if __name__ == "__main__":
    main()
