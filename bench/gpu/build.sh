#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Builds the CUDA flavour of ndmini from Kokkos and Kokkos Kernels sources that you bring:
#   1. Kokkos with Serial + CUDA (nvcc_wrapper, lambdas) for one GPU architecture,
#   2. Kokkos Kernels (BLAS component, cuBLAS TPL) against it,
#   3. ndmini with the `cuda` preset (build-cuda/ in this checkout) against both.
# Usage: bench/gpu/build.sh KOKKOS_SRC KOKKOS_KERNELS_SRC [PREFIX]
#   PREFIX (default ./kokkos-cuda) receives build/ and the kokkos, kokkos-kernels installs;
#   a step whose install is already there is skipped, so a rerun only rebuilds ndmini.
# Environment: KOKKOS_ARCH (Kokkos_ARCH_* name, default HOPPER90), CUDA_SM (default sm_90,
#   nvcc_wrapper's default architecture, for CUDA 13, which dropped sm_70), CXX (host
#   compiler, default g++), JOBS (default: all cores), KK_ETI (ON: pre-instantiate Kokkos Kernels
#   for float; default OFF), BUILD_DIR (ndmini's build tree, default build-cuda in this checkout),
#   TARGETS (space-separated targets to build, default all), NDMINI_CMAKE_ARGS (more -D options for
#   ndmini's configure). CUDA 13 needs Kokkos 4.7.1 or later (or 4.6.99 with the local CUDA 13 patch).
set -euo pipefail

if [ $# -lt 2 ] || [ ! -f "$1/CMakeLists.txt" ] || [ ! -f "$2/CMakeLists.txt" ]; then
  echo "usage: $0 KOKKOS_SRC KOKKOS_KERNELS_SRC [PREFIX]  (two source directories with a CMakeLists.txt)" >&2
  exit 2
fi
kokkos_src=$(cd "$1" && pwd)
kernels_src=$(cd "$2" && pwd)
prefix=$(mkdir -p "${3:-kokkos-cuda}" && cd "${3:-kokkos-cuda}" && pwd)
repo=$(cd "$(dirname "$0")/../.." && pwd)
arch=${KOKKOS_ARCH:-HOPPER90}
jobs=${JOBS:-$(nproc)}
# ndmini's only Kokkos Kernels call, GEMM on float LayoutRight views, goes to cuBLAS through the
# TPL: pre-instantiating Kokkos Kernels' own float kernels (KK_ETI=ON) only costs build time.
eti=${KK_ETI:-OFF}
export NVCC_WRAPPER_DEFAULT_COMPILER=${CXX:-g++}
export NVCC_WRAPPER_DEFAULT_ARCH=${CUDA_SM:-sm_90}
command -v nvcc > /dev/null || export PATH=/usr/local/cuda/bin:$PATH

run() {
  echo "+ $*"
  "$@"
}

if [ ! -d "$prefix/kokkos/include" ]; then
  run cmake -S "$kokkos_src" -B "$prefix/build/kokkos" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_COMPILER="$kokkos_src/bin/nvcc_wrapper" -DCMAKE_CXX_STANDARD=17 -DCMAKE_CXX_EXTENSIONS=OFF \
    -DKokkos_ENABLE_SERIAL=ON -DKokkos_ENABLE_CUDA=ON -DKokkos_ENABLE_CUDA_LAMBDA=ON "-DKokkos_ARCH_${arch}=ON" \
    -DCMAKE_INSTALL_PREFIX="$prefix/kokkos"
  run cmake --build "$prefix/build/kokkos" -j "$jobs"
  run cmake --install "$prefix/build/kokkos"
fi

if [ ! -d "$prefix/kokkos-kernels/include" ]; then
  run cmake -S "$kernels_src" -B "$prefix/build/kokkos-kernels" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_COMPILER="$prefix/kokkos/bin/nvcc_wrapper" -DKokkos_ROOT="$prefix/kokkos" \
    -DCMAKE_INSTALL_PREFIX="$prefix/kokkos-kernels" \
    -DKokkosKernels_ENABLE_ALL_COMPONENTS=OFF -DKokkosKernels_ENABLE_COMPONENT_BLAS=ON \
    -DKokkosKernels_ENABLE_TPL_CUBLAS=ON -DKokkosKernels_ENABLE_TPL_BLAS=OFF \
    "-DKokkosKernels_INST_FLOAT=$eti" -DKokkosKernels_INST_DOUBLE=OFF -DKokkosKernels_INST_COMPLEX_FLOAT=OFF \
    -DKokkosKernels_INST_COMPLEX_DOUBLE=OFF -DKokkosKernels_INST_LAYOUTRIGHT=ON -DKokkosKernels_INST_LAYOUTLEFT=OFF \
    -DKokkosKernels_INST_EXECSPACE_SERIAL=OFF -DKokkosKernels_INST_EXECSPACE_CUDA=ON \
    -DKokkosKernels_INST_MEMSPACE_CUDASPACE=ON -DKokkosKernels_INST_MEMSPACE_CUDAUVMSPACE=OFF
  run cmake --build "$prefix/build/kokkos-kernels" -j "$jobs"
  run cmake --install "$prefix/build/kokkos-kernels"
fi

cd "$repo"
build_dir=${BUILD_DIR:-$repo/build-cuda}
targets=()
for t in ${TARGETS:-}; do targets+=(--target "$t"); done
# shellcheck disable=SC2086  # NDMINI_CMAKE_ARGS is a list of options
run cmake --preset cuda -B "$build_dir" -DKokkos_ROOT="$prefix/kokkos" -DKokkosKernels_ROOT="$prefix/kokkos-kernels" ${NDMINI_CMAKE_ARGS:-}
run cmake --build "$build_dir" -j "$jobs" "${targets[@]}"
echo "ndmini (CUDA, Kokkos_ARCH_${arch}) built in $build_dir; on a GPU node: ctest --test-dir $build_dir -L gpu"
