#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# `ndmini config DECK [--set ...]` prints every key with its value and where
# it came from (default, deck, --set), the -1 degrees resolved, as a deck that
# reads back to the same values; `ndmini keys` lists the keys docs/deck.md
# lists, with their types and defaults.
source "$(dirname "$0")/lib.sh"
run 1 config tiny.toml --set train.lr=0.01 >config.txt 2>&1 || {
  cat config.txt
  fail "ndmini config failed"
}
cat config.txt
# A key's line: NAME = VALUE, then its origin.
has() { grep -Eq "^$1 = $2 +# $3\$" config.txt || fail "no line '$1 = $2  # $3'"; }
has lr 0.01 --set        # --set over the deck's 0.003
has steps 40 deck        # the deck's
has recompute "\"none\"" default  # not in tiny.toml
has dp_shard 1 'default \(-1, resolved\)'  # the default -1, filled for one rank
# Every key of the schema, once.
[ "$(grep -Ec '^[a-z_]+ = ' config.txt)" -eq "$(grep -Ec '^\| `[a-z_]+\.[a-z_]+` \|' "$SOURCE_DIR/docs/deck.md")" ] ||
  fail "config does not print every key of docs/deck.md"
# Read back as a deck: the same values, now every one from the deck.
grep -v '^#' config.txt >full.toml
run 1 config full.toml >again.txt 2>&1 || {
  cat again.txt
  fail "the printed configuration is not a deck"
}
values() { grep -v '^#' "$1" | sed -E 's/ +#.*//' | grep -v '^$'; }
diff <(values config.txt) <(values again.txt) ||
  fail "read back, the configuration has other values"
! grep -Eq '# (default|--set)' again.txt || fail "a key of the printed deck is not taken from it"

run 1 keys >keys.txt 2>&1 || {
  cat keys.txt
  fail "ndmini keys failed"
}
# The keys, types and defaults of docs/deck.md's tables, in its order.
sed -nE 's/^\| `([a-z_]+\.[a-z_]+)` \| ([a-z]+) \| `?([^`|]*)`? \|.*/\1 \2 \3/p' "$SOURCE_DIR/docs/deck.md" |
  sed -E 's/ +$//' >want.txt
sed -nE 's/^  ([a-z_]+\.[a-z_]+) +([a-z]+) +(`[^`]*`|required) .*/\1 \2 \3/p' keys.txt | tr -d '`' >got.txt
[ -s want.txt ] || fail "no keys read from docs/deck.md"
diff want.txt got.txt || fail "ndmini keys differs from docs/deck.md's keys"
grep -q '^\[train\] The optimizer steps' keys.txt || fail "ndmini keys has no section introductions"
echo "ok: config ($(wc -l <full.toml) lines) and keys ($(wc -l <got.txt) keys)"
