#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Files that are not what ndmini reads (the case name is $1): a device, a FIFO,
# a folder, a file far too large, a token file whose header lies, a checkpoint
# folder holding another step. Each must be refused by name, at once and in
# bounded memory: exit 1, one message, within 20 s (a FIFO read would block
# forever, /dev/zero never ends), and a peak RSS (all processes, as GNU time
# sees them) at most 64 MiB above that of a run refused for a missing deck.
source "$(dirname "$0")/lib.sh"

[ -x /usr/bin/time ] || {
  echo "SKIP: needs GNU time at /usr/bin/time (apt-get install time)"
  exit 77
}
LIMIT_S=20

# bounded ARGS...: ndmini on one rank under `timeout` and GNU time; sets rc,
# kb (peak RSS) and secs, and leaves the output in out.txt.
bounded() {
  rc=0
  /usr/bin/time -f '%M %e' -o time.txt timeout "$LIMIT_S" "$MPIEXEC" "$MPIEXEC_NUMPROC_FLAG" 1 "$NDMINI" "$@" \
    >out.txt 2>&1 || rc=$?
  read -r kb secs < <(tail -n 1 time.txt)  # after "Command exited with non-zero status N"
}

bounded train absent.toml
grep -qF "deck 'absent.toml' does not exist" out.txt || fail "the baseline run says: $(cat out.txt)"
max_kb=$((kb + 65536))
echo "baseline: a missing deck is refused in ${secs} s at a peak RSS of ${kb} kB"

# refused WANT ARGS...: ndmini must stop with status 1 and one message
# containing WANT, within LIMIT_S seconds, at a peak RSS of at most max_kb.
refused() {
  local want=$1
  shift
  bounded "$@"
  cat out.txt
  [ "$rc" -ne 124 ] || fail "ndmini did not stop within $LIMIT_S s: ndmini $*"
  [ "$rc" -eq 1 ] || fail "expected the error status 1, got $rc: ndmini $*"
  grep -qF -- "$want" out.txt || fail "expected the message to contain: $want"
  [ "$(grep -Ec '^ndmini: (error|verify):' out.txt)" -eq 1 ] || fail "expected exactly one message"
  [ "$kb" -le "$max_kb" ] || fail "peak RSS $kb kB, above the bound of $max_kb kB: ndmini $*"
  echo "ok: exit 1 in $secs s at a peak RSS of $kb kB (bound $max_kb kB): $want"
}

# A checkpoint folder: ckpt/step_00000002, ckpt/step_00000004, 'latest' naming 4.
make_checkpoints() {
  run 1 train tiny.toml --set train.steps=4 --set checkpoint.every=2 "${QUICK[@]}" >/dev/null
  [ "$(cat ckpt/latest)" = 4 ] || fail "no checkpoint to damage"
}
resume=(train tiny.toml --set train.steps=6 "${QUICK[@]}" --resume)

# le32 N: N as 4 little-endian bytes, in printf's notation.
le32() { printf '\\x%02x\\x%02x\\x%02x\\x%02x' $(($1 & 255)) $(($1 >> 8 & 255)) $(($1 >> 16 & 255)) $(($1 >> 24 & 255)); }
# token_file FILE COUNT TOKENS: an llm.c header (magic, version 1) saying
# COUNT tokens, followed by TOKENS zero tokens.
token_file() {
  {
    printf "$(le32 20240520)$(le32 1)$(le32 "$2")"
    head -c $((1024 - 12)) /dev/zero
    head -c $((2 * $3)) /dev/zero
  } >"$1"
}

text=(--set data.source=text)
tokens=(--set data.source=tokens)
case "$1" in
  deck_dev_zero)
    refused "deck '/dev/zero' is a character device, not a regular file; name a .toml file" train /dev/zero ;;
  deck_dev_urandom)
    refused "deck '/dev/urandom' is a character device, not a regular file" train /dev/urandom ;;
  deck_fifo)
    mkfifo deck.toml
    refused "deck 'deck.toml' is a FIFO (named pipe), not a regular file" train deck.toml
    refused "deck 'deck.toml' is a FIFO (named pipe), not a regular file" check deck.toml ;;
  deck_folder)
    mkdir decks
    refused "deck 'decks' is a folder, not a regular file; name a .toml file" train decks ;;
  deck_huge)
    truncate -s 100M huge.toml
    refused "deck 'huge.toml' has 104857600 bytes; ndmini reads at most 1048576 bytes from it" train huge.toml ;;
  data_dev_zero)
    refused 'data.path = "/dev/zero" is a character device, not a regular file; point data.path at a text file' \
      train tiny.toml "${text[@]}" --set data.path=/dev/zero ;;
  data_dev_urandom)
    refused 'data.path = "/dev/urandom" is a character device, not a regular file; point data.path at an llm.c' \
      train tiny.toml "${tokens[@]}" --set data.path=/dev/urandom
    head -c 20000 /dev/urandom | base64 >book.txt
    refused 'data.val_path = "/dev/urandom" is a character device, not a regular file' train tiny.toml "${text[@]}" \
      --set data.path=book.txt --set data.val_path=/dev/urandom --set train.eval_every=2 ;;
  data_fifo)
    mkfifo corpus.txt
    refused 'data.path = "corpus.txt" is a FIFO (named pipe), not a regular file' \
      train tiny.toml "${text[@]}" --set data.path=corpus.txt ;;
  token_header_lies)
    # More tokens promised than the file holds, then fewer: both refused from
    # the header and the size alone, before a token is read.
    token_file more.bin 1000000000 200
    refused 'data.path = "more.bin": its header says 1000000000 tokens, 2000001024 bytes with the header, but the file has 1424 bytes' \
      train tiny.toml "${tokens[@]}" --set data.path=more.bin
    token_file fewer.bin 100 200
    refused 'data.path = "fewer.bin": its header says 100 tokens, 1224 bytes with the header, but the file has 1424 bytes' \
      train tiny.toml "${tokens[@]}" --set data.path=fewer.bin
    token_file right.bin 200 200
    run 1 train tiny.toml "${tokens[@]}" --set data.path=right.bin --set train.steps=1 "${QUICK[@]}" >right.out 2>&1 ||
      { cat right.out; fail "a token file whose header is right was refused"; } ;;
  manifest_fifo)
    make_checkpoints
    rm ckpt/step_00000004/manifest.txt
    mkfifo ckpt/step_00000004/manifest.txt
    want="checkpoint manifest 'ckpt/step_00000004/manifest.txt' is a FIFO (named pipe), not a regular file"
    refused "$want" "${resume[@]}"
    refused "$want" ckpt verify ckpt ;;
  manifest_dev_zero)
    make_checkpoints
    ln -sf /dev/zero ckpt/step_00000004/manifest.txt
    want="checkpoint manifest 'ckpt/step_00000004/manifest.txt' is a character device, not a regular file"
    refused "$want" "${resume[@]}"
    refused "$want" ckpt verify ckpt ;;
  manifest_huge)
    make_checkpoints
    truncate -s 100M ckpt/step_00000004/manifest.txt
    want="checkpoint manifest 'ckpt/step_00000004/manifest.txt' has 104857600 bytes; ndmini reads at most 16777216"
    refused "$want" "${resume[@]}"
    refused "$want" ckpt verify ckpt ;;
  latest_huge)
    make_checkpoints
    truncate -s 0 ckpt/latest && truncate -s 100M ckpt/latest  # no newline: a line reader would take it all
    want="the 'latest' marker 'ckpt/latest' has 104857600 bytes; ndmini reads at most 64 bytes from it"
    refused "$want; pick a checkpoint with --resume STEP (available steps: 2, 4)" "${resume[@]}"
    refused "$want" ckpt verify ckpt ;;
  latest_dev_zero)
    make_checkpoints
    ln -sf /dev/zero ckpt/latest
    want="the 'latest' marker 'ckpt/latest' is a character device, not a regular file"
    refused "$want" "${resume[@]}"
    refused "$want" ckpt info ckpt ;;
  latest_other_step)
    # 'latest' names step 4, whose folder holds step 2's files: resuming would
    # silently restart at step 2.
    make_checkpoints
    cp ckpt/step_00000002/* ckpt/step_00000004/
    want="checkpoint folder 'ckpt/step_00000004' is named for step 4, but its checkpoint.h5 holds step 2"
    refused "$want" "${resume[@]}"
    refused "$want" "${resume[@]}" 4
    refused "$want" ckpt verify ckpt
    run 1 ckpt verify ckpt/step_00000002 >good.txt || { cat good.txt; fail "step 2 itself was refused"; } ;;
  *)
    fail "unknown case $1" ;;
esac
