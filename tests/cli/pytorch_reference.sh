#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# An independent reference: bench/pytorch/gpt.py, a PyTorch implementation
# written apart from ndmini's kernels, loads ndmini's step-0 checkpoint of a
# deck (checkpoint.at_start) and trains the same synthetic batches; its
# first losses and gradient norms equal ndmini's one-rank fp32 ones within
# 1e-5 (relative).
# $1: the deck (from inputs/); more arguments: --set KEY=VALUE for both.
# Skips (77) where no python3 imports torch, numpy and h5py (Debian:
# python3-torch python3-h5py, which .ci/install-deps.sh installs).
source "$(dirname "$0")/lib.sh"
deck=$1
shift
STEPS=4
python=""
for candidate in python3 /usr/bin/python3; do
  if "$candidate" -c 'import torch, numpy, h5py' 2>/dev/null; then
    python=$candidate
    break
  fi
done
if [ -z "$python" ]; then
  echo "SKIP: no python3 here imports torch, numpy and h5py (Debian: apt-get install python3-torch python3-h5py)"
  exit 77
fi
cp "$SOURCE_DIR/inputs/$deck" "$deck"
sets=()
for s in "$@"; do sets+=(--set "$s"); done
# One route for the products: the reference is fp32 BLAS, whatever a timing would pick.
run 1 train "$deck" "${sets[@]}" --set train.steps=$STEPS --set train.log_every=1 --set checkpoint.at_start=true --set checkpoint.every=1000 \
  --set checkpoint.dir=ck --set perf.gemm_route=blas "${QUICK[@]}" --metrics ndmini.jsonl >ndmini.txt 2>&1 ||
  { cat ndmini.txt; fail "ndmini train $deck failed"; }
[ -f ck/step_00000000/checkpoint.h5 ] || fail "no step-0 checkpoint (checkpoint.at_start)"
# shellcheck disable=SC2068
OMP_NUM_THREADS=1 "$python" "$SOURCE_DIR/bench/pytorch/gpt.py" "$deck" ${@/#/--set=} --steps $STEPS \
  --init-from ck/step_00000000 --metrics torch.jsonl --quiet >torch.txt 2>&1 ||
  { cat torch.txt; fail "bench/pytorch/gpt.py failed"; }
"$python" - ndmini.jsonl torch.jsonl "$deck" <<'PY'
import json, sys
def steps(path):
    return {r["step"]: r for r in map(json.loads, open(path)) if "loss" in r and "summary" not in r}
ours, ref = steps(sys.argv[1]), steps(sys.argv[2])
if len(ref) < 4 or any(s not in ours for s in ref):
    sys.exit(f"FAIL: steps missing: ndmini {sorted(ours)}, pytorch {sorted(ref)}")
worst = 0.0
for s in sorted(ref):
    for key in ("loss", "grad_norm"):
        rel = abs(ours[s][key] - ref[s][key]) / abs(ref[s][key])
        worst = max(worst, rel)
        print(f"step {s} {key}: ndmini {ours[s][key]:.7f} pytorch {ref[s][key]:.7f} relative difference {rel:.2e}")
if worst > 1e-5:
    sys.exit(f"FAIL: {sys.argv[3]}: ndmini's losses and gradient norms differ from PyTorch's by up to {worst:.2e} "
             "(bound 1e-5)")
print(f"ok: {sys.argv[3]}: {len(ref)} losses and gradient norms equal PyTorch's within {worst:.2e} (bound 1e-5)")
PY
