#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# An unset layout fills the world (parallel.dp_shard = -1 by default):
# `mpiexec -n 2 ndmini train inputs/tiny.toml`, as written, trains FSDP over
# the 2 ranks, says so in the banner, and its losses are the one-rank run's
# within the equivalence bound (1e-5 relative).
source "$(dirname "$0")/lib.sh"

run 1 train "$SOURCE_DIR/inputs/tiny.toml" --metrics one.jsonl >one_out.txt || { cat one_out.txt; fail "1 rank failed"; }
grep -q "^layout:" one_out.txt && fail "a one-rank run announced a filled layout" || true
run 2 train "$SOURCE_DIR/inputs/tiny.toml" --metrics two.jsonl | tee out.txt
grep -qF 'mesh pp=1 dp_replicate=1 dp_shard=2 cp=1 tp=1' out.txt || fail "the banner lacks the filled mesh"
grep -qF 'layout: parallel.dp_shard = -1 (the default) fills the world: dp_shard = 2 of 2 ranks' out.txt ||
  fail "the banner does not say the default filled the world"
losses one.jsonl >one.txt
losses two.jsonl >two.txt
[ "$(wc -l <two.txt)" -eq "$(wc -l <one.txt)" ] && [ -s two.txt ] || fail "the runs logged different steps"
paste one.txt two.txt | awk '{ d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > m) m = d }
  END { printf "worst relative loss difference %.2e\n", m; exit !(m < 1e-5) }' || fail "2-rank losses differ from 1 rank"
echo "ok: the tiny deck as written trains on 2 ranks (dp_shard = 2) with the one-rank losses"
