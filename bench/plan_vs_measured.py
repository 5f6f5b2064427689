#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""ndmini plan's predicted step time next to the measured one, on this machine.

Trains every 1- and 2-rank layout of a deck (dp, fsdp, tp, tp + sequence
parallelism, cp, pp with each schedule, recompute) REPEATS times, in rounds:
one run of every layout per round, so a slow spell of a shared machine
spoils one run of a few layouts, not all runs of one. Each round starts by
calibrating this machine (`mpiexec -n 2 ndmini plan --calibrate`: GEMM
rates, kernel and memory bandwidth, each collective's latency and
bandwidth; nothing is fitted to the runs), and the round's runs train with
`perf.cluster` set to that file: a calibration is a 30-second sample of a
machine whose speed drifts over minutes, so each round is predicted from
one taken minutes before it. Each run's metrics summary carries the
measured step (the median over its steps after the first) and the
planner's prediction of the same layout, so the table sets them side by
side: per layout the median of the runs' medians and their range, the
median of the runs' predictions, the error; the compute and exposed
communication split the same way; and whether the predicted fastest layout
is the measured fastest (or within 5% of it).

Run it on a quiet machine, one rank per core (OPENBLAS_NUM_THREADS=1 is set
for the runs): the figures are what this machine does that day.

Usage: plan_vs_measured.py [NDMINI] [--deck DECK] [--steps N] [--repeats R]
                           [--cluster FILE] [--out FILE]
  NDMINI     the executable (default build/miniapp/ndmini)
  --deck     default inputs/small.toml
  --steps    steps per run (default 6; the first is left out of the median)
  --repeats  runs per layout (default 3)
  --cluster  a cluster file to use in every round instead of calibrating
  --out      also write the Markdown table to FILE
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

import deck_runs  # bench/deck_runs.py: the arguments the deck-training scripts share

REPO = deck_runs.REPO

# label, ranks, overrides. The micro-batch follows the layout: two
# data-parallel ranks split the batch of 4; a pipeline needs micro-batches
# to overlap (4 of 1); everything else keeps the deck's.
LAYOUTS = [
    ("one rank", 1, []),
    ("one rank, recompute", 1, ["train.recompute=\"block\""]),
    ("dp 2", 2, ["parallel.dp_replicate=2", "train.micro_batch=2"]),
    ("fsdp 2", 2, ["parallel.dp_shard=2", "train.micro_batch=2"]),
    ("tp 2", 2, ["parallel.tp=2"]),
    ("tp 2 + sp", 2, ["parallel.tp=2", "parallel.sequence_parallel=true"]),
    ("tp 2, recompute", 2, ["parallel.tp=2", "train.recompute=\"block\""]),
    ("cp 2", 2, ["parallel.cp=2"]),
    ("pp 2 gpipe", 2, ["parallel.pp=2", "parallel.schedule=\"gpipe\"", "train.micro_batch=1"]),
    ("pp 2 1f1b", 2, ["parallel.pp=2", "parallel.schedule=\"1f1b\"", "train.micro_batch=1"]),
    ("pp 2 interleaved", 2, ["parallel.pp=2", "parallel.schedule=\"interleaved_1f1b\"", "parallel.virtual_stages=3",
                             "train.micro_batch=1"]),
]


def run(cmd, **kw):
    return subprocess.run(cmd, check=False, capture_output=True, text=True, **kw)


def mpiexec(ranks, args):
    return ["mpiexec", "-n", str(ranks)] + args


def summary_of(path):
    with open(path) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    summary = lines[-1]
    if not summary.get("summary"):
        raise RuntimeError(f"{path}: no summary record")
    return summary


def key_value(cluster_text, key):
    """The first value of `key` in a cluster file's text (the intra-node one for a link's key)."""
    for line in cluster_text.splitlines():
        if line.split("=")[0].strip() == key:
            return float(line.split("=")[1])
    raise RuntimeError(f"the cluster file has no {key}")


def pct(predicted, measured):
    return 100.0 * (predicted - measured) / measured


def main():
    p = deck_runs.parser(__doc__)
    p.add_argument("--cluster")
    a = deck_runs.parse(p, "plan_vs_measured.py")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    work = tempfile.mkdtemp(prefix="ndmini-plan-vs-measured.")

    # In rounds: one run of every layout, then the next round. This machine's
    # speed drifts over tens of seconds; a slow spell then falls on one run of
    # a few layouts, which the median drops, not on every run of one layout.
    runs_of = [[] for _ in LAYOUTS]
    clusters = []  # each round's cluster file: (path, text)
    for rep in range(a.repeats):
        cluster = a.cluster
        if cluster is None:
            cluster = os.path.join(work, f"here-{rep + 1}.toml")
            print(f"round {rep + 1}: calibrating: mpiexec -n 2 ndmini plan --calibrate", flush=True)
            r = run(mpiexec(2, [a.ndmini, "plan", "--calibrate", "--out", cluster]), env=env)
            if r.returncode != 0:
                sys.exit(r.stdout + r.stderr)
        with open(cluster) as f:
            clusters.append((cluster, f.read()))
        peak_gflops = key_value(clusters[-1][1], "peak_tflops_fp32") * 1e3  # MFU's peak: no start-up calibration
        for i, (label, ranks, overrides) in enumerate(LAYOUTS):
            sets = [f"train.steps={a.steps}", f"perf.cluster={cluster}"] + overrides
            sets.append(f"perf.peak_gflops={peak_gflops}")
            metrics = os.path.join(work, f"m-{i}-{rep}.jsonl")
            cmd = [a.ndmini, "train", a.deck, "--metrics", metrics]
            for s in sets:
                cmd += ["--set", s]
            r = run(mpiexec(ranks, cmd), env=env)
            if r.returncode != 0:
                sys.exit(f"{label}: ndmini train failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
            runs_of[i].append(summary_of(metrics))
            print(f"{label:22s} run {rep + 1}/{a.repeats}: {runs_of[i][-1]['median_step_ms']:9.1f} ms measured, "
                  f"{runs_of[i][-1]['predicted']['step_ms']:9.1f} ms predicted", flush=True)
    rows = []
    for (label, ranks, overrides), runs in zip(LAYOUTS, runs_of):
        step = [s["median_step_ms"] for s in runs]
        median = lambda f: statistics.median(f(s) for s in runs)  # each figure: the median of the runs'
        rows.append({
            "label": label, "ranks": ranks, "overrides": overrides,
            "measured": statistics.median(step), "min": min(step), "max": max(step),
            "predicted": median(lambda s: s["predicted"]["step_ms"]),
            "compute": median(lambda s: s["compute_ms"]),
            "compute_predicted": median(lambda s: s["predicted"]["compute_ms"]),
            "comm": median(lambda s: sum(s["exposed_comm_ms"].values())),
            "comm_predicted": median(lambda s: sum(s["predicted"]["exposed_comm_ms"].values())),
        })

    deck = os.path.relpath(a.deck, REPO)
    lines = [f"Deck `{deck}`, {a.steps} steps per run (the first left out), {a.repeats} runs per layout; "
             f"cluster file: {'calibrated at the start of each round' if a.cluster is None else a.cluster}. "
             "Each figure is the median of the runs'.", ""]
    if a.cluster is None:
        keys = ["peak_tflops_fp32", "compute", "attention", "memory_bandwidth_gbs", "kernel_bandwidth_gbs",
                "bandwidth_gbs", "all_gather_gbs", "reduce_scatter_gbs", "p2p_gbs"]
        lines += ["The rounds' calibrations (intra-node links):", "",
                  "| round | " + " | ".join(f"`{k}`" for k in keys) + " |", "|---|" + "---|" * len(keys)]
        for n, (_, text) in enumerate(clusters):
            lines.append(f"| {n + 1} | " + " | ".join(f"{key_value(text, k):.4g}" for k in keys) + " |")
        lines += ["", "Round 1's file:", ""]
    lines += ["```", clusters[0][1].strip(), "```", "",
             "| layout | ranks | measured ms (median, range) | predicted ms | error | compute meas. / pred. ms "
             "| exposed comm meas. / pred. ms |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['label']} | {r['ranks']} | {r['measured']:.1f} ({r['min']:.1f}-{r['max']:.1f}) | "
                     f"{r['predicted']:.1f} | {pct(r['predicted'], r['measured']):+.1f}% | "
                     f"{r['compute']:.1f} / {r['compute_predicted']:.1f} | {r['comm']:.1f} / {r['comm_predicted']:.1f} |")
    errors = [abs(pct(r["predicted"], r["measured"])) for r in rows]
    within = sum(e <= 15 for e in errors)
    for ranks in (1, 2):
        group = [r for r in rows if r["ranks"] == ranks]
        fastest = min(group, key=lambda r: r["measured"])
        picked = min(group, key=lambda r: r["predicted"])
        slower = pct(picked["measured"], fastest["measured"])
        lines += ["", f"{ranks} rank(s): measured fastest **{fastest['label']}** ({fastest['measured']:.1f} ms); "
                      f"predicted fastest **{picked['label']}**, measured {picked['measured']:.1f} ms "
                      f"({slower:+.1f}% of the fastest; the issue asks at most 5%)."]
    lines += ["", f"{within} of {len(rows)} layouts within 15%; mean |error| {statistics.mean(errors):.1f}%, "
                  f"worst {max(errors):.1f}%."]
    deck_runs.emit("\n".join(lines) + "\n", a.out)


if __name__ == "__main__":
    main()
