#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The synthetic task is learnable: within the tiny deck's 40 steps the loss
# must fall from about ln(256) = 5.55 to below 2.5 (its floor is about ln 2).
# Argument: the deck in inputs/ (default tiny.toml; llama-tiny.toml: the same
# task on Llama's blocks).
source "$(dirname "$0")/lib.sh"
deck=${1:-tiny.toml}
[ -f "$deck" ] || cp "$SOURCE_DIR/inputs/$deck" .

run 1 train "$deck" --set train.log_every=1 --metrics m.jsonl | tee out.txt
first=$(losses m.jsonl | head -n1)
last=$(losses m.jsonl | tail -n1)
echo "first loss $first, last loss $last"
[ "$(losses m.jsonl | wc -l)" -eq 40 ] || fail "expected 40 step records"
awk -v f="$first" 'BEGIN { exit !(f > 5.0 && f < 6.0) }' || fail "first loss $first is not near ln(256)"
awk -v l="$last" 'BEGIN { exit !(l < 2.5) }' || fail "loss did not fall below 2.5 in 40 steps: $last"
grep -q '"summary":true' m.jsonl || fail "no summary record"
grep -q '^PERFORMANCE' out.txt || fail "no PERFORMANCE block"
