#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# bench/gpu/check.sh's paths that need no GPU: usage errors, the no-GPU exit
# (77, with a summary saying so), the dry run's plan, and the loss comparison
# (within 1e-5 relative passes, beyond fails). Case: $1.
source "$(dirname "$0")/lib.sh"
check=$SOURCE_DIR/bench/gpu/check.sh

# metrics FILE LOSS...: a metrics file with one step record per loss, and a summary line.
metrics() {
  local file=$1 step=0
  shift
  : >"$file"
  for l in "$@"; do
    echo "{\"comm\":{},\"grad_norm\":1.0,\"loss\":$l,\"lr\":0.001,\"step\":$step,\"step_ms\":2.5}" >>"$file"
    step=$((step + 1))
  done
  echo '{"final_loss":1.0,"steps":3,"summary":true}' >>"$file"
}

case "$1" in
  usage)
    rc=0
    "$check" >out.txt 2>&1 || rc=$?
    [ "$rc" -eq 2 ] || fail "no OUTDIR: expected exit 2, got $rc"
    grep -q "OUTDIR is missing" out.txt || fail "no OUTDIR: message missing"
    rc=0
    "$check" o --steps x >out.txt 2>&1 || rc=$?
    [ "$rc" -eq 2 ] && grep -q -- "--steps must be" out.txt || fail "bad --steps: expected exit 2 and a message"
    rc=0
    "$check" o --kokkos-src /nowhere >out.txt 2>&1 || rc=$?
    [ "$rc" -eq 2 ] && grep -q -- "go together" out.txt || fail "--kokkos-src alone: expected exit 2"
    echo "ok: usage errors exit 2 with a message"
    ;;
  no_gpu)
    rc=0
    NDMINI_CHECK_NO_GPU=1 "$check" out >out.txt 2>&1 || rc=$?
    cat out.txt
    [ "$rc" -eq 77 ] || fail "without a GPU: expected exit 77, got $rc"
    grep -q "no NVIDIA GPU" out/summary.md || fail "summary.md does not say there is no GPU"
    grep -qx "status=skipped_no_gpu" out/figures.env || fail "figures.env lacks status=skipped_no_gpu"
    echo "ok: exit 77, summary and figures say why"
    ;;
  dry_run)
    NDMINI_CHECK_NO_GPU=1 "$check" out --dry-run --build-dir "$WORK/no-build" --kokkos-prefix /opt/kc \
      --cpu-build "$WORK/no-cpu" >out.txt 2>&1 || fail "the dry run failed: $(cat out.txt)"
    cat out.txt
    for want in "cmake -S $SOURCE_DIR -B $WORK/no-build --preset cuda -DKokkos_ROOT=/opt/kc/kokkos" \
      "ctest --test-dir $WORK/no-build -L gpu" "-L unit -LE large" "$WORK/no-build/miniapp/ndmini train" \
      "$WORK/no-cpu/miniapp/ndmini train" "--compare-losses" "model.seq_len=1024" "train.precision=fp32" \
      "train.precision=bf16" "gpt2_t1024_bf16"; do
      grep -qF -- "$want" out.txt || fail "the plan lacks: $want"
    done
    grep -q "dry run done (nothing ran)" out.txt || fail "no closing line"
    [ ! -e "$WORK/no-build/CMakeCache.txt" ] || fail "the dry run configured something"
    echo "ok: the plan names every stage"
    ;;
  compare)
    metrics gpu.jsonl 5.5451774597167969 4.2000000001 3.1
    metrics cpu.jsonl 5.5451774597167969 4.2000000000 3.1000149
    "$check" --compare-losses gpu.jsonl cpu.jsonl >out.txt 2>&1 || fail "within 1e-5 must pass: $(cat out.txt)"
    grep -q "steps compared 3" out.txt || fail "expected 3 steps compared: $(cat out.txt)"
    metrics far.jsonl 5.5451774597167969 4.2001 3.1
    rc=0
    "$check" --compare-losses far.jsonl cpu.jsonl >out.txt 2>&1 || rc=$?
    cat out.txt
    [ "$rc" -eq 1 ] || fail "a 2.4e-5 difference must fail"
    grep -q "step 1:" out.txt || fail "the failing step is not named"
    metrics short.jsonl 5.5451774597167969 4.2
    rc=0
    "$check" --compare-losses short.jsonl cpu.jsonl >out.txt 2>&1 || rc=$?
    [ "$rc" -eq 1 ] || fail "a run with fewer steps must fail"
    echo "ok: the comparison passes within 1e-5 and fails beyond, or on missing steps"
    ;;
  *) fail "unknown case $1" ;;
esac
