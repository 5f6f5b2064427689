#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Checkpoint write and read bandwidth of a deck's model and AdamW state
# (gpt2-124m.toml: about 1.5 GB) on 1 and 2 ranks, split into create, raw
# write, digest, flush, metadata, commit and prune, next to `dd` writing
# (conv=fsync) and reading the same bytes in the same folder, in the same run.
#
#   bench/checkpoint_io.sh                       # gpt2-124m, 1 and 2 ranks, 3 repetitions
#   DIR=/scratch/me REPS=5 RANKS="1 2 4" bench/checkpoint_io.sh inputs/small.toml
#
# Environment: DIR (the file system under test; default $TMPDIR or /tmp),
# REPS (3), RANKS ("1 2"), BENCH_EXE (default build/bench/bench_checkpoint),
# MPIEXEC (mpiexec). Each rank holds its FSDP-like share of the state in
# memory: 1.5 GB in all for gpt2-124m, plus the page cache of the file.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
deck=${1:-$root/inputs/gpt2-124m.toml}
exe=${BENCH_EXE:-$root/build/bench/bench_checkpoint}
dir=${DIR:-${TMPDIR:-/tmp}}
reps=${REPS:-3}
ranks=${RANKS:-1 2}
mpiexec=${MPIEXEC:-mpiexec}
if [ ! -x "$exe" ]; then
  echo "checkpoint_io.sh: no benchmark at $exe; build the bench_checkpoint target or set BENCH_EXE" >&2
  exit 1
fi
echo "# checkpoint I/O: $(basename "$deck") in $dir ($(df -hT "$dir" | awk 'NR == 2 { print $2 ", " $5 " used" }'))"
for np in $ranks; do
  echo
  echo "## $np rank(s)"
  OPENBLAS_NUM_THREADS=1 "$mpiexec" -n "$np" "$exe" --deck "$deck" --dir "$dir" --reps "$reps"
done
