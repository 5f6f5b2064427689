#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# SIGKILL one random rank at a random moment (during a step or a save), then
# resume until the run is complete: the losses of every step and the final
# parameters and AdamW state must be bitwise those of an uninterrupted run.
# $1 = ranks, $2 = trials, then deck settings KEY=VALUE for every run (e.g.
# train.precision=bf16). Prints "K of K trials bitwise identical".
source "$(dirname "$0")/lib.sh"
np=$1
trials=$2
shift 2
extra=()
for setting in "$@"; do extra+=(--set "$setting"); done
STEPS=12
args=(train tiny.toml --set train.steps=$STEPS --set train.log_every=1 --set train.micro_batch=2
  --set checkpoint.every=1 --set checkpoint.keep=2 --set parallel.dp_shard="$np" "${QUICK[@]}" "${extra[@]}")
final=$(printf 'step_%08d' $STEPS)

t0=$(now)
run "$np" "${args[@]}" --set checkpoint.dir=ref --metrics ref.jsonl >ref.txt 2>&1 || { cat ref.txt; fail "reference run failed"; }
span=$(seconds_since "$t0")
step_losses ref.jsonl >ref_losses.txt
[ "$(wc -l <ref_losses.txt)" -eq $STEPS ] || fail "the reference logged $(wc -l <ref_losses.txt) steps"
echo "reference: $STEPS steps in $span s"

RANDOM=$((np * 7919 + trials))  # reproducible draws, different per configuration
good=0
for ((trial = 1; trial <= trials; trial++)); do
  dir=trial$trial
  killed=0
  while [ $killed -eq 0 ]; do
    rm -rf "$dir" "$dir".*.jsonl
    # A moment between start-up and the end of the uninterrupted run.
    delay=$(awk -v r=$RANDOM -v s="$span" 'BEGIN { printf "%.2f", 0.2 + (s - 0.2) * r / 32768 }')
    "$MPIEXEC" "$MPIEXEC_NUMPROC_FLAG" "$np" "$NDMINI" "${args[@]}" --set checkpoint.dir="$dir" \
      --metrics "$dir.0.jsonl" >"$dir.0.txt" 2>&1 &
    job=$!
    sleep "$delay"
    pids=($(rank_pids $job))
    if [ ${#pids[@]} -eq "$np" ] && kill -0 $job 2>/dev/null; then
      victim=${pids[$((RANDOM % np))]}
      kill -9 "$victim" 2>/dev/null && killed=1
      # Where it hit: the newest committed step, and whether a save was under way.
      where="latest $(cat "$dir/latest" 2>/dev/null || echo none)"
      ls -a "$dir" 2>/dev/null | grep -q '^\.step_.*\.tmp$' && where="$where, during a save"
    fi
    rc=0
    wait $job || rc=$?
    # Too late: a kill after the run's last step and save, as the ranks leave
    # MPI, finds the job complete; MPICH's mpiexec may then exit 0 (nothing was lost).
    if [ $killed -eq 1 ] && [ $rc -eq 0 ] && grep -q "\"step\":$((STEPS - 1))," "$dir.0.jsonl" &&
      [ "$(cat "$dir/latest" 2>/dev/null)" = $STEPS ]; then
      echo "trial $trial: the kill at $delay s came after the run's end (exit 0, all saved); drawing again"
      killed=0
      span=$delay
      continue
    fi
    if [ $killed -eq 1 ] && [ $rc -eq 0 ]; then cat "$dir.0.txt"; fail "trial $trial: SIGKILL sent but the job exited 0"; fi
    [ $killed -eq 1 ] || { echo "trial $trial: the job ended before the kill at $delay s; drawing again"; span=$delay; }
  done
  # Resume until complete (from scratch when no checkpoint was committed yet).
  part=0
  while [ ! -d "$dir/$final" ] || [ "$(cat "$dir/latest" 2>/dev/null)" != $STEPS ]; do
    part=$((part + 1))
    [ $part -le 3 ] || fail "trial $trial: not complete after 3 resumes"
    resume=()
    [ -f "$dir/latest" ] && resume=(--resume)
    run "$np" "${args[@]}" --set checkpoint.dir="$dir" "${resume[@]}" --metrics "$dir.$part.jsonl" >"$dir.$part.txt" 2>&1 ||
      { cat "$dir.$part.txt"; fail "trial $trial: resume $part failed"; }
  done
  # Every loss any part logged equals the reference's for that step, and every step was logged.
  cat "$dir".*.jsonl | grep '"step"' >"$dir.all.jsonl" || true
  step_losses "$dir.all.jsonl" | sort -n -k1,1 -u >"$dir.losses.txt"
  diff_losses=$(step_losses "$dir.all.jsonl" | LC_ALL=C sort -u | LC_ALL=C join -j1 - <(LC_ALL=C sort ref_losses.txt) |
    awk '$2 != $3' | wc -l)
  logged=$(awk '{ print $1 }' "$dir.losses.txt" | sort -un | wc -l)
  same=1
  [ "$diff_losses" -eq 0 ] || { echo "trial $trial: $diff_losses losses differ from the reference"; same=0; }
  [ "$logged" -eq $STEPS ] || { echo "trial $trial: only $logged of $STEPS steps logged"; same=0; }
  h5diff -r "ref/$final/checkpoint.h5" "$dir/$final/checkpoint.h5" /model /model >/dev/null || { echo "trial $trial: parameters differ"; same=0; }
  h5diff -r "ref/$final/checkpoint.h5" "$dir/$final/checkpoint.h5" /optimizer /optimizer >/dev/null ||
    { echo "trial $trial: optimizer state differs"; same=0; }
  echo "trial $trial: killed rank process $victim at $delay s ($where), $part resume(s), bitwise identical: $same"
  good=$((good + same))
done
# Negative control: the comparison sees a difference (step 11 against step 12).
if h5diff -q "ref/$(printf 'step_%08d' $((STEPS - 1)))/checkpoint.h5" "ref/$final/checkpoint.h5" /model /model >/dev/null 2>&1; then
  fail "steps $((STEPS - 1)) and $STEPS compare equal: the comparison cannot see anything"
fi
echo "$good of $trials trials bitwise identical ($np ranks)"
[ "$good" -eq "$trials" ] || fail "$((trials - good)) trial(s) differ"
