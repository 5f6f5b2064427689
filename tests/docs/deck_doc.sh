#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# docs/deck.md is what ndmini_deck_doc generates from the deck parser's schema,
# and a page that differs by one line is refused, naming the line and the fix.
# Environment: DECK_DOC (the generator), SOURCE_DIR.
set -euo pipefail
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$DECK_DOC" --check "$SOURCE_DIR/docs/deck.md" || fail "docs/deck.md is stale (see the message above)"

# Every key the parser takes has its row (the generator refuses a key without a meaning).
"$DECK_DOC" >"$work/deck.md"
for key in model.layers train.steps parallel.dp_shard checkpoint.every comm.timeout_s fault.phase; do
  grep -qF "| \`$key\` |" "$work/deck.md" || fail "no row for $key"
done

# A hand edit is caught.
sed 's/| `train.steps` | integer | `20` |/| `train.steps` | integer | `21` |/' "$work/deck.md" >"$work/edited.md"
cmp -s "$work/deck.md" "$work/edited.md" && fail "the edit did not change the copy"
if "$DECK_DOC" --check "$work/edited.md" 2>"$work/err.txt"; then fail "an edited page was accepted"; fi
cat "$work/err.txt"
grep -qE "^ndmini: error: .*edited.md differs .* \(first at line [0-9]+\); regenerate it: " "$work/err.txt" ||
  fail "the refusal does not name the file, the line and the fix"
echo "ok: docs/deck.md matches the schema; an edited copy is refused"
