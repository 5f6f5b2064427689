#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""The communication an MoE deck's 2-rank layouts expose, group by group.

Each layout trains the deck on 2 ranks (OPENBLAS_NUM_THREADS=1), its runs
interleaved with the other layout's in every repetition (so a busy minute
hits them alike):
  ep=2   dp_shard=2, ep=2: every rank holds 2 of 4 experts whole; the
         tokens travel in the expert group's all-to-alls ("ep")
  ep=1   dp_shard=2, ep=1: every rank computes all experts, sharded over the
         expert fsdp group ("efsdp", gathered as the block's are over "fsdp")
For each communicator with traffic it prints, per step (median over the steps
after the first, then the median of the repetitions and their range): the
bytes rank 0 moved, the slowest rank's exposed time and the least-blocked
rank's (`exposed_min_ms` of the metrics: the transfer no rank could hide,
without waiting for a slower rank: what the code decides on a shared VM).

Usage: moe_exposed_comm.py [NDMINI] [--deck DECK] [--steps N] [--repeats R] [--micro-batch B] [--out FILE]
"""
import os
import statistics
import subprocess
import sys
import tempfile

import deck_runs  # bench/deck_runs.py: the arguments the deck-training scripts share

sys.path.insert(0, os.path.join(deck_runs.REPO, "bench", "scaling"))
import study  # noqa: E402  bench/scaling/study.py: the metrics file's reader

LAYOUTS = [  # label, overrides
    ("ep=2", ["parallel.dp_shard=2", "parallel.ep=2"]),
    ("ep=1", ["parallel.dp_shard=2", "parallel.ep=1"]),
]


def run(a, overrides, metrics):
    cmd = ["mpiexec", "-n", "2", a.ndmini, "train", a.deck, "--metrics", metrics]
    for o in overrides + [f"train.steps={a.steps}", "train.log_every=1000", f"train.micro_batch={a.micro_batch}",
                          "perf.peak_gflops=50"]:
        cmd += ["--set", o]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"moe_exposed_comm.py: {' '.join(cmd)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    steps, _ = study.read_metrics(metrics)
    kept = [s for s in steps if s["step"] >= 1]  # the first step is warm-up
    out = {"step_ms": statistics.median(s["step_ms"] for s in kept)}
    for name in sorted({n for s in kept for n in s.get("comm", {})}):
        per = [s["comm"][name] for s in kept if name in s.get("comm", {})]
        if sum(c["calls"] for c in per) == 0:
            continue
        for key in ("bytes", "exposed_ms", "exposed_min_ms"):
            out[(name, key)] = statistics.median(c[key] for c in per)
    return out


def spread(values, fmt):
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def main():
    p = deck_runs.parser(__doc__)
    p.set_defaults(deck=os.path.join(deck_runs.REPO, "inputs", "moe-small.toml"), steps=8)
    p.add_argument("--micro-batch", type=int, default=2)
    a = deck_runs.parse(p, "moe_exposed_comm.py")
    results = {label: [] for label, _ in LAYOUTS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.repeats):
            for label, overrides in LAYOUTS:
                results[label].append(run(a, overrides, os.path.join(tmp, f"{label}-{r}.jsonl")))
    lines = [f"{os.path.basename(a.deck)} on 2 ranks, micro-batch {a.micro_batch}, {a.steps} steps (the first "
             f"excluded), {a.repeats} repetitions: median (range) of the per-run medians per step", "",
             "| layout | step ms | group | MiB (rank 0) | exposed ms, slowest rank | exposed ms, least-blocked rank |",
             "|---|---:|---|---:|---:|---:|"]
    for label, _ in LAYOUTS:
        runs = results[label]
        groups = sorted({k[0] for run_ in runs for k in run_ if isinstance(k, tuple)})
        step = spread([x["step_ms"] for x in runs], "{:.0f}")
        for g in groups:
            if any((g, "bytes") not in x for x in runs):
                continue
            lines.append(f"| {label} | {step} | {g} | {spread([x[(g, 'bytes')] / 1048576 for x in runs], '{:.2f}')} | "
                         f"{spread([x[(g, 'exposed_ms')] for x in runs], '{:.1f}')} | "
                         f"{spread([x[(g, 'exposed_min_ms')] for x in runs], '{:.1f}')} |")
    deck_runs.emit("\n".join(lines), a.out)


if __name__ == "__main__":
    main()
