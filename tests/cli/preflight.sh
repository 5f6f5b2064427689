#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# `ndmini check` opens what the first step opens (src/train/preflight.hpp):
# for each input that would stop a run at its start, check must exit 1 with
# the one error line train gives, in seconds, having trained nothing. The
# case name is $1.
source "$(dirname "$0")/lib.sh"

# same_refusal WANT ARGS...: `check ARGS` and `train ARGS` both exit 1 with
# the same single error line, which contains WANT; check within 30 s.
same_refusal() {
  local want=$1
  shift
  local rc=0 t0
  t0=$(now)
  run 1 check "$@" >check.txt 2>&1 || rc=$?
  local took
  took=$(seconds_since "$t0")
  cat check.txt
  [ "$rc" -eq 1 ] || fail "check exited $rc, expected 1 (the error status)"
  less_than "$took" 30 || fail "check took $took s"
  grep -q "deck OK" check.txt && fail "check printed 'deck OK' for a deck train refuses" || true
  rc=0
  run 1 train "$@" "${QUICK[@]}" >train.txt 2>&1 || rc=$?
  cat train.txt
  [ "$rc" -eq 1 ] || fail "train exited $rc, expected 1"
  grep -q "^step " train.txt && fail "train trained before refusing" || true
  local check_error train_error
  check_error=$(grep '^ndmini: error:' check.txt)
  train_error=$(grep '^ndmini: error:' train.txt)
  [ "$(printf '%s\n' "$check_error" | wc -l)" -eq 1 ] || fail "check printed more than one error line"
  [ "$check_error" = "$train_error" ] || fail "check and train differ: '$check_error' vs '$train_error'"
  grep -qF -- "$want" <<<"$check_error" || fail "expected the message to contain: $want"
  echo "ok: check and train both exit 1 with '$check_error' (check: $took s)"
}

TEXT=(--set data.source=text)
TOKENS=(--set data.source=tokens)
SAVES=(--set checkpoint.every=5)

case "$1" in
  missing_data)
    same_refusal 'data.path = "absent.txt" does not exist' tiny.toml "${TEXT[@]}" --set data.path=absent.txt ;;
  not_token_file)
    # Four spaces read as an int32: the magic a text file given as tokens shows.
    printf '%4096s' ' ' >words.bin
    same_refusal 'data.path = "words.bin": bad magic 538976288' tiny.toml "${TOKENS[@]}" --set data.path=words.bin ;;
  short_text)
    printf 'too short' >short.txt
    same_refusal 'data.path = "short.txt": the file holds 9 tokens, too short for model.seq_len = 64' \
      tiny.toml "${TEXT[@]}" --set data.path=short.txt ;;
  checkpoint_not_folder)
    touch a_file
    same_refusal "checkpoint.dir = 'a_file' is not a folder" tiny.toml "${SAVES[@]}" --set checkpoint.dir=a_file ;;
  checkpoint_uncreatable)
    touch a_file
    same_refusal "checkpoint.dir = 'a_file/sub': the folder cannot be created" tiny.toml "${SAVES[@]}" \
      --set checkpoint.dir=a_file/sub ;;
  checkpoint_no_room)
    # The file system's free bytes as the test hook of src/io/folder.cpp reports them: 1 MiB.
    NDMINI_CKPT_FREE_BYTES=1048576 same_refusal "for one checkpoint of this model" tiny.toml "${SAVES[@]}" ;;
  missing_cluster)
    same_refusal "perf.cluster: cluster file 'absent.toml' does not exist" tiny.toml --set perf.cluster=absent.toml ;;
  inputs_ok)
    # The control: good files pass check, which says what it opened, and train runs on them.
    head -c 3000 "$SOURCE_DIR/README.md" >corpus.txt
    args=(tiny.toml "${TEXT[@]}" --set data.path=corpus.txt "${SAVES[@]}" --set train.steps=5)
    run 1 check "${args[@]}" >check.txt 2>&1 || { cat check.txt; fail "check refused good inputs"; }
    cat check.txt
    grep -qF "inputs OK: data text corpus.txt (3000 tokens); checkpoint.dir = 'ckpt' writable" check.txt ||
      fail "check did not say what it opened"
    run 1 train "${args[@]}" "${QUICK[@]}" >train.txt 2>&1 || { cat train.txt; fail "train failed on inputs check passed"; }
    grep -Eq "^step +4/" train.txt || fail "train did not reach its last step"
    echo "ok: check passed the inputs train then trained on" ;;
  *) fail "unknown case $1" ;;
esac
