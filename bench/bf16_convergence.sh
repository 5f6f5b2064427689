#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Convergence of bf16 against fp32 (issue 18's proof): the same deck and seed
# trained in both precisions with the validation loss on; prints the final
# training and validation losses of each and their relative difference, and
# draws both curves (bench/bf16_convergence_plot.py).
#
#   bench/bf16_convergence.sh                 # small:300 and tiny (its 40 steps), fp32 then bf16
#   CANDIDATE=fp32 bench/bf16_convergence.sh  # fp32 against itself: checks the script, not bf16
#   bench/bf16_convergence.sh tiny:40 small:50   # DECK[:STEPS], decks from inputs/
#
# Environment: REFERENCE (fp32), CANDIDATE (bf16), EVAL_EVERY (25: the
# validation loss every N steps and at the last; 5 for decks of at most 50
# steps), TOLERANCE (0.01: the relative bound on the final losses),
# NDMINI_EXE (default build/miniapp/ndmini), NP (ranks, 1), PYTHON (a python3
# with matplotlib), OUT_DIR (logs and metrics; default a fresh temporary
# directory), PNG (the figure; default bench/results/bf16-convergence.png, or
# OUT_DIR/convergence.png when REFERENCE = CANDIDATE, so a check of the script
# never replaces the real figure).
# Exit status: 1 when a run fails, 2 when a final loss differs by more than TOLERANCE.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
exe=${NDMINI_EXE:-$root/build/miniapp/ndmini}
np=${NP:-1}
reference=${REFERENCE:-fp32}
candidate=${CANDIDATE:-bf16}
out=${OUT_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/ndmini-bf16-convergence.XXXXXX")}
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(small:300 tiny)
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}

die() {
  echo "bf16_convergence.sh: error: $*" >&2
  exit 1
}
[ -x "$exe" ] || die "no executable at $exe; build ndmini_exe (cmake --build build --target ndmini_exe) or set NDMINI_EXE"
source "$root/bench/python_with.sh"
PYTHON=$(python_with matplotlib)
"$PYTHON" -c 'import matplotlib' 2>/dev/null ||
  die "$PYTHON cannot import matplotlib; install it (Debian 12: apt-get install python3-matplotlib) or set PYTHON"
if [ "$reference" = "$candidate" ]; then
  png=${PNG:-$out/convergence.png}
else
  png=${PNG:-$root/bench/results/bf16-convergence.png}
fi

# Every run is checked before the first one trains.
runs=()
for c in "${cases[@]}"; do
  IFS=: read -r deck steps <<<"$c"
  [ -f "$root/inputs/$deck.toml" ] || die "'$c': no deck inputs/$deck.toml"
  [[ -z "${steps:-}" || "$steps" =~ ^[1-9][0-9]*$ ]] || die "'$c': STEPS must be a positive number"
  for precision in "$reference" "$candidate"; do
    if ! msg=$("$exe" check "$root/inputs/$deck.toml" --world "$np" --set "train.precision=$precision" 2>&1); then
      die "ndmini refuses $deck with train.precision=$precision: $(grep -m1 'error:' <<<"$msg")
(CANDIDATE=fp32 checks this script with fp32 against itself)"
    fi
  done
done
mkdir -p "$out" "$(dirname "$png")"

for c in "${cases[@]}"; do
  IFS=: read -r deck steps <<<"$c"
  overrides=(--set train.log_every=1)
  [ -z "${steps:-}" ] || overrides+=(--set "train.steps=$steps")
  every=${EVAL_EVERY:-}
  if [ -z "$every" ]; then
    every=25
    [ -z "${steps:-}" ] && steps=$(sed -n 's/^steps *= *\([0-9]*\).*/\1/p' "$root/inputs/$deck.toml" | head -n 1)
    [ "${steps:-0}" -gt 50 ] || every=5
  fi
  overrides+=(--set "train.eval_every=$every")
  for role in reference candidate; do
    precision=$reference label=$reference
    [ "$role" = reference ] || precision=$candidate label=$candidate
    # The same precision twice: the second run is a repeat (ndmini is deterministic: bitwise equal).
    [ "$role" = reference ] || [ "$reference" != "$candidate" ] || label=$candidate-repeat
    name=$deck-$label
    echo "training $deck in $precision, log in $out/$name.log" >&2
    if ! mpiexec -n "$np" "$exe" train "$root/inputs/$deck.toml" --set "train.precision=$precision" \
        "${overrides[@]}" --metrics "$out/$name.jsonl" >"$out/$name.log" 2>&1; then
      echo "bf16_convergence.sh: $deck in $precision failed; the last lines of $out/$name.log:" >&2
      tail -n 20 "$out/$name.log" >&2
      exit 1
    fi
    runs+=("$deck:$label=$out/$name.jsonl")
  done
done

# The binary's commit (its --build-info), not the checkout's.
commit=$("$exe" --build-info 2>/dev/null | sed -n 's/.*"git_sha": *"\([0-9a-f]\{7\}\).*/\1/p')
"$PYTHON" "$root/bench/bf16_convergence_plot.py" --png "$png" --tolerance "${TOLERANCE:-0.01}" \
  --note "$(date -u '+%Y-%m-%d'), ndmini commit ${commit:-unknown}, $np rank(s)" "${runs[@]}"
