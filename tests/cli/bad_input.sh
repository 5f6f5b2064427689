#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# One bad input per invocation (the case name is $1): ndmini must refuse it
# with one clear message naming the key or file, and exit non-zero.
source "$(dirname "$0")/lib.sh"

case "$1" in
  unknown_key)
    sed -i 's/^steps = 40/setps = 40/' tiny.toml
    expect_error "unknown key train.setps; did you mean train.steps?" train tiny.toml ;;
  set_typo)
    # A typo given with --set is reported against --set, not against the deck file.
    expect_error "ndmini: error: --set train.setps=40: unknown key train.setps; did you mean train.steps?" \
      train tiny.toml --set train.setps=40
    expect_error "ndmini: error: --set trian.steps=4: unknown section [trian]; did you mean [train]?" \
      config tiny.toml --set trian.steps=4 ;;
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
    expect_error "deck 'no_such_deck.toml' does not exist; name a .toml file" train no_such_deck.toml ;;
  missing_data)
    expect_error 'data.path = "absent.txt" does not exist; point data.path at a text file' \
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
      check tiny.toml --set parallel.tp=2 --set parallel.dp_shard=1 --world 3
    # Every degree set, and the others divide the world: the refusal names the -1 that fills it.
    expect_error "or set parallel.dp_shard = -1 (--set parallel.dp_shard=-1) to fill the job with FSDP (dp_shard = 2)" \
      check tiny.toml --set parallel.tp=2 --set parallel.dp_shard=1 --world 4
    # dp_shard's default -1 cannot fill 3 ranks with tp = 2.
    expect_error "parallel.dp_shard = -1 (the default) cannot be resolved: the other degrees (dp_replicate=1 x tp=2 x cp=1 x pp=1) multiply to 2" \
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
  reduce_dtype_value)
    expect_error 'comm.reduce_dtype = "fp16" is out of range: must be "fp32" or "bf16"' \
      train tiny.toml --set train.precision=bf16 --set comm.reduce_dtype=fp16 ;;
  reduce_dtype_needs_bf16)
    expect_error 'comm.reduce_dtype = "bf16" needs train.precision = "bf16"' \
      train tiny.toml --set comm.reduce_dtype=bf16 ;;
  # Mixture-of-Experts (inputs/moe-tiny.toml: 4 experts, top-2): one message each.
  moe_top_k)
    cp "$SOURCE_DIR/inputs/moe-tiny.toml" moe.toml
    expect_error "model.moe_top_k = 0 is out of range: must be between 1 and model.moe_experts = 4" \
      check moe.toml --set model.moe_top_k=0
    expect_error "model.moe_top_k = 5 is out of range: must be between 1 and model.moe_experts = 4" \
      check moe.toml --set model.moe_top_k=5 ;;
  moe_experts_ep)
    cp "$SOURCE_DIR/inputs/moe-tiny.toml" moe.toml
    expect_error "model.moe_experts = 4 is out of range: must be a multiple of parallel.ep = 3" \
      check moe.toml --set parallel.ep=3 --world 3 ;;
  moe_ep_divide)
    cp "$SOURCE_DIR/inputs/moe-tiny.toml" moe.toml
    expect_error "parallel.ep = 4 does not divide dp_shard x cp x tp = 2 x 1 x 1 = 2" \
      check moe.toml --set parallel.ep=4 --set parallel.dp_replicate=2 --set train.micro_batch=2 --world 4 ;;
  moe_tp_needs_sp)
    cp "$SOURCE_DIR/inputs/moe-tiny.toml" moe.toml
    expect_error "parallel.tp = 2 with an MoE block needs parallel.sequence_parallel = true" \
      check moe.toml --set parallel.tp=2 --world 2 ;;
  moe_every_zero)
    cp "$SOURCE_DIR/inputs/moe-tiny.toml" moe.toml
    expect_error "model.moe_every = 0 is out of range: must be at least 1" check moe.toml --set model.moe_every=0 ;;
  moe_negative_rate)
    cp "$SOURCE_DIR/inputs/moe-tiny.toml" moe.toml
    expect_error "train.moe_z_loss = -0.1 is out of range: must be >= 0" check moe.toml --set train.moe_z_loss=-0.1
    expect_error "train.moe_seq_aux = -0.1 is out of range: must be >= 0" check moe.toml --set train.moe_seq_aux=-0.1
    expect_error "train.moe_bias_rate = -0.1 is out of range: must be >= 0" \
      check moe.toml --set model.moe_score=sigmoid --set train.moe_bias_rate=-0.1 ;;
  moe_check_reports)
    # check reports the MoE blocks and the expert groups of a deck train takes.
    cp "$SOURCE_DIR/inputs/moe-tiny.toml" moe.toml
    run 1 check moe.toml --set parallel.ep=2 --set train.micro_batch=2 --world 4 >out.txt 2>&1 ||
      { cat out.txt; fail "check refused moe-tiny on 4 ranks with ep = 2"; }
    grep -qF "parameters        187520 total, 121216 active per token" out.txt || fail "check: no parameter counts"
    grep -qF "expert groups (ep = 2 consecutive ranks of dp_shard x cp x tp): [0 1] [2 3]" out.txt ||
      fail "check: no expert groups"
    grep -qF "deck OK" out.txt || fail "check: no 'deck OK' for a deck train takes" ;;
  world_mismatch)
    # Launched on 2 ranks with a layout for 4: every rank must stop, none hang.
    rc=0
    run 2 train tiny.toml --set parallel.tp=4 >out.txt 2>&1 || rc=$?
    cat out.txt
    [ "$rc" -ne 0 ] || fail "a layout for 4 ranks must be refused on 2"
    grep -qF "parallel.dp_shard = -1 (the default) cannot be resolved: the other degrees (dp_replicate=1 x tp=4 x cp=1 x pp=1) multiply to 4, which does not divide the 2 ranks" out.txt ||
      fail "missing the layout message"
    ;;
  metrics_full_disk)
    # A metrics file that cannot be written (a full disk): every rank stops, not only rank 0.
    rc=0
    run_ranks 2 train tiny.toml --set parallel.dp_replicate=2 "${QUICK[@]}" --metrics /dev/full >out.txt 2>&1 || rc=$?
    cat out.txt
    [ "$rc" -ne 0 ] || fail "metrics that cannot be written must fail the run"
    grep -qF -- "--metrics /dev/full: writing the metrics failed (No space left on device)" out.txt || fail "missing the message"
    every_rank_failed 2 out.txt
    ;;
  latest_deleted)
    run 1 train tiny.toml --set train.steps=4 --set checkpoint.every=2 "${QUICK[@]}" >/dev/null
    rm ckpt/latest
    expect_error "no 'latest' marker in 'ckpt', but it holds checkpoints of steps 2, 4 (the marker was deleted or never written); resume one explicitly, e.g. --resume 4" \
      train tiny.toml --set train.steps=6 "${QUICK[@]}" --resume ;;
  latest_binary)
    run 1 train tiny.toml --set train.steps=2 --set checkpoint.every=1 "${QUICK[@]}" >/dev/null
    printf '\x00\xff\x1b[2J' >ckpt/latest
    expect_error "does not hold a step number (it holds '\\x00\\xff\\x1b[2J')" train tiny.toml "${QUICK[@]}" --resume
    if grep -q $'\x1b' out.txt; then fail "the marker's raw bytes reached the terminal"; fi ;;
  data_path_folder)
    mkdir corpus
    expect_error 'data.path = "corpus" is a folder, not a regular file' train tiny.toml --set data.source=text --set data.path=corpus ;;
  free_space_rounding)
    # 1.95 MiB free: the message must not round it up to 2.0 (nor claim more than there is).
    NDMINI_CKPT_FREE_BYTES=2044723 expect_error "MiB, 1.9 MiB are free" train tiny.toml --set checkpoint.every=1 "${QUICK[@]}"
    grep -q "^step " out.txt && fail "trained before checking checkpoint.dir" || true ;;
  unusable_checkpoint_dir)
    # Found at start-up, before any training time is spent.
    touch a_file
    expect_error "checkpoint.dir = 'a_file' is not a folder" train tiny.toml --set checkpoint.every=1 \
      --set checkpoint.dir=a_file "${QUICK[@]}"
    grep -q "^step " out.txt && fail "trained before checking checkpoint.dir" || true
    expect_error "checkpoint.dir = 'a_file/sub': the folder cannot be created" train tiny.toml --set checkpoint.every=1 \
      --set checkpoint.dir=a_file/sub "${QUICK[@]}" ;;
  data_changed_on_resume)
    head -c 20000 /dev/urandom | base64 >a.txt
    head -c 20000 /dev/urandom | base64 >b.txt
    cp a.txt moved.txt
    text=(--set data.source=text --set train.steps=4 --set checkpoint.every=2 "${QUICK[@]}")
    run 1 train tiny.toml "${text[@]}" --set data.path=a.txt --set train.steps=2 >/dev/null
    expect_error "cannot resume from ckpt/step_00000002: it was trained on text 'a.txt' (" train tiny.toml "${text[@]}" \
      --set data.path=b.txt --resume
    grep -qF "the deck reads text 'b.txt' (" out.txt || fail "the message does not name the new source"
    grep -qF "set data.allow_source_change = true" out.txt || fail "the message does not name the switch"
    run 1 train tiny.toml "${text[@]}" --set data.path=moved.txt --resume >moved.out || fail "a moved, identical file was refused"
    grep -qF "was trained on 'a.txt'; the deck reads 'moved.txt', with the same size and digest" moved.out ||
      fail "no note on the moved file"
    rm -rf ckpt/step_00000004
    echo 2 >ckpt/latest
    run 1 train tiny.toml "${text[@]}" --set data.path=b.txt --set data.allow_source_change=true --resume >changed.out ||
      fail "data.allow_source_change = true did not allow the change"
    grep -qF "(data.allow_source_change = true)" changed.out || fail "no note on the changed source" ;;
  weight_decay_range)
    expect_error "train.weight_decay = 1e+30 is out of range: must be in [0, 1]" train tiny.toml --set train.weight_decay=1e30 ;;
  resume_at_final_step)
    run 1 train tiny.toml --set train.steps=4 --set checkpoint.every=2 "${QUICK[@]}" >/dev/null
    rc=0
    run 1 train tiny.toml --set train.steps=4 --set checkpoint.every=2 "${QUICK[@]}" --resume --metrics m.jsonl >out.txt 2>&1 || rc=$?
    cat out.txt m.jsonl
    [ "$rc" -eq 0 ] || fail "a resume of a finished run must exit 0"
    grep -qF "checkpoint: step 4 is train.steps = 4; nothing left to train (raise train.steps to go on)" out.txt ||
      fail "missing the message"
    grep -q '"summary":true' m.jsonl || fail "no summary"
    grep -q '"final_loss":null' m.jsonl || fail "the summary invents a final loss"
    grep -q '"steps":0' m.jsonl || fail "the summary does not say that no step ran" ;;
  huge_layers | huge_channels | huge_seq_len)
    # check refuses, naming the key, without allocating the model: under a
    # 1.5 GB address-space limit an attempt would fail with bad_alloc instead.
    case "$1" in
      huge_layers) key=model.layers value=1000000000 ;;
      huge_channels) key=model.channels value=1048576 ;;
      huge_seq_len) key=model.seq_len value=1000000000 ;;
    esac
    (ulimit -v 1500000 && expect_error "$key = $value" check tiny.toml --set "$key=$value")
    grep -q "more than the .* one rank may use" out.txt || fail "the message does not compare with the memory available"
    expect_error "$key = $value" train tiny.toml --set "$key=$value" "${QUICK[@]}"
    grep -q "^step " out.txt && fail "trained although the deck cannot fit" || true ;;
  memory_limit)
    # A deck limit below the estimate refuses a deck that would fit the node.
    expect_error "(perf.memory_per_rank_gib = 0.001)" check tiny.toml --set perf.memory_per_rank_gib=0.001 ;;
  eval_without_held_out)
    expect_error 'train.eval_every = 5 needs held-out data for data.source = "text": set data.val_path' \
      train tiny.toml --set data.source=text --set data.path=book.txt --set train.eval_every=5 ;;
  eval_keys)
    expect_error "train.eval_batches = 0 is out of range: must be at least 1" train tiny.toml --set train.eval_batches=0
    expect_error "train.eval_every = -2 is out of range: must be >= 0" train tiny.toml --set train.eval_every=-2
    expect_error "data.val_fraction = 1.5 is out of range: must be in [0, 1)" \
      train tiny.toml --set data.source=text --set data.path=book.txt --set data.val_fraction=1.5
    expect_error "data.val_path applies to data.source = \"text\" or \"tokens\"" train tiny.toml --set data.val_path=v.txt
    expect_error "data.val_path and data.val_fraction both name held-out data" train tiny.toml --set data.source=text \
      --set data.path=book.txt --set data.val_path=v.txt --set data.val_fraction=0.1 ;;
  val_path_missing)
    head -c 20000 /dev/urandom | base64 >book.txt
    expect_error 'data.val_path = "absent.txt" does not exist' train tiny.toml --set data.source=text \
      --set data.path=book.txt --set data.val_path=absent.txt --set train.eval_every=2 ;;
  val_fraction_short)
    head -c 2000 /dev/urandom | base64 -w 0 | head -c 2000 >book.txt
    expect_error "data.val_fraction = 0.01 of the 2000 tokens of data.path = \"book.txt\" holds out 20 tokens, too few for model.seq_len = 64" \
      train tiny.toml --set data.source=text --set data.path=book.txt --set data.val_fraction=0.01 ;;
  *)
    fail "unknown case $1" ;;
esac
