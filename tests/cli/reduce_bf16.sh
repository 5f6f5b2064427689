#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# comm.reduce_dtype = "bf16" on 2 ranks: two runs give bitwise identical loss
# traces (the MPI bf16 sum is deterministic), the key changes the trace (the
# reductions do round), and a run resumed from a checkpoint equals the
# uninterrupted one bit for bit (losses, parameters, optimizer state).
source "$(dirname "$0")/lib.sh"
N=4
bf16=(--set train.precision=bf16 --set comm.reduce_dtype=bf16 --set train.log_every=1 --set perf.peak_gflops=30)

# Determinism, on data parallelism's bucket all-reduces.
for name in a b; do
  run 2 train tiny.toml "${bf16[@]}" --set parallel.dp_replicate=2 --set train.steps=$((2 * N)) \
    --metrics $name.jsonl >/dev/null
done
losses a.jsonl >a.txt
losses b.jsonl >b.txt
[ "$(wc -l <a.txt)" -eq $((2 * N)) ] || fail "expected $((2 * N)) losses"
diff a.txt b.txt || fail "two runs with comm.reduce_dtype = bf16 differ"
# Negative control: the same run with fp32 reductions has another trace.
run 2 train tiny.toml "${bf16[@]}" --set comm.reduce_dtype=fp32 --set parallel.dp_replicate=2 \
  --set train.steps=$((2 * N)) --metrics c.jsonl >/dev/null
losses c.jsonl >c.txt
if diff -q a.txt c.txt >/dev/null; then fail "bf16 reductions gave the fp32 reductions' losses"; fi

# Exact resume, on FSDP's reduce-scatter: 2N steps straight (saving at N and
# 2N), versus a new job resuming from the checkpoint of step N for N more.
run 2 train tiny.toml "${bf16[@]}" --set parallel.dp_shard=2 --set train.steps=$((2 * N)) \
  --set checkpoint.every=$N --set checkpoint.dir=straight --metrics straight.jsonl >/dev/null
mkdir split
cp -r "straight/$(printf 'step_%08d' $N)" split/
run 2 train tiny.toml "${bf16[@]}" --set parallel.dp_shard=2 --set train.steps=$((2 * N)) \
  --set checkpoint.every=$N --set checkpoint.dir=split --resume $N --metrics part2.jsonl | tee resume.txt
grep -q "resumed from split/$(printf 'step_%08d' $N) at step $N" resume.txt || fail "did not resume at step $N"
losses straight.jsonl >straight.txt
{ head -n $N straight.txt; losses part2.jsonl; } >split.txt
[ "$(wc -l <split.txt)" -eq $((2 * N)) ] || fail "expected $((2 * N)) losses from the split run"
diff straight.txt split.txt || fail "losses after resume differ from the straight run"
a="straight/$(printf 'step_%08d' $((2 * N)))/checkpoint.h5"
b="split/$(printf 'step_%08d' $((2 * N)))/checkpoint.h5"
h5diff -r "$a" "$b" /model /model || fail "parameters differ after resume"
h5diff -r "$a" "$b" /optimizer /optimizer || fail "optimizer state differs after resume"
# Negative control: the checkpoints of step N and 2N differ.
if h5diff -q "split/$(printf 'step_%08d' $N)/checkpoint.h5" "$b" /model /model >/dev/null 2>&1; then
  fail "parameters at step $N and $((2 * N)) are identical: the comparison cannot see anything"
fi
echo "ok: bitwise identical traces twice, fp32 reductions differ, exact resume"
