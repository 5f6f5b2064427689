# SPDX-License-Identifier: BSD-3-Clause
# Shared helpers for the end-to-end tests. The caller sets NDMINI (the
# executable), MPIEXEC, MPIEXEC_NUMPROC_FLAG and SOURCE_DIR.
set -euo pipefail

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# A scratch folder per test, removed on exit.
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ndmini-test.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"

# run NP ARGS...: ndmini under mpiexec with NP ranks.
run() {
  local np=$1
  shift
  "$MPIEXEC" "$MPIEXEC_NUMPROC_FLAG" "$np" "$NDMINI" "$@"
}

# expect_error SUBSTRING ARGS...: ndmini must exit non-zero and print SUBSTRING.
expect_error() {
  local want=$1
  shift
  local rc=0
  run 1 "$@" >out.txt 2>&1 || rc=$?
  cat out.txt
  [ "$rc" -ne 0 ] || fail "expected a non-zero exit for: ndmini $*"
  grep -qF -- "$want" out.txt || fail "expected the message to contain: $want"
  echo "ok: exit $rc with '$want'"
}

# losses FILE: the loss of every step record of a metrics file, one per line,
# exactly as written (full precision).
losses() {
  grep '"step"' "$1" | sed -E 's/.*"loss":([^,}]*).*/\1/'
}

# The tiny deck, copied so tests can edit it.
cp "$SOURCE_DIR/inputs/tiny.toml" tiny.toml
