#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# What a checkpoint at every step costs the step: a deck (gpt2-124m.toml) on
# one rank trained without saves, with a sync save after every step and with
# checkpoint.async = true saving after every step, side by side in rounds
# (one run of each per round, so a slow spell of a shared machine spoils one
# round, not one configuration). A step's time here is its wall time on the
# critical path: the metrics' step_ms (compute) plus its io_ms (for a sync
# save the whole save; for an async one the copy to host memory, the start
# and the commit, plus any wait for the background write). The first step
# (warm-up) is left out; each run gives its median, the table the median and
# range over the rounds and the ratios to the run without saves of the same round.
#
#   bench/checkpoint_async.sh                    # gpt2-124m, 5 steps, 3 rounds
#   ROUNDS=5 STEPS=8 DIR=/scratch/me bench/checkpoint_async.sh inputs/small.toml
#
# Environment: ROUNDS (3), STEPS (5), DIR (the checkpoints' file system;
# default $TMPDIR or /tmp), NDMINI_EXE (default build/miniapp/ndmini),
# PEAK_GFLOPS (100: skips the start-up calibration; MFU is not the point),
# SETTINGS (more KEY=VALUE deck settings for every run, e.g. a shorter step:
# "model.seq_len=64 train.global_batch=1 train.micro_batch=1").
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
deck=${1:-$root/inputs/gpt2-124m.toml}
exe=${NDMINI_EXE:-$root/build/miniapp/ndmini}
rounds=${ROUNDS:-3}
steps=${STEPS:-5}
dir=${DIR:-${TMPDIR:-/tmp}}
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
if [ ! -x "$exe" ]; then
  echo "checkpoint_async.sh: no executable at $exe; build ndmini_exe or set NDMINI_EXE" >&2
  exit 1
fi
work=$(mktemp -d "$dir/ndmini-ckpt-async.XXXXXX")
trap 'rm -rf "$work"' EXIT

# The median over the steps after the first of step_ms + io_ms.
median_step() {
  python3 - "$1" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l and '"summary"' not in l]
print("%.1f" % statistics.median(r["step_ms"] + r.get("io_ms", 0) for r in rows[1:]))
EOF
}

echo "# checkpoint cost per step: $(basename "$deck") ${SETTINGS:-}, $steps steps (first left out), 1 rank, checkpoints in $dir"
declare -A results
for ((round = 1; round <= rounds; round++)); do
  for mode in none sync async; do
    settings=(--set train.steps="$steps" --set perf.peak_gflops="${PEAK_GFLOPS:-100}" --set checkpoint.keep=1
      --set checkpoint.dir="$work/ck_$mode")
    for setting in ${SETTINGS:-}; do settings+=(--set "$setting"); done
    case $mode in
      sync) settings+=(--set checkpoint.every=1) ;;
      async) settings+=(--set checkpoint.every=1 --set checkpoint.async=true) ;;
    esac
    rm -rf "$work/ck_$mode"
    "$exe" train "$deck" "${settings[@]}" --metrics "$work/$mode.jsonl" >"$work/$mode.txt" 2>&1 ||
      { cat "$work/$mode.txt"; echo "checkpoint_async.sh: the $mode run failed" >&2; exit 1; }
    results[$mode,$round]=$(median_step "$work/$mode.jsonl")
    echo "$mode $round ${results[$mode,$round]}" >>"$work/results.txt"
    if [ "$mode" = async ]; then hidden=$(grep -o 'async save(s) written.*' "$work/async.txt" || true); fi
  done
  echo "round $round ($(uptime | sed 's/.*load average: //')): no saves ${results[none,$round]} ms, sync ${results[sync,$round]} ms," \
    "async ${results[async,$round]} ms per step | $hidden"
done

python3 - "$rounds" "$work/results.txt" <<'EOF'
import statistics, sys
rounds = int(sys.argv[1])
vals = {(m, int(r)): float(v) for m, r, v in (l.split() for l in open(sys.argv[2]))}
get = lambda mode: [vals[(mode, r)] for r in range(1, rounds + 1)]
def span(v, fmt="%.1f"):
    return (fmt + " (" + fmt + "-" + fmt + ")") % (statistics.median(v), min(v), max(v))
none, sync, asy = get("none"), get("sync"), get("async")
print("\nmedian (min-max) over %d rounds, ms per step:" % rounds)
print("| no saves | sync save every step | async save every step | async / no saves (same round) | sync / no saves (same round) |")
print("|---|---|---|---|---|")
print("| %s | %s | %s | %s | %s |" % (span(none), span(sync), span(asy),
      span([a / n for a, n in zip(asy, none)], "%.3f"), span([s / n for s, n in zip(sync, none)], "%.3f")))
EOF
