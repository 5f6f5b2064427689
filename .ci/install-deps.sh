#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Installs what ndmini needs on Debian 12 from Debian's own packages
# (Kokkos 3.4 comes inside Trilinos). Runs as root, or through sudo.
# --tests: also what the test suite's independent reference needs (PyTorch
# and h5py for tests/cli/pytorch_reference.sh, which skips without them).
set -euo pipefail
packages=(
  g++ cmake ninja-build pkg-config clang-format
  time  # GNU time: the peak memory of refused inputs (tests/cli/bad_files.sh)
  mpich libmpich-dev
  libhdf5-mpich-dev hdf5-tools
  libtrilinos-kokkos-dev libtrilinos-kokkos-kernels-dev libopenblas-dev
  libdnnl-dev ocl-icd-opencl-dev  # oneDNN (bf16 products); its CMake package needs the OpenCL headers
  libtomlplusplus-dev libcli11-dev nlohmann-json3-dev
  libgtest-dev libbenchmark-dev
  python3  # bench/scaling and its ctest -L harness tests (matplotlib optional: the figure)
)
case "${1:-}" in
  --tests) packages+=(python3-torch python3-h5py python3-numpy) ;;
  "") ;;
  *)
    echo "install-deps.sh: unknown option '$1' (--tests: also the test suite's PyTorch reference)" >&2
    exit 2
    ;;
esac
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
