#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Golden loss traces: $1 (tiny: inputs/tiny.toml; odd: tests/golden/odd.toml)
# trained on one rank must give the losses stored in tests/golden/$1.trace --
# bit for bit when this build has the fingerprint that wrote the trace
# (compiler, Kokkos version and backend, build type, -march=native, CPU model
# and instruction sets, OPENBLAS_CORETYPE, OMP_NUM_THREADS), and within a relative 1e-5 per step elsewhere (another
# compiler, BLAS kernel or backend orders sums differently).
#
# After a change MEANT to alter the numerics, refresh both traces with
#   NDMINI_GOLDEN_REFRESH=1 ctest --test-dir build -R golden
# and say why in the commit message.
source "$(dirname "$0")/lib.sh"
name=$1
case "$name" in
  tiny) deck="$SOURCE_DIR/inputs/tiny.toml" ;;
  odd) deck="$SOURCE_DIR/tests/golden/odd.toml" ;;
  *) fail "unknown golden deck '$name'" ;;
esac
trace="$SOURCE_DIR/tests/golden/$name.trace"

"$NDMINI" --build-info >build.json
fingerprint=$(python3 - <<'PY'
import json, os
b = json.load(open("build.json"))
import hashlib
info = open("/proc/cpuinfo").read().splitlines()
cpu = next((l.split(":", 1)[1].strip() for l in info if l.startswith("model name")), "unknown")
# The instruction sets, hashed: a generic model name can hide different CPUs.
flags = next((l.split(":", 1)[1].split() for l in info if l.startswith("flags")), [])
isa = hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:12]
keys = ("compiler", "kokkos_version", "kokkos_backend", "build_type", "native")
print(json.dumps({**{k: b.get(k) for k in keys}, "cpu": cpu, "isa": isa,
                  "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", ""),
                  "threads": os.environ.get("OMP_NUM_THREADS", "")}, sort_keys=True))
PY
)

run 1 train "$deck" --set train.log_every=1 "${QUICK[@]}" --metrics m.jsonl >out.txt 2>&1 || {
  cat out.txt
  fail "training failed"
}
step_losses m.jsonl >losses.txt

if [ "${NDMINI_GOLDEN_REFRESH:-0}" = 1 ]; then
  {
    echo "# fingerprint $fingerprint"
    echo "# ndmini golden loss trace of $(basename "$deck"), one rank: step, loss as written by --metrics"
    cat losses.txt
  } >"$trace"
  echo "refreshed $trace ($(wc -l <losses.txt) steps)"
  exit 0
fi
[ -f "$trace" ] || fail "no trace $trace (refresh with NDMINI_GOLDEN_REFRESH=1)"

python3 - "$trace" losses.txt "$fingerprint" <<'PY'
import json, sys
trace, got_file, fingerprint = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
lines = open(trace).read().splitlines()
stored_fp = json.loads(lines[0].split(" ", 2)[2])
want = [l.split() for l in lines if not l.startswith("#")]
got = [l.split() for l in open(got_file).read().splitlines()]
if [w[0] for w in want] != [g[0] for g in got]:
    sys.exit(f"FAIL: steps {[g[0] for g in got]} differ from the trace's {[w[0] for w in want]}")
if stored_fp == fingerprint:
    diff = [(w[0], w[1], g[1]) for w, g in zip(want, got) if w[1] != g[1]]
    if diff:
        sys.exit("FAIL: this build wrote the trace, yet losses differ bitwise (step, trace, now): " + str(diff[:5]))
    print(f"ok: {len(got)} losses bit for bit (same build fingerprint)")
else:
    worst = max(abs(float(g[1]) - float(w[1])) / abs(float(w[1])) for w, g in zip(want, got))
    print(f"another build than the trace's ({stored_fp} vs {fingerprint}): relative tolerance 1e-5")
    if worst > 1e-5:
        sys.exit(f"FAIL: largest relative loss difference {worst:.2e} > 1e-5")
    print(f"ok: {len(got)} losses within {worst:.1e} relative")
PY
