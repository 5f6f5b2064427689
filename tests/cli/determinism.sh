#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Two runs of one deck give bitwise identical loss traces (every logged
# float compared as the text JSON prints, which round-trips exactly).
# The GEMM route is pinned: perf.gemm_route = "auto" chooses by timing, which
# two runs may read differently on a near tie (docs/deck.md).
source "$(dirname "$0")/lib.sh"

run 1 train tiny.toml --set perf.gemm_route=blas --set train.steps=12 --set train.log_every=1 --metrics a.jsonl >/dev/null
run 1 train tiny.toml --set perf.gemm_route=blas --set train.steps=12 --set train.log_every=1 --metrics b.jsonl >/dev/null
losses a.jsonl >a.txt
losses b.jsonl >b.txt
[ "$(wc -l <a.txt)" -eq 12 ] || fail "expected 12 losses"
diff a.txt b.txt || fail "loss traces differ between two identical runs"
# Negative control: another seed must change the trace.
run 1 train tiny.toml --set perf.gemm_route=blas --set train.steps=12 --set train.log_every=1 --set train.seed=99 --metrics c.jsonl >/dev/null
losses c.jsonl >c.txt
if diff -q a.txt c.txt >/dev/null; then fail "a different seed gave the same losses"; fi
echo "ok: identical traces, and a different seed differs"
