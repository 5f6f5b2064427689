#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# A Llama checkpoint reshards like GPT-2's: the Llama deck (grouped-query
# c_q/c_k/c_v, SwiGLU's c_gate/c_up, no wpe, an untied lm_head on the last
# stage) trains on tp=2 x pp=2 (4 ranks) and saves step 4; it resumes on
# dp_shard=2 (2 ranks) and on 1 rank. Both continue the uninterrupted run:
# their losses of steps 4..7 agree with its own within the equivalence
# suite's fp32 bound (relative 1e-5), which a fresh model (its step-0 loss)
# misses by far.
source "$(dirname "$0")/lib.sh"
cp "$SOURCE_DIR/inputs/llama-tiny.toml" llama.toml
common=(--set train.steps=8 --set train.log_every=1 --set checkpoint.every=4 "${QUICK[@]}")

run 4 train llama.toml "${common[@]}" --set parallel.tp=2 --set parallel.pp=2 --set checkpoint.dir=tp_pp \
  --metrics tp_pp.jsonl >tp_pp.txt 2>&1 || { cat tp_pp.txt; fail "the tp x pp run of the Llama deck failed"; }
ckpt=tp_pp/step_00000004/checkpoint.h5
[ -f "$ckpt" ] || fail "the tp x pp run saved no step 4"
# The global tensors of docs/checkpoint-format.md, and none of GPT-2's own.
h5ls -r "$ckpt/model" >tensors.txt || { cat tensors.txt; fail "h5ls cannot read $ckpt"; }
for name in wte h/1/attn/c_q/weight h/1/attn/c_k/weight h/1/attn/c_v/weight h/1/mlp/c_gate/weight \
  h/1/mlp/c_up/weight h/1/mlp/c_proj/weight h/0/ln_2/weight ln_f/weight lm_head/weight; do
  grep -q "^/$name " tensors.txt || { cat tensors.txt; fail "the checkpoint has no /model/$name"; }
done
for name in wpe h/0/attn/c_attn/weight h/0/ln_1/bias h/0/attn/c_q/bias ln_f/bias; do
  if grep -q "^/$name " tensors.txt; then fail "the checkpoint holds /model/$name, which a Llama has not"; fi
done

# The tp x pp run's step 4, resumed in folders of their own.
resume_copy tp_pp 4 dp_shard 2 llama.toml "${common[@]}" --set parallel.dp_shard=2
resume_copy tp_pp 4 one 1 llama.toml "${common[@]}"

continues_within_1e5 tp_pp "tp x pp" dp_shard one
echo "ok: a Llama checkpoint of tp x pp resumes on dp_shard and on one rank"
