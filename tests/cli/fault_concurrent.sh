#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Two jobs on one checkpoint folder: the second is refused at once, naming
# the folder and the first job (host, pid); the first finishes, its
# checkpoints intact. The first job's ranks are stopped (SIGSTOP) while the
# second tries, so it holds the folder then whatever the machine's load.
source "$(dirname "$0")/lib.sh"

run 2 train tiny.toml --set train.steps=30 --set checkpoint.every=1 --set parallel.dp_shard=2 "${QUICK[@]}" \
  >first.txt 2>&1 &
first=$!
# No deadline here: ctest's TIMEOUT bounds a job that never saves.
until [ -s ckpt/latest ]; do
  kill -0 $first 2>/dev/null || { cat first.txt; fail "the first job ended before its first checkpoint"; }
  sleep 0.05
done
read -ra ranks <<<"$(rank_pids $first)"
[ ${#ranks[@]} -eq 2 ] || fail "expected the first job's 2 rank processes, found: ${ranks[*]}"
kill -STOP "${ranks[@]}"
trap 'kill -CONT "${ranks[@]}" 2>/dev/null || true; rm -rf "$WORK"' EXIT
holder=$(cat ckpt/.lock)
t0=$(now)
rc=0
run 1 train tiny.toml --set checkpoint.every=1 "${QUICK[@]}" >second.txt 2>&1 || rc=$?
elapsed=$(seconds_since "$t0")
cat second.txt
kill -CONT "${ranks[@]}"
trap 'rm -rf "$WORK"' EXIT
wait $first || { cat first.txt; fail "the first job failed"; }
[ "$rc" -ne 0 ] || fail "the second job was not refused"
grep -qF "checkpoint.dir = 'ckpt' is in use by another job (${holder%$'\n'})" second.txt ||
  fail "the refusal does not name the folder and the holder ($holder)"
less_than "$elapsed" 10 || fail "the refusal took $elapsed s"
grep -q "^step " second.txt && fail "the second job trained before being refused"
[ "$(cat ckpt/latest)" = 30 ] || fail "the first job's latest is $(cat ckpt/latest), expected 30"
run 1 ckpt verify ckpt || fail "the first job's last checkpoint does not verify"
echo "ok: the second job was refused in $elapsed s; the first finished intact"
