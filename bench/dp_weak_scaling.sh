#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Weak scaling of data parallelism, measured side by side: small.toml on one
# rank, then on NP ranks (one per core) with dp_replicate = NP and the global
# batch NP times larger (the micro-batch per rank fixed). Prints tokens/s,
# the ratio to NP x the one-rank rate (the target is 0.9 or more) and the
# exposed communication per step.
#
#   bench/dp_weak_scaling.sh            # NP=2, 20 steps
#   NP=2 STEPS=30 bench/dp_weak_scaling.sh
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
exe=${NDMINI_EXE:-$root/build/miniapp/ndmini}
np=${NP:-2}
steps=${STEPS:-20}
out=${OUT_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/ndmini-dp-scaling.XXXXXX")}
export OPENBLAS_NUM_THREADS=1
deck="$root/inputs/small.toml"
batch=$(sed -n 's/^global_batch *= *\([0-9]*\).*/\1/p' "$deck")

echo "1 rank: small.toml, global batch $batch, $steps steps" >&2
mpiexec -n 1 "$exe" train "$deck" --set "train.steps=$steps" --metrics "$out/one.jsonl" >"$out/one.log"
echo "$np ranks: dp_replicate=$np, global batch $((batch * np))" >&2
mpiexec -n "$np" "$exe" train "$deck" --set "train.steps=$steps" --set "parallel.dp_replicate=$np" \
  --set "train.global_batch=$((batch * np))" --metrics "$out/many.jsonl" >"$out/many.log"

python3 - "$out" "$np" <<'PY'
import json, statistics, sys

out, np = sys.argv[1], int(sys.argv[2])

def load(name):
    steps, summary = [], None
    for line in open(f"{out}/{name}.jsonl"):
        rec = json.loads(line)
        if rec.get("summary"):
            summary = rec
        else:
            steps.append(rec)
    return steps[1:], summary  # the first step is warm-up

one_steps, one = load("one")
many_steps, many = load("many")
exposed = statistics.median(sum(c["exposed_ms"] for c in r["comm"].values()) for r in many_steps)
in_flight = statistics.median(r["comm"]["dp_replicate"]["ms"] for r in many_steps)
ratio = many["tokens_per_s"] / (np * one["tokens_per_s"])
print(f"| ranks | mesh | median ms/step | tokens/s | tokens/s/rank | exposed comm ms/step | dp all-reduce in flight ms |")
print(f"|---:|---|---:|---:|---:|---:|---:|")
print(f"| 1 | {one['mesh']} | {one['median_step_ms']:.1f} | {one['tokens_per_s']:.0f} | {one['tokens_per_s']:.0f} | 0.0 | 0.0 |")
print(f"| {np} | {many['mesh']} | {many['median_step_ms']:.1f} | {many['tokens_per_s']:.0f} | "
      f"{many['tokens_per_s_per_rank']:.0f} | {exposed:.1f} | {in_flight:.1f} |")
print(f"\nweak-scaling efficiency: {ratio:.3f} of {np} x the one-rank tokens/s (target >= 0.9)")
PY
echo "logs and metrics in $out" >&2
