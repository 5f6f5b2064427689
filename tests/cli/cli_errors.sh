#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The command line's own mistakes and the deck settings that do nothing (the
# case name is $1): a command-line error is one line beginning
# `ndmini: error:` and exit status 2 (--help and --version still exit 0); a
# deck error exits 1; a setting without effect is one `note:` line and the
# run goes on.
source "$(dirname "$0")/lib.sh"

# expect_exit STATUS SUBSTRING ARGS...: ndmini (one rank) exits with STATUS,
# its output is one line beginning `ndmini: error:`, and it holds SUBSTRING.
expect_exit() {
  local want_rc=$1 want=$2
  shift 2
  local rc=0
  run 1 "$@" >out.txt 2>&1 || rc=$?
  cat out.txt
  [ "$rc" -eq "$want_rc" ] || fail "expected exit status $want_rc, got $rc for: ndmini $*"
  [ "$(own_lines out.txt | wc -l)" -eq 1 ] || fail "expected one line of output for: ndmini $*"
  grep -q "^ndmini: error: " out.txt || fail "the message does not begin with 'ndmini: error:'"
  grep -qF -- "$want" out.txt || fail "expected the message to contain: $want"
  echo "ok: exit $rc with '$want'"
}

# expect_note SUBSTRING ARGS...: ndmini (one rank) exits 0 and prints exactly
# one note, holding SUBSTRING.
expect_note() {
  local want=$1
  shift
  run 1 "$@" >out.txt 2>&1 || { cat out.txt; fail "ndmini $* was refused; expected a note"; }
  grep '^note:' out.txt || true
  [ "$(grep -c '^note:' out.txt)" -eq 1 ] || fail "expected exactly one note for: ndmini $*"
  grep '^note:' out.txt | grep -qF -- "$want" || fail "expected the note to contain: $want"
  echo "ok: one note with '$want'"
}

subcommands="expected train, check, config, keys, ckpt or plan"
case "$1" in
  unknown_subcommand)
    expect_exit 2 "unknown subcommand 'frobnicate' for ndmini: $subcommands; 'ndmini --help' describes them" \
      frobnicate
    expect_exit 2 "unknown subcommand 'frob' for ndmini ckpt: expected info or verify" ckpt frob
    expect_exit 2 "ndmini needs a subcommand: train, check, config, keys, ckpt or plan"
    expect_exit 2 "ndmini ckpt needs a subcommand: info or verify" ckpt ;;
  world_range)
    for n in 0 -3 2000000 x; do
      expect_exit 2 "--world: '$n' must be a whole number between 1 and 1048576" check tiny.toml --world "$n"
      if grep -Eq '[0-9]{8}' out.txt; then fail "a number of 8 digits or more in the message"; fi
    done
    run 1 check tiny.toml --world 1048576 --set parallel.dp_replicate=-1 --set train.global_batch=1048576 \
      --set train.micro_batch=1 >out.txt 2>&1 || { cat out.txt; fail "--world 1048576 must be accepted"; }
    grep -qF "(1048576 ranks)" out.txt || fail "check did not describe 1048576 ranks" ;;
  parse_errors)
    # CLI11's messages, in the form of every other error, with exit status 2.
    expect_exit 2 "deck is required; 'ndmini train --help' lists the options" train
    expect_exit 2 "path is required; 'ndmini ckpt info --help' lists the options" ckpt info
    expect_exit 2 "--bogus" --bogus
    expect_exit 2 "ndmini check does not take: --wrld 3" check tiny.toml --wrld 3
    expect_exit 2 "ndmini train does not take: extra" train tiny.toml extra
    for step in abc -1 1.5 99999999999; do
      expect_exit 2 "--resume: '$step' must be a step number >= 0 (or nothing, for 'latest'" train tiny.toml --resume "$step"
    done
    # Help and version are answers, not errors.
    run 1 --help >out.txt 2>&1 || fail "--help exited non-zero"
    if grep -q "error" out.txt; then fail "--help printed an error"; fi
    run 1 check --help >out.txt 2>&1 || fail "check --help exited non-zero"
    grep -qF "Usage: ndmini check [OPTIONS] deck" out.txt || fail "check --help lost its usage line"
    run 1 --version >out.txt 2>&1 || fail "--version exited non-zero"
    grep -q "^ndmini " out.txt || fail "--version did not print the version" ;;
  every_rank)
    # Launched on 2 ranks: one message, and every rank exits 2.
    rc=0
    run_ranks 2 frobnicate >out.txt 2>&1 || rc=$?
    cat out.txt
    [ "$rc" -ne 0 ] || fail "an unknown subcommand must fail the job"
    [ "$(grep -c '^ndmini: error: unknown subcommand' out.txt)" -eq 1 ] || fail "expected the message once"
    for r in 0 1; do grep -Eq "^rank $r exited with 2$" out.txt || fail "rank $r did not exit with status 2"; done ;;
  two_wildcards)
    # Deck errors keep exit status 1.
    expect_exit 1 "parallel.dp_shard and parallel.tp are both -1; at most one degree may be -1" \
      check tiny.toml --set parallel.dp_shard=-1 --set parallel.tp=-1 --world 4 ;;
  comm_timeout)
    for v in 1e300 inf nan 1e-9 -1 604801; do
      expect_exit 1 "comm.timeout_s = " check tiny.toml --set comm.timeout_s="$v"
      grep -qF "must be 0 (no deadline) or between 0.1 and 604800 seconds (one week)" out.txt ||
        fail "comm.timeout_s = $v: the message does not give the range"
    done
    for v in 0 0.1 604800; do
      run 1 check tiny.toml --set comm.timeout_s="$v" >out.txt 2>&1 || { cat out.txt; fail "comm.timeout_s = $v refused"; }
    done ;;
  notes)
    expect_note 'parallel.schedule = "interleaved_1f1b" has no effect with parallel.pp = 1' \
      check tiny.toml --set parallel.schedule=interleaved_1f1b
    expect_note "parallel.sequence_parallel = true has no effect with parallel.tp = 1" \
      check tiny.toml --set parallel.sequence_parallel=true
    expect_note "train.warmup_steps = 8 exceeds train.steps = 2: the run ends in warm-up, at 25% of train.lr" \
      check tiny.toml --set train.warmup_steps=8 --set train.steps=2
    # A run says it too, and trains.
    expect_note "parallel.sequence_parallel = true has no effect" \
      train tiny.toml --set parallel.sequence_parallel=true --set train.steps=4 --set train.log_every=1 "${QUICK[@]}"
    grep -Eq '^step +3/' out.txt || fail "the run with a note did not train its 4 steps"
    # None where every setting acts.
    run 1 check tiny.toml >out.txt 2>&1 || fail "check of the tiny deck failed"
    if grep -q '^note:' out.txt; then fail "a note for the tiny deck"; fi ;;
  *) fail "unknown case '$1'" ;;
esac
