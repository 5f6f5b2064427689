#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A NaN in one rank's gradient at step K (2 ranks; $1 = the layout: a replica
# of data parallelism, where only that rank sees it, an FSDP shard, or the
# last pipeline stage, whose copy of the tied wte is applied but left out of
# the gradient norm): every
# rank stops at step K naming it, the rank and the tensor, no update is
# applied, no checkpoint is written after step K - 1, `latest` is unchanged
# and the message points at it.
source "$(dirname "$0")/lib.sh"
layout=$1
K=3

rc=0
run_ranks 2 train tiny.toml --set train.steps=6 --set train.log_every=1 --set checkpoint.every=1 \
  --set parallel."$layout"=2 "${QUICK[@]}" --set fault.kind=nan --set fault.rank=1 --set fault.step=$K \
  --metrics m.jsonl >out.txt 2>&1 || rc=$?
cat out.txt
[ "$rc" -ne 0 ] || fail "a NaN gradient was accepted"
grep -qF "fault: nan fired on rank 1 at step $K" out.txt || fail "the fault did not fire"
every_rank_failed 2 out.txt
grep -qF "non-finite gradient norm at step $K (first on rank 1, in the gradient of '" out.txt ||
  fail "the message does not name the step, the rank and the tensor"
# On the last stage the poisoned tensor is its copy of the tied wte (left out of the norm, still applied).
if [ "$layout" = pp ]; then
  grep -qF "in the gradient of 'wte'" out.txt || fail "the last stage's tied wte copy was not named"
fi
grep -qF "The update of step $K was not applied" out.txt || fail "the message does not say the update was skipped"
grep -qF "the newest good checkpoint is step $((K - 1)) in 'ckpt'" out.txt || fail "the message does not point at step $((K - 1))"
grep -qF -- "--resume $((K - 1))" out.txt || fail "the message does not say how to resume"
[ "$(cat ckpt/latest)" = $((K - 1)) ] || fail "'latest' is $(cat ckpt/latest), expected $((K - 1))"
for s in $(seq $K 6); do [ ! -e "ckpt/$(printf 'step_%08d' "$s")" ] || fail "step $s was saved after the NaN"; done
no_debris ckpt
# Steps before K were logged, step K was not (it never completed).
[ "$(step_losses m.jsonl | awk '{ print $1 }' | tr '\n' ' ')" = "$(seq -s ' ' 0 $((K - 1))) " ] ||
  fail "unexpected logged steps: $(step_losses m.jsonl | awk '{ print $1 }' | tr '\n' ' ')"
run 1 ckpt verify ckpt || fail "the newest checkpoint does not verify"

# The final state is saved only once one more batch's loss shows it sane: a
# NaN there (step 6 = train.steps) keeps it out; step 4 stays the newest.
rm -rf ckpt
rc=0
run_ranks 2 train tiny.toml --set train.steps=6 --set checkpoint.every=2 --set parallel."$layout"=2 "${QUICK[@]}" \
  --set fault.kind=nan --set fault.rank=1 --set fault.step=6 >final.txt 2>&1 || rc=$?
cat final.txt
[ "$rc" -ne 0 ] || fail "a final state with a NaN loss was accepted"
grep -qF "fault: nan fired on rank 1 at step 6" final.txt || fail "the fault did not fire"
every_rank_failed 2 final.txt
grep -qF "non-finite loss at step 6 (first on rank 1)" final.txt || fail "the message does not name the step and rank"
grep -qF "The final state (after step 5) was not saved" final.txt || fail "the message does not say the state was kept out"
[ "$(cat ckpt/latest)" = 4 ] || fail "'latest' is $(cat ckpt/latest), expected 4"
[ ! -e ckpt/step_00000006 ] || fail "the final state was saved"
echo "ok: NaN at step $K on rank 1 ($layout) stopped every rank; latest is step $((K - 1)); the final state's NaN kept it out"
