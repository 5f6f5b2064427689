#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# `ndmini check --world N` validates a layout for N ranks on one and prints the
# mesh: -1 resolved, every rank's coordinates, the groups of each axis.
source "$(dirname "$0")/lib.sh"

# micro_batch 2: tiny.toml's global batch of 8 must split over the 4 data-parallel ranks.
run 1 check tiny.toml --set parallel.tp=2 --set parallel.dp_replicate=-1 --set train.micro_batch=2 --world 8 \
  >out.txt 2>&1
cat out.txt

expect_line() {
  grep -qF -- "$1" out.txt || fail "expected the mesh to show: $1"
}
expect_line "deck OK"
expect_line "mesh pp=1 dp_replicate=4 dp_shard=1 cp=1 tp=2 (8 ranks)"
expect_line "rank  pp dp_replicate dp_shard cp tp"
# tp fastest: rank 5 is dp_replicate 2, tp 1.
grep -qE '^ +5 +0 +2 +0 +0 +1$' out.txt || fail "expected rank 5 at dp_replicate=2 tp=1"
expect_line "tp groups: [0 1] [2 3] [4 5] [6 7]"
expect_line "dp_replicate groups: [0 2 4 6] [1 3 5 7]"
grep -qE '^ +7 +0 +3 +0 +0 +1$' out.txt || fail "expected a row for every rank, up to 7"
! grep -qF "fsdp groups" out.txt || fail "no fsdp groups when dp_shard x cp = 1"
echo "ok: check --world 8 printed the mesh"

# All five axes: stages (layers per stage), cp chunks, the memory estimate, the tied-embedding pairs.
run 1 check tiny.toml --set model.layers=3 --set parallel.pp=2 --set parallel.cp=2 --set parallel.tp=2 \
  --set train.micro_batch=2 --world 8 >out.txt 2>&1
cat out.txt
expect_line "pipeline          1f1b schedule, 4 micro-batches | stage 0: layers 0-1 (+embedding) | stage 1: layers 2-2 (+head)"
expect_line "context           4 chunks of 16 tokens per sequence; cp rank i holds chunks i and 3-i"
for stage in 0 1; do
  grep -qE "^memory estimate   stage $stage: [0-9.]+ MiB per rank: " out.txt || fail "expected stage $stage's memory estimate"
done
expect_line "pipeline ends (first and last stage): [0 4] [1 5] [2 6] [3 7]"
expect_line "cp groups: [0 2] [1 3] [4 6] [5 7]"
echo "ok: check --world 8 printed stages, chunks and memory for pp x cp x tp"
