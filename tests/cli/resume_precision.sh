#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Checkpoints hold fp32 masters whatever the precision a run trained in, so
# they cross precisions and layouts: a bf16 run on tp=2 x pp=2 (4 ranks)
# saves step 4; it resumes under fp32 on dp_shard=2 (2 ranks) and on 1 rank,
# and an fp32 checkpoint resumes under bf16.
# - The two fp32 resumptions load the same masters: their losses of steps
#   4..7 agree as the equivalence suite's fp32 layouts do (relative 1e-5).
# - They continue the bf16 run: each of those losses is within 1% of the
#   uninterrupted bf16 run's (measured: 1e-4 to 3e-4; a fresh model's loss,
#   5.5 against 4.8 at step 4, would be 15% off).
source "$(dirname "$0")/lib.sh"
common=(--set train.steps=8 --set train.log_every=1 --set checkpoint.every=4 "${QUICK[@]}")

run 4 train tiny.toml "${common[@]}" --set train.precision=bf16 --set parallel.tp=2 --set parallel.pp=2 \
  --set checkpoint.dir=bf16 --metrics bf16.jsonl >bf16.txt 2>&1 || { cat bf16.txt; fail "the bf16 tp x pp run failed"; }
[ -f bf16/step_00000004/checkpoint.h5 ] || fail "the bf16 run saved no step 4"

# The bf16 run's step 4, resumed in folders of their own.
resume_copy bf16 4 fp32_dp_shard 2 tiny.toml "${common[@]}" --set train.precision=fp32 --set parallel.dp_shard=2
resume_copy bf16 4 fp32_one 1 tiny.toml "${common[@]}" --set train.precision=fp32

step_losses bf16.jsonl | awk '$1 >= 4' >want.txt
step_losses fp32_dp_shard.jsonl >a.txt
step_losses fp32_one.jsonl >b.txt
[ "$(wc -l <a.txt)" -eq 4 ] && [ "$(wc -l <b.txt)" -eq 4 ] || fail "the resumed runs did not log steps 4..7"
join a.txt b.txt | awk '{ d = ($2 - $3) / $3; if (d < 0) d = -d; if (d > 1e-5) { print "step " $1 ": " $2 " vs " $3; bad = 1 } }
  END { exit bad }' || fail "the two fp32 resumptions of one checkpoint disagree"
join a.txt want.txt | awk '{ d = ($2 - $3) / $3; if (d < 0) d = -d; print "step " $1 ": fp32 " $2 ", bf16 " $3 ", relative " d;
  if (d > 0.01) bad = 1 } END { exit bad }' || fail "the fp32 resumption does not continue the bf16 run"

# And back: the fp32 run's step 8 resumes under bf16 for 4 more steps.
run 2 train tiny.toml --set train.steps=12 --set train.log_every=1 "${QUICK[@]}" --set train.precision=bf16 \
  --set parallel.dp_shard=2 --set checkpoint.dir=fp32_dp_shard --resume 8 --metrics back.jsonl >back.txt 2>&1 ||
  { cat back.txt; fail "resuming an fp32 checkpoint under bf16 failed"; }
grep -q "resumed from fp32_dp_shard/step_00000008 at step 8" back.txt || fail "the bf16 run did not resume at step 8"
[ "$(step_losses back.jsonl | wc -l)" -eq 4 ] || fail "the bf16 resumption did not log steps 8..11"
echo "ok: a bf16 checkpoint of tp x pp resumes under fp32 on dp_shard and on one rank, and back"
