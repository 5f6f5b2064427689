#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A real full disk ($1 = ranks): checkpoint.dir on a 12 MiB tmpfs, filled
# before the run so that the save of step 1 fits and the save of step 2 does
# not, whatever the timing: with checkpoint.keep = 1, step 1 stays on disk
# until step 2 is committed, so step 2 meets exactly the room left beside one
# checkpoint. What one save takes (C) is measured on the same tmpfs first.
# Three guards can meet the full disk, one per case: the free-space check
# before a save (phase 'create'); the space reservation (free-space check
# skipped by a test hook; 'create', ENOSPC from fallocate); the ranks' writes
# themselves (reservation skipped too, as on a file system without fallocate;
# 'write', ENOSPC from pwrite). Each time: the job exits non-zero on every
# rank with one message naming the phase, no temporary folder is left, and
# step 1 verifies and resumes.
# Needs to mount a tmpfs: as root, or in a user namespace (unshare -rm);
# skipped (exit 77) where neither is allowed.
source "$(dirname "$0")/lib.sh"
np=$1

if [ "$(id -u)" -ne 0 ] && [ -z "${NDMINI_IN_USERNS:-}" ]; then
  if unshare -rm true 2>/dev/null; then
    exec env NDMINI_IN_USERNS=1 unshare -rm bash "$0" "$@"
  fi
  echo "SKIP: cannot mount a tmpfs here (not root, and no user namespaces for unshare -rm)"
  exit 77
fi
mkdir mnt
if ! mount -t tmpfs -o size=12m tmpfs mnt 2>mount.txt; then
  echo "SKIP: mounting a tmpfs failed: $(cat mount.txt)"
  exit 77
fi
trap 'umount "$WORK/mnt" 2>/dev/null; rm -rf "$WORK"' EXIT

args=(train tiny.toml --set train.steps=4 --set checkpoint.every=1 --set checkpoint.keep=1 --set train.micro_batch=2
  --set parallel.dp_shard="$np" "${QUICK[@]}")

# free_bytes: what the tmpfs has free (whole pages, as tmpfs counts them).
free_bytes() { echo $(($(stat -f -c '%a' mnt) * $(stat -f -c '%S' mnt))); }

# full_disk_case NAME LEAVE PHASE [VAR=VALUE...]: with the test hooks VAR
# set, measure one save's C, fill the tmpfs until C + LEAVE bytes are free,
# train: step 2 must fail in PHASE with LEAVE bytes free.
full_disk_case() (
  local name=$1 leave=$2 phase=$3
  shift 3
  # shellcheck disable=SC2163  # exports each VAR=VALUE argument
  [ $# -eq 0 ] || export "$@"  # in this case's subshell only
  local dir=mnt/$name
  local before after one_save
  before=$(free_bytes)
  run "$np" "${args[@]}" --set train.steps=1 --set checkpoint.dir=mnt/measure >"$name.measure.txt" 2>&1 ||
    { cat "$name.measure.txt"; fail "$name: one save failed"; }
  after=$(free_bytes)
  one_save=$((before - after))
  rm -rf mnt/measure
  [ "$(free_bytes)" -eq "$before" ] || fail "$name: removing the measured checkpoint did not free its room"
  # Whole pages: tmpfs takes what is free in pages of 4 KiB.
  dd if=/dev/zero of=mnt/fill bs=4096 count=$(((before - one_save - leave) / 4096)) status=none
  local free_at_start
  free_at_start=$(free_bytes)
  echo "$name: one save takes $one_save bytes; $free_at_start bytes free at the start, $leave beside step 1"

  local rc=0
  run_ranks "$np" "${args[@]}" --set checkpoint.dir="$dir" >"$name.txt" 2>&1 || rc=$?
  cat "$name.txt"
  [ $rc -ne 0 ] || fail "$name: the job exited 0 on a full disk"
  every_rank_failed "$np" "$name.txt"
  [ "$(grep -c 'ndmini: error:' "$name.txt")" -eq 1 ] || fail "$name: expected one error message"
  grep -qF "saving checkpoint step 2 to '$dir' failed in phase '$phase' on rank" "$name.txt" ||
    fail "$name: expected the save of step 2 to fail in phase '$phase'"
  grep -Eq "No space left on device|not enough free space" "$name.txt" || fail "$name: the message lacks the cause"
  grep -qF "'latest' still names step 1" "$name.txt" || fail "$name: the message does not name step 1"
  [ "$(cat "$dir/latest")" = 1 ] || fail "$name: 'latest' names $(cat "$dir/latest"), expected 1"
  no_debris "$dir"
  rm -f mnt/fill
  run 1 ckpt verify "$dir" || fail "$name: step 1 does not verify"
  run "$np" "${args[@]}" --set checkpoint.dir="$dir" --set checkpoint.every=0 --set train.steps=2 \
    --resume >"$name.resume.txt" 2>&1 || { cat "$name.resume.txt"; fail "$name: step 1 does not resume"; }
  grep -qF "resumed from $dir/step_00000001 at step 1" "$name.resume.txt" || fail "$name: did not resume from step 1"
  rm -rf "$dir"
  echo "ok: $name: every rank stopped in phase '$phase' of step 2; step 1 intact and resumed"
)

# The free-space check asks for the data, 8 KiB per tensor and 1 MiB (io/folder.cpp):
# 3.1 MiB for the tiny deck, where one save takes 1.5 MiB. Step 1 passes it with LEAVE
# >= 3.1 - 1.5 MiB, step 2 fails it with LEAVE < 3.1 MiB: 2.25 MiB is mid-way.
full_disk_case precheck $((2304 * 1024)) create
full_disk_case reserve $((256 * 1024)) create NDMINI_CKPT_FREE_BYTES=1000000000000
full_disk_case write $((600 * 1024)) write NDMINI_CKPT_FREE_BYTES=1000000000000 NDMINI_CKPT_NO_RESERVE=1
