#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Hang detection end to end: rank SKIP of an NP-rank job skips one
# collective (hang_driver.cpp); the job must exit non-zero within the
# timeout plus the diagnosis' grace (and start-up), and the message must name
# that rank and the collective it did not issue, and every answering rank's
# ledger. Usage: hang.sh NP SKIP [a2a] (environment: HANG_DRIVER, MPIEXEC,
# MPIEXEC_NUMPROC_FLAG). With a2a the skipped collective is a variable
# all-to-all whose bytes differ between ranks (they must not count as a divergence).
set -euo pipefail
np=$1
skip=$2
op=${3:-all_reduce}
timeout_s=3
step=3
# Start-up on a busy 2-core machine takes seconds; the bound is still far
# below the CTest timeout, so a hang fails here and not by being killed.
bound_s=40

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

out=$(mktemp "${TMPDIR:-/tmp}/ndmini-hang.XXXXXX")
trap 'rm -f "$out"' EXIT
start=$(date +%s)
rc=0
args=()
[ "$op" = a2a ] && args=(--a2a)
"$MPIEXEC" "$MPIEXEC_NUMPROC_FLAG" "$np" "$HANG_DRIVER" --timeout "$timeout_s" --skip-rank "$skip" \
  --skip-step "$step" --steps 6 "${args[@]}" >"$out" 2>&1 || rc=$?
elapsed=$(($(date +%s) - start))
cat "$out"
echo "exit $rc after ${elapsed} s"

[ "$rc" -ne 0 ] || fail "the job exited 0: the skipped collective went unnoticed"
[ "$elapsed" -le "$bound_s" ] || fail "the job took ${elapsed} s (bound ${bound_s} s with comm.timeout_s = ${timeout_s})"
grep -q "hang_driver: all" "$out" && fail "the job ran to its end"
# Each step is one 'dp' then one 'world' collective, so the skip at step 3
# puts the skipping rank's 'world' #3 where the others have 'dp' #3: the
# rank's collective #6.
want="first divergence at collective #$((2 * step)) of each rank: rank $skip issued 'world' #$step (all_reduce_scalar, 8 B) where"
grep -qF -- "$want" "$out" || fail "expected the verdict: $want"
skipped="issued 'dp' #$step (all_reduce, 4096 B)"
[ "$op" = a2a ] && skipped="issued 'dp' #$step (all_to_all_v, "
grep -qF -- "$skipped" "$out" || fail "expected the collective it skipped: $skipped"
grep -qF "collective timeout:" "$out" || fail "expected the timeout line"
for r in $(seq 0 $((np - 1))); do
  grep -q "ndmini: rank $r ledger: " "$out" || fail "expected rank $r's ledger"
done
grep -qF "WAITING" "$out" || fail "expected the ledgers to mark the waiting collective"
echo "ok: rank $skip named, exit $rc after ${elapsed} s"
