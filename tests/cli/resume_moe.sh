#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A Mixture-of-Experts run saves and resumes: moe-tiny (4 experts of 128,
# top-2, in both blocks) trains on dp_shard=2 with ep=2 and saves step 4.
# Its checkpoint holds the router and the experts as global tensors with the
# expert index first (docs/checkpoint-format.md). Resumed in the same layout
# it continues bit for bit; on tp=2 with SP and ep=2, and on one rank, within
# the equivalence suite's fp32 bound (relative 1e-5). The balanced router's
# load is exact: every expert gets tokens x k / E, printed on each progress line.
source "$(dirname "$0")/lib.sh"
cp "$SOURCE_DIR/inputs/moe-tiny.toml" moe.toml
common=(--set train.steps=8 --set train.log_every=1 --set checkpoint.every=4 "${QUICK[@]}")

run 2 train moe.toml "${common[@]}" --set parallel.dp_shard=2 --set parallel.ep=2 --set checkpoint.dir=ep \
  --metrics ep.jsonl >ep.txt 2>&1 || { cat ep.txt; fail "the ep = 2 run of the MoE deck failed"; }
ckpt=ep/step_00000004/checkpoint.h5
[ -f "$ckpt" ] || fail "the ep = 2 run saved no step 4"
h5ls -r "$ckpt/model" >tensors.txt || { cat tensors.txt; fail "h5ls cannot read $ckpt"; }
for want in "h/0/mlp/router/weight Dataset {4, 64}" "h/1/mlp/experts/c_fc/weight Dataset {4, 128, 64}" \
  "h/1/mlp/experts/c_fc/bias Dataset {4, 128}" "h/0/mlp/experts/c_proj/weight Dataset {4, 64, 128}"; do
  grep -q "^/${want% Dataset*} *Dataset ${want#* Dataset }" tensors.txt || { cat tensors.txt; fail "the checkpoint has no /model/$want"; }
done
if grep -q "^/h/0/mlp/c_fc/weight " tensors.txt; then fail "the checkpoint holds the dense MLP an MoE block replaces"; fi
grep -q "moe tokens/expert min" ep.txt || { cat ep.txt; fail "the progress line has no expert load"; }
grep -Eq " a2a [0-9.]+ MiB exposed [0-9.]+ ms" ep.txt || { cat ep.txt; fail "the progress line has no all-to-all"; }
grep -Eq "^  moe +imbalance [0-9.]+ \([0-9.]+-[0-9.]+ over 8 steps\), tokens per expert [0-9]+ to [0-9]+ in a step, all-to-all [0-9.]+ MiB per step" ep.txt ||
  { cat ep.txt; fail "the PERFORMANCE block has no moe line"; }
grep '"summary":true' ep.jsonl | grep -q '"moe":{"imbalance_max"' || fail "the metrics summary has no expert load"
grep -q '"moe":{"imbalance"' ep.jsonl || fail "the metrics records have no expert load"

resume_copy ep 4 same 2 moe.toml "${common[@]}" --set parallel.dp_shard=2 --set parallel.ep=2
resume_copy ep 4 tp 2 moe.toml "${common[@]}" --set parallel.tp=2 --set parallel.sequence_parallel=true \
  --set parallel.ep=2
resume_copy ep 4 one 1 moe.toml "${common[@]}"

continues_within_1e5 ep "ep = 2" tp one
step_losses same.jsonl >same.losses
diff want.txt same.losses || fail "the resumed ep = 2 run is not bitwise the uninterrupted one"

# The balanced router: 8 sequences of 64 tokens, 2 experts each, over 4 experts: 256 tokens per expert.
run 2 train moe.toml --set train.steps=1 "${QUICK[@]}" --set parallel.dp_shard=2 --set parallel.ep=2 \
  --set model.moe_router=balanced >balanced.txt 2>&1 || { cat balanced.txt; fail "the balanced router's run failed"; }
grep -q "moe tokens/expert min 256 mean 256.0 max 256 imbalance 1.00" balanced.txt ||
  { cat balanced.txt; fail "the balanced router's load is not 256 tokens per expert"; }
echo "ok: an MoE checkpoint of ep = 2 resumes bitwise, on tp x ep and on one rank; the load is reported"
