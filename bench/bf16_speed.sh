#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# bf16 against fp32, ndmini against PyTorch, side by side in one run on one
# core: each repetition runs every configuration of a deck in turn
# (interleaved), so a busy minute of a shared machine hits all of them alike.
# Prints a markdown table of tokens/s (median of the repetitions and their
# range), the ratios ndmini bf16 / ndmini fp32 and ndmini bf16 / PyTorch bf16,
# and ndmini at its best precision over the best of PyTorch (issue 34's 1.25x).
# ndmini's GEMM route is its own start-up choice (perf.gemm_route = auto: the
# banner's gemm line, copied into the provenance from the first run's log).
#
#   bench/bf16_speed.sh                        # small:8 gpt2-124m:5, 3 repetitions, all four runs
#   bench/bf16_speed.sh small:8:4 tiny:40      # DECK:STEPS[:GLOBAL_BATCH], decks from inputs/
#   RUNS="ndmini:fp32 torch:fp32 torch:bf16" bench/bf16_speed.sh   # leave ndmini bf16 out
#
# Environment: RUNS (default "ndmini:fp32 ndmini:bf16 torch:fp32 torch:bf16"),
# REPS (3), NDMINI_EXE (default build/miniapp/ndmini), PYTHON (a python3 that
# imports torch; default the first of python3, /usr/bin/python3 that does),
# OUT_DIR (logs and metrics; default a fresh temporary directory).
# One core per run: OPENBLAS_NUM_THREADS=1, OMP_NUM_THREADS=1, one MPI rank,
# torch.set_num_threads(1). OPENBLAS_CORETYPE: a value in the environment is
# kept (OPENBLAS_CORETYPE= set empty: OpenBLAS as installed picks its kernel);
# unset, the one `ndmini check` suggests (when it warns that OpenBLAS runs a
# kernel older than the CPU) is exported for every run, PyTorch's too (its
# fp32 products go through the system BLAS, OpenBLAS on Debian).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
exe=${NDMINI_EXE:-$root/build/miniapp/ndmini}
reps=${REPS:-3}
read -r -a configs <<<"${RUNS:-ndmini:fp32 ndmini:bf16 torch:fp32 torch:bf16}"
out=${OUT_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/ndmini-bf16-speed.XXXXXX")}
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(small:8 gpt2-124m:5)
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

die() {
  echo "bf16_speed.sh: error: $*" >&2
  exit 1
}
[[ "$reps" =~ ^[1-9][0-9]*$ ]] || die "REPS=$reps: give a positive number of repetitions"
wants_torch=0
for c in "${configs[@]}"; do
  case "$c" in
    ndmini:fp32 | ndmini:bf16) ;;
    torch:fp32 | torch:bf16) wants_torch=1 ;;
    *) die "RUNS: '$c' is not one of ndmini:fp32 ndmini:bf16 torch:fp32 torch:bf16" ;;
  esac
done
[ -x "$exe" ] || die "no executable at $exe; build ndmini_exe (cmake --build build --target ndmini_exe) or set NDMINI_EXE"
source "$root/bench/python_with.sh"
PYTHON=$(python_with torch)
if [ "$wants_torch" = 1 ] && ! "$PYTHON" -c 'import torch, numpy' 2>/dev/null; then
  die "$PYTHON cannot import torch and numpy; install them (Debian 12: apt-get install python3-torch) or set PYTHON"
fi

# Every case is checked before anything runs: the deck, the batch, and each precision asked for.
declare -a decks steps batches
for c in "${cases[@]}"; do
  IFS=: read -r deck nsteps batch <<<"$c"
  [ -f "$root/inputs/$deck.toml" ] || die "'$c': no deck inputs/$deck.toml"
  if ! [[ "${nsteps:-}" =~ ^[0-9]+$ ]] || [ "$nsteps" -lt 2 ]; then
    die "'$c': give DECK:STEPS with at least 2 steps (the first is left out of the medians as warm-up)"
  fi
  [[ -z "${batch:-}" || "$batch" =~ ^[1-9][0-9]*$ ]] || die "'$c': GLOBAL_BATCH must be a positive number"
  decks+=("$deck")
  steps+=("$nsteps")
  batches+=("${batch:-}")
  for cfg in "${configs[@]}"; do
    [ "${cfg%%:*}" = ndmini ] || continue
    set_batch=()
    [ -z "${batch:-}" ] || set_batch=(--set "train.global_batch=$batch" --set "train.micro_batch=$batch")
    if ! msg=$("$exe" check "$root/inputs/$deck.toml" --set "train.precision=${cfg#*:}" "${set_batch[@]}" 2>&1); then
      die "ndmini refuses $deck with train.precision=${cfg#*:}: $(grep -m1 'error:' <<<"$msg")
(leave that run out, e.g. RUNS=\"ndmini:fp32 torch:fp32 torch:bf16\")"
    fi
  done
done
mkdir -p "$out"

coretype_note="OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-} from the environment, kept"
machine=$("$exe" check "$root/inputs/${decks[0]}.toml" 2>&1 || true)  # its gemm line and any warning
if [ -z "${OPENBLAS_CORETYPE+set}" ]; then
  coretype=$(sed -n 's/.*Fix: export OPENBLAS_CORETYPE=\([A-Za-z0-9_]*\).*/\1/p' <<<"$machine" | head -n 1)
  if [ -n "$coretype" ]; then
    export OPENBLAS_CORETYPE=$coretype
    coretype_note="OPENBLAS_CORETYPE=$coretype set by this script: ndmini check warns that OpenBLAS runs a kernel older than this CPU"
  else
    coretype_note="OPENBLAS_CORETYPE unset: ndmini check does not warn (OpenBLAS picks a kernel for this CPU itself)"
  fi
fi
echo "bf16_speed.sh: $coretype_note; logs and metrics in $out" >&2
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "cpu: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"
  echo "ndmini: $("$exe" --build-info 2>/dev/null || echo unknown)"
  echo "ndmini's $(grep -m1 '^gemm:' <<<"$machine" || echo "gemm: unknown")"
  if [ "$wants_torch" = 1 ]; then
    echo "pytorch: $("$PYTHON" -c 'import torch; print(torch.__version__)')"
  fi
  echo "openblas: $coretype_note"
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$out/provenance.txt"

for i in "${!decks[@]}"; do
  deck=${decks[$i]}
  overrides=()
  [ -z "${batches[$i]}" ] || overrides=(--set "train.global_batch=${batches[$i]}" --set "train.micro_batch=${batches[$i]}")
  for rep in $(seq 1 "$reps"); do
    for cfg in "${configs[@]}"; do
      impl=${cfg%%:*} precision=${cfg#*:}
      name="case$i-$deck-$impl-$precision-rep$rep"
      echo "running $name (${steps[$i]} steps)" >&2
      if [ "$impl" = ndmini ]; then
        cmd=(mpiexec -n 1 "$exe" train "$root/inputs/$deck.toml" --set "train.steps=${steps[$i]}"
          --set "train.precision=$precision" "${overrides[@]}" --metrics "$out/$name.jsonl")
      else
        cmd=("$PYTHON" "$root/bench/pytorch/gpt.py" "$root/inputs/$deck.toml" --steps "${steps[$i]}"
          --precision "$precision" --threads 1 --warmup-steps 1 "${overrides[@]}" --metrics "$out/$name.jsonl")
      fi
      if ! "${cmd[@]}" >"$out/$name.log" 2>&1; then
        echo "bf16_speed.sh: $name failed; the last lines of $out/$name.log:" >&2
        tail -n 20 "$out/$name.log" >&2
        exit 1
      fi
    done
  done
done
{
  echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
  for cfg in "${configs[@]}"; do  # the route each precision's run took, from its banner
    [ "${cfg%%:*}" = ndmini ] || continue
    echo "ndmini ${cfg#*:} run's $(grep -m1 '^gemm:' "$out/case0-${decks[0]}-ndmini-${cfg#*:}-rep1.log" || echo "gemm: unknown")"
  done
} >>"$out/provenance.txt"

"$PYTHON" - "$root" "$out" "$reps" "${cases[*]}" "${configs[*]}" <<'PY'
import json, os, statistics, sys, tomllib

root, out, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
cases, configs = sys.argv[4].split(), sys.argv[5].split()
LABEL = {"ndmini:fp32": "ndmini fp32", "ndmini:bf16": "ndmini bf16",
         "torch:fp32": "PyTorch fp32", "torch:bf16": "PyTorch bf16 autocast"}


def summary(path):
    found = None
    with open(path) as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                if rec.get("summary"):
                    found = rec
    if found is None:
        sys.exit(f"bf16_speed.sh: no summary line in {path}")
    return found


def median_range(values, fmt):
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


print(f"| deck | global batch x T | steps (timed) | run | tokens/s, median of {reps} (range) | ms/step | MFU (peak) |")
print("|---|---|---|---|---:|---:|---|")
tokens = {}
for c, case in enumerate(cases):
    deck, _, batch = (case.split(":") + ["", ""])[:3]
    with open(os.path.join(root, "inputs", deck + ".toml"), "rb") as f:
        spec = tomllib.load(f)
    shape = f"{batch or spec['train']['global_batch']} x {spec['model']['seq_len']}"
    for cfg in configs:
        impl, precision = cfg.split(":")
        runs = [summary(os.path.join(out, f"case{c}-{deck}-{impl}-{precision}-rep{r}.jsonl")) for r in range(1, reps + 1)]
        tokens[c, cfg] = [s["tokens_per_s"] for s in runs]
        mfu = "n/a"
        if impl == "ndmini":
            peak = statistics.median(s["peak_flops"] for s in runs) / 1e9
            mfu = (median_range([100 * s["mfu"] for s in runs], "{:.1f}%") +
                   f" of {peak:.0f} GFLOP/s ({runs[0]['peak_source'].split(' (')[0]})")
        print(f"| {deck} | {shape} | {runs[0]['steps']} ({runs[0]['steps'] - 1}) | {LABEL[cfg]} | "
              f"{median_range(tokens[c, cfg], '{:.0f}')} | "
              f"{median_range([s['median_step_ms'] for s in runs], '{:.1f}')} | {mfu} |")

RATIOS = [("ndmini:bf16", "ndmini:fp32", ""), ("ndmini:bf16", "torch:bf16", ""),
          ("torch:bf16", "torch:fp32", ""), ("ndmini:fp32", "torch:fp32", "")]
rows = [(c, case, a, b, goal) for c, case in enumerate(cases)
        for a, b, goal in RATIOS if (c, a) in tokens and (c, b) in tokens]
# Issue 34's figure: ndmini at its best precision (the higher median) over
# the best of PyTorch's runs, per repetition paired in the order they ran.
for c, case in enumerate(cases):
    ours = [k for k in ("ndmini:fp32", "ndmini:bf16") if (c, k) in tokens]
    theirs = [k for k in ("torch:fp32", "torch:bf16") if (c, k) in tokens]
    if ours and theirs:
        best = lambda keys: max(keys, key=lambda k: statistics.median(tokens[c, k]))
        rows.append((c, case, best(ours), best(theirs), ">= 1.25 (issue 34: ndmini's best / PyTorch's best)"))
if rows:
    print()
    print("| case | ratio of tokens/s | of the medians | per repetition (range) | target |")
    print("|---|---|---:|---|---|")
    for c, case, a, b, goal in rows:
        x, y = tokens[c, a], tokens[c, b]
        paired = [p / q for p, q in zip(x, y)]
        print(f"| {case} | {LABEL[a]} / {LABEL[b]} | {statistics.median(x) / statistics.median(y):.2f}x | "
              f"{min(paired):.2f}-{max(paired):.2f}x | {goal or '-'} |")
print()
with open(os.path.join(out, "provenance.txt")) as f:
    for line in f:
        print(f"- {line.strip()}")
PY
