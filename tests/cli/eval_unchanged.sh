#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The validation loss (train.eval_every) changes nothing in training: under a
# pipeline, FSDP without resharding, context parallelism, and a text file with
# a held-out fraction, the loss and gradient norm of every step are bitwise
# those of the same run without it. It is reported where docs/output.md says.
source "$(dirname "$0")/lib.sh"

# trace FILE: "step loss grad_norm" of every step record, exactly as written.
trace() {
  grep '"step"' "$1" | sed -E 's/.*"grad_norm":([^,}]*).*"loss":([^,}]*).*"step":([0-9]+).*/\3 \2 \1/'
}

head -c 30000 /dev/urandom | base64 >book.txt
text=(--set data.source=text --set data.path=book.txt --set data.val_fraction=0.2)
layouts=("--set parallel.pp=2"
         "--set parallel.dp_shard=2 --set parallel.reshard_after_forward=false"
         "--set parallel.cp=2"
         "--set parallel.dp_replicate=2 ${text[*]}")
common=(--set train.steps=10 --set train.log_every=1 "${QUICK[@]}")
for layout in "${layouts[@]}"; do
  echo "== $layout"
  # shellcheck disable=SC2086
  run 2 train tiny.toml "${common[@]}" $layout --metrics off.jsonl >off.txt
  # shellcheck disable=SC2086
  run 2 train tiny.toml "${common[@]}" $layout --set train.eval_every=4 --set train.eval_batches=2 \
    --metrics on.jsonl >on.txt
  trace off.jsonl >off.trace
  trace on.jsonl >on.trace
  [ "$(wc -l <on.trace)" -eq 10 ] || fail "expected 10 step records"
  diff off.trace on.trace || fail "$layout: the validation loss changed training"
  # Evaluated at steps 0, 4, 8 and the last (9); nowhere else.
  [ "$(grep '"step"' on.jsonl | grep '"val_loss"' | sed -E 's/.*"step":([0-9]+),.*/\1/' | tr '\n' ' ')" = "0 4 8 9 " ] ||
    fail "$layout: val_loss not on steps 0 4 8 9: $(grep -c val_loss on.jsonl) records"
  if grep '"step"' off.jsonl | grep -q val_loss; then fail "val_loss without train.eval_every"; fi
  grep -q '"final_val_loss":[0-9]' on.jsonl || fail "no final_val_loss in the summary"
  grep -q '"final_val_step":9' on.jsonl || fail "final_val_step is not 9"
  grep -q '"final_val_loss":null' off.jsonl || fail "final_val_loss without evaluation is not null"
  [ "$(grep -c '^step .* | val_loss [0-9.]*$' on.txt)" -eq 4 ] || fail "the progress lines do not show val_loss 4 times"
  grep -q "^  validation         loss [0-9.]* at step 9" on.txt || fail "PERFORMANCE has no validation line"
  grep -q "^validation: every 4 steps" on.txt || fail "the banner does not describe the validation loss"
done
echo "ok: training is bitwise the same with the validation loss on"
