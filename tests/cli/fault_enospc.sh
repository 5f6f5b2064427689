#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A full disk in one phase of a save, on one rank ($1 = phase, $2 = rank; 2
# ranks): every rank exits non-zero within 10 s of the fault, with one message
# naming the phase and the file; no temporary folder is left; `latest` still
# names the previous checkpoint, which verifies and resumes. Further
# arguments KEY=VALUE go to every run (checkpoint.async=true).
source "$(dirname "$0")/lib.sh"
phase=$1
rank=$2
shift 2
extra=()
for setting in "$@"; do extra+=(--set "$setting"); done

t0=$(now)
rc=0
run_ranks 2 train tiny.toml --set train.steps=4 --set checkpoint.every=1 --set parallel.dp_shard=2 "${QUICK[@]}" \
  --set fault.kind=enospc --set fault.phase="$phase" --set fault.rank="$rank" --set fault.step=3 "${extra[@]}" >out.txt 2>&1 || rc=$?
elapsed=$(seconds_since "$t0")
cat out.txt
[ "$rc" -ne 0 ] || fail "the save of step 3 failed, yet the job exited 0"
grep -qF "fault: enospc at phase '$phase' fired on rank $rank at step 3" out.txt || fail "the fault did not fire"
every_rank_failed 2 out.txt
# Steps 1 and 2 were saved before the fault, so the whole run is short; the
# fault itself must end it at once (no rank left waiting).
less_than "$elapsed" 10 || fail "the job took $elapsed s; a failed save must end every rank within seconds"
[ "$(grep -c 'ndmini: error:' out.txt)" -eq 1 ] || fail "expected exactly one error message"
grep -qF "saving checkpoint step 3 to 'ckpt' failed in phase '$phase' on rank $rank" out.txt ||
  fail "the message does not name the step, phase and rank"
grep -qF "ckpt/.step_00000003.tmp/checkpoint.h5': No space left on device" out.txt || fail "the message does not name the file"
grep -qF "'latest' still names step 2" out.txt || fail "the message does not name the intact checkpoint"

[ "$(cat ckpt/latest)" = 2 ] || fail "'latest' moved: $(cat ckpt/latest)"
[ ! -e ckpt/step_00000003 ] || fail "a checkpoint of step 3 exists after its save failed"
no_debris ckpt
run 1 ckpt verify ckpt || fail "the previous checkpoint does not verify"
run 2 train tiny.toml --set train.steps=4 --set checkpoint.every=1 --set parallel.dp_shard=2 "${QUICK[@]}" "${extra[@]}" --resume \
  >resume.txt 2>&1 || { cat resume.txt; fail "the previous checkpoint does not resume"; }
grep -q "resumed from ckpt/step_00000002 at step 2" resume.txt || fail "did not resume from step 2"
echo "ok: phase $phase on rank $rank: every rank stopped after $elapsed s in all; step 2 intact and resumed"
