#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The README's main job: the tiny deck on 2 ranks (dp_replicate = 2) trains
# the same model as one rank: the loss trace matches within 1e-5 relative,
# and the gradient all-reduce shows up in the communication accounting: the
# PERFORMANCE block has a line for each group of more than one rank
# (dp_replicate and the loss's batch group), the metrics file every group.
source "$(dirname "$0")/lib.sh"

run 1 train tiny.toml --set train.log_every=1 --metrics one.jsonl >/dev/null
run 2 train tiny.toml --set parallel.dp_replicate=2 --set train.log_every=1 --metrics two.jsonl | tee out.txt
losses one.jsonl >one.txt
losses two.jsonl >two.txt
[ "$(wc -l <two.txt)" -eq 40 ] || fail "expected 40 step records"
paste one.txt two.txt | awk '{ d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > m) m = d }
  END { printf "worst relative loss difference %.2e\n", m; exit !(m < 1e-5) }' || fail "2-rank losses differ from 1 rank"
grep -q 'mesh pp=1 dp_replicate=2 dp_shard=1 cp=1 tp=1' out.txt || fail "banner lacks the mesh"
grep -Eq 'exposed comm +[0-9.]+ ms +dp_replicate' out.txt || fail "PERFORMANCE lacks the dp_replicate line"
grep '"step":1,' two.jsonl | grep -q '"dp_replicate":{"bytes":[1-9]' || fail "no dp_replicate traffic accounted"
lines=$(grep -c 'exposed comm' out.txt)
[ "$lines" -eq 2 ] || fail "PERFORMANCE shows $lines exposed-comm lines, expected 2 (dp_replicate, batch: the groups of more than one rank)"
grep -Eq 'exposed comm +[0-9.]+ ms +batch ' out.txt || fail "PERFORMANCE lacks the batch line"
grep '"step":1,' two.jsonl | grep -q '"norm":{' || fail "the metrics file lost the one-rank groups"
