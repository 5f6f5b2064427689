#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Every rank dropping a group's sums ([fault] kind = "skip_collective",
# rank = -1): the run neither hangs nor stops (each rank sums as if alone),
# every rank says it fired; a group the layout does not split is refused
# before the first step (exit 1, as other errors of a run), naming the key.
source "$(dirname "$0")/lib.sh"
drop=(--set fault.kind=skip_collective --set fault.rank=-1 --set fault.step=1)

run 2 train tiny.toml --set train.steps=4 --set parallel.dp_replicate=2 "${QUICK[@]}" --set comm.timeout_s=5 \
  "${drop[@]}" --set fault.group=dp_replicate >out.txt 2>&1 || { cat out.txt; fail "the run stopped"; }
cat out.txt
for r in 0 1; do
  grep -qF "rank $r drops its sums on 'dp_replicate' from here on" out.txt || fail "rank $r did not report the fault"
done
grep -qE "^step +3/" out.txt || fail "the run did not reach its last step"

rc=0
run 2 train tiny.toml --set train.steps=4 --set parallel.dp_replicate=2 "${QUICK[@]}" "${drop[@]}" \
  --set fault.group=tp >bad.txt 2>&1 || rc=$?
cat bad.txt
[ "$rc" -eq 1 ] || fail "expected exit status 1 (an error of the run, on every rank) for a group of one rank, got $rc"
grep -qF 'ndmini: error: fault.group = "tp" has fewer than 2 ranks in this layout' bad.txt ||
  fail "the refusal does not name fault.group"
grep -qE "^step " bad.txt && fail "a step ran before the refusal"
echo "ok: every rank dropped dp_replicate's sums and finished; a group of one rank was refused"
