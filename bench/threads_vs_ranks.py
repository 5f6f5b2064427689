#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
"""Two cores as one rank with two threads, or as two single-thread ranks.

For each precision, three runs of a deck side by side, interleaved in every
repetition (so a busy minute hits them alike):
  1 rank, 1 thread     OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
  1 rank, 2 threads    OPENBLAS_NUM_THREADS=2 OMP_NUM_THREADS=2
  2 ranks, 1 thread    parallel.dp_replicate=2, half the micro-batch each
(OMP_PROC_BIND=false in all.) It prints tokens/s (median of the
repetitions, and their range), the speed-up of each over one thread of the
same build, the matrix-product libraries' thread counts from the banner's
`gemm:` line (what really ran on two threads), and whether the 1- and
2-thread runs' losses are the same bits. With --build given more than once,
the builds (e.g. a Serial and an OpenMP Kokkos) run interleaved too, so
their figures are side by side in one run.

Usage: threads_vs_ranks.py [NDMINI] [--build LABEL=NDMINI]... [--passive] [--deck DECK] [--steps N] [--repeats R] [--out FILE]
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

import deck_runs  # bench/deck_runs.py: the arguments the deck-training scripts share

REPO = deck_runs.REPO

CONFIGS = [  # label, ranks, threads, overrides, environment
    ("1 rank, 1 thread", 1, 1, [], {}),
    ("1 rank, 2 threads", 1, 2, [], {}),
    ("2 ranks (dp_replicate), 1 thread each", 2, 1, ["parallel.dp_replicate=2"], {}),
]
# --passive: OpenMP's idle threads sleep at once instead of spinning first,
# which matters where other processes share the cores.
PASSIVE = ("1 rank, 2 threads, OMP_WAIT_POLICY=passive", 1, 2, [], {"OMP_WAIT_POLICY": "passive"})


def builds(a):
    """[(label, executable)]: the --build entries, or the positional executable alone."""
    if not a.build:
        return [("", a.ndmini)]
    out = []
    for entry in a.build:
        label, sep, path = entry.partition("=")
        if not sep or not label or not os.access(path, os.X_OK):
            sys.exit(f"threads_vs_ranks.py: --build {entry}: expected LABEL=EXECUTABLE, an executable ndmini")
        out.append((label, path))
    return out


def main():
    p = deck_runs.parser(__doc__)
    p.add_argument("--build", action="append", metavar="LABEL=NDMINI",
                   help="a build to measure (repeatable: the builds run interleaved); default: NDMINI alone")
    p.add_argument("--passive", action="store_true",
                   help="also one rank with two threads under OMP_WAIT_POLICY=passive")
    a = deck_runs.parse(p, "threads_vs_ranks.py")
    runs = builds(a)
    configs = CONFIGS + ([PASSIVE] if a.passive else [])
    work = tempfile.mkdtemp(prefix="ndmini-threads-vs-ranks.")
    results = {}  # (precision, build, label) -> {"tok": [...], "gemm": str, "losses": [...]}
    for rep in range(a.repeats):
        for precision in ("fp32", "bf16"):
            for build, ndmini in runs:
                for label, ranks, threads, overrides, extra_env in configs:
                    metrics = os.path.join(work, f"m-{precision}-{len(results)}-{rep}.jsonl")
                    # Half the micro-batch on each of two data-parallel ranks: the same global batch.
                    micro = ["train.micro_batch=2"] if ranks == 2 else []
                    sets = [f"train.steps={a.steps}", "train.log_every=1", f"train.precision={precision}",
                            "perf.peak_gflops=100"] + overrides + micro
                    cmd = ["mpiexec", "-n", str(ranks), ndmini, "train", a.deck, "--metrics", metrics]
                    for s in sets:
                        cmd += ["--set", s]
                    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
                               OMP_PROC_BIND="false", **extra_env)
                    r = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
                    if r.returncode != 0:
                        sys.exit(f"{precision} {build} {label}: ndmini train failed:\n"
                                 f"{r.stdout[-2000:]}{r.stderr[-2000:]}")
                    with open(metrics) as f:
                        records = [json.loads(line) for line in f if line.strip()]
                    entry = results.setdefault((precision, build, label), {"tok": [], "gemm": "", "losses": None})
                    entry["tok"].append(records[-1]["tokens_per_s"])
                    entry["gemm"] = next((line for line in r.stdout.splitlines() if line.startswith("gemm:")), "")
                    entry["losses"] = [rec["loss"] for rec in records if "step" in rec]
                    print(f"rep {rep + 1}/{a.repeats} {precision} {build:8s} {label:40s} "
                          f"{entry['tok'][-1]:8.0f} tok/s", flush=True)

    lines = [f"Deck `{os.path.relpath(a.deck, REPO)}`, {a.steps} steps per run (the first left out), "
             f"{a.repeats} repetitions, the runs of each precision interleaved.", ""]
    build_column = len(runs) > 1
    for precision in ("fp32", "bf16"):
        lines += [f"**{precision}**", "",
                  "| " + ("build | " if build_column else "") + "run | tokens/s (median, range) | over 1 thread | "
                  "products on |",
                  "|---" * (5 if build_column else 4) + "|"]
        for build, _ in runs:
            base = statistics.median(results[(precision, build, CONFIGS[0][0])]["tok"])
            for label, *_ in configs:
                e = results[(precision, build, label)]
                med = statistics.median(e["tok"])
                lines.append("| " + (f"{build} | " if build_column else "") +
                             f"{label} | {med:.0f} ({min(e['tok']):.0f}-{max(e['tok']):.0f}) | {med / base:.2f}x | "
                             f"{e['gemm'].removeprefix('gemm: ').replace(' | ', '; ')} |")
        lines.append("")
        for build, _ in runs:
            same = (results[(precision, build, CONFIGS[0][0])]["losses"] ==
                    results[(precision, build, CONFIGS[1][0])]["losses"])
            lines.append(f"Losses of the 1- and 2-thread runs{' of ' + build if build else ''} ({a.steps} steps): "
                         f"{'the same bits' if same else 'DIFFERENT'}.")
        lines.append("")
    deck_runs.emit("\n".join(lines), a.out)


if __name__ == "__main__":
    main()
