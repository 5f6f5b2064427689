#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Training throughput of the decks: a few steps of each, then a markdown table
# built from the summary line that `ndmini train --metrics` writes last.
#
#   bench/throughput.sh                    # small:12 gpt2-124m:6
#   bench/throughput.sh small:20 tiny:50   # DECK:STEPS, decks from inputs/
#
# Environment: NDMINI_EXE (default build/miniapp/ndmini), NP (ranks, 1),
# OUT_DIR (logs and metrics; default a fresh temporary directory),
# OPENBLAS_NUM_THREADS (default 1: one core per rank, as the MFU peak assumes).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
exe=${NDMINI_EXE:-$root/build/miniapp/ndmini}
np=${NP:-1}
out=${OUT_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/ndmini-throughput.XXXXXX")}
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=(small:12 gpt2-124m:6)

if [ ! -x "$exe" ]; then
  echo "throughput.sh: no executable at $exe; build ndmini_exe or set NDMINI_EXE" >&2
  exit 1
fi
mkdir -p "$out"

for run in "${runs[@]}"; do
  deck=${run%%:*}
  steps=${run#*:}
  [ "$steps" != "$run" ] || steps=12
  echo "running $deck: $steps steps on $np rank(s), log in $out/$deck.log" >&2
  if ! mpiexec -n "$np" "$exe" train "$root/inputs/$deck.toml" --set "train.steps=$steps" \
      --metrics "$out/$deck.jsonl" >"$out/$deck.log" 2>&1; then
    echo "throughput.sh: $deck failed; the last lines of $out/$deck.log:" >&2
    tail -n 20 "$out/$deck.log" >&2
    exit 1
  fi
done

# The summary line is the last one with "summary": true. MFU is measured
# against the start-up calibration (the 1024^3 product and the run's own
# products, through the GEMM route the run chose, in its precision) unless
# the deck sets perf.peak_gflops; MFU/GEMM is the achieved model FLOP/s per
# rank over the calibrated GEMM rate (equal to MFU when the peak is the
# calibration). A figure to distrust is flagged: MFU above 100% (the peak is
# below what the run did: a peak from the deck, or a calibration slowed by a
# busy core), or the banner's OpenBLAS warning (a kernel older than the CPU:
# fp32 BLAS figures far below the machine's; export the OPENBLAS_CORETYPE it
# names). Each deck's route (the banner's gemm line) is printed under the table.
python3 - "$out" "${runs[@]}" <<'PY'
import json, os, sys

out, runs = sys.argv[1], sys.argv[2:]
print("| deck | ranks | steps | median ms/step | tokens/s | model GFLOP/s/rank | MFU | GEMM GFLOP/s (calibrated) | MFU/GEMM | flags |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
routes = []
for run in runs:
    deck = run.split(":")[0]
    summary = None
    with open(os.path.join(out, deck + ".jsonl")) as f:
        for line in f:
            line = line.strip()
            if line:
                rec = json.loads(line)
                if rec.get("summary"):
                    summary = rec
    if summary is None:
        sys.exit(f"throughput.sh: no summary line in {out}/{deck}.jsonl")
    ranks = round(summary["tokens_per_s"] / summary["tokens_per_s_per_rank"]) if summary.get("tokens_per_s_per_rank") else 1
    model = summary["mfu"] * summary["peak_flops"] / 1e9
    calibrated = str(summary.get("peak_source", "")).startswith("measured")
    gemm = f"{summary['peak_flops'] / 1e9:.1f}" if calibrated else "n/a (peak from deck)"
    ratio = f"{model / (summary['peak_flops'] / 1e9):.3f}" if calibrated else "n/a"
    log = open(os.path.join(out, deck + ".log")).read().splitlines()
    flags = []
    if summary["mfu"] > 1:
        flags.append("MFU above 100%: the peak is below the run's rate")
    if any(l.startswith("warning: OpenBLAS runs") for l in log):
        flags.append("OpenBLAS runs a kernel older than the CPU (see the log's warning)")
    routes += [f"- {deck}: {l}" for l in log if l.startswith("gemm:")][:1]
    print(f"| {deck} | {ranks} | {summary['steps']} | {summary['median_step_ms']:.1f} | "
          f"{summary['tokens_per_s']:.0f} | {model:.1f} | {100 * summary['mfu']:.1f}% | {gemm} | {ratio} | "
          f"{'; '.join(flags) or '-'} |")
if routes:
    print()
    print("\n".join(routes))
PY
