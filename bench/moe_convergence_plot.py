#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Compares an MoE run with a dense run from their `ndmini train --metrics`
files (bench/moe_convergence.sh runs them).

    moe_convergence_plot.py --png out.png moe-small=moe-small.jsonl small=small.jsonl

The MoE run first. Prints a markdown table (final training and validation
loss of each run; the MoE run's expert load over the run) and draws both loss
curves (training per step, validation as markers) above the MoE run's
imbalance (the most-loaded expert's tokens over the mean) per step.
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "scaling"))
import study  # noqa: E402  bench/scaling/study.py: the metrics file's reader


def read_metrics(path):
    """Per-step records and the summary of one metrics file, or an exit naming what is wrong."""
    try:
        records, summary = study.read_metrics(path)
    except OSError as e:
        sys.exit(f"moe_convergence_plot.py: error: cannot read '{path}': {e.strerror}")
    if summary is None or not records:
        sys.exit(f"moe_convergence_plot.py: error: '{path}' has no steps or no summary line (did the run finish?)")
    return records, summary


def last_val(records):
    vals = [r["val_loss"] for r in records if r.get("val_loss") is not None]
    return vals[-1] if vals else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--png", required=True)
    ap.add_argument("--note", default="")
    ap.add_argument("runs", nargs=2, metavar="NAME=FILE")
    args = ap.parse_args()
    runs = []
    for item in args.runs:
        name, eq, path = item.partition("=")
        if not eq:
            sys.exit(f"moe_convergence_plot.py: error: '{item}': expected NAME=FILE")
        runs.append((name, *read_metrics(path)))
    moe_name, moe_records, _ = runs[0]
    loads = [r["moe"] for r in moe_records if "moe" in r]
    if not loads:
        sys.exit(f"moe_convergence_plot.py: error: the first run ('{moe_name}') has no expert load: not an MoE run")

    print("| run | steps | final training loss | final validation loss |")
    print("|---|---:|---:|---:|")
    for name, records, _ in runs:
        val = last_val(records)
        val_text = f"{val:.6f}" if val is not None else "-"
        print(f"| {name} | {records[-1]['step']} | {records[-1]['loss']:.6f} | {val_text} |")
    imb = [l["imbalance"] for l in loads]
    print()
    print(f"{moe_name}: imbalance (max/mean tokens per expert) median {statistics.median(imb):.3f}, "
          f"first step {imb[0]:.3f}, last {imb[-1]:.3f}, range {min(imb):.3f}-{max(imb):.3f}; "
          f"tokens per expert min {min(l['tokens_per_expert_min'] for l in loads)}, "
          f"max {max(l['tokens_per_expert_max'] for l in loads)}, mean {loads[0]['tokens_per_expert_mean']:.1f}")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    for name, records, _ in runs:
        line, = top.plot([r["step"] for r in records], [r["loss"] for r in records], lw=1, label=f"{name} training")
        vals = [(r["step"], r["val_loss"]) for r in records if r.get("val_loss") is not None]
        if vals:
            top.plot(*zip(*vals), "o", color=line.get_color(), ms=4, label=f"{name} validation")
    top.set_ylabel("loss")
    top.set_title(f"{moe_name} against {runs[1][0]} (same active parameters)" + (f"\n{args.note}" if args.note else ""))
    top.legend()
    top.grid(alpha=0.3)
    bottom.plot([r["step"] for r in moe_records if "moe" in r], imb, lw=1, color="tab:red")
    bottom.axhline(1.0, color="gray", lw=0.5)
    bottom.set_ylabel("imbalance\n(max/mean)")
    bottom.set_xlabel("step")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    print(f"\nfigure: {args.png}")


if __name__ == "__main__":
    main()
