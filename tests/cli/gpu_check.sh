#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# bench/gpu/check.sh's paths that need no GPU: usage errors, the no-GPU exit
# (77, with a summary saying so), the dry run's plan, the loss comparison
# (within 1e-5 relative passes, beyond fails), and --bundle's library check on a
# stand-in bundle (stand-in cuBLAS, cuBLASLt and NCCL: found, the wrong major
# version, a bundled library missing). Case: $1.
source "$(dirname "$0")/lib.sh"
check=$SOURCE_DIR/bench/gpu/check.sh

# metrics FILE LOSS...: a metrics file with one step record per loss, and a summary line.
metrics() {
  local file=$1 step=0
  shift
  : >"$file"
  for l in "$@"; do
    echo "{\"comm\":{},\"grad_norm\":1.0,\"loss\":$l,\"lr\":0.001,\"step\":$step,\"step_ms\":2.5}" >>"$file"
    step=$((step + 1))
  done
  echo '{"final_loss":1.0,"steps":3,"summary":true}' >>"$file"
}

case "$1" in
  usage)
    rc=0
    "$check" >out.txt 2>&1 || rc=$?
    [ "$rc" -eq 2 ] || fail "no OUTDIR: expected exit 2, got $rc"
    grep -q "OUTDIR is missing" out.txt || fail "no OUTDIR: message missing"
    rc=0
    "$check" o --steps x >out.txt 2>&1 || rc=$?
    [ "$rc" -eq 2 ] && grep -q -- "--steps must be" out.txt || fail "bad --steps: expected exit 2 and a message"
    rc=0
    "$check" o --kokkos-src /nowhere >out.txt 2>&1 || rc=$?
    [ "$rc" -eq 2 ] && grep -q -- "go together" out.txt || fail "--kokkos-src alone: expected exit 2"
    echo "ok: usage errors exit 2 with a message"
    ;;
  no_gpu)
    rc=0
    NDMINI_CHECK_NO_GPU=1 "$check" out >out.txt 2>&1 || rc=$?
    cat out.txt
    [ "$rc" -eq 77 ] || fail "without a GPU: expected exit 77, got $rc"
    grep -q "no NVIDIA GPU" out/summary.md || fail "summary.md does not say there is no GPU"
    grep -qx "status=skipped_no_gpu" out/figures.env || fail "figures.env lacks status=skipped_no_gpu"
    echo "ok: exit 77, summary and figures say why"
    ;;
  dry_run)
    NDMINI_CHECK_NO_GPU=1 "$check" out --dry-run --build-dir "$WORK/no-build" --kokkos-prefix /opt/kc \
      --cpu-build "$WORK/no-cpu" >out.txt 2>&1 || fail "the dry run failed: $(cat out.txt)"
    cat out.txt
    for want in "cmake -S $SOURCE_DIR -B $WORK/no-build --preset cuda -DKokkos_ROOT=/opt/kc/kokkos" \
      "ctest --test-dir $WORK/no-build -L gpu" "-L unit -LE large" "$WORK/no-build/miniapp/ndmini train" \
      "$WORK/no-cpu/miniapp/ndmini train" "--compare-losses" "model.seq_len=1024" "train.precision=fp32" \
      "train.precision=bf16" "gpt2_t1024_bf16"; do
      grep -qF -- "$want" out.txt || fail "the plan lacks: $want"
    done
    grep -q "dry run done (nothing ran)" out.txt || fail "no closing line"
    [ ! -e "$WORK/no-build/CMakeCache.txt" ] || fail "the dry run configured something"
    echo "ok: the plan names every stage"
    ;;
  compare)
    metrics gpu.jsonl 5.5451774597167969 4.2000000001 3.1
    metrics cpu.jsonl 5.5451774597167969 4.2000000000 3.1000149
    "$check" --compare-losses gpu.jsonl cpu.jsonl >out.txt 2>&1 || fail "within 1e-5 must pass: $(cat out.txt)"
    grep -q "steps compared 3" out.txt || fail "expected 3 steps compared: $(cat out.txt)"
    metrics far.jsonl 5.5451774597167969 4.2001 3.1
    rc=0
    "$check" --compare-losses far.jsonl cpu.jsonl >out.txt 2>&1 || rc=$?
    cat out.txt
    [ "$rc" -eq 1 ] || fail "a 2.4e-5 difference must fail"
    grep -q "step 1:" out.txt || fail "the failing step is not named"
    metrics short.jsonl 5.5451774597167969 4.2
    rc=0
    "$check" --compare-losses short.jsonl cpu.jsonl >out.txt 2>&1 || rc=$?
    [ "$rc" -eq 1 ] || fail "a run with fewer steps must fail"
    echo "ok: the comparison passes within 1e-5 and fails beyond, or on missing steps"
    ;;
  bundle)
    # A stand-in bundle: the real gpu_libs and zstd, a program that needs a library found only
    # zstd-compressed in lib/, and stand-in GPU libraries that answer the version queries.
    for tool in cc zstd ldd; do command -v "$tool" >/dev/null || { echo "no $tool: skipped"; exit 77; }; done
    b=$WORK/bundle gpu=$WORK/site/nvidia/cublas/lib nccl=$WORK/site/nvidia/nccl/lib
    mkdir -p "$b/bin" "$b/lib" "$b/inputs" "$b/cpu" "$gpu" "$nccl"
    cc -O1 -o "$b/bin/gpu_libs" "$SOURCE_DIR/bench/gpu/gpu_libs.c" -ldl
    cp "$(command -v zstd)" "$b/bin/zstd"
    echo 'int ndmini_fake(void) { return 7; }' >fake.c
    cc -shared -fPIC -Wl,-soname,libndmini_fake.so.1 -o libndmini_fake.so.1 fake.c
    echo 'int ndmini_fake(void); int main(void) { return ndmini_fake() == 7 ? 0 : 1; }' >uses.c
    cc -o "$b/bin/uses_fake" uses.c ./libndmini_fake.so.1
    zstd -q -c libndmini_fake.so.1 >"$b/lib/libndmini_fake.so.1.zst"
    echo 'int cublasGetProperty(int t, int* v) { *v = t == 0 ? 13 : t == 1 ? 1 : 0; return 0; }' >cublas.c
    echo 'unsigned long cublasLtGetVersion(void) { return 130100; }' >cublaslt.c
    echo 'int ncclGetVersion(int* v) { *v = 22809; return 0; }' >nccl.c
    cc -shared -fPIC -o "$gpu/libcublas.so.13" cublas.c
    cc -shared -fPIC -o "$gpu/libcublasLt.so.13" cublaslt.c
    cc -shared -fPIC -o "$nccl/libnccl.so.2" nccl.c
    printf '%s\n' BUNDLE_COMMIT=test BUNDLE_DATE=now BUNDLE_CUBLAS=13.1.0 BUNDLE_CUBLASLT=13.1.0 BUNDLE_NCCL=2.28.9 \
      BUNDLE_GLIBC_REQUIRED=2.17 >"$b/manifest.env"
    export NDMINI_GPU_LIB_PATH=$gpu:$nccl

    # Found, as built: the library check passes, then no GPU (forced here): 77, three files.
    rc=0
    NDMINI_CHECK_NO_GPU=1 "$check" --bundle "$b" out >out.txt 2>&1 || rc=$?
    cat out.txt
    [ "$rc" -eq 77 ] || fail "stand-ins as built: expected exit 77, got $rc"
    grep -q "library check passed" out/summary.md || fail "summary.md does not say the library check passed"
    grep -q "cublas    13.1.0   $gpu/libcublas.so.13  (as built)" out.txt || fail "the stand-in cuBLAS is not the one found"
    grep -qx "nccl_version=2.28.9" out/figures.env || fail "figures.env lacks nccl_version=2.28.9"
    grep -qx "status=skipped_no_gpu" out/figures.env || fail "figures.env lacks status=skipped_no_gpu"
    [ "$(cd out && ls | tr '\n' ' ')" = "figures.env logs.tar.gz summary.md " ] || fail "OUTDIR holds: $(ls out)"
    tar -tzf out/logs.tar.gz | grep -q logs/gpu_libs.log || fail "logs.tar.gz lacks logs/gpu_libs.log"

    # Another major version of NCCL: exit 2, named.
    sed -i 's/^BUNDLE_NCCL=.*/BUNDLE_NCCL=3.0.0/' "$b/manifest.env"
    rc=0
    NDMINI_CHECK_NO_GPU=1 "$check" --bundle "$b" out2 >out.txt 2>&1 || rc=$?
    cat out.txt
    [ "$rc" -eq 2 ] || fail "NCCL of another major version: expected exit 2, got $rc"
    grep -q "library check FAILED.*MAJOR VERSION DIFFERS: the bundle was built with 3.0.0" out2/summary.md ||
      fail "the summary does not name the version that differs"
    grep -qx "status=failed_libraries" out2/figures.env || fail "figures.env lacks status=failed_libraries"
    sed -i 's/^BUNDLE_NCCL=.*/BUNDLE_NCCL=2.28.9/' "$b/manifest.env"

    # A glibc older than the bundle needs: exit 2, naming both.
    sed -i 's/^BUNDLE_GLIBC_REQUIRED=.*/BUNDLE_GLIBC_REQUIRED=99.1/' "$b/manifest.env"
    rc=0
    NDMINI_CHECK_NO_GPU=1 "$check" --bundle "$b" out4 >out.txt 2>&1 || rc=$?
    [ "$rc" -eq 2 ] && grep -q "the bundle needs 99.1 or later" out4/summary.md ||
      fail "an old glibc: expected exit 2 naming the version needed, got $rc: $(cat out.txt)"
    sed -i 's/^BUNDLE_GLIBC_REQUIRED=.*/BUNDLE_GLIBC_REQUIRED=2.17/' "$b/manifest.env"

    # A bundled library missing (the compressed one removed): exit 2, naming the program and the library.
    rm "$b/lib/libndmini_fake.so.1.zst"
    rc=0
    NDMINI_CHECK_NO_GPU=1 "$check" --bundle "$b" out3 >out.txt 2>&1 || rc=$?
    cat out.txt
    [ "$rc" -eq 2 ] || fail "a bundled library missing: expected exit 2, got $rc"
    grep -q "ldd: uses_fake: libndmini_fake.so.1" out3/summary.md || fail "the summary does not name the missing library"
    echo "ok: --bundle finds the GPU libraries by folder, unpacks the bundle's, and exits 2 naming what is missing or differs"
    ;;
  *) fail "unknown case $1" ;;
esac
