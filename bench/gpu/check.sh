#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The GPU check: one script for a machine with one NVIDIA GPU, about 10 minutes with a prebuilt tree.
#   1. takes a built `cuda` tree, or builds it (bench/gpu/build.sh's steps);
#   2. runs `ctest -L gpu` and the unit tests (`ctest -L unit -LE large`) on the GPU;
#   3. trains inputs/tiny.toml on the GPU and on the CPU (a host build) and compares every step's
#      loss: fp32, at most 1e-5 relative;
#   4. trains inputs/gpt2-124m.toml at T = 1024 for a few steps in fp32, then in bf16 mixed
#      precision, and reports each one's tokens/s, step time, GPU memory and MFU against the GEMM
#      peak measured in its precision and against the GPU's dense bf16 peak.
# Every figure goes to OUTDIR: summary.md (for people), figures.env (KEY=value, for scripts),
# the metrics files of each run and logs/ (one log per stage).
#
# Usage: bench/gpu/check.sh OUTDIR [options]
#        bench/gpu/check.sh --bundle DIR OUTDIR [--steps N] [--budget SECONDS] [--bf16-peak-tflops X]
#   --bundle DIR          a bare GPU machine: nothing is built; everything comes from DIR, made by
#                         bench/gpu/bundle.sh (its libraries first on the library path; cuBLAS,
#                         cuBLASLt and NCCL from the CUDA toolkit's lib64, pip's nvidia/*/lib or
#                         NDMINI_GPU_LIB_PATH). In order: the library check (exit 2 when one is
#                         missing), the GPU (exit 77 when there is none), test_cublas, the tiny deck
#                         against DIR's CPU losses, gpt2-124m T = 1024 fp32 and bf16, test_nccl on one
#                         rank (every NCCL collective), test_comm on one rank (MPI on device memory).
#                         Budget 420 s by default; OUTDIR gets summary.md, figures.env, logs.tar.gz.
#   --build-dir DIR       the `cuda` build tree (default: build-cuda in this checkout); used as it is
#                         when it holds miniapp/ndmini, else configured and built from --kokkos-prefix
#   --kokkos-prefix DIR   where Kokkos and Kokkos Kernels for CUDA are installed (DIR/kokkos,
#                         DIR/kokkos-kernels, as bench/gpu/build.sh lays them out)
#   --kokkos-src DIR --kernels-src DIR
#                         build those first (bench/gpu/build.sh) into --kokkos-prefix
#   --cpu-build DIR       a host build for the CPU run of the tiny deck (default: build, the
#                         `release` preset; configured and built when missing, alongside the GPU stages)
#   --steps N             gpt2-124m steps (default 8; the first is left out of the figures)
#   --budget SECONDS      for the whole check (default 600); each stage gets at most what is left
#   --bf16-peak-tflops X  the GPU's dense bf16 peak (default: 989.4 for H100/H200 SXM, by name)
#   --dry-run             print the plan and every command; run nothing
#   --compare-losses GPU.jsonl CPU.jsonl [TOL]
#                         only compare two metrics files, step by step (exit 0 within TOL, default 1e-5)
# Exit status: 0 every check passed; 1 a check failed; 2 bad usage, or (--bundle) a library the
# bundle needs is missing here; 77 no NVIDIA GPU on this machine (nothing checked;
# NDMINI_CHECK_NO_GPU=1 takes this path anywhere).
set -euo pipefail
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then
  # The comment at the head of this file, less its licence line.
  sed -n '3,/^set -euo pipefail/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"
  exit 0
fi

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
readonly kSkip=77
readonly kLossTol=1e-5
readonly kGpt2SeqLen=1024

die_usage() {
  echo "check.sh: $*" >&2
  echo "usage: bench/gpu/check.sh OUTDIR [--build-dir DIR] [--kokkos-prefix DIR] [--kokkos-src DIR --kernels-src DIR]" >&2
  echo "       [--cpu-build DIR] [--steps N] [--budget SECONDS] [--bf16-peak-tflops X] [--dry-run]" >&2
  echo "       bench/gpu/check.sh --bundle DIR OUTDIR [--steps N] [--budget SECONDS] [--bf16-peak-tflops X]" >&2
  echo "       bench/gpu/check.sh --compare-losses GPU.jsonl CPU.jsonl [TOL]" >&2
  exit 2
}

# losses FILE: "step loss" for every step record of a metrics file.
losses() {
  grep '"step"' "$1" | grep -v '"summary"' | sed -E 's/.*"step":([0-9]+).*"loss":([^,}]*).*/\1 \2/;t;s/.*"loss":([^,}]*).*"step":([0-9]+).*/\2 \1/'
}

# compare_losses GPU CPU TOL: prints the worst relative difference; exit 0 when every step is within TOL.
compare_losses() {
  local gpu=$1 cpu=$2 tol=$3
  [ -s "$gpu" ] || { echo "no GPU metrics file: $gpu" >&2; return 1; }
  [ -s "$cpu" ] || { echo "no CPU metrics file: $cpu" >&2; return 1; }
  join <(losses "$gpu" | sort -k1,1) <(losses "$cpu" | sort -k1,1) | sort -n -k1,1 |
    awk -v tol="$tol" -v ng="$(losses "$gpu" | wc -l)" -v nc="$(losses "$cpu" | wc -l)" '
      { d = $2 - $3; if (d < 0) d = -d; c = $3; if (c < 0) c = -c; r = (c > 0) ? d / c : d;
        if (r > worst) { worst = r; at = $1 } n++;
        if (r > tol) printf "step %d: GPU %s CPU %s relative %.3e > %s\n", $1, $2, $3, r, tol }
      END { printf "steps compared %d (GPU %d, CPU %d); worst relative difference %.3e at step %d (bound %s)\n",
                   n, ng, nc, worst, at, tol;
            exit (n == 0 || n != ng || n != nc || worst > tol) ? 1 : 0 }'
}

if [ "${1:-}" = "--compare-losses" ]; then
  [ $# -ge 3 ] || die_usage "--compare-losses needs GPU.jsonl CPU.jsonl [TOL]"
  compare_losses "$2" "$3" "${4:-$kLossTol}"
  exit $?
fi

# ---- arguments ----------------------------------------------------------------------------
bundle="" budget=600 gpt2_limit=200
if [ "${1:-}" = "--bundle" ]; then
  [ $# -ge 3 ] || die_usage "--bundle needs DIR OUTDIR"
  [ -f "$2/manifest.env" ] || die_usage "$2 is not a bundle (no manifest.env; bench/gpu/bundle.sh makes one)"
  bundle=$(cd "$2" && pwd)
  budget=420 gpt2_limit=120
  shift 2
fi
[ $# -ge 1 ] || die_usage "OUTDIR is missing"
case "$1" in -*) die_usage "the first argument is OUTDIR, not an option ($1)" ;; esac
out=$1
shift
build_dir=$repo/build-cuda
cpu_build=$repo/build
kokkos_prefix="" kokkos_src="" kernels_src=""
steps=8 bf16_peak_tflops="" dry_run=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir | --kokkos-prefix | --kokkos-src | --kernels-src | --cpu-build | --dry-run)
      [ -z "$bundle" ] || die_usage "$1 does not go with --bundle (nothing is built there)" ;;
  esac
  case "$1" in
    --build-dir | --kokkos-prefix | --kokkos-src | --kernels-src | --cpu-build | --steps | --budget | --bf16-peak-tflops)
      [ $# -ge 2 ] || die_usage "$1 needs a value"
      case "$1" in
        --build-dir) build_dir=$2 ;;
        --kokkos-prefix) kokkos_prefix=$2 ;;
        --kokkos-src) kokkos_src=$2 ;;
        --kernels-src) kernels_src=$2 ;;
        --cpu-build) cpu_build=$2 ;;
        --steps) steps=$2 ;;
        --budget) budget=$2 ;;
        --bf16-peak-tflops) bf16_peak_tflops=$2 ;;
      esac
      shift 2
      ;;
    --dry-run)
      dry_run=1
      shift
      ;;
    *) die_usage "unknown option $1" ;;
  esac
done
if ! [[ "$steps" =~ ^[0-9]+$ ]] || [ "$steps" -lt 2 ]; then die_usage "--steps must be an integer >= 2 (got $steps)"; fi
if ! [[ "$budget" =~ ^[0-9]+$ ]] || [ "$budget" -lt 60 ]; then die_usage "--budget must be seconds >= 60 (got $budget)"; fi
[ -z "$bf16_peak_tflops" ] || [[ "$bf16_peak_tflops" =~ ^[0-9]+([.][0-9]+)?$ ]] ||
  die_usage "--bf16-peak-tflops must be a number (got $bf16_peak_tflops)"
if [ -n "$kokkos_src$kernels_src" ] && { [ -z "$kokkos_src" ] || [ -z "$kernels_src" ]; }; then
  die_usage "--kokkos-src and --kernels-src go together"
fi
[ -n "$kokkos_src" ] && [ -z "$kokkos_prefix" ] && kokkos_prefix=$repo/kokkos-cuda

mkdir -p "$out/logs" "$out/work"
out=$(cd "$out" && pwd)
[ -n "$bundle" ] || build_dir=$(mkdir -p "$build_dir" && cd "$build_dir" && pwd)
inputs=$repo/inputs
[ -z "$bundle" ] || inputs=$bundle/inputs
figures=$out/figures.env
summary=$out/summary.md
: >"$figures"
start_s=$SECONDS
failures=0
cpu_build_pid="" mem_pid="" bundle_libs=""
# Background helpers (the CPU build, the memory sampler) end with the script; with --bundle the
# logs, metrics and work files become one tarball (also when a step fails or the GPU is missing).
# shellcheck disable=SC2317  # called by the trap
cleanup() {
  local pid
  for pid in $cpu_build_pid $mem_pid; do kill "$pid" 2>/dev/null || true; done
  [ -z "$bundle_libs" ] || rm -rf "$bundle_libs"
  if [ -n "$bundle" ] && [ -d "$out/logs" ]; then
    (cd "$out" && mv ./*.jsonl ./*.csv logs/ 2>/dev/null; tar -czf logs.tar.gz logs && rm -rf logs work) || true
  fi
}
trap cleanup EXIT

# figure KEY VALUE: one line of figures.env.
figure() { printf '%s=%s\n' "$1" "$2" >>"$figures"; }
note() {
  echo "check.sh: $*"
  echo "- $*" >>"$summary"
}
left() { echo $((budget - (SECONDS - start_s))); }

# stage NAME LIMIT CMD...: CMD under a timeout of min(LIMIT, what is left of the budget), its output
# in logs/NAME.log; records NAME_status (pass, fail or timeout) and NAME_s. Returns CMD's status.
stage() {
  local name=$1 limit=$2
  shift 2
  local avail
  avail=$(left)
  if [ "$avail" -lt "$limit" ]; then limit=$avail; fi
  if [ "$dry_run" = 1 ]; then
    echo "[dry-run] $name (timeout ${limit}s): $*"
    return 0
  fi
  if [ "$limit" -le 5 ]; then
    note "$name: not run, the ${budget}s budget is spent"
    figure "${name}_status" "not_run"
    failures=$((failures + 1))
    return 1
  fi
  echo "check.sh: $name (at most ${limit}s) ..."
  local t0=$SECONDS rc=0
  timeout --kill-after=10 "$limit" "$@" >"$out/logs/$name.log" 2>&1 || rc=$?
  local status=pass
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    status=timeout
  elif [ "$rc" -ne 0 ]; then
    status=fail
  fi
  figure "${name}_status" "$status"
  figure "${name}_s" $((SECONDS - t0))
  note "$name: $status in $((SECONDS - t0)) s (exit $rc; logs/$name.log)"
  [ "$status" = pass ] || {
    failures=$((failures + 1))
    tail -n 20 "$out/logs/$name.log" | sed 's/^/    /'
  }
  return "$rc"
}

{
  echo "# ndmini GPU check"
  echo
  if [ -n "$bundle" ]; then
    echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ); bundle $(sed -n 's/^BUNDLE_COMMIT=//p' "$bundle/manifest.env") built $(sed -n 's/^BUNDLE_DATE=//p' "$bundle/manifest.env")"
  else
    echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ); commit: $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$repo" diff --quiet 2>/dev/null || echo ' (with local changes)')"
  fi
} >"$summary"

# gpt2_run PRECISION: a few steps in that precision; figures gpt2_PRECISION_*; MFU against the
# peak the run calibrates in its own precision and against the GPU's dense bf16 peak.
gpt2_run() {
  local precision=$1 name=gpt2_t1024_$1
  local gpt2=(train "$inputs/gpt2-124m.toml" --set "model.seq_len=$kGpt2SeqLen" --set "train.steps=$steps"
    --set train.log_every=1 --set "train.precision=$precision" --set checkpoint.every=0)
  local mem_log=$out/logs/gpu_memory_$precision.csv
  if [ "$dry_run" = 0 ] && command -v nvidia-smi >/dev/null 2>&1; then
    # GPU memory in use, once a second, while the run lasts.
    (while true; do
      nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -n 1
      sleep 1
    done) >"$mem_log" &
    mem_pid=$!
  fi
  stage "$name" "$gpt2_limit" "${in_work[@]}" "${launch[@]}" "$ndmini_gpu" "${gpt2[@]}" --metrics "$out/$name.jsonl" || true
  if [ -n "$mem_pid" ]; then
    kill "$mem_pid" 2>/dev/null || true
    mem_pid=""
  fi
  [ "$dry_run" = 0 ] || return 0
  local summary_line flops_per_token tokens_per_s mfu_bf16="" mem_max
  summary_line=$(grep '"summary"' "$out/$name.jsonl" 2>/dev/null | tail -n 1 || true)
  # field NAME: a number of the summary line.
  field() { sed -nE "s/.*\"$1\":([-0-9.eE+]+).*/\1/p" <<<"$summary_line"; }
  flops_per_token=$(sed -nE 's/^FLOPs per token +([0-9.eE+]+).*/\1/p' "$out/logs/gpt2_check.log" 2>/dev/null | head -n 1)
  tokens_per_s=$(field tokens_per_s)
  if [ -z "$summary_line" ] || [ -z "$tokens_per_s" ]; then
    note "gpt2-124m T=$kGpt2SeqLen $precision: no summary line in $name.jsonl (logs/$name.log)"
    failures=$((failures + 1))
    return 0
  fi
  figure "gpt2_${precision}_tokens_per_s" "$tokens_per_s"
  figure "gpt2_${precision}_median_step_ms" "$(field median_step_ms)"
  figure "gpt2_${precision}_mfu_vs_measured_peak" "$(field mfu)"
  figure "gpt2_${precision}_measured_peak_flops" "$(field peak_flops)"
  figure "gpt2_${precision}_final_loss" "$(field final_loss)"
  figure gpt2_flops_per_token "$flops_per_token"
  if [ -n "$bf16_peak_tflops" ] && [ -n "$flops_per_token" ]; then
    mfu_bf16=$(awk -v f="$flops_per_token" -v t="$tokens_per_s" -v p="$bf16_peak_tflops" \
      'BEGIN { printf "%.4f", f * t / (p * 1e12) }')
    figure gpt2_bf16_dense_peak_tflops "$bf16_peak_tflops"
    figure "gpt2_${precision}_mfu_vs_bf16_dense_peak" "$mfu_bf16"
  fi
  mem_max=$(sort -n "$mem_log" 2>/dev/null | tail -n 1)
  [ -z "$mem_max" ] || figure "gpt2_${precision}_gpu_memory_used_max_mib" "$mem_max"
  note "gpt2-124m T=$kGpt2SeqLen $precision: $tokens_per_s tokens/s, median step $(field median_step_ms) ms," \
    "MFU $(field mfu) of the measured $precision GEMM peak$([ -z "$mfu_bf16" ] || echo ", $mfu_bf16 of the ${bf16_peak_tflops} TFLOP/s dense bf16 peak")," \
    "GPU memory up to ${mem_max:-?} MiB"
}

# ---- --bundle: a bare GPU machine, everything from the bundle ---------------------------------------
# gpu_lib_dirs: the folders that may hold cuBLAS, cuBLASLt and NCCL here, in the order searched:
# NDMINI_GPU_LIB_PATH, the CUDA toolkit, then pip's nvidia-* wheels wherever a Python keeps them.
gpu_lib_dirs() {
  local d lib
  local -a candidates=()
  IFS=: read -r -a candidates <<<"${NDMINI_GPU_LIB_PATH:-}"
  candidates+=("${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib)
  local -a sites=(/usr/local/lib/python3*/dist-packages /usr/local/lib/python3*/site-packages
    /usr/lib/python3/dist-packages /opt/conda/lib/python3*/site-packages "$HOME"/.local/lib/python3*/site-packages)
  if command -v python3 >/dev/null 2>&1; then
    while read -r d; do sites+=("$d"); done < <(timeout 20 python3 -c \
      'import site, sys; print("\n".join(site.getsitepackages() + [site.getusersitepackages()] + sys.path))' 2>/dev/null || true)
  fi
  for d in "${sites[@]}"; do candidates+=("$d"/nvidia/*/lib); done
  for d in "${candidates[@]}"; do
    [ -n "$d" ] || continue
    for lib in libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
      if [ -e "$d/$lib" ]; then
        readlink -f "$d"
        break
      fi
    done
  done | awk '!seen[$0]++'
}

if [ -n "$bundle" ]; then
  # shellcheck disable=SC1091
  . "$bundle/manifest.env"
  # The libraries: the bundle's (the compressed ones unpacked outside it), then the machine's GPU libraries.
  bundle_libs=$(mktemp -d "${TMPDIR:-/tmp}/ndmini-bundle-lib.XXXXXX")
  for f in "$bundle"/lib/*.zst; do
    [ -f "$f" ] || continue
    target=$bundle_libs/$(basename "$f" .zst)
    if [ -x "$bundle/bin/zstd" ] && LD_LIBRARY_PATH=$bundle/lib "$bundle/bin/zstd" -q -d -c "$f" >"$target" 2>/dev/null; then
      :
    elif command -v zstd >/dev/null 2>&1; then
      zstd -q -d -c "$f" >"$target"
    else
      note "library check FAILED: no zstd to unpack $(basename "$f")"
      figure status failed_libraries
      exit 2
    fi
  done
  mapfile -t gpu_dirs < <(gpu_lib_dirs)
  lib_path=$bundle_libs:$bundle/lib
  for d in "${gpu_dirs[@]}"; do lib_path=$lib_path:$d; done
  export LD_LIBRARY_PATH=$lib_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PATH=$bundle/bin:$PATH
  note "bundle: $bundle ($(du -sh "$bundle" | cut -f1)); GPU library folders found: ${gpu_dirs[*]:-none}"

  # 1. The libraries: glibc, then cuBLAS/cuBLASLt/NCCL against what the bundle was built with, then
  # every bundled binary's libraries (only the driver, libcuda, may be missing: that is the GPU step's).
  glibc_here=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')
  figure glibc "$glibc_here"
  if [ -n "$BUNDLE_GLIBC_REQUIRED" ] && [ -n "$glibc_here" ] &&
    [ "$(printf '%s\n%s\n' "$BUNDLE_GLIBC_REQUIRED" "$glibc_here" | sort -V | head -n 1)" != "$BUNDLE_GLIBC_REQUIRED" ]; then
    note "library check FAILED: this glibc is $glibc_here, the bundle needs $BUNDLE_GLIBC_REQUIRED or later"
    figure status failed_libraries
    exit 2
  fi
  lib_rc=0
  "$bundle/bin/gpu_libs" --expect "cublas=$BUNDLE_CUBLAS" --expect "cublasLt=$BUNDLE_CUBLASLT" \
    --expect "nccl=$BUNDLE_NCCL" "${gpu_dirs[@]}" >"$out/logs/gpu_libs.log" 2>&1 || lib_rc=$?
  cat "$out/logs/gpu_libs.log"
  sed -n 's/^gpu_libs: \([a-zA-Z]*\) *\([0-9.]*\) .*/\1_version=\2/p' "$out/logs/gpu_libs.log" >>"$figures"
  missing=$(for f in "$bundle"/bin/*; do ldd "$f" 2>/dev/null | awk -v f="$(basename "$f")" '/not found/ { print f ": " $1 }'; done |
    grep -v ': libcuda\.so' || true)
  if [ "$lib_rc" -ne 0 ] || [ -n "$missing" ]; then
    why=$(grep -h 'not found\|DIFFERS\|failed' "$out/logs/gpu_libs.log" | sed 's/^gpu_libs: //' | tr -s ' ' | tr '\n' ';' || true)
    [ -z "$missing" ] || why="${why:+$why }ldd: $(tr '\n' ';' <<<"$missing")"
    note "library check FAILED: ${why%;} (logs/gpu_libs.log)"
    figure status failed_libraries
    exit 2
  fi
  note "library check passed: cuBLAS, cuBLASLt, NCCL found (built with $BUNDLE_CUBLAS, $BUNDLE_CUBLASLT, $BUNDLE_NCCL); every bundled binary's libraries resolve (glibc $glibc_here, needs $BUNDLE_GLIBC_REQUIRED)"
  figure library_check pass

  # 2. The GPU: nvidia-smi where there is one, else the CUDA runtime's device count.
  gpu_name=""
  if [ "${NDMINI_CHECK_NO_GPU:-0}" = 1 ]; then
    note "no NVIDIA GPU on this machine (NDMINI_CHECK_NO_GPU=1): nothing checked"
    figure status skipped_no_gpu
    exit "$kSkip"
  fi
  if command -v nvidia-smi >/dev/null 2>&1; then
    gpu_name=$(timeout 30 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || true)
    timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv \
      >"$out/gpu.csv" 2>&1 || true
  fi
  if [ -z "$gpu_name" ]; then
    dev_rc=0
    "$bundle/bin/gpu_libs" --devices >"$out/logs/gpu_devices.log" 2>&1 || dev_rc=$?
    if [ "$dev_rc" -eq 0 ]; then
      gpu_name="CUDA device (nvidia-smi gives no name)"
    else
      note "no NVIDIA GPU on this machine (nvidia-smi finds none; $(tail -n 1 "$out/logs/gpu_devices.log")): nothing checked"
      figure status skipped_no_gpu
      exit "$kSkip"
    fi
  fi
  note "GPU: $gpu_name"
  figure gpu "\"$gpu_name\""
  case "$gpu_name" in *H100*SXM* | *H100\ 80GB\ HBM3* | *H200*) : "${bf16_peak_tflops:=989.4}" ;; esac

  # 3. The runs, in the order of what matters most if the time runs out.
  ndmini_gpu=$bundle/bin/ndmini
  launch=("$bundle/bin/mpiexec.hydra" -launcher fork -n 1)
  # shellcheck disable=SC2016  # expanded by the inner bash
  in_work=(bash -c 'cd "$1" && shift && "$@"' _ "$out/work")
  stage test_cublas 60 "$bundle/bin/test_cublas" || true
  stage tiny_gpu 90 "${in_work[@]}" "${launch[@]}" "$ndmini_gpu" train "$inputs/tiny.toml" --set train.log_every=1 \
    --set checkpoint.every=0 --metrics "$out/tiny_gpu.jsonl" || true
  if compare_losses "$out/tiny_gpu.jsonl" "$bundle/cpu/tiny_cpu.jsonl" "$kLossTol" >"$out/logs/tiny_compare.log" 2>&1; then
    figure tiny_losses_match pass
    note "tiny deck, GPU vs the bundle's CPU losses: $(tail -n 1 "$out/logs/tiny_compare.log")"
  else
    figure tiny_losses_match fail
    failures=$((failures + 1))
    note "tiny deck, GPU vs the bundle's CPU losses DIFFER: $(tail -n 1 "$out/logs/tiny_compare.log") (logs/tiny_compare.log)"
  fi
  figure tiny_worst_rel_diff "$(sed -nE 's/.*worst relative difference ([^ ]+).*/\1/p' "$out/logs/tiny_compare.log")"
  stage gpt2_check 30 "$ndmini_gpu" check "$inputs/gpt2-124m.toml" --set "model.seq_len=$kGpt2SeqLen" || true
  figure gpt2_seq_len "$kGpt2SeqLen"
  gpt2_run fp32
  gpt2_run bf16
  # Every collective the code issues on NCCL (all-reduce, all-gather, reduce-scatter, broadcast,
  # send/recv, the grouped p2p of the cp ring, bf16 sums), on one rank, world and split communicators.
  stage test_nccl_np1 90 env NDMINI_NCCL_TIMEOUT_S=60 "${launch[@]}" "$bundle/bin/test_nccl" || true
  # MPI on device memory, on the path ndmini chooses for this MPI (direct or staged through pinned memory).
  stage test_comm_np1 90 env OPENBLAS_NUM_THREADS=1 "${launch[@]}" "$bundle/bin/test_comm" || true
  mpi_path=$(grep -ho 'MPI on device buffers: [^(;]*' "$out/logs/test_comm_np1.log" "$out/logs/tiny_gpu.log" 2>/dev/null | head -n 1 || true)
  [ -z "$mpi_path" ] || { note "$mpi_path"; figure mpi_device_path "\"$mpi_path\""; }
  for name in test_cublas test_nccl_np1 test_comm_np1; do
    line=$(grep -E '^\[  (PASSED|FAILED) +\]|tests? ran' "$out/logs/$name.log" 2>/dev/null | tr '\n' ' ' || true)
    [ -z "$line" ] || figure "${name}_gtest" "\"$line\""
  done

  figure check_s $((SECONDS - start_s))
  if [ "$failures" -eq 0 ]; then
    figure status pass
    note "every check passed in $((SECONDS - start_s)) s"
    exit 0
  fi
  figure status fail
  note "$failures check(s) failed in $((SECONDS - start_s)) s; logs in logs.tar.gz"
  exit 1
fi

# ---- the GPU ------------------------------------------------------------------------------
gpu_name=""
if [ "${NDMINI_CHECK_NO_GPU:-0}" != 1 ] && command -v nvidia-smi >/dev/null 2>&1; then
  gpu_name=$(timeout 30 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || true)
fi
if [ -z "$gpu_name" ]; then
  if [ "$dry_run" = 1 ]; then
    note "no NVIDIA GPU here: a dry run shows the plan all the same"
    gpu_name="(none: dry run)"
  else
    note "no NVIDIA GPU on this machine (nvidia-smi finds none): nothing checked"
    figure status skipped_no_gpu
    exit "$kSkip"
  fi
else
  timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv \
    >"$out/gpu.csv" 2>&1 || true
  gpu_count=$( (timeout 30 nvidia-smi --query-gpu=name --format=csv,noheader || true) | wc -l)
  [ "$gpu_count" -eq 1 ] || note "$gpu_count GPUs visible: the runs use one (CUDA_VISIBLE_DEVICES picks which)"
fi
note "GPU: $gpu_name"
figure gpu "\"$gpu_name\""
if [ -z "$bf16_peak_tflops" ]; then
  case "$gpu_name" in
    *H100*SXM* | *H100\ 80GB\ HBM3* | *H200*) bf16_peak_tflops=989.4 ;;  # dense bf16, SXM parts
    *) bf16_peak_tflops="" ;;
  esac
fi

# ---- builds ---------------------------------------------------------------------------------
jobs=$(nproc 2>/dev/null || echo 4)
if [ ! -x "$cpu_build/miniapp/ndmini" ]; then
  # The host build runs beside the GPU stages; the tiny comparison waits for it.
  note "CPU build: $cpu_build has no miniapp/ndmini; building the release preset there in the background"
  if [ "$dry_run" = 1 ]; then
    echo "[dry-run] cpu_build: cmake -S $repo -B $cpu_build --preset release && cmake --build $cpu_build -j $jobs --target ndmini_exe"
  else
    (cd "$repo" && cmake -S "$repo" -B "$cpu_build" --preset release -DNDMINI_ENABLE_TESTS=OFF \
      -DNDMINI_ENABLE_BENCHMARKS=OFF && cmake --build "$cpu_build" -j "$jobs" --target ndmini_exe) \
      >"$out/logs/cpu_build.log" 2>&1 &
    cpu_build_pid=$!
  fi
fi

if [ -n "$kokkos_src" ]; then
  stage kokkos_build 1800 env JOBS="$jobs" "$repo/bench/gpu/build.sh" "$kokkos_src" "$kernels_src" "$kokkos_prefix" ||
    true
fi
if [ ! -x "$build_dir/miniapp/ndmini" ]; then
  [ -n "$kokkos_prefix" ] ||
    { [ "$dry_run" = 1 ] && kokkos_prefix="KOKKOS_PREFIX"; } ||
    die_usage "$build_dir holds no built ndmini: give --kokkos-prefix (installed Kokkos CUDA) or --kokkos-src/--kernels-src"
  stage cuda_configure 300 cmake -S "$repo" -B "$build_dir" --preset cuda -DKokkos_ROOT="$kokkos_prefix/kokkos" \
    -DKokkosKernels_ROOT="$kokkos_prefix/kokkos-kernels" || true
  stage cuda_build 1800 cmake --build "$build_dir" -j "$jobs" || true
fi
if [ "$dry_run" = 0 ] && [ ! -x "$build_dir/miniapp/ndmini" ]; then
  note "no CUDA build: the GPU stages cannot run"
  figure status failed_build
  exit 1
fi
ndmini_gpu=$build_dir/miniapp/ndmini
ndmini_cpu=$cpu_build/miniapp/ndmini
launch=()
if command -v mpiexec >/dev/null 2>&1; then launch=(mpiexec -n 1); fi
if [ "$dry_run" = 0 ]; then
  grep -q 'NDMINI_KOKKOS_CUDA:INTERNAL=ON\|Kokkos_DEVICES.*CUDA' "$build_dir/CMakeCache.txt" 2>/dev/null ||
    note "warning: $build_dir may not be a Kokkos CUDA build (CMakeCache.txt does not say CUDA)"
fi

# ---- tests on the GPU -------------------------------------------------------------------------
# ctest_counts LOG PREFIX: figures from ctest's "N% tests passed, F tests failed out of T" line.
ctest_counts() {
  local line
  line=$(grep -E 'tests passed, [0-9]+ tests? failed out of [0-9]+' "$1" | tail -n 1 || true)
  [ -n "$line" ] || return 0
  figure "${2}_failed" "$(sed -E 's/.* ([0-9]+) tests? failed out of.*/\1/' <<<"$line")"
  figure "${2}_total" "$(sed -E 's/.*out of ([0-9]+).*/\1/' <<<"$line")"
  figure "${2}_skipped" "$(grep -c '\*\*\*Skipped\|Not Run (Disabled)' "$1" || true)"
}
stage ctest_gpu 180 ctest --test-dir "$build_dir" -L gpu --output-on-failure || true
[ "$dry_run" = 1 ] || ctest_counts "$out/logs/ctest_gpu.log" ctest_gpu
stage ctest_unit 300 ctest --test-dir "$build_dir" -L unit -LE large -j 4 --output-on-failure || true
[ "$dry_run" = 1 ] || ctest_counts "$out/logs/ctest_unit.log" ctest_unit

# ---- the tiny deck: GPU against CPU -------------------------------------------------------------
tiny=(train "$inputs/tiny.toml" --set train.log_every=1 --set checkpoint.every=0)
# in_work CMD...: CMD run from work/ (runs may write files where they start).
# shellcheck disable=SC2016  # expanded by the inner bash
in_work=(bash -c 'cd "$1" && shift && "$@"' _ "$out/work")
stage tiny_gpu 120 "${in_work[@]}" "${launch[@]}" "$ndmini_gpu" "${tiny[@]}" \
  --metrics "$out/tiny_gpu.jsonl" || true
if [ -n "$cpu_build_pid" ]; then
  echo "check.sh: waiting for the CPU build ..."
  while kill -0 "$cpu_build_pid" 2>/dev/null && [ "$(left)" -gt 10 ]; do sleep 2; done
  if kill -0 "$cpu_build_pid" 2>/dev/null; then
    kill "$cpu_build_pid" 2>/dev/null || true
    note "CPU build ran out of time (logs/cpu_build.log)"
  fi
  wait "$cpu_build_pid" || note "CPU build failed (logs/cpu_build.log)"
  cpu_build_pid=""
fi
stage tiny_cpu 180 "${in_work[@]}" "${launch[@]}" "$ndmini_cpu" "${tiny[@]}" \
  --metrics "$out/tiny_cpu.jsonl" || true
if [ "$dry_run" = 1 ]; then
  echo "[dry-run] compare: $0 --compare-losses $out/tiny_gpu.jsonl $out/tiny_cpu.jsonl $kLossTol"
elif compare_losses "$out/tiny_gpu.jsonl" "$out/tiny_cpu.jsonl" "$kLossTol" >"$out/logs/tiny_compare.log" 2>&1; then
  figure tiny_losses_match pass
  note "tiny deck, GPU vs CPU losses: $(tail -n 1 "$out/logs/tiny_compare.log")"
else
  figure tiny_losses_match fail
  failures=$((failures + 1))
  note "tiny deck, GPU vs CPU losses DIFFER: $(tail -n 1 "$out/logs/tiny_compare.log") (logs/tiny_compare.log)"
fi
[ "$dry_run" = 1 ] || figure tiny_worst_rel_diff "$(sed -nE 's/.*worst relative difference ([^ ]+).*/\1/p' "$out/logs/tiny_compare.log")"

# ---- gpt2-124m at T = 1024, fp32 then bf16 ----------------------------------------------------------
stage gpt2_check 60 "$ndmini_gpu" check "$inputs/gpt2-124m.toml" --set "model.seq_len=$kGpt2SeqLen" || true
figure gpt2_seq_len "$kGpt2SeqLen"
gpt2_run fp32
gpt2_run bf16

figure check_s $((SECONDS - start_s))
if [ "$dry_run" = 1 ]; then
  echo "check.sh: dry run done (nothing ran)"
  exit 0
fi
if [ "$failures" -eq 0 ]; then
  figure status pass
  note "every check passed in $((SECONDS - start_s)) s"
  exit 0
fi
figure status fail
note "$failures check(s) failed; see $summary and $out/logs"
exit 1
