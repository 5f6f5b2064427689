#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Pre-emption (core/signals.hpp), a checkpoint saved after every step.
# $1 = ranks, $2 = trials, $3 = "once", "cluster", "twice" or "leaving"; $4 = "busy":
# one busy loop per core beside the job for the whole test.
# once: SIGTERM or SIGUSR1 at a random moment (in a step or inside a save),
#   sent to mpiexec (which forwards it to every rank), to one rank only, to
#   every rank (as srun delivers it), or to every process.
# cluster: always to every process, as a node daemon (Slurm's scancel or
#   time limit) delivers it: mpiexec, the hydra proxy and each rank, one by
#   one in random order 0-30 ms apart, so each rank gets its own copy and
#   the forwarded ones.
#   Every time (once, cluster) the copies are one request: the job exits
#   with 128 + the signal after one line naming the signal and the
#   checkpoint saved, and no "second signal"; that checkpoint is `latest`
#   and verifies; resuming from it to the end gives losses, parameters and
#   AdamW state bitwise those of an uninterrupted run.
# twice: one rank held (SIGSTOP) so that the step boundary cannot come
#   first, then the first SIGTERM to every process as in cluster, and after
#   the copy window (2 s) a deliberate second SIGTERM goes to every rank or
#   to mpiexec alone: the job ends at once (MPI_Abort: mpiexec exits 143,
#   the held rank taken down with the rest), `latest`, where there is one,
#   verifies, and resuming from it gives the uninterrupted run bit for bit.
# leaving: the first SIGTERM to every process as in cluster, and the second
#   while the ranks are leaving after the stop save: the test hook
#   NDMINI_TEST_HAND_OVER_PAUSE_MS keeps rank 0 for 8 s in its pause before
#   it hands the status over (miniapp/exit_status.cpp), after the save and
#   its line. Once that line is out and the copy window has passed, trial by
#   trial: rank 0 held (SIGSTOP) in that pause or not, the deliberate second
#   SIGTERM to every rank or to mpiexec alone. The job ends at once with 143
#   (never 0), the stop save is `latest` and verifies, and resuming from it
#   gives the uninterrupted run bit for bit.
source "$(dirname "$0")/lib.sh"
np=$1
trials=$2
mode=$3
busy=${4:-}
STEPS=12
args=(train tiny.toml --set train.steps=$STEPS --set train.log_every=1 --set train.micro_batch=2
  --set checkpoint.every=1 --set checkpoint.keep=2 --set parallel.dp_shard="$np" "${QUICK[@]}")
final=$(printf 'step_%08d' $STEPS)
# core/signals.hpp's kCopyWindowSeconds, and a margin: the deliberate second request comes after it.
WINDOW_S=2
# leaving: rank 0's pause before the hand-over (the test hook), far longer than the copy window.
job_env=()
[ "$mode" = leaving ] && job_env=(NDMINI_TEST_HAND_OVER_PAUSE_MS=8000)
# Both cores busy (a loaded node): the copies' spacing and the step's timing under contention.
busy_pids=()
if [ "$busy" = busy ]; then
  for ((c = 0; c < $(nproc); c++)); do
    bash -c 'while :; do :; done' &
    busy_pids+=($!)
  done
  trap 'kill "${busy_pids[@]}" 2>/dev/null || true; rm -rf "$WORK"' EXIT
fi

# proxy_pids JOB: mpiexec's hydra proxies (the launcher's forwarders, children of mpiexec).
proxy_pids() {
  local k
  for k in $(ps -o pid= --ppid "$1" 2>/dev/null || true); do
    [ "$(ps -o comm= -p "$k" 2>/dev/null)" = hydra_pmi_proxy ] && echo "$k"
  done
}

# signal_every_process SIG JOB RANK_PIDS...: SIG to mpiexec, its proxies and
# each rank, one by one in a random order, 0-30 ms apart.
signal_every_process() {
  local sig=$1 job=$2 i j t p
  shift 2
  local procs=("$job" $(proxy_pids "$job") "$@") names=()
  for ((i = ${#procs[@]} - 1; i > 0; i--)); do
    j=$((RANDOM % (i + 1)))
    t=${procs[$i]} procs[$i]=${procs[$j]} procs[$j]=$t
  done
  # Named before the first kill: no ps between two signals.
  for p in "${procs[@]}"; do
    if [ "$p" = "$job" ]; then
      names+=(mpiexec)
    elif [ "$(ps -o comm= -p "$p" 2>/dev/null)" = ndmini ]; then
      names+=("rank$(rank_of "$p" 2>/dev/null || echo ?)")
    else
      names+=(proxy)
    fi
  done
  local gaps=($(awk -v seed=$RANDOM -v n=${#procs[@]} 'BEGIN { srand(seed); for (i = 0; i < n; i++) printf "%.3f ", int(rand() * 31) / 1000 }'))
  for ((i = 0; i < ${#procs[@]}; i++)); do
    kill -"$sig" "${procs[$i]}" 2>/dev/null || true
    sleep "${gaps[$i]}"
  done
  order="${names[*]}"
}

# second_request TARGET JOB RANK_PIDS...: the deliberate second SIGTERM to
# "every rank" or "mpiexec"; the job must end at once (within 15 s: a bound
# far below the collective timeout a held rank would otherwise end in).
second_request() {
  local target=$1 job=$2 w
  shift 2
  t1=$(now)
  if [ "$target" = mpiexec ]; then kill -TERM "$job" 2>/dev/null || true; else kill -TERM "$@" 2>/dev/null || true; fi
  for ((w = 0; w < 150; w++)); do
    kill -0 "$job" 2>/dev/null || return 0
    sleep 0.1
  done
  kill_job "$job" "$@"
  wait "$job" || true
  cat "$dir.0.txt"
  fail "trial $trial: the job did not end within 15 s of the deliberate second SIGTERM"
}

# kill_job JOB RANK_PIDS...: SIGCONT and SIGKILL what is left of a job (a test that failed).
kill_job() {
  local job=$1
  shift
  kill -CONT "$@" 2>/dev/null || true
  kill -KILL "$@" $(proxy_pids "$job") "$job" 2>/dev/null || true
}

# ready_ranks JOB: the job's rank PIDs once every rank catches SIGTERM (the
# handler is installed: bit 14 of SigCgt); fails if the job ends first.
ready_ranks() {
  local pids p mask all
  while kill -0 "$1" 2>/dev/null; do
    pids=($(rank_pids "$1"))
    if [ ${#pids[@]} -eq "$np" ]; then
      all=1
      for p in "${pids[@]}"; do
        mask=$(awk '/^SigCgt:/ { print $2 }' "/proc/$p/status" 2>/dev/null || true)
        (((0x${mask:-0} >> 14) & 1)) || all=0
      done
      [ $all -eq 1 ] && { echo "${pids[@]}"; return 0; }
    fi
    sleep 0.01
  done
  return 1
}

# The uninterrupted run; span: from the handlers' installation to its end.
run "$np" "${args[@]}" --set checkpoint.dir=ref --metrics ref.jsonl >ref.txt 2>&1 &
job=$!
ready_ranks $job >/dev/null || { wait $job || true; cat ref.txt; fail "the reference run ended before its ranks were ready"; }
t0=$(now)
wait $job || { cat ref.txt; fail "reference run failed"; }
span=$(seconds_since "$t0")
step_losses ref.jsonl >ref_losses.txt
[ "$(wc -l <ref_losses.txt)" -eq $STEPS ] || fail "the reference logged $(wc -l <ref_losses.txt) steps"
echo "reference: $STEPS steps in $span s after start-up"

# finish DIR TRIAL: resume from latest (or start afresh where no checkpoint
# was committed) to the end; every step's loss logged by any part, and the final parameters
# and AdamW state, must be the reference's bit for bit.
finish() {
  local dir=$1 trial=$2 resume=() at
  if [ -f "$dir/latest" ]; then
    resume=(--resume)
    at=$(cat "$dir/latest")
  fi
  run "$np" "${args[@]}" --set checkpoint.dir="$dir" "${resume[@]}" --metrics "$dir.1.jsonl" >"$dir.1.txt" 2>&1 ||
    { cat "$dir.1.txt"; fail "trial $trial: the resumed run failed"; }
  if [ -n "${at:-}" ]; then
    grep -q "resumed from $dir/$(printf 'step_%08d' "$at") at step $at " "$dir.1.txt" ||
      fail "trial $trial: did not resume from latest (step $at)"
  fi
  no_debris "$dir"
  cat "$dir.0.jsonl" "$dir.1.jsonl" 2>/dev/null | grep '"step"' >"$dir.all.jsonl" || true
  # A step logged twice (run before the signal, again after the resume) must agree with itself too.
  step_losses "$dir.all.jsonl" | LC_ALL=C sort -u >"$dir.losses.txt"
  diff <(awk '{ print $1 }' "$dir.losses.txt" | sort -n) <(seq 0 $((STEPS - 1))) >/dev/null ||
    fail "trial $trial: the logged steps are not each of 0..$((STEPS - 1)) once: $(tr '\n' ' ' <"$dir.losses.txt")"
  diff "$dir.losses.txt" <(LC_ALL=C sort ref_losses.txt) || fail "trial $trial: losses differ from the reference"
  h5diff -r "ref/$final/checkpoint.h5" "$dir/$final/checkpoint.h5" /model /model >/dev/null ||
    fail "trial $trial: parameters differ from the reference"
  h5diff -r "ref/$final/checkpoint.h5" "$dir/$final/checkpoint.h5" /optimizer /optimizer >/dev/null ||
    fail "trial $trial: optimizer state differs from the reference"
}

saving() { ls -a "$1" 2>/dev/null | grep -q '^\.step_.*\.tmp$'; }

RANDOM=$((np * 7919 + trials + ${#mode}))  # reproducible draws, different per configuration
in_save=0
to_mpiexec=0 to_one=0 to_every=0 to_all=0
for ((trial = 1; trial <= trials; trial++)); do
  dir=trial$trial
  if [ "$mode" = once ] || [ "$mode" = cluster ]; then
    sig=$([ $((RANDOM % 2)) -eq 0 ] && echo TERM || echo USR1)
    status=$((128 + $(kill -l "$sig")))
    to=$((RANDOM % 4))  # 0: mpiexec, 1: one rank, 2: every rank, 3: every process
    [ "$mode" = cluster ] && to=3
  else
    sig=TERM
    status=143
  fi
  draws=0
  while :; do
    draws=$((draws + 1))
    [ $draws -le 5 ] || fail "trial $trial: 5 draws in a row came too late"
    rm -rf "$dir" "$dir".*
    delay=$(awk -v r=$RANDOM -v s="$span" 'BEGIN { printf "%.3f", s * r / 32768 }')
    # mpiexec itself, not run (a function: $! would be a subshell).
    env "${job_env[@]}" "$MPIEXEC" "$MPIEXEC_NUMPROC_FLAG" "$np" "$NDMINI" "${args[@]}" --set checkpoint.dir="$dir" \
      --metrics "$dir.0.jsonl" >"$dir.0.txt" 2>&1 &
    job=$!
    pids=($(ready_ranks $job)) || { wait $job || true; cat "$dir.0.txt"; fail "trial $trial: the job did not start"; }
    if [ "$mode" = leaving ]; then
      # The exit path is under test, not the moment: soon after the first save, so no draw comes too
      # late however the machine's load has changed since the reference run.
      until [ -f "$dir/latest" ] || ! kill -0 $job 2>/dev/null; do sleep 0.01; done
      delay=$(awk -v r=$RANDOM 'BEGIN { printf "%.3f", 0.3 * r / 32768 }')
    fi
    sleep "$delay"
    where="latest $(cat "$dir/latest" 2>/dev/null || echo none)"
    alive=1
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || alive=0; done
    if [ $alive -eq 0 ]; then
      wait $job || true
      echo "trial $trial: the job ended before the signal at $delay s; drawing again"
      span=$delay
      continue
    fi
    t1=$(now)
    if [ "$mode" = once ] || [ "$mode" = cluster ]; then
      case $to in
        0)
          target=mpiexec
          kill -"$sig" $job 2>/dev/null || true
          ;;
        1)
          target="rank $((RANDOM % np))"
          kill -"$sig" "${pids[${target#rank }]}" 2>/dev/null || true
          ;;
        2)
          target="every rank"
          kill -"$sig" "${pids[@]}" 2>/dev/null || true
          ;;
        3)
          signal_every_process "$sig" $job "${pids[@]}"
          target="every process ($order)"
          ;;
      esac
      saving "$dir" && where="$where, during a save"
    elif [ "$mode" = twice ]; then
      # Held first, so that the step boundary cannot come before the second
      # request however fast the steps are (held after the first signal, the
      # hold came too late in 5 draws in a row on a quiet machine); the held
      # rank's copies stay pending, the others get both requests.
      held=$((RANDOM % np))
      kill -STOP "${pids[$held]}" 2>/dev/null || true
      signal_every_process TERM $job "${pids[@]}"
      second=$([ $((trial % 2)) -eq 1 ] && echo "every rank" || echo mpiexec)
      target="every process ($order), rank $held held, after ${WINDOW_S}.3 s again to $second"
      sleep "$WINDOW_S.3"
      second_request "$second" $job "${pids[@]}"
    else
      signal_every_process TERM $job "${pids[@]}"
      t_first=$(now)  # the last copy sent: the copy window is counted from here
      # The stop save made and its line printed: rank 0 is then in its pause
      # before the hand-over (8 s by the hook). Not seen: the signal came too
      # late for a stop (the draws below), or the job went wrong (failed below).
      stopped=0
      for ((w = 0; w < 3000; w++)); do
        grep -q "stopped after step" "$dir.0.txt" && { stopped=1; break; }
        kill -0 $job 2>/dev/null || break
        sleep 0.01
      done
      if [ $stopped -eq 1 ]; then
        held=none
        if [ $(((trial - 1) % 4)) -lt 2 ]; then
          for p in "${pids[@]}"; do [ "$(rank_of "$p" 2>/dev/null)" = 0 ] && held=$p; done
          kill -STOP "$held" 2>/dev/null || true
          held="rank 0 held in its pause"
        else
          held="none held"
        fi
        second=$([ $((trial % 2)) -eq 1 ] && echo "every rank" || echo mpiexec)
        # After the copy window: the second request is a deliberate one.
        sleep "$(awk -v a="$t_first" -v b="$(now)" -v w=$WINDOW_S 'BEGIN { r = a + w + 0.3 - b; printf "%.3f", (r > 0 ? r : 0) }')"
        kill -0 $job 2>/dev/null ||
          { wait $job || true; cat "$dir.0.txt"; fail "trial $trial: the job ended inside the hook's 8 s pause"; }
        target="every process ($order), stopped and saved, $held, again to $second"
        second_request "$second" $job "${pids[@]}"
      elif kill -0 $job 2>/dev/null; then
        kill_job $job "${pids[@]}"
        wait $job || true
        cat "$dir.0.txt"
        fail "trial $trial: no stop line within 30 s of the first SIGTERM"
      fi
    fi
    rc=0
    wait $job || rc=$?
    [ "$mode" = twice ] || [ "$mode" = leaving ] && ended_in=$(seconds_since "$t1")
    # Too late as well: a first signal after the last step (a short run on a
    # quiet machine) finds the run complete; it says so and exits 128 + N
    # with nothing left to save, so this draw tests nothing.
    if grep -qF "received after the last step: the run is complete ($STEPS of $STEPS steps done)" "$dir.0.txt"; then
      echo "trial $trial: SIG$sig at $delay s came after the last step (the run complete); drawing again"
      span=$delay
      continue
    fi
    # Too late: a (first) signal after the run's last agreement, with every
    # step done and saved, finds the job completing; it exits 0 (nothing was lost).
    if [ $rc -eq 0 ] && grep -q "\"step\":$((STEPS - 1))," "$dir.0.jsonl" && ! grep -q "second signal" "$dir.0.txt"; then
      echo "trial $trial: SIG$sig at $delay s came after the run's end (exit 0, all done); drawing again"
      span=$delay
      continue
    fi
    [ $rc -ne 0 ] || { cat "$dir.0.txt"; fail "trial $trial: SIG$sig sent to $target but the job exited 0"; }
    # Too late: the signal came after the last step (the run is complete, the
    # status still says it was signalled) or, the second one, after the job
    # had stopped at the step boundary.
    if { [ "$mode" = once ] || [ "$mode" = cluster ]; } && [ $rc -eq $status ] && ! grep -q "stopped after step" "$dir.0.txt"; then
      grep -q "\"step\":$((STEPS - 1))," "$dir.0.jsonl" ||
        { cat "$dir.0.txt"; fail "trial $trial: SIG$sig to $target: exit $rc, no stop line, and the run did not complete"; }
      echo "trial $trial: SIG$sig at $delay s came after the last step (exit $rc); drawing again"
      span=$delay
      continue
    fi
    if [ "$mode" = twice ] && grep -q "stopped after step" "$dir.0.txt"; then
      echo "trial $trial: the job stopped at the boundary before the second signal; drawing again"
      continue
    fi
    [ "$mode" = leaving ] && [ $stopped -eq 0 ] && { cat "$dir.0.txt"; fail "trial $trial: the job ended ($rc) without a stop line"; }
    break
  done
  if [ "$mode" = leaving ]; then
    [ $rc -eq 143 ] ||
      { cat "$dir.0.txt"; fail "trial $trial: exit status $rc after the second SIGTERM in the exit path, expected 143"; }
    grep -q "^ndmini: second signal (SIGTERM): ending the job at once with status 143" "$dir.0.txt" ||
      { cat "$dir.0.txt"; fail "trial $trial: no line for the second signal"; }
    line=$(grep "^ndmini: SIGTERM received: stopped after step" "$dir.0.txt")
    saved=$(echo "$line" | sed -n "s|.*saved checkpoint $dir/step_0*\([0-9][0-9]*\) .*exit status 143\$|\1|p")
    [ -n "$saved" ] || fail "trial $trial: the stop line names no saved checkpoint and status: $line"
    [ "$(cat "$dir/latest")" = "$saved" ] || fail "trial $trial: latest is $(cat "$dir/latest"), the line says $saved"
    no_debris "$dir"
    "$NDMINI" ckpt verify "$dir" >/dev/null || fail "trial $trial: the stop save (step $saved) does not verify"
    summary="exit $rc, $ended_in s after the second signal, latest (step $saved, the stop save) verifies"
  elif [ "$mode" != twice ]; then
    ! grep -q "second signal" "$dir.0.txt" ||
      { cat "$dir.0.txt"; fail "trial $trial: a copy of the one request was taken for a second one"; }
    [ $rc -eq $status ] || { cat "$dir.0.txt"; fail "trial $trial: exit status $rc, expected $status (128 + SIG$sig)"; }
    line=$(grep "^ndmini: SIG$sig received: stopped after step" "$dir.0.txt") ||
      { cat "$dir.0.txt"; fail "trial $trial: no line naming SIG$sig and the step"; }
    saved=$(echo "$line" | sed -n "s|.*saved checkpoint $dir/step_0*\([0-9][0-9]*\) .*exit status $status\$|\1|p")
    [ -n "$saved" ] || fail "trial $trial: the line names no saved checkpoint and status: $line"
    [ "$(cat "$dir/latest")" = "$saved" ] || fail "trial $trial: latest is $(cat "$dir/latest"), the line says $saved"
    [ "$(step_losses "$dir.0.jsonl" | wc -l)" -eq "$saved" ] || fail "trial $trial: steps logged before the stop != $saved"
    no_debris "$dir"
    "$NDMINI" ckpt verify "$dir" >/dev/null || fail "trial $trial: the checkpoint saved at the signal does not verify"
    summary="exit $rc, saved step $saved"
  else
    [ $rc -eq 143 ] || { cat "$dir.0.txt"; fail "trial $trial: exit status $rc after the second SIGTERM, expected 143"; }
    grep -q "^ndmini: second signal (SIGTERM): ending the job at once with status 143" "$dir.0.txt" ||
      { cat "$dir.0.txt"; fail "trial $trial: no line for the second signal"; }
    saving "$dir" && where="$where, a save cut short"
    summary="exit $rc, $ended_in s after the second signal, no checkpoint committed yet"
    if [ -f "$dir/latest" ]; then
      "$NDMINI" ckpt verify "$dir" >/dev/null || fail "trial $trial: latest ($(cat "$dir/latest")) does not verify"
      summary="exit $rc, $ended_in s after the second signal, latest (step $(cat "$dir/latest")) verifies"
    fi
  fi
  case "$where" in *save*) in_save=$((in_save + 1)) ;; esac
  case "$target" in
    mpiexec) to_mpiexec=$((to_mpiexec + 1)) ;;
    rank*) to_one=$((to_one + 1)) ;;
    "every rank") to_every=$((to_every + 1)) ;;
    *) to_all=$((to_all + 1)) ;;
  esac
  finish "$dir" "$trial"
  echo "trial $trial: SIG$sig to $target at $delay s ($where): $summary; resumed to the end bitwise identical"
done
# Negative control: the comparison sees a difference (step 11 against step 12).
if h5diff -q "ref/$(printf 'step_%08d' $((STEPS - 1)))/checkpoint.h5" "ref/$final/checkpoint.h5" /model /model >/dev/null 2>&1; then
  fail "steps $((STEPS - 1)) and $STEPS compare equal: the comparison cannot see anything"
fi
echo "$trials of $trials trials ($mode, $np ranks): non-zero exit, checkpoint verified, bitwise identical after resume;" \
  "sent to mpiexec $to_mpiexec, to one rank $to_one, to every rank $to_every, to every process $to_all;" \
  "$in_save inside a save${busy:+; both cores busy}"
