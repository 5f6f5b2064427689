#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A stalled rank: SIGSTOP one random rank of a training job at a random
# moment (inside a step, an agreement or a checkpoint save: a save every
# step), and the job must end with the watchdog's exit status within
# comm.timeout_s plus the diagnosis' grace, naming that rank as stalled.
# $1 = trials; then the layouts, as NP:KEY=VALUE,KEY=VALUE (parallel.*),
# taken in turn. Prints "K of K trials ended in time naming the stalled rank".
source "$(dirname "$0")/lib.sh"
trials=$1
shift
layouts=("$@")
timeout_s=3
# The alarm comes timeout_s after the survivors' wait began (at most a step
# after the stop), the verdict 2 s later (the grace), the job's teardown
# after; a loaded 2-core machine adds seconds to each.
bound_s=$((timeout_s + 2 + 6))

RANDOM=$((trials * 104729 + ${#layouts[@]}))  # reproducible draws, different per configuration
good=0
for ((trial = 1; trial <= trials; trial++)); do
  spec=${layouts[$(((trial - 1) % ${#layouts[@]}))]}
  np=${spec%%:*}
  sets=()
  IFS=, read -ra kv <<<"${spec#*:}"
  for s in "${kv[@]}"; do sets+=(--set "parallel.$s"); done
  dir=trial$trial
  rm -rf "$dir"
  "$MPIEXEC" "$MPIEXEC_NUMPROC_FLAG" "$np" "$NDMINI" train tiny.toml --set train.steps=100000 --set train.log_every=1 \
    --set train.micro_batch=2 --set checkpoint.every=1 --set checkpoint.keep=2 --set checkpoint.dir="$dir" \
    --set comm.timeout_s=$timeout_s "${sets[@]}" "${QUICK[@]}" >"$dir.txt" 2>&1 &
  job=$!
  # Training has started (the first step is logged), then a random moment of the next 1.5 s.
  for ((i = 0; i < 600; i++)); do
    grep -q '^step ' "$dir.txt" 2>/dev/null && break
    kill -0 $job 2>/dev/null || { cat "$dir.txt"; fail "trial $trial ($spec): the job ended before training"; }
    sleep 0.1
  done
  sleep "$(awk -v r=$RANDOM 'BEGIN { printf "%.2f", 1.5 * r / 32768 }')"
  pids=($(rank_pids $job))
  [ ${#pids[@]} -eq "$np" ] || { kill -9 $job; fail "trial $trial: found ${#pids[@]} of $np rank processes"; }
  victim_pid=${pids[$((RANDOM % np))]}
  victim=$(rank_of "$victim_pid")
  kill -STOP "$victim_pid"
  t_stop=$(now)
  where="after step $(grep -c '^step ' "$dir.txt")"
  ls -a "$dir" 2>/dev/null | grep -q '^\.step_.*\.tmp$' && where="$where, during a save"
  # Wait for the job, but never past the bound by much: a hang fails here.
  while kill -0 $job 2>/dev/null && less_than "$(seconds_since "$t_stop")" $((bound_s + 10)); do sleep 0.1; done
  if kill -0 $job 2>/dev/null; then
    kill -9 "${pids[@]}" $job 2>/dev/null || true
    cat "$dir.txt"
    fail "trial $trial ($spec): still running $((bound_s + 10)) s after rank $victim was stopped: a hang"
  fi
  rc=0
  wait $job || rc=$?
  took=$(seconds_since "$t_stop")
  ok=1
  [ "$rc" -eq 12 ] || { echo "trial $trial: exit $rc, expected the watchdog's 12"; ok=0; }
  less_than "$took" $bound_s || { echo "trial $trial: ended $took s after the stop (bound $bound_s s)"; ok=0; }
  grep -qF "stalled: rank $victim did not answer" "$dir.txt" || { echo "trial $trial: rank $victim not named"; ok=0; }
  [ $ok -eq 1 ] || { cat "$dir.txt"; }
  echo "trial $trial ($spec): stopped rank $victim $where; exit $rc after $took s; named: $ok"
  good=$((good + ok))
done
echo "$good of $trials trials ended in time naming the stalled rank"
[ "$good" -eq "$trials" ] || fail "$((trials - good)) trial(s) failed"
