#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A rank that skips a collective in training ([fault] kind = "skip_collective"
# at step K): the job ends with the watchdog's exit status within
# comm.timeout_s plus its grace, naming the rank, the collective it did not
# issue and every rank's ledger, instead of hanging. $1 = the layout: an
# axis run at degree 2 on 2 ranks ("pp"), or KEY=VALUE,... on $2 ranks; with
# several pipeline stages of several ranks, the verdict compares rank 1 with
# its own stage's peers only.
source "$(dirname "$0")/lib.sh"
layout=$1
np=${2:-2}
K=2
bound_s=60  # 3 s timeout, 2 s diagnosis grace, start-up on a busy machine
sets=()
if [[ $layout == *=* ]]; then
  IFS=, read -ra kv <<<"$layout"
  for s in "${kv[@]}"; do sets+=(--set "parallel.$s"); done
else
  sets=(--set parallel."$layout"=2)
fi

start=$(date +%s)
rc=0
run "$np" train tiny.toml --set train.steps=6 --set train.micro_batch=2 "${sets[@]}" "${QUICK[@]}" --set comm.timeout_s=3 \
  --set fault.kind=skip_collective --set fault.rank=1 --set fault.step=$K >out.txt 2>&1 || rc=$?
elapsed=$(($(date +%s) - start))
cat out.txt
echo "exit $rc after $elapsed s"
[ "$rc" -eq 12 ] || fail "expected the watchdog's exit status 12, got $rc"
[ "$elapsed" -le "$bound_s" ] || fail "the job took $elapsed s (bound $bound_s s)"
grep -qF "fault injection: rank 1 skips all_reduce_scalar on 'batch'" out.txt || fail "the fault did not fire"
grep -qF "collective timeout:" out.txt || fail "expected the timeout line"
grep -qF "not issued by rank 1" out.txt || fail "the diagnosis does not name rank 1"
for ((r = 0; r < np; r++)); do grep -q "ndmini: rank $r ledger: " out.txt || fail "expected rank $r's ledger"; done
if [ "$np" -gt 2 ]; then
  grep -qF "among its peers (ranks 0 1): rank 1 issued 'norm'" out.txt ||
    fail "expected the verdict to compare rank 1 with its stage's peers (ranks 0 1)"
fi
echo "ok: the skipped collective on rank 1 ($layout) was named and the job ended after $elapsed s"
