#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A rank that skips a collective in training ([fault] kind = "skip_collective"
# at step K; 2 ranks, $1 = the layout): the job ends with the watchdog's exit
# status within comm.timeout_s plus its grace, naming the rank, the
# collective it did not issue and every rank's ledger, instead of hanging.
source "$(dirname "$0")/lib.sh"
layout=$1
K=2
bound_s=60  # 3 s timeout, 2-10 s diagnosis grace, start-up on a busy machine

start=$(date +%s)
rc=0
run 2 train tiny.toml --set train.steps=6 --set parallel."$layout"=2 "${QUICK[@]}" --set comm.timeout_s=3 \
  --set fault.kind=skip_collective --set fault.rank=1 --set fault.step=$K >out.txt 2>&1 || rc=$?
elapsed=$(($(date +%s) - start))
cat out.txt
echo "exit $rc after $elapsed s"
[ "$rc" -eq 12 ] || fail "expected the watchdog's exit status 12, got $rc"
[ "$elapsed" -le "$bound_s" ] || fail "the job took $elapsed s (bound $bound_s s)"
grep -qF "fault injection: rank 1 skips all_reduce_scalar on 'batch'" out.txt || fail "the fault did not fire"
grep -qF "collective timeout:" out.txt || fail "expected the timeout line"
grep -qF "not issued by rank 1" out.txt || fail "the diagnosis does not name rank 1"
for r in 0 1; do grep -q "ndmini: rank $r ledger: " out.txt || fail "expected rank $r's ledger"; done
echo "ok: the skipped collective on rank 1 ($layout) was named and the job ended after $elapsed s"
