#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Convergence of a Mixture-of-Experts deck against the dense deck of the same
# active parameters (issue 33's proof): both trained from their seeds with the
# validation loss on; prints the final training and validation losses and the
# MoE run's expert load (tokens per expert: min, mean, max, imbalance =
# max/mean, over the run), and draws the loss curves and the imbalance per
# step (bench/moe_convergence_plot.py).
#
#   bench/moe_convergence.sh                     # moe-small against small, 300 steps each
#   bench/moe_convergence.sh moe-tiny tiny 40    # MOE_DECK DENSE_DECK STEPS, decks from inputs/
#
# Environment: EVAL_EVERY (25; 5 for runs of at most 50 steps), NP (ranks, 1),
# SETTINGS (extra --set KEY=VALUE words for both runs, e.g. "train.precision=bf16"),
# NDMINI_EXE (default build/miniapp/ndmini), PYTHON (a python3 with
# matplotlib), OUT_DIR (logs and metrics; default a fresh temporary
# directory), PNG (default bench/results/moe-convergence.png).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
exe=${NDMINI_EXE:-$root/build/miniapp/ndmini}
np=${NP:-1}
moe=${1:-moe-small}
dense=${2:-small}
steps=${3:-300}
out=${OUT_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/ndmini-moe-convergence.XXXXXX")}
png=${PNG:-$root/bench/results/moe-convergence.png}
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}

die() {
  echo "moe_convergence.sh: error: $*" >&2
  exit 1
}
[ -x "$exe" ] || die "no executable at $exe; build ndmini_exe (cmake --build build --target ndmini_exe) or set NDMINI_EXE"
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || die "STEPS '$steps' must be a positive number"
source "$root/bench/python_with.sh"
PYTHON=$(python_with matplotlib)
"$PYTHON" -c 'import matplotlib' 2>/dev/null ||
  die "$PYTHON cannot import matplotlib; install it (Debian 12: apt-get install python3-matplotlib) or set PYTHON"

every=${EVAL_EVERY:-25}
[ -n "${EVAL_EVERY:-}" ] || [ "$steps" -gt 50 ] || every=5
settings=(--set train.log_every=1 --set "train.steps=$steps" --set "train.eval_every=$every")
for s in ${SETTINGS:-}; do settings+=(--set "$s"); done
# Both decks are checked before the first one trains.
for deck in "$moe" "$dense"; do
  [ -f "$root/inputs/$deck.toml" ] || die "no deck inputs/$deck.toml"
  if ! msg=$("$exe" check "$root/inputs/$deck.toml" --world "$np" "${settings[@]}" 2>&1); then
    die "ndmini refuses $deck: $(grep -m1 'error:' <<<"$msg")"
  fi
done
mkdir -p "$out" "$(dirname "$png")"

runs=()
for deck in "$moe" "$dense"; do
  echo "training $deck ($steps steps, $np rank(s)), log in $out/$deck.log" >&2
  if ! mpiexec -n "$np" "$exe" train "$root/inputs/$deck.toml" "${settings[@]}" --metrics "$out/$deck.jsonl" \
    >"$out/$deck.log" 2>&1; then
    echo "moe_convergence.sh: $deck failed; the last lines of $out/$deck.log:" >&2
    tail -n 20 "$out/$deck.log" >&2
    exit 1
  fi
  runs+=("$deck=$out/$deck.jsonl")
done

commit=$("$exe" --build-info 2>/dev/null | sed -n 's/.*"git_sha": *"\([0-9a-f]\{7\}\).*/\1/p')
"$PYTHON" "$root/bench/moe_convergence_plot.py" --png "$png" \
  --note "$(date -u '+%Y-%m-%d'), ndmini commit ${commit:-unknown}, $np rank(s)" "${runs[@]}"
