#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# `ndmini ckpt info` and `ndmini ckpt verify` on a checkpoint written by 2
# ranks: what info reports, verify passing, then failing (exit 1, naming the
# tensor or the metadata) on a bit flipped in the raw data and in the metadata.
source "$(dirname "$0")/lib.sh"
head -c 30000 /dev/urandom | base64 >corpus.txt
run 2 train tiny.toml --set train.steps=4 --set checkpoint.every=2 --set parallel.dp_shard=2 --set data.source=text \
  --set data.path=corpus.txt "${QUICK[@]}" >/dev/null
dir=ckpt/step_00000004

run 1 ckpt info ckpt >info.txt || { cat info.txt; fail "ckpt info failed"; }
cat info.txt | head -n 12
for want in "step             4" "consumed_tokens  2048" "seed             1234" \
  "layout           pp=1 dp_replicate=1 dp_shard=2 cp=1 tp=1" "data_source      text" "data_path        corpus.txt" \
  "data_bytes       $(stat -c %s corpus.txt)" "data_digest      " "/model/wte  [256, 64]  65536  " \
  "/optimizer/exp_avg_sq/h/1/mlp/c_proj/weight  [64, 256]" "[model]"; do
  grep -qF -- "$want" info.txt || fail "ckpt info lacks: $want"
done
[ "$(grep -c '^  /' info.txt)" -eq 84 ] || fail "ckpt info lists $(grep -c '^  /' info.txt) tensors, expected 84"
run 1 ckpt info "$dir" | cmp - info.txt || fail "info of the step folder differs from info of 'latest'"
run 1 ckpt info "$dir/checkpoint.h5" | cmp - info.txt || fail "info of the file differs"
run 2 ckpt verify ckpt >verify.txt 2>&1 || { cat verify.txt; fail "verify failed on a good checkpoint"; }
grep -qF "$dir: OK (manifest, metadata and 84 tensor digests over 1446912 bytes)" verify.txt || fail "verify says: $(cat verify.txt)"

# One bit of raw data: info (metadata only) still reads it, verify names the tensor.
cp -r ckpt flipped
offset=$(awk '$1 == "extent" && $4 == "/model/h/0/mlp/c_fc/weight" { print $2 + 4000 }' flipped/step_00000004/manifest.txt)
byte=$(od -An -tu1 -j "$offset" -N1 flipped/step_00000004/checkpoint.h5 | tr -d ' ')
printf "$(printf '\\%03o' $((byte ^ 4)))" | dd of=flipped/step_00000004/checkpoint.h5 bs=1 seek="$offset" conv=notrunc status=none
rc=0
run 1 ckpt verify flipped >bad.txt 2>&1 || rc=$?
cat bad.txt
[ "$rc" -eq 1 ] || fail "verify exited $rc on a flipped data bit"
grep -qF "tensor '/model/h/0/mlp/c_fc/weight' does not match its digest" bad.txt || fail "verify does not name the tensor"
[ "$(grep -c 'does not match' bad.txt)" -eq 1 ] || fail "verify blames more than the one tensor"
run 1 ckpt info flipped >/dev/null || fail "info refused a checkpoint whose metadata is intact"

# One bit of metadata: both refuse before HDF5 reads it.
cp -r ckpt meta
printf '\x01' | dd of=meta/step_00000004/checkpoint.h5 bs=1 seek=200 conv=notrunc status=none
rc=0
run 1 ckpt verify meta >meta.txt 2>&1 || rc=$?
cat meta.txt
[ "$rc" -eq 1 ] || fail "verify exited $rc on damaged metadata"
grep -qF "its metadata hash" meta.txt || fail "verify does not name the metadata"
rc=0
run 1 ckpt info meta >/dev/null 2>&1 || rc=$?
[ "$rc" -eq 1 ] || fail "info exited $rc on damaged metadata"
expect_error "is neither a checkpoint folder" ckpt info .
echo "ok: info and verify report a good checkpoint and catch a flipped data bit and a flipped metadata byte"
