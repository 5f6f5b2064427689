#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Exact resume: 2N steps in one go, versus N steps + save, then a NEW process
# resumes and runs N more. Losses and the saved parameters and optimizer
# state at step 2N must be bitwise identical (h5diff with no tolerance).
# Arguments: deck settings KEY=VALUE for every run (e.g. train.precision=bf16).
source "$(dirname "$0")/lib.sh"
N=6
extra=(--set perf.gemm_route=blas)  # one route for every run: "auto" chooses by timing
for setting in "$@"; do extra+=(--set "$setting"); done

run 1 train tiny.toml "${extra[@]}" --set train.steps=$((2 * N)) --set train.log_every=1 \
  --set checkpoint.every=$N --set checkpoint.dir=straight --metrics straight.jsonl >/dev/null
# The split run: same deck (the LR schedule spans 2N steps), checkpoint at N;
# then drop everything after step N, as if the job had died there.
run 1 train tiny.toml "${extra[@]}" --set train.steps=$((2 * N)) --set train.log_every=1 \
  --set checkpoint.every=$N --set checkpoint.dir=split --metrics part1.jsonl >/dev/null
rm -rf "split/$(printf 'step_%08d' $((2 * N)))"
run 1 train tiny.toml "${extra[@]}" --set train.steps=$((2 * N)) --set train.log_every=1 \
  --set checkpoint.every=$N --set checkpoint.dir=split --resume $N --metrics part2.jsonl | tee resume.txt
grep -q "resumed from split/$(printf 'step_%08d' $N) at step $N" resume.txt || fail "did not resume at step $N"

losses straight.jsonl >straight.txt
{ losses part1.jsonl | head -n $N; losses part2.jsonl; } >split.txt
[ "$(wc -l <split.txt)" -eq $((2 * N)) ] || fail "expected $((2 * N)) losses from the split run"
diff straight.txt split.txt || fail "losses after resume differ from the straight run"

a="straight/$(printf 'step_%08d' $((2 * N)))/checkpoint.h5"
b="split/$(printf 'step_%08d' $((2 * N)))/checkpoint.h5"
[ -f "$a" ] && [ -f "$b" ] || fail "missing final checkpoints $a $b"
h5diff -r "$a" "$b" /model /model || fail "parameters differ after resume"
h5diff -r "$a" "$b" /optimizer /optimizer || fail "optimizer state differs after resume"
# Negative control: the checkpoint of step N differs from step 2N.
if h5diff -q "split/$(printf 'step_%08d' $N)/checkpoint.h5" "$b" /model /model >/dev/null 2>&1; then
  fail "parameters at step $N and $((2 * N)) are identical: the comparison cannot see anything"
fi
# A bare --resume takes the step named by 'latest' (the newest checkpoint, 2N).
run 1 train tiny.toml "${extra[@]}" --set train.steps=$((2 * N)) --set checkpoint.dir=straight --resume | tee bare.txt
grep -q "resumed from straight/$(printf 'step_%08d' $((2 * N))) at step $((2 * N))" bare.txt ||
  fail "a bare --resume did not take the latest checkpoint"
echo "ok: bitwise identical losses, parameters and optimizer state after resume"
