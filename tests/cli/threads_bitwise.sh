#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The bits do not depend on the thread count: in a build whose Kokkos runs
# host threads (OpenMP backend), one rank on 1 and on 2 threads gives the
# same losses and the same final parameters and optimizer state (h5diff, no
# tolerance), in fp32 and in bf16; the banner shows that the second run did
# use 2 threads. Skipped (exit 77) in a build without such a backend.
# Arguments: deck settings KEY=VALUE for every run (e.g. train.precision=bf16).
source "$(dirname "$0")/lib.sh"
extra=()
for setting in "$@"; do extra+=(--set "$setting"); done

backend=$("$NDMINI" --build-info | sed -E 's/.*"kokkos_backend": "([^"]*)".*/\1/')
case "$backend" in
  *OpenMP* | *Threads*) ;;
  *)
    echo "skip: Kokkos' backend here is '$backend', which runs no host threads of its own; build against" \
      "a Kokkos with Kokkos_ENABLE_OPENMP (e.g. Spack kokkos+openmp) to test threads"
    exit 77
    ;;
esac

# train_on THREADS NAME [SETTINGS...]: 6 steps of the tiny deck on one rank with THREADS threads, a
# checkpoint at the end in NAME/, the metrics in NAME.jsonl and the output in NAME.txt.
train_on() {
  local threads=$1 name=$2
  shift 2
  (
    export OMP_NUM_THREADS=$threads OMP_PROC_BIND=false
    run 1 train tiny.toml "${extra[@]}" "$@" --set train.steps=6 --set train.log_every=1 --set checkpoint.every=6 \
      --set checkpoint.dir="$name" "${QUICK[@]}" --metrics "$name.jsonl" >"$name.txt" 2>&1
  ) || { cat "$name.txt"; fail "training on $threads threads failed"; }
  losses "$name.jsonl" >"$name.losses"
}
train_on 1 out1
train_on 2 out2
grep '^gemm:' out1.txt out2.txt
grep -q '^gemm: .*in panels on 2 OpenMP threads' out2.txt || fail "the 2-thread run's banner does not show 2 threads"
grep -q '^gemm: .*in panels on 1 OpenMP thread' out1.txt || fail "the 1-thread run's banner does not show 1 thread"
[ "$(wc -l <out1.losses)" -eq 6 ] || fail "expected 6 losses"
diff out1.losses out2.losses || fail "the losses on 1 and 2 threads differ"
a=out1/step_00000006/checkpoint.h5 b=out2/step_00000006/checkpoint.h5
h5diff -r "$a" "$b" /model /model || fail "the parameters after 1- and 2-thread training differ"
h5diff -r "$a" "$b" /optimizer /optimizer || fail "the optimizer state after 1- and 2-thread training differs"
# Negative control: another seed on 2 threads must change the parameters.
train_on 2 seed99 --set train.seed=99
if h5diff -q "$a" seed99/step_00000006/checkpoint.h5 /model /model >/dev/null 2>&1; then
  fail "another seed gave the same parameters: the comparison cannot see anything"
fi
echo "ok: 1 and 2 threads give bitwise identical losses, parameters and optimizer state"
