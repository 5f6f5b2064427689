#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Throughput regression check (ctest -L perf; not in `ctest --preset release`): trains
# each deck below on one rank REPS times and compares the median tokens/s with
# a baseline stored for THIS machine and build kind. Fails when a deck is
# slower than the baseline by more than MARGIN (default 0.10: medians of a
# shared machine still move by several percent). The first run on a machine
# has nothing to compare with: it records the baseline and skips (code 77).
#
#   ctest --test-dir build -L perf                          # compare (or record)
#   NDMINI_PERF_RECORD=1 ctest --test-dir build -L perf     # record a new baseline
#
# Environment: NDMINI (the executable), MPIEXEC, MPIEXEC_NUMPROC_FLAG,
# SOURCE_DIR (set by CTest), NDMINI_PERF_BASELINE (the baseline file; default
# ~/.cache/ndmini/perf-baseline.json), REPS (3), MARGIN (0.10).
set -euo pipefail
reps=${REPS:-3}
margin=${MARGIN:-0.10}
baseline=${NDMINI_PERF_BASELINE:-$HOME/.cache/ndmini/perf-baseline.json}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
work=$(mktemp -d "${TMPDIR:-/tmp}/ndmini-perf.XXXXXX")
trap 'rm -rf "$work"' EXIT
decks=(tiny:40 small:8)

for run in "${decks[@]}"; do
  deck=${run%%:*} steps=${run#*:}
  for ((r = 1; r <= reps; r++)); do
    echo "perf: $deck, $steps steps, repetition $r of $reps" >&2
    "$MPIEXEC" "$MPIEXEC_NUMPROC_FLAG" 1 "$NDMINI" train "$SOURCE_DIR/inputs/$deck.toml" --set train.steps="$steps" \
      --set perf.peak_gflops=100 --metrics "$work/$deck.$r.jsonl" >"$work/$deck.$r.log" 2>&1 ||
      { tail -20 "$work/$deck.$r.log"; exit 1; }
  done
done
"$NDMINI" --build-info >"$work/build.json"

python3 - "$work" "$baseline" "$margin" "${NDMINI_PERF_RECORD:-0}" "${decks[@]}" <<'PY'
import json, os, statistics, sys
work, path, margin, record, decks = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4] == "1", sys.argv[5:]
build = json.load(open(os.path.join(work, "build.json")))
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown")
# One baseline per kind of machine and build (keep the file on the machine, e.g. a
# persistent NDMINI_PERF_BASELINE in CI); a code change is what it measures.
key = " | ".join([cpu, build["compiler"], "Kokkos " + build["kokkos_version"],
                  build["kokkos_backend"], build["build_type"], "native" if build.get("native") else "portable"])
now = {}
for run in decks:
    deck = run.split(":")[0]
    rates = []
    for name in sorted(os.listdir(work)):
        if name.startswith(deck + ".") and name.endswith(".jsonl"):
            summary = [json.loads(l) for l in open(os.path.join(work, name)) if '"summary"' in l][-1]
            rates.append(summary["tokens_per_s"])
    now[deck] = {"median": statistics.median(rates), "runs": rates}
store = json.load(open(path)) if os.path.exists(path) else {}
if record or key not in store:
    store[key] = now
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    json.dump(store, open(path, "w"), indent=1)
    print(f"perf: recorded the baseline for [{key}] in {path}: " +
          ", ".join(f"{d} {v['median']:.0f} tokens/s" for d, v in now.items()))
    sys.exit(77)  # nothing compared
failed = False
for deck, v in now.items():
    base = store[key].get(deck)
    if base is None:
        print(f"perf: {deck}: no baseline (record with NDMINI_PERF_RECORD=1)")
        failed = True
        continue
    ratio = v["median"] / base["median"]
    verdict = "REGRESSION" if ratio < 1 - margin else "ok"
    print(f"perf: {deck}: {v['median']:.0f} tokens/s (runs {', '.join(f'{x:.0f}' for x in v['runs'])}) "
          f"vs baseline {base['median']:.0f}: {ratio:.3f} [{verdict}, margin {margin:.2f}]")
    failed = failed or ratio < 1 - margin
sys.exit(1 if failed else 0)
PY
