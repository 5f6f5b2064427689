#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Builds, on a CPU machine with the CUDA toolkit, one folder that a bare GPU machine runs as it is
# (`bench/gpu/check.sh --bundle DIR OUTDIR`, docs/gpu.md): nothing is built there and nothing but
# the NVIDIA driver, cuBLAS/cuBLASLt and NCCL is taken from it.
#   1. Kokkos (Serial + CUDA, sm_90) and Kokkos Kernels (cuBLAS TPL) from the sources you bring, with
#      the patches of PATCHES_DIR applied to a copy of the Kokkos source; then the CUDA ndmini and its
#      gpu-labelled test binaries (bench/gpu/build.sh's steps, NCCL on);
#   2. a portable host ndmini, and with it the tiny deck's CPU metrics (the GPU losses' reference);
#   3. DIR: bin/ (ndmini for CUDA, test_cublas, test_nccl, test_comm, gpu_libs, MPICH's
#      mpiexec.hydra and hydra_pmi_proxy, zstd), lib/ (every shared library those name except glibc's, the
#      driver, cuBLAS/cuBLASLt and NCCL; the larger ones zstd-compressed, unpacked by check.sh),
#      inputs/ (the decks), cpu/tiny_cpu.jsonl, check.sh and manifest.env (what it was built with).
#      Binaries and libraries are stripped.
# Usage: bench/gpu/bundle.sh DIR KOKKOS_SRC KOKKOS_KERNELS_SRC [PATCHES_DIR]
#   DIR: the bundle (created, or replaced when it holds an earlier bundle); put it in this checkout
#   as gpu-bundle/ (ignored by git) so it travels with the checkout.
#   PATCHES_DIR: *.patch files for Kokkos (applied with patch -p1 to a copy under WORK).
# Environment: WORK (build trees, default build-gpu-bundle in this checkout: a rerun only rebuilds
#   what changed), JOBS (default: all cores), HOST_BUILD (an existing portable host build tree to
#   take miniapp/ndmini from instead of building one), ZSTD_ABOVE_KIB (libraries larger than this are
#   zstd-compressed, default 256), BUNDLE_HOST (1: add the host ndmini as bin/ndmini-host), and bench/gpu/build.sh's KOKKOS_ARCH, CUDA_SM, CXX, KK_ETI.
# Exit status: 0 the bundle is complete; 1 a step failed; 2 bad usage.
set -euo pipefail
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then
  # The comment at the head of this file, less its licence line.
  sed -n '3,/^set -euo pipefail/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"
  exit 0
fi

usage() {
  echo "bundle.sh: $*" >&2
  echo "usage: bench/gpu/bundle.sh DIR KOKKOS_SRC KOKKOS_KERNELS_SRC [PATCHES_DIR]" >&2
  exit 2
}
if [ $# -lt 3 ] || [ $# -gt 4 ]; then usage "three or four arguments"; fi
[ -f "$2/CMakeLists.txt" ] || usage "KOKKOS_SRC $2 has no CMakeLists.txt"
[ -f "$3/CMakeLists.txt" ] || usage "KOKKOS_KERNELS_SRC $3 has no CMakeLists.txt"
[ $# -lt 4 ] || [ -d "$4" ] || usage "PATCHES_DIR $4 is not a folder"
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dir=$1
kokkos_src=$(cd "$2" && pwd)
kernels_src=$(cd "$3" && pwd)
patches=${4:+$(cd "$4" && pwd)}
work=$(mkdir -p "${WORK:-$repo/build-gpu-bundle}" && cd "${WORK:-$repo/build-gpu-bundle}" && pwd)
jobs=${JOBS:-$(nproc)}
zstd_above_kib=${ZSTD_ABOVE_KIB:-256}
if [ -e "$dir" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ] && [ ! -f "$dir/manifest.env" ]; then
  usage "$dir exists and is not a bundle (no manifest.env): refusing to replace it"
fi
for tool in cmake ninja strip objdump ldd zstd; do
  command -v "$tool" >/dev/null || { echo "bundle.sh: $tool is needed and not found" >&2; exit 1; }
done
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
t_start=$SECONDS
step() { echo "bundle.sh: [$((SECONDS - t_start)) s] $*"; }
run() {
  echo "+ $*"
  "$@"
}

# ---- 1. the CUDA tree ------------------------------------------------------------------------
if [ -n "$patches" ]; then
  # The patches go to a copy: the source you bring is left as it is.
  if [ ! -f "$work/kokkos-src/.bundle-patched" ]; then
    step "copying Kokkos to $work/kokkos-src and applying $patches/*.patch"
    rm -rf "$work/kokkos-src"
    cp -a "$kokkos_src" "$work/kokkos-src"
    for p in "$patches"/*.patch; do
      [ -f "$p" ] || continue
      if patch -d "$work/kokkos-src" -p1 -R --dry-run -s -f <"$p" >/dev/null 2>&1; then
        echo "  $(basename "$p"): already in this source"
      else
        patch -d "$work/kokkos-src" -p1 -s -N <"$p" || { echo "bundle.sh: $p does not apply" >&2; exit 1; }
        echo "  $(basename "$p"): applied"
      fi
    done
    touch "$work/kokkos-src/.bundle-patched"
  fi
  kokkos_src=$work/kokkos-src
fi
cuda_targets="ndmini_exe test_cublas test_nccl test_comm"
step "CUDA build: Kokkos, Kokkos Kernels, then $cuda_targets in $work/cuda"
JOBS=$jobs BUILD_DIR=$work/cuda TARGETS=$cuda_targets NDMINI_CMAKE_ARGS="-DNDMINI_ENABLE_BENCHMARKS=OFF" \
  "$repo/bench/gpu/build.sh" "$kokkos_src" "$kernels_src" "$work/kokkos-cuda"

# ---- 2. the host build and the CPU reference -------------------------------------------------
host_build=${HOST_BUILD:-$work/host}
if [ -z "${HOST_BUILD:-}" ]; then
  step "host build (portable preset) in $host_build"
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  (cd "$repo" && run cmake --preset portable -B "$host_build" -DNDMINI_ENABLE_TESTS=OFF \
    -DNDMINI_ENABLE_BENCHMARKS=OFF "${launcher[@]}")
  run cmake --build "$host_build" -j "$jobs" --target ndmini_exe
fi
[ -x "$host_build/miniapp/ndmini" ] || { echo "bundle.sh: no $host_build/miniapp/ndmini" >&2; exit 1; }
if grep -q '^NDMINI_ENABLE_NATIVE:BOOL=ON' "$host_build/CMakeCache.txt" 2>/dev/null; then
  echo "bundle.sh: warning: $host_build is tuned for this CPU (-march=native); ndmini-host may not run elsewhere"
fi

step "assembling $dir"
rm -rf "$dir"
mkdir -p "$dir/bin" "$dir/lib" "$dir/inputs" "$dir/cpu"
dir=$(cd "$dir" && pwd)
step "the tiny deck on the CPU (the GPU run's reference)"
mkdir -p "$work/tiny-cpu"
(cd "$work/tiny-cpu" && run mpiexec -n 1 "$host_build/miniapp/ndmini" train "$repo/inputs/tiny.toml" \
  --set train.log_every=1 --set checkpoint.every=0 --metrics "$dir/cpu/tiny_cpu.jsonl") >"$work/tiny-cpu/log" 2>&1 ||
  { cat "$work/tiny-cpu/log" >&2; echo "bundle.sh: the CPU run of the tiny deck failed" >&2; exit 1; }

# ---- 3. the bundle ---------------------------------------------------------------------------
cp "$work/cuda/miniapp/ndmini" "$dir/bin/ndmini"
# The host ndmini is not needed on the GPU machine (its losses are carried); BUNDLE_HOST=1 adds it
# for bundle_proof.sh's training run (oneDNN, OpenBLAS, LAPACK, libgfortran, Debian's Kokkos:
# about 21 MiB more, 55 MiB in all, near the 60 MiB limit).
[ "${BUNDLE_HOST:-0}" != 1 ] || cp "$host_build/miniapp/ndmini" "$dir/bin/ndmini-host"
for t in test_cublas test_nccl test_comm; do
  f=$(find "$work/cuda" -name "$t" -type f -perm -u+x | head -n 1)
  [ -n "$f" ] || { echo "bundle.sh: $t was not built" >&2; exit 1; }
  cp "$f" "$dir/bin/$t"
done
cc -std=c11 -O2 -Wall -o "$dir/bin/gpu_libs" "$repo/bench/gpu/gpu_libs.c" -ldl
mpiexec_real=$(readlink -f "$(command -v mpiexec)")
case "$(basename "$mpiexec_real")" in
  mpiexec.hydra) ;;
  *) echo "bundle.sh: mpiexec is $mpiexec_real, not MPICH's hydra" >&2; exit 1 ;;
esac
cp "$mpiexec_real" "$dir/bin/mpiexec.hydra"
cp "$(dirname "$mpiexec_real")/hydra_pmi_proxy" "$dir/bin/hydra_pmi_proxy"
# zstd unpacks the compressed libraries on machines without one (a Debian minbase has none).
cp "$(command -v zstd)" "$dir/bin/zstd"
cp "$repo/inputs/tiny.toml" "$repo/inputs/gpt2-124m.toml" "$dir/inputs/"
cp "$repo/bench/gpu/check.sh" "$dir/check.sh"

# kept_from_machine SONAME: true for the libraries the GPU machine provides (glibc, the driver,
# cuBLAS/cuBLASLt, NCCL). glibc stays out: its libraries must match the machine's dynamic loader.
kept_from_machine() {
  case "$1" in
    linux-vdso.so.* | ld-linux*.so.* | libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | \
      libutil.so.* | libresolv.so.* | libanl.so.* | libnsl.so.* | libBrokenLocale.so.* | libmvec.so.*) return 0 ;;
    libcuda.so.* | libnvidia-*.so.* | libcublas.so.* | libcublasLt.so.* | libnccl.so.*) return 0 ;;
  esac
  return 1
}
for f in "$dir"/bin/*; do
  while read -r soname path; do
    soname=$(basename "$soname")
    kept_from_machine "$soname" && continue
    [ -f "$dir/lib/$soname" ] && continue
    if [ -z "$path" ] || [ ! -f "$path" ]; then
      echo "bundle.sh: $(basename "$f") needs $soname, not found here" >&2
      exit 1
    fi
    cp -L "$path" "$dir/lib/$soname"
  done < <(ldd "$f" | awk '/=>/ { print $1, ($3 == "not" ? "" : $3) } !/=>/ { print $1, "" }')
done
strip --strip-unneeded "$dir"/bin/* "$dir"/lib/* 2>/dev/null || true
chmod 755 "$dir"/bin/*
chmod 644 "$dir"/lib/*

# What it was built with: check.sh compares the GPU machine's libraries and glibc with these.
versions=$("$dir/bin/gpu_libs" /usr/local/cuda/lib64)
ver() { awk -v n="$1" '$2 == n { print $3 }' <<<"$versions"; }
glibc_required=$(for f in "$dir"/bin/* "$dir"/lib/*; do objdump -T "$f" 2>/dev/null; done |
  grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n 1)
cudart=$(ldd "$dir/bin/ndmini" | awk '/libcudart/ { print $3 }')
{
  echo "BUNDLE_COMMIT=$(git -C "$repo" rev-parse --short HEAD)$(git -C "$repo" diff --quiet HEAD 2>/dev/null || echo -dirty)"
  echo "BUNDLE_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "BUNDLE_CUBLAS=$(ver cublas)"
  echo "BUNDLE_CUBLASLT=$(ver cublasLt)"
  echo "BUNDLE_NCCL=$(ver nccl)"
  echo "BUNDLE_CUDART=$(basename "$(readlink -f "$cudart")" | sed 's/libcudart.so.//')"
  echo "BUNDLE_NVCC=\"$(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')\""
  echo "BUNDLE_KOKKOS=$(sed -n 's/^set(PACKAGE_VERSION "\(.*\)")$/\1/p' "$work/kokkos-cuda/kokkos/lib/cmake/Kokkos/KokkosConfigVersion.cmake" 2>/dev/null | head -n 1)"
  echo "BUNDLE_KOKKOS_ARCH=${KOKKOS_ARCH:-HOPPER90}"
  echo "BUNDLE_CUDA_SM=${CUDA_SM:-sm_90}"
  echo "BUNDLE_CXX=\"$(${CXX:-g++} --version | sed -n 1p)\""
  echo "BUNDLE_GLIBC_REQUIRED=$glibc_required"
  echo "BUNDLE_KOKKOS_PATCHES=\"$([ -z "$patches" ] || find "$patches" -maxdepth 1 -name '*.patch' -printf '%f ' | sort)\""
} >"$dir/manifest.env"

# The larger libraries travel zstd-compressed (check.sh unpacks them outside DIR). zstd -10:
# about xz -6's size (OpenBLAS 36 MiB -> 5.3 MiB) in a tenth of its time.
for f in "$dir"/lib/*; do
  if [ "$(du -k "$f" | cut -f1)" -gt "$zstd_above_kib" ]; then zstd -q -10 -T"$jobs" --rm "$f"; fi
done
# files.txt lists every other file of the bundle with its size (not itself, which is being written).
(cd "$dir" && find . -type f ! -path ./files.txt | sort | xargs ls -l | awk '{ print $5, $9 }') >"$dir/files.txt"
size_kib=$(du -sk "$dir" | cut -f1)
step "bundle $dir: $((size_kib / 1024)) MiB, $(find "$dir" -type f | wc -l) files; built with cuBLAS $(ver cublas), NCCL $(ver nccl), glibc >= $glibc_required"
if [ "$size_kib" -gt $((60 * 1024)) ]; then
  echo "bundle.sh: the bundle is over 60 MiB (${size_kib} KiB): it will not travel to the GPU machine" >&2
  exit 1
fi
