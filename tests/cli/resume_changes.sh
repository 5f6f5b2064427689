#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A resume says what changed: one line per setting that differs from the
# checkpoint's run (and none for the others); a resume from an older step
# names the newer checkpoints its saves replace and those it leaves; a
# checkpoint's `config` holds every key, defaults and resolved -1s included.
source "$(dirname "$0")/lib.sh"

base=(--set checkpoint.every=2 --set train.log_every=1 "${QUICK[@]}")
run 1 train tiny.toml "${base[@]}" --set train.steps=8 >first.txt || { cat first.txt; fail "the first run failed"; }

# The full configuration: keys tiny.toml does not set, and dp_shard's -1 resolved to this run's 1.
run 1 ckpt info ckpt >info.txt
for want in 'eval_batches = 1' 'reshard_after_forward = true' 'dp_shard = 1' 'reduce_dtype = "fp32"'; do
  grep -qF "$want" info.txt || { cat info.txt; fail "the checkpoint's config lacks '$want'"; }
done
grep -qF 'dp_shard = -1' info.txt && fail "the checkpoint's config holds an unresolved -1" || true

# From step 4 of 2, 4, 6, 8, with 3 keys changed: steps 6 is saved again, 8 is not (train.steps = 7).
run 1 train tiny.toml "${base[@]}" --set train.steps=7 --set train.lr=1e-2 --set train.precision=bf16 --resume 4 \
  >second.txt || { cat second.txt; fail "the resume failed"; }
cat second.txt
grep -qxF 'resume: train.steps = 7 (the checkpoint'"'"'s run had 8)' second.txt || fail "no line for train.steps"
grep -qxF 'resume: train.lr = 0.01 (the checkpoint'"'"'s run had 0.003)' second.txt || fail "no line for train.lr"
grep -qxF 'resume: train.precision = "bf16" (the checkpoint'"'"'s run had "fp32")' second.txt ||
  fail "no line for train.precision"
[ "$(grep -c '^resume: ' second.txt)" -eq 3 ] || fail "lines for settings that did not change"
grep -qF 'checkpoint: ckpt holds checkpoints newer than step 4: this run'"'"'s saves replace step_00000006; it leaves step_00000008 as they are' \
  second.txt || fail "the newer checkpoints are not named"

# Going on with more steps and nothing else changed: that one line, and no newer checkpoints.
rm -rf ckpt
run 1 train tiny.toml "${base[@]}" --set train.steps=4 >/dev/null
run 1 train tiny.toml "${base[@]}" --set train.steps=6 --resume >third.txt
cat third.txt
[ "$(grep -c '^resume: ' third.txt)" -eq 1 ] && grep -qxF 'resume: train.steps = 6 (the checkpoint'"'"'s run had 4)' third.txt ||
  fail "expected the one line for train.steps"
grep -qF 'newer than step' third.txt && fail "named newer checkpoints where there are none" || true
echo "ok: a resume names each changed setting and the newer checkpoints; the checkpoint holds every key"
