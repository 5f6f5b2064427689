# SPDX-License-Identifier: BSD-3-Clause
# Shared helpers for the end-to-end tests. The caller sets NDMINI (the
# executable), MPIEXEC, MPIEXEC_NUMPROC_FLAG and SOURCE_DIR.
set -euo pipefail

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# A scratch folder per test, removed on exit.
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ndmini-test.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"

# run NP ARGS...: ndmini under mpiexec with NP ranks.
run() {
  local np=$1
  shift
  "$MPIEXEC" "$MPIEXEC_NUMPROC_FLAG" "$np" "$NDMINI" "$@"
}

# expect_error SUBSTRING ARGS...: ndmini must exit non-zero and print SUBSTRING.
expect_error() {
  local want=$1
  shift
  local rc=0
  run 1 "$@" >out.txt 2>&1 || rc=$?
  cat out.txt
  [ "$rc" -ne 0 ] || fail "expected a non-zero exit for: ndmini $*"
  grep -qF -- "$want" out.txt || fail "expected the message to contain: $want"
  echo "ok: exit $rc with '$want'"
}

# losses FILE: the loss of every step record of a metrics file, one per line,
# exactly as written (full precision).
losses() {
  grep '"step"' "$1" | sed -E 's/.*"loss":([^,}]*).*/\1/'
}

# The tiny deck, copied so tests can edit it.
cp "$SOURCE_DIR/inputs/tiny.toml" tiny.toml

# run_ranks NP ARGS...: like run, but every rank reports its own exit status
# on stderr ("rank R exited with S"), so a test can assert that each rank
# stopped, not only that mpiexec did.
run_ranks() {
  local np=$1
  shift
  "$MPIEXEC" "$MPIEXEC_NUMPROC_FLAG" "$np" bash -c \
    '"$0" "$@"; s=$?; echo "rank ${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-?}} exited with $s" >&2; exit $s' "$NDMINI" "$@"
}

# every_rank_failed NP FILE: each of NP ranks reported status 1 in FILE: the
# agreed error, not a crash (a signal shows as 128 + its number).
every_rank_failed() {
  local np=$1 file=$2 r
  for ((r = 0; r < np; r++)); do
    grep -Eq "^rank $r exited with 1$" "$file" || fail "rank $r did not exit with the error status 1"
  done
}

# now: seconds since the epoch, with nanoseconds.
now() { date +%s.%N; }

# seconds_since T0: elapsed seconds (float).
seconds_since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

# less_than A B: true when the number A < B.
less_than() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }

# step_losses FILE: "step loss" pairs of a metrics file, exactly as written.
step_losses() {
  grep '"step"' "$1" | sed -E 's/.*"loss":([^,}]*).*"step":([0-9]+).*/\2 \1/'
}

# resume_copy FROM STEP NAME NP ARGS...: copy checkpoint folder FROM's step STEP into a fresh folder
# NAME and resume it there: `ndmini train ARGS` (the deck and its settings) on NP ranks, its metrics
# in NAME.jsonl, its output in NAME.txt; fails unless the run resumed from that checkpoint at STEP.
resume_copy() {
  local from=$1 step=$2 name=$3 np=$4
  shift 4
  local folder
  folder=$(printf 'step_%08d' "$step")
  rm -rf "$name"
  mkdir -p "$name"
  cp -r "$from/$folder" "$name/"
  echo "$step" >"$name/latest"
  run "$np" train "$@" --set checkpoint.dir="$name" --resume "$step" --metrics "$name.jsonl" >"$name.txt" 2>&1 ||
    { cat "$name.txt"; fail "resuming $from/$folder as $name failed"; }
  grep -q "resumed from $name/$folder at step $step" "$name.txt" || { cat "$name.txt"; fail "$name did not resume at step $step"; }
}

# continues_within_1e5 REF LABEL NAME...: the runs NAME (their NAME.jsonl) resumed
# at step 4 of the 8-step run REF (REF.jsonl, described by LABEL) and logged
# steps 4..7 within 1e-5 (relative) of REF's losses; a negative control shows
# the comparison can fail (REF's step-0 loss is over 1e-2 above its step 4's).
# REF's steps 4..7 are left in want.txt ("step loss" lines).
continues_within_1e5() {
  local ref=$1 label=$2 name first
  shift 2
  step_losses "$ref.jsonl" | awk '$1 >= 4' >want.txt
  [ "$(wc -l <want.txt)" -eq 4 ] || fail "the $label run did not log steps 4..7"
  for name in "$@"; do
    step_losses "$name.jsonl" >"$name.losses"
    [ "$(wc -l <"$name.losses")" -eq 4 ] || fail "$name did not log steps 4..7"
    join "$name.losses" want.txt | awk -v name="$name" -v label="$label" '{ d = ($2 - $3) / $3; if (d < 0) d = -d;
      print name " step " $1 ": " $2 " vs " $3 " (" label "), relative " d; if (d > 1e-5) bad = 1 } END { exit bad }' ||
      fail "$name's resumption does not continue the $label run"
  done
  first=$(step_losses "$ref.jsonl" | awk '$1 == 0 { print $2 }')
  awk -v f="$first" -v l="$(head -n1 want.txt | cut -d' ' -f2)" 'BEGIN { d = (f - l) / l; exit !(d > 1e-2) }' ||
    fail "step 0's loss $first is as low as step 4's: the run did not train"
}

# No debris: a checkpoint folder holds no .step_*.tmp, .step_*.old or .step_*.pruned.
no_debris() {
  local dir=$1
  if ls -a "$dir" | grep -Eq '^\.step_.*\.(tmp|old|pruned)$'; then fail "debris left in $dir: $(ls -a "$dir" | tr '\n' ' ')"; fi
}

# own_lines FILE: the lines of ndmini's output, without the notice Kokkos'
# OpenMP backend prints at start-up when OMP_PROC_BIND is unset (its
# message, not ndmini's; the Serial backend prints none).
own_lines() {
  grep -v -E '^(Kokkos::OpenMP::initialize WARNING|  In general, for best performance|  For best performance with OpenMP|  For unit testing set OMP_PROC_BIND|MPI detected: For OpenMP binding)' "$1" |
    grep -v '^$' || true
}

# Fast settings for runs that only exercise checkpoints: no GEMM calibration.
QUICK=(--set perf.peak_gflops=100)

# rank_pids PID: the ndmini processes of the job whose mpiexec is PID (its descendants).
rank_pids() {
  local todo=("$1") pid kids found=()
  while [ ${#todo[@]} -gt 0 ]; do
    pid=${todo[0]}
    todo=("${todo[@]:1}")
    kids=$(ps -o pid= --ppid "$pid" 2>/dev/null || true)
    for k in $kids; do
      todo+=("$k")
      [ "$(ps -o comm= -p "$k" 2>/dev/null)" = ndmini ] && found+=("$k")
    done
  done
  echo "${found[@]}"
}

# rank_of PID: the MPI rank of an ndmini process (from its environment).
rank_of() {
  tr '\0' '\n' <"/proc/$1/environ" | sed -n -E 's/^(PMI_RANK|OMPI_COMM_WORLD_RANK)=//p' | head -1
}
