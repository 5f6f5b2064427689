#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Weak scaling of data parallelism, side by side in one study of the scaling
# harness (bench/scaling/scaling.py): small.toml on one rank, then on NP
# ranks with dp_replicate = NP and with dp_shard = NP (FSDP), the global
# batch NP times larger. Prints the harness's table (tokens/s, efficiency
# against the one-rank run, exposed communication share) and leaves
# results.csv, results.md and scaling.png in OUT_DIR.
#
#   bench/dp_weak_scaling.sh            # NP=2, 20 steps
#   NP=2 STEPS=30 REPEATS=3 bench/dp_weak_scaling.sh
#
# Environment: NDMINI_EXE (default build/miniapp/ndmini), NP, STEPS, REPEATS
# (default 1), OUT_DIR (default a fresh temporary directory).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
np=${NP:-2}
out=${OUT_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/ndmini-dp-scaling.XXXXXX")}
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
exec python3 "$root/bench/scaling/scaling.py" "$root/inputs/small.toml" --mode weak \
  --point 1:dp_replicate=1 --point "$np:dp_replicate=$np" --point "$np:dp_shard=$np" \
  --steps "${STEPS:-20}" --repeats "${REPEATS:-1}" --name dp-weak \
  --exe "${NDMINI_EXE:-$root/build/miniapp/ndmini}" --out "$out"
