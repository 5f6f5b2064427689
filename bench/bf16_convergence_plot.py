#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Compares training runs of the same deck and seed in two precisions, from
their `ndmini train --metrics` files (bench/bf16_convergence.sh runs them).

    bf16_convergence_plot.py --png out.png --tolerance 0.01 \\
        small:fp32=small-fp32.jsonl small:bf16=small-bf16.jsonl tiny:fp32=... tiny:bf16=...

Arguments are CASE:PRECISION=FILE, two precisions per case, the reference
first. Prints a markdown table (final training and validation loss of each run
and their relative difference) and draws, per case, both loss curves (training
per step, validation as markers) and the per-step relative difference of the
training loss. Exit status 2 when a relative difference exceeds --tolerance.
"""
import argparse
import json
import sys


def read_metrics(path):
    """(steps, losses, val_steps, val_losses, summary) of one metrics file."""
    steps, losses, val_steps, val_losses, summary = [], [], [], [], None
    try:
        with open(path) as f:
            for line in f:
                if not line.strip():
                    continue
                rec = json.loads(line)
                if rec.get("summary"):
                    summary = rec
                    continue
                if "step" not in rec:
                    continue  # the header record (version, deck, config) measures nothing
                steps.append(rec["step"])
                losses.append(rec["loss"])
                if rec.get("val_loss") is not None:
                    val_steps.append(rec["step"])
                    val_losses.append(rec["val_loss"])
    except OSError as e:
        sys.exit(f"bf16_convergence_plot.py: error: cannot read '{path}': {e.strerror}")
    if summary is None:
        sys.exit(f"bf16_convergence_plot.py: error: '{path}' has no summary line (did the run finish?)")
    return steps, losses, val_steps, val_losses, summary


def parse_runs(items):
    """{case: [(precision, path), (precision, path)]} in the order given."""
    cases = {}
    for item in items:
        name, eq, path = item.partition("=")
        case, colon, precision = name.rpartition(":")
        if not eq or not colon or not case:
            sys.exit(f"bf16_convergence_plot.py: error: '{item}': expected CASE:PRECISION=FILE")
        cases.setdefault(case, []).append((precision, path))
    for case, runs in cases.items():
        if len(runs) != 2:
            sys.exit(f"bf16_convergence_plot.py: error: case '{case}' has {len(runs)} runs; give two "
                     "(the reference precision first)")
    return cases


def relative(a, b):
    return abs(a - b) / abs(b) if b else float("inf")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", metavar="CASE:PRECISION=FILE")
    ap.add_argument("--png", required=True, help="the figure to write")
    ap.add_argument("--tolerance", type=float, default=0.01, help="relative bound on the final losses (0.01)")
    ap.add_argument("--note", default="", help="a line under the figure's title (provenance)")
    args = ap.parse_args()
    cases = parse_runs(args.runs)
    data = {case: [(p, read_metrics(path)) for p, path in runs] for case, runs in cases.items()}

    print("| case | steps | precision | final training loss | final validation loss (step) |")
    print("|---|---:|---|---:|---:|")
    for case, runs in data.items():
        for precision, (_, _, _, _, s) in runs:
            val = "n/a" if s["final_val_loss"] is None else f"{s['final_val_loss']:.6f} ({s['final_val_step']})"
            print(f"| {case} | {s['steps']} | {precision} | {s['final_loss']:.6f} | {val} |")
    print()
    print(f"| case | candidate / reference | training loss, relative difference | "
          f"validation loss, relative difference | within {100 * args.tolerance:g}% |")
    print("|---|---|---:|---:|---|")
    worst = 0.0
    for case, ((ref_p, ref), (cand_p, cand)) in data.items():
        rs, cs = ref[4], cand[4]
        train = relative(cs["final_loss"], rs["final_loss"])
        diffs = [train]
        val_text = "n/a"
        if rs["final_val_loss"] is not None and cs["final_val_loss"] is not None:
            val = relative(cs["final_val_loss"], rs["final_val_loss"])
            diffs.append(val)
            val_text = f"{100 * val:.3f}%"
        worst = max(worst, *diffs)
        ok = "yes" if max(diffs) <= args.tolerance else "NO"
        print(f"| {case} | {cand_p} / {ref_p} | {100 * train:.3f}% | {val_text} | {ok} |")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(data), figsize=(6 * len(data), 7), squeeze=False,
                             gridspec_kw={"height_ratios": [3, 1]}, sharex="col")
    for col, (case, runs) in enumerate(data.items()):
        top, bottom = axes[0][col], axes[1][col]
        for (precision, (steps, losses, vsteps, vlosses, _)), style in zip(runs, ("-", "--")):
            line, = top.plot(steps, losses, style, lw=1.2, label=f"{precision} training")
            top.plot(vsteps, vlosses, "o" if style == "-" else "x", color=line.get_color(), ms=5,
                     label=f"{precision} validation")
        top.set_title(case)
        top.set_ylabel("loss")
        top.grid(alpha=0.3)
        top.legend()
        (ref_p, ref), (cand_p, cand) = runs
        by_step = dict(zip(ref[0], ref[1]))
        common = [s for s in cand[0] if s in by_step]
        cand_by_step = dict(zip(cand[0], cand[1]))
        bottom.plot(common, [100 * (cand_by_step[s] - by_step[s]) / by_step[s] for s in common], lw=1)
        bottom.axhline(0, color="grey", lw=0.8)
        bottom.set_ylabel(f"{cand_p} - {ref_p}, % of {ref_p}")
        bottom.set_xlabel("step")
        bottom.grid(alpha=0.3)
    (ref_p, _), (cand_p, _) = next(iter(data.values()))
    title = f"ndmini {cand_p} against {ref_p}, same deck and seed"
    fig.suptitle(title + (f"\n{args.note}" if args.note else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    print(f"\nfigure: {args.png}")
    if worst > args.tolerance:
        print(f"bf16_convergence_plot.py: a final loss differs by {100 * worst:.3f}%, "
              f"more than {100 * args.tolerance:g}%", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
