#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A real full disk: checkpoint.dir on a 12 MiB tmpfs, and `dd` fills it once
# the first checkpoint is committed, while the job goes on saving every step
# ($1 = ranks). Three guards can meet the full disk first: the free-space
# check before a save; the space reservation (free-space check skipped by a
# test hook); the ranks' writes themselves (reservation skipped too, as on a
# file system without fallocate). The fill lands at a random point of a save,
# so any phase may fail. Each time: every rank exits non-zero within 10 s of
# the fill with one message, no temporary folder is left, and the previous
# checkpoint verifies and resumes.
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

args=(train tiny.toml --set train.steps=400 --set checkpoint.every=1 --set checkpoint.keep=1 --set train.micro_batch=2
  --set parallel.dp_shard="$np" "${QUICK[@]}")

# full_disk_case NAME LEAVE [ENV...]: train until `latest` exists, then fill
# the disk leaving LEAVE bytes.
full_disk_case() {
  local name=$1 leave=$2
  shift 2
  local dir=mnt/$name
  env "$@" "$MPIEXEC" "$MPIEXEC_NUMPROC_FLAG" "$np" bash -c \
    '"$0" "$@"; s=$?; echo "rank ${PMI_RANK:-?} exited with $s" >&2; exit $s' \
    "$NDMINI" "${args[@]}" --set checkpoint.dir="$dir" >"$name.txt" 2>&1 &
  local job=$!
  for _ in $(seq 1200); do
    [ -s "$dir/latest" ] && break
    kill -0 $job 2>/dev/null || break
    sleep 0.025
  done
  [ -s "$dir/latest" ] || { cat "$name.txt"; fail "$name: no checkpoint before the fill"; }
  dd if=/dev/zero of=mnt/fill bs=64k 2>/dev/null || true
  [ "$leave" -gt 0 ] && truncate -s -"$leave" mnt/fill
  local t0 rc=0
  t0=$(now)
  wait $job || rc=$?
  local elapsed
  elapsed=$(seconds_since "$t0")
  cat "$name.txt"
  [ $rc -ne 0 ] || fail "$name: the job exited 0 on a full disk"
  every_rank_failed "$np" "$name.txt"
  less_than "$elapsed" 10 || fail "$name: the job took $elapsed s to stop after the disk filled"
  [ "$(grep -c 'ndmini: error:' "$name.txt")" -eq 1 ] || fail "$name: expected one error message"
  grep -Eq "No space left on device|not enough free space" "$name.txt" || fail "$name: the message lacks the cause"
  grep -Eq "failed in phase '[a-z]+' on rank [0-9]+" "$name.txt" || fail "$name: the message lacks the phase and rank"
  local latest
  latest=$(cat "$dir/latest")
  grep -qF "'latest' still names step $latest" "$name.txt" || fail "$name: the message does not name step $latest"
  no_debris "$dir"
  rm -f mnt/fill
  run 1 ckpt verify "$dir" || fail "$name: the previous checkpoint does not verify"
  run "$np" "${args[@]}" --set checkpoint.dir="$dir" --set checkpoint.every=0 --set train.steps=$((latest + 1)) \
    --resume >"$name.resume.txt" 2>&1 || { cat "$name.resume.txt"; fail "$name: the previous checkpoint does not resume"; }
  rm -rf "$dir"
  echo "ok: $name: every rank stopped $elapsed s after the fill ($(grep -Eo "phase '[a-z]+'" "$name.txt")); step $latest intact and resumed"
}

full_disk_case precheck 0
full_disk_case reserve $((256 * 1024)) NDMINI_CKPT_FREE_BYTES=1000000000000
full_disk_case write $((600 * 1024)) NDMINI_CKPT_FREE_BYTES=1000000000000 NDMINI_CKPT_NO_RESERVE=1
