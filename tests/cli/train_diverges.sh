#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A run that diverges (lr 9.9 with weight decay 1 at a constant rate: each
# update is finite, the loss or gradient turns non-finite some steps later)
# must never save the state whose own step is non-finite: the newest
# checkpoint is the last state shown sane, and resuming it runs that step
# with a finite loss and gradient norm (a checkpoint written straight after
# each update would hold the diverged state instead, and its resume would
# fail at once).
source "$(dirname "$0")/lib.sh"
args=(train tiny.toml --set train.steps=60 --set train.lr=9.9 --set train.min_lr=9.9 --set train.warmup_steps=0
  --set train.weight_decay=1 --set train.grad_clip=0 --set train.log_every=1 --set checkpoint.every=1 "${QUICK[@]}")

rc=0
run 1 "${args[@]}" --metrics a.jsonl >a.txt 2>&1 || rc=$?
cat a.txt | grep -v '^step'
[ "$rc" -ne 0 ] || fail "the deck was meant to diverge within 60 steps"
K=$(sed -nE 's/.*non-finite (loss|gradient norm) at step ([0-9]+).*/\2/p' a.txt)
[ -n "$K" ] && [ "$K" -gt 1 ] || fail "no non-finite step named"
[ "$(cat ckpt/latest)" = $((K - 1)) ] || fail "'latest' is $(cat ckpt/latest), expected step $((K - 1))"
[ ! -e "ckpt/$(printf 'step_%08d' "$K")" ] || fail "the state of step $K was saved although its step was non-finite"
grep -qF "the newest good checkpoint is step $((K - 1)) in 'ckpt'" a.txt || fail "the message does not point at step $((K - 1))"

rc=0
run 1 "${args[@]}" --resume --metrics b.jsonl >b.txt 2>&1 || rc=$?
first=$(grep '"step"' b.jsonl | head -n 1)
echo "resumed: $first"
echo "$first" | grep -q "\"step\":$((K - 1))," || fail "the resume did not start at step $((K - 1))"
echo "$first" | grep -Eq '"grad_norm":[0-9.e+-]+,' || fail "the resumed state's gradient norm is not finite"
echo "$first" | grep -Eq '"loss":[0-9.e+-]+,' || fail "the resumed state's loss is not finite"
echo "ok: diverged at step $K; the newest checkpoint, step $((K - 1)), resumes with a finite loss"
