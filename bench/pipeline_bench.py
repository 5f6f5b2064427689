#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Pipeline bubble, activation memory and recomputation, measured.

Runs `ndmini train` (through mpiexec) and reads each run's metrics summary:

1. pp = 2 with m = 2, 4, 8 micro-batches per step, GPipe and 1F1B: the step
   time, the bubble each stage measured (time waiting for its neighbour), the
   ideal fraction (pp - 1) / (m + pp - 1), and the activations each stage held
   in flight at most (GPipe keeps m micro-batches, 1F1B at most pp - r).
2. One rank, train.recompute = "none" versus "block": step time and the
   activations held, so the memory saved and the time it costs sit side by side.

Usage: bench/pipeline_bench.py [--ndmini build/miniapp/ndmini] [--deck inputs/small.toml]
                               [--steps 8] [--repeats 3]
Each figure is the median over --repeats runs; their range is printed too.
Run it on a quiet machine with one core per rank.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run(args, ranks, overrides):
    """One training run; returns its metrics summary (dict)."""
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.jsonl")
        cmd = ["mpiexec", "-n", str(ranks), args.ndmini, "train", args.deck, "--metrics", metrics,
               "--set", f"train.steps={args.steps}", "--set", "perf.peak_gflops=100",
               "--set", "train.log_every=1000"]
        for o in overrides:
            cmd += ["--set", o]
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"failed: {' '.join(cmd)}\n{done.stdout}\n{done.stderr}")
        with open(metrics) as f:
            return [json.loads(line) for line in f if '"summary"' in line][-1]


def repeated(args, ranks, overrides):
    """--repeats runs: the list of their summaries."""
    return [run(args, ranks, overrides) for _ in range(args.repeats)]


def med(values):
    return statistics.median(values)


def span(values, fmt="{:.1f}"):
    return (fmt + "-" + fmt).format(min(values), max(values))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ndmini", default="build/miniapp/ndmini")
    p.add_argument("--deck", default="inputs/small.toml")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    mib = 1048576.0

    print(f"# Pipeline bubble, pp = 2, micro-batch 1, {args.deck}, medians of {args.repeats} runs\n")
    print("| schedule | m | step ms (range) | stage 0 bubble | stage 1 bubble | ideal | "
          "activations stage 0 / 1 (MiB) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for schedule in ("gpipe", "1f1b"):
        for m in (2, 4, 8):
            runs = repeated(args, 2, ["parallel.pp=2", f"parallel.schedule={schedule}", "train.micro_batch=1",
                                      f"train.global_batch={m}"])
            step = [r["median_step_ms"] for r in runs]
            b0 = med([r["bubble_ms_per_stage"][0] for r in runs])
            b1 = med([r["bubble_ms_per_stage"][1] for r in runs])
            act = runs[0]["peak_activation_bytes_per_stage"]
            print(f"| {schedule} | {m} | {med(step):.1f} ({span(step)}) | {b0:.1f} ms ({100 * b0 / med(step):.0f}%) | "
                  f"{b1:.1f} ms ({100 * b1 / med(step):.0f}%) | {100 * runs[0]['ideal_bubble']:.0f}% | "
                  f"{act[0] / mib:.1f} / {act[1] / mib:.1f} |")

    print(f"\n# Activation recomputation, one rank, {args.deck}, medians of {args.repeats} runs\n")
    print("| recompute | step ms (range) | activations in flight (MiB) |")
    print("|---|---:|---:|")
    for mode in ("none", "block"):
        runs = repeated(args, 1, [f"train.recompute={mode}"])
        step = [r["median_step_ms"] for r in runs]
        print(f"| {mode} | {med(step):.1f} ({span(step)}) | {runs[0]['peak_activation_bytes_per_stage'][0] / mib:.1f} |")


if __name__ == "__main__":
    main()
