#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# One bad input per invocation (the case name is $1): ndmini must refuse it
# with one clear message naming the key or file, and exit non-zero.
source "$(dirname "$0")/lib.sh"

case "$1" in
  unknown_key)
    sed -i 's/^steps = 40/setps = 40/' tiny.toml
    expect_error "unknown key train.setps; did you mean train.steps?" train tiny.toml ;;
  unknown_section)
    printf '\n[trian]\nsteps = 3\n' >>tiny.toml
    expect_error "unknown section [trian]; did you mean [train]?" train tiny.toml ;;
  wrong_type)
    sed -i 's/^steps = 40/steps = "forty"/' tiny.toml
    expect_error "train.steps must be an integer, got a string" train tiny.toml ;;
  out_of_range)
    expect_error "train.lr = -1 is out of range: must be in (0, 10)" train tiny.toml --set train.lr=-1 ;;
  batch_divide)
    expect_error "train.global_batch = 8 is out of range: must be a multiple of train.micro_batch = 3" \
      train tiny.toml --set train.micro_batch=3 ;;
  heads_divide)
    expect_error "model.channels = 64 is out of range: must be divisible by model.heads = 5" \
      train tiny.toml --set model.heads=5 ;;
  missing_deck)
    expect_error "cannot read deck 'no_such_deck.toml'" train no_such_deck.toml ;;
  missing_data)
    expect_error 'data.path = "absent.txt": cannot open the file' \
      train tiny.toml --set data.source=text --set data.path=absent.txt ;;
  short_data)
    printf 'too short' >short.txt
    expect_error 'data.path = "short.txt": the file holds 9 tokens, too short for model.seq_len = 64' \
      train tiny.toml --set data.source=text --set data.path=short.txt ;;
  bad_magic)
    head -c 4096 /dev/zero >bad.bin
    expect_error 'data.path = "bad.bin": bad magic 0' train tiny.toml --set data.source=tokens --set data.path=bad.bin ;;
  missing_checkpoint)
    expect_error "no checkpoint" train tiny.toml --resume --set checkpoint.dir=empty_ckpt ;;
  layout_product)
    expect_error "parallel: dp_replicate=1 x dp_shard=1 x tp=2 x cp=1 x pp=1 = 2 ranks, but the job has 3" \
      check tiny.toml --set parallel.tp=2 --world 3 ;;
  tp_heads)
    expect_error "model.heads = 4 is not divisible by parallel.tp = 8" check tiny.toml --set parallel.tp=8 --world 8 ;;
  cp_seq_divide)
    expect_error "model.seq_len = 64 is not divisible by 2 x parallel.cp = 6" \
      check tiny.toml --set parallel.cp=3 --world 3 ;;
  pp_layers)
    expect_error "model.layers = 2 is fewer than the 4 pipeline chunks" check tiny.toml --set parallel.pp=4 --world 4 ;;
  pp_micro_batches)
    expect_error "needs at least pp micro-batches per step, but each pipeline gets 1" \
      check tiny.toml --set parallel.pp=2 --set train.micro_batch=8 --world 2 ;;
  unwritable_metrics)
    # Only rank 0 writes the metrics: its failure must stop rank 1 too, not leave it waiting.
    rc=0
    run 2 train tiny.toml --set parallel.dp_replicate=2 --metrics no_such_dir/m.jsonl >out.txt 2>&1 || rc=$?
    cat out.txt
    [ "$rc" -ne 0 ] || fail "an unwritable metrics file must be refused"
    grep -qF -- "--metrics no_such_dir/m.jsonl: cannot open the file for writing" out.txt || fail "missing the message"
    ;;
  world_mismatch)
    # Launched on 2 ranks with a layout for 4: every rank must stop, none hang.
    rc=0
    run 2 train tiny.toml --set parallel.tp=4 >out.txt 2>&1 || rc=$?
    cat out.txt
    [ "$rc" -ne 0 ] || fail "a layout for 4 ranks must be refused on 2"
    grep -qF "= 4 ranks, but the job has 2" out.txt || fail "missing the layout message"
    ;;
  *)
    fail "unknown case $1" ;;
esac
