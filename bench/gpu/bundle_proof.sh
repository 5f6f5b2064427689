#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Proves, without a GPU, that a bundle of bench/gpu/bundle.sh is self-contained: in a Debian 12
# root made with `debootstrap --variant=minbase` (no MPICH, HDF5, OpenBLAS, oneDNN, UCX, Kokkos),
#   1. `ldd` of every bundled binary and library, with the bundle's library path, finds everything
#      except the driver (libcuda), cuBLAS/cuBLASLt and NCCL, and finds it in the bundle;
#   2. `check.sh --bundle` exits 2 with its message while cuBLAS and NCCL are missing;
#   3. with this machine's cuBLAS, cuBLASLt and NCCL laid out as pip's wheels lay them out
#      (nvidia/cublas/lib, nvidia/nccl/lib), its library check passes, it reaches the GPU step and
#      exits 77 (no GPU) with its message, and OUTDIR holds summary.md, figures.env, logs.tar.gz;
#   4. the bundled MPICH launches (mpiexec.hydra -n 1) the bundled ndmini (--version), and the
#      host ndmini where the bundle has one (BUNDLE_HOST=1), which trains the tiny deck to the
#      losses bundle.sh recorded (cpu/tiny_cpu.jsonl; 1e-5 relative, as ndmini picks its GEMM
#      route by timing, which a busy machine changes).
# Usage: bench/gpu/bundle_proof.sh [BUNDLE [ROOT]]
#   BUNDLE: default gpu-bundle in this checkout. ROOT: the Debian root (default
#   ${TMPDIR:-/tmp}/ndmini-bookworm-minbase), made with debootstrap when it does not exist, from
#   DEBIAN_MIRROR (default: the first Debian URI of /etc/apt/sources*). The bundle is copied to
#   ROOT/opt/bundle; ROOT is otherwise left as made (the stand-in libraries are removed at the end).
# Environment: GPU_LIBS_FROM (a folder with libcublas.so.13, libcublasLt.so.13, libnccl.so.2;
#   default /usr/local/cuda/lib64), CUDA_STUB (the toolkit's stub libcuda.so, for step 4 when
#   ndmini links the driver; default GPU_LIBS_FROM/stubs/libcuda.so).
# Exit status: 0 the proof holds; 1 it does not (what failed is printed); 77 skipped: no bundle,
#   not root (chroot needs it), no debootstrap and no ROOT, or no stand-in libraries.
set -euo pipefail
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then
  # The comment at the head of this file, less its licence line.
  sed -n '3,/^set -euo pipefail/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"
  exit 0
fi

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
readonly kSkip=77
bundle=${1:-$repo/gpu-bundle}
root=${2:-${TMPDIR:-/tmp}/ndmini-bookworm-minbase}
stand_in=${GPU_LIBS_FROM:-/usr/local/cuda/lib64}
skip() {
  echo "bundle_proof: SKIP: $*"
  exit "$kSkip"
}
fail() {
  echo "bundle_proof: FAIL: $*" >&2
  exit 1
}
[ -f "$bundle/manifest.env" ] || skip "no bundle at $bundle (bench/gpu/bundle.sh makes one)"
[ "$(id -u)" -eq 0 ] || skip "chroot needs root"
command -v chroot >/dev/null || skip "no chroot"
for f in libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
  [ -e "$stand_in/$f" ] || skip "no $stand_in/$f to stand in for the GPU machine's (set GPU_LIBS_FROM)"
done
bundle=$(cd "$bundle" && pwd)
t0=$SECONDS

if [ ! -x "$root/usr/bin/bash" ]; then
  command -v debootstrap >/dev/null || skip "no debootstrap (apt-get install debootstrap) and no Debian root at $root"
  # Only apt's own files (*.list, *.sources), those that exist: Debian 12 has no sources.list, and
  # a missing file made sed exit 2, which set -e -o pipefail turned into a silent exit 2.
  mirror=${DEBIAN_MIRROR:-$(for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ ! -f "$f" ] || sed -n 's/^URIs: *\([^ ]*debian\)$/\1/p; s/^deb \(http[^ ]*debian\) .*/\1/p' "$f"
  done | head -n 1)}
  mirror=${mirror:-http://deb.debian.org/debian}
  echo "bundle_proof: debootstrap --variant=minbase bookworm $root $mirror"
  debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.debootstrap.log" 2>&1 ||
    fail "debootstrap failed (see $root.debootstrap.log)"
  echo "bundle_proof: Debian root made in $((SECONDS - t0)) s"
fi
in_root() { chroot "$root" "$@"; }
grep -q '^12\.' "$root/etc/debian_version" || fail "$root is not Debian 12 ($(cat "$root/etc/debian_version"))"
# shellcheck disable=SC2016  # dpkg-query's own format
present=$(in_root dpkg-query -W -f '${Package}\n' |
  grep -E '^(mpich|libmpich|libhdf5|libopenblas|libblas|libdnnl|libucx|libtrilinos|libkokkos|libgfortran|zstd|xz-utils|python3)' || true)
[ -z "$present" ] || fail "the root is not bare: it has $(tr '\n' ' ' <<<"$present")"
echo "bundle_proof: the root is Debian $(cat "$root/etc/debian_version") minbase without MPICH, HDF5, OpenBLAS, oneDNN, UCX, gfortran, zstd, xz, python3"

rm -rf "$root/opt/bundle" "$root/opt/bundle-libs" "$root/tmp/proof-out" "$root/tmp/proof-run"
mkdir -p "$root/opt"
cp -a "$bundle" "$root/opt/bundle"
pip_site=$root/usr/local/lib/python3.11/dist-packages/nvidia
mounted=()
# shellcheck disable=SC2317  # called by the trap
undo() {
  local m
  rm -rf "$pip_site"
  for m in "${mounted[@]}"; do umount "$m" || true; done
}
trap undo EXIT
rm -rf "$pip_site"
# A GPU machine has /proc and /sys (MPICH's hydra and hwloc read them); mounted where this machine allows.
for fs in proc sysfs; do
  m=$root/${fs%fs}
  [ "$fs" = sysfs ] && m=$root/sys
  if ! mountpoint -q "$m" && mount -t "$fs" "$fs" "$m" 2>/dev/null; then mounted+=("$m"); fi
  mountpoint -q "$m" || echo "bundle_proof: note: no ${m#"$root"} in the root (mount refused)"
done

# 1. ldd in the root: the compressed libraries unpacked as check.sh does, with the bundled zstd.
mkdir -p "$root/opt/bundle-libs"
for f in "$root"/opt/bundle/lib/*.zst; do
  [ -f "$f" ] || continue
  in_root env LD_LIBRARY_PATH=/opt/bundle/lib /opt/bundle/bin/zstd -q -d -c "/opt/bundle/lib/$(basename "$f")" \
    >"$root/opt/bundle-libs/$(basename "$f" .zst)" || fail "the bundled zstd could not unpack $(basename "$f") in the root"
done
allowed='^(libcuda\.so\.1|libcublas\.so\.13|libcublasLt\.so\.13|libnccl\.so\.2)$'
checked=0 unresolved_all=""
for f in "$root"/opt/bundle/bin/* "$root"/opt/bundle/lib/* "$root"/opt/bundle-libs/*; do
  case "$f" in *.zst) continue ;; esac
  rel=${f#"$root"}
  lrc=0
  out=$(in_root env LD_LIBRARY_PATH=/opt/bundle-libs:/opt/bundle/lib ldd "$rel" 2>&1) || lrc=$?
  if [ "$lrc" -ne 0 ]; then
    grep -q 'not a dynamic executable' <<<"$out" && continue
    fail "ldd $rel in the root exited $lrc: $out"
  fi
  checked=$((checked + 1))
  unresolved=$(awk '/not found/ { print $1 }' <<<"$out")
  bad=$(grep -vE "$allowed" <<<"$unresolved" || true)
  [ -z "$bad" ] || fail "ldd $rel in the root: not found: $(tr '\n' ' ' <<<"$bad")"
  # Everything found must come from the bundle, or be glibc's own.
  foreign=$(awk '/=> \// { print $3 }' <<<"$out" | grep -vE '^/opt/bundle' |
    grep -vE '/(libc|libm|libdl|libpthread|librt|libutil|libresolv|libmvec|ld-linux-x86-64)\.so' || true)
  [ -z "$foreign" ] || fail "ldd $rel in the root takes from the root: $(tr '\n' ' ' <<<"$foreign")"
  unresolved_all="$unresolved_all $unresolved"
done
missing_set=$(tr ' ' '\n' <<<"$unresolved_all" | sort -u | grep . | tr '\n' ' ' || true)
echo "bundle_proof: 1. ldd of $checked bundled files in the root: everything resolves in the bundle or glibc;" \
  "not found only: ${missing_set:-nothing}(the GPU machine's)"

# 2. check.sh --bundle without cuBLAS/NCCL: exit 2 and the message.
rc=0
in_root /opt/bundle/check.sh --bundle /opt/bundle /tmp/proof-out >"$root/tmp/proof-check1.log" 2>&1 || rc=$?
[ "$rc" -eq 2 ] || { cat "$root/tmp/proof-check1.log"; fail "check.sh --bundle without cuBLAS/NCCL exited $rc, not 2"; }
if ! grep -q 'library check FAILED' "$root/tmp/proof-check1.log" || ! grep -q 'libcublas.so.13 not found' "$root/tmp/proof-check1.log"; then
  cat "$root/tmp/proof-check1.log"
  fail "check.sh --bundle exited 2 without saying which library is missing"
fi
echo "bundle_proof: 2. without cuBLAS/NCCL: exit 2, \"$(grep -m1 -o 'library check FAILED: [^;]*' "$root/tmp/proof-check1.log")\""

# 3. with the stand-ins where pip puts them: the library check passes, then exit 77 at the GPU step.
mkdir -p "$pip_site/cublas/lib" "$pip_site/nccl/lib"
for f in libcublas.so.13 libcublasLt.so.13; do ln "$(readlink -f "$stand_in/$f")" "$pip_site/cublas/lib/$f" 2>/dev/null ||
  cp -L "$stand_in/$f" "$pip_site/cublas/lib/$f"; done
ln "$(readlink -f "$stand_in/libnccl.so.2")" "$pip_site/nccl/lib/libnccl.so.2" 2>/dev/null ||
  cp -L "$stand_in/libnccl.so.2" "$pip_site/nccl/lib/libnccl.so.2"
rm -rf "$root/tmp/proof-out"
rc=0
t_check=$SECONDS
in_root /opt/bundle/check.sh --bundle /opt/bundle /tmp/proof-out >"$root/tmp/proof-check2.log" 2>&1 || rc=$?
[ "$rc" -eq "$kSkip" ] || { cat "$root/tmp/proof-check2.log"; fail "check.sh --bundle with the libraries exited $rc, not 77"; }
summary=$root/tmp/proof-out/summary.md
if ! grep -q 'library check passed' "$summary" || ! grep -q 'no NVIDIA GPU' "$summary"; then
  cat "$summary"
  fail "check.sh --bundle exited 77 without passing the library check first"
fi
files=$(cd "$root/tmp/proof-out" && ls)
if [ "$(wc -l <<<"$files")" -gt 8 ] || [ ! -f "$root/tmp/proof-out/logs.tar.gz" ] || [ ! -f "$root/tmp/proof-out/figures.env" ]; then
  fail "OUTDIR holds $(tr '\n' ' ' <<<"$files") (want summary.md, figures.env, logs.tar.gz)"
fi
echo "bundle_proof: 3. with cuBLAS/NCCL in nvidia/*/lib: library check passed, exit 77 at the GPU step in $((SECONDS - t_check)) s;" \
  "OUTDIR: $(tr '\n' ' ' <<<"$files")"
grep -E 'library check passed|no NVIDIA GPU' "$summary" | sed 's/^/    /'

# 4. The bundled MPICH launches the bundled CUDA ndmini (its --version needs no GPU) and, when the
# bundle has one (BUNDLE_HOST=1), the host ndmini through the tiny deck to the losses recorded
# (within 1e-5: the GEMM route is chosen by timing).
mkdir -p "$root/tmp/proof-run"
lib_path=/opt/bundle-libs:/opt/bundle/lib:/usr/local/lib/python3.11/dist-packages/nvidia/cublas/lib:/usr/local/lib/python3.11/dist-packages/nvidia/nccl/lib
launch="/opt/bundle/bin/mpiexec.hydra -launcher fork -n 1"
# A CUDA ndmini links the driver (Kokkos does): the toolkit's stub libcuda stands in for it here.
stub=${CUDA_STUB:-$stand_in/stubs/libcuda.so}
ndmini_libs=$(in_root env LD_LIBRARY_PATH="$lib_path" ldd /opt/bundle/bin/ndmini)
if grep -q 'libcuda.so.1 => not found' <<<"$ndmini_libs"; then
  [ -f "$stub" ] || fail "ndmini needs libcuda.so.1 and there is no stub at $stub to stand in for the driver (CUDA_STUB)"
  mkdir -p "$pip_site/driver-stub"
  cp "$stub" "$pip_site/driver-stub/libcuda.so.1"
  lib_path=$lib_path:${pip_site#"$root"}/driver-stub
  echo "bundle_proof:    (ndmini links libcuda.so.1: the CUDA toolkit's stub stands in for the driver)"
fi
rc=0
in_root env LD_LIBRARY_PATH="$lib_path" bash -c "cd /tmp/proof-run && $launch /opt/bundle/bin/ndmini --version" \
  >"$root/tmp/proof-mpiexec.log" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || { tail -n 30 "$root/tmp/proof-mpiexec.log"; fail "mpiexec.hydra -n 1 ndmini --version in the root exited $rc"; }
echo "bundle_proof: 4. mpiexec.hydra -n 1 ndmini --version in the root: $(grep -m1 ndmini "$root/tmp/proof-mpiexec.log")"
if [ -x "$root/opt/bundle/bin/ndmini-host" ]; then
  rc=0
  in_root env LD_LIBRARY_PATH="$lib_path" bash -c "cd /tmp/proof-run && $launch /opt/bundle/bin/ndmini-host train \
    /opt/bundle/inputs/tiny.toml --set train.log_every=1 --set checkpoint.every=0 --metrics /tmp/proof-run/tiny.jsonl" \
    >"$root/tmp/proof-host.log" 2>&1 || rc=$?
  [ "$rc" -eq 0 ] || { tail -n 30 "$root/tmp/proof-host.log"; fail "mpiexec.hydra -n 1 ndmini-host train in the root exited $rc"; }
  "$repo/bench/gpu/check.sh" --compare-losses "$root/tmp/proof-run/tiny.jsonl" "$bundle/cpu/tiny_cpu.jsonl" 1e-5 ||
    fail "the host ndmini in the root does not reproduce the bundle's CPU losses"
  echo "bundle_proof:    and ndmini-host trains the tiny deck in the root to the losses recorded (1e-5: the GEMM route is chosen by timing)"
fi
echo "bundle_proof: PASS in $((SECONDS - t0)) s"
