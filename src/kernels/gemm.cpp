// SPDX-License-Identifier: BSD-3-Clause
// The dense layers and ndmini's GEMM wrapper: every matrix product of the
// model goes through gemm() / gemm_strided_batched() here. A CUDA build with
// cuBLAS (NDMINI_HAVE_CUBLAS) calls cublasGemmEx / cublasGemmStridedBatchedEx
// on Kokkos' CUDA stream with one handle per process; every other build
// calls KokkosBlas::gemm (BLAS on the host), or oneDNN's matmul for the
// classes of products use_onednn_fp32 below sends there in a build with oneDNN.
// bf16 products (gemm_bf16*) go to cuBLAS (CUDA_R_16BF, fp32 accumulation)
// or oneDNN, or are emulated through the fp32 route (no oneDNN in the build,
// or none of its bf16 products on this CPU).
#include <string>
#include <type_traits>

#include "kernels/kernels.hpp"

#if defined(KOKKOS_ENABLE_CUDA) && defined(NDMINI_HAVE_CUBLAS)
#define NDMINI_GEMM_CUBLAS 1
#include <type_traits>

#include "kernels/gemm_cublas.hpp"
#else
#include <KokkosBlas3_gemm.hpp>
#endif
#include "kernels/gemm_library.hpp"
#ifdef NDMINI_HAVE_ONEDNN
#include "kernels/gemm_onednn.hpp"
#endif
#ifdef NDMINI_HOST_PANELS
#include <algorithm>
// The Fortran BLAS that Kokkos Kernels links (column-major).
extern "C" void F77_BLAS_MANGLE(sgemm, SGEMM)(const char* transa, const char* transb, const int* m, const int* n,
                                              const int* k, const float* alpha, const float* a, const int* lda,
                                              const float* b, const int* ldb, const float* beta, float* c,
                                              const int* ldc);
#endif

#include "core/error.hpp"

namespace ndmini::kernels {
namespace {

using Range = Kokkos::RangePolicy<ExecSpace>;

bool transposed(const char* t) { return t[0] == 'T' || t[0] == 't'; }

HostGemmRoute g_route = HostGemmRoute::by_shape;

// Shapes must agree: cuBLAS would read past a too-small operand. Cheap
// integer checks; the message is built only when one fails.
template <class A, class B, class C>
void check_shapes(const char* transa, const char* transb, const A& a, const B& b, const C& c) {
  const std::size_t m = c.extent(0), n = c.extent(1);
  const std::size_t am = transposed(transa) ? a.extent(1) : a.extent(0);
  const std::size_t ak = transposed(transa) ? a.extent(0) : a.extent(1);
  const std::size_t bk = transposed(transb) ? b.extent(1) : b.extent(0);
  const std::size_t bn = transposed(transb) ? b.extent(0) : b.extent(1);
  if (am != m || bn != n || ak != bk)
    throw InternalError("gemm: op(A) is " + std::to_string(am) + "x" + std::to_string(ak) + ", op(B) " +
                        std::to_string(bk) + "x" + std::to_string(bn) + ", C " + std::to_string(m) + "x" +
                        std::to_string(n));
}

#ifdef NDMINI_GEMM_CUBLAS
static_assert(std::is_same_v<ExecSpace, Kokkos::Cuda>, "cuBLAS products run on Kokkos' CUDA execution space");

template <class View>
cublas::Operand operand(const View& x, std::size_t stride) {
  return {x.data(), static_cast<int>(x.stride(0)), static_cast<long long>(stride)};
}

// The handle goes when Kokkos finalizes (before the CUDA context does).
void release_handle_at_finalize() {
  static const bool hooked = [] {
    Kokkos::push_finalize_hook(cublas::release_handle);
    return true;
  }();
  (void)hooked;
}

// On Kokkos' stream, so products and kernels stay in issue order.
void product(const char* transa, const char* transb, real alpha, ConstSlice2D a, std::size_t stride_a, ConstSlice2D b,
             std::size_t stride_b, real beta, Slice2D c, std::size_t stride_c, int count, GemmClass) {
  release_handle_at_finalize();
  const int k = static_cast<int>(transposed(transa) ? a.extent(0) : a.extent(1));
  cublas::gemm(ExecSpace().cuda_stream(), transa[0], transb[0], static_cast<int>(c.extent(0)),
               static_cast<int>(c.extent(1)), k, alpha, operand(a, stride_a), operand(b, stride_b), beta, c.data(),
               static_cast<int>(c.stride(0)), static_cast<long long>(stride_c), count);
}
#else
#ifdef NDMINI_HAVE_ONEDNN
onednn::Operand operand(const void* data, int ld, std::size_t stride) {
  return {data, ld, static_cast<long long>(stride)};
}

// fp32 through oneDNN instead of BLAS? Per class of products (the Linear
// layers' single products, the heads' batched ones), as the start-up
// calibration chose by timing both on the run's shapes (run/calibration.cpp)
// or the deck forced (perf.gemm_route); BLAS until then. One choice per
// class for the whole run, the same on every rank (the calibration agrees
// on it), so every rank of a layout takes the same route.
bool use_onednn_fp32(GemmClass cls) {
  if (g_route != HostGemmRoute::by_shape) return g_route == HostGemmRoute::onednn;
  return gemm_library(cls, false) == GemmLibrary::onednn;
}
#endif

#ifdef NDMINI_HOST_PANELS
// Each matrix of C cut along its longer side into an even number of
// panels (so two threads, or four, share them evenly) of about kPanel rows
// (or columns): sizes that follow from the shape alone. Every panel repacks
// the operand it shares with the others, which costs about 1 / kPanel of
// the product: large panels keep one thread's loss small.
constexpr int kPanel = 256, kMaxPanels = 16;

struct Panels {
  bool rows;  // row panels of C (else column panels)
  int size, count;
};

Panels panels_of(int m, int n) {
  const bool rows = m >= n;
  const int extent = rows ? m : n;
  int count = std::min(kMaxPanels, (extent + kPanel - 1) / kPanel);
  if (count > 1) count += count % 2;
  const int size = std::max(1, ((extent + count - 1) / count + 15) / 16 * 16);
  return {rows, size, (extent + size - 1) / size};
}

// fp32 products on a threaded host backend: every panel of C is one
// single-thread BLAS call on one of Kokkos' threads, so the rank's threads
// share the product without a second thread pool beside Kokkos' (BLAS runs
// on one thread, use_rank_threads()), and every element of C comes from the
// same call on the same panel whatever the thread count: the bits do not
// depend on it. The Fortran BLAS directly: KokkosBlas::gemm may launch
// kernels of its own, which a parallel region must not.
void product_in_panels(const char* transa, const char* transb, real alpha, ConstSlice2D a, std::size_t stride_a,
                       ConstSlice2D b, std::size_t stride_b, real beta, Slice2D c, std::size_t stride_c, int count) {
  use_rank_threads();
  const bool ta = transposed(transa), tb = transposed(transb);
  const char op_a = ta ? 'T' : 'N', op_b = tb ? 'T' : 'N';
  const int m = static_cast<int>(c.extent(0)), n = static_cast<int>(c.extent(1));
  const int k = static_cast<int>(ta ? a.extent(0) : a.extent(1));
  const int lda = std::max<int>(1, a.stride(0)), ldb = std::max<int>(1, b.stride(0)),
            ldc = std::max<int>(1, c.stride(0));
  const Panels p = panels_of(m, n);
  const real* ap = a.data();
  const real* bp = b.data();
  real* cp = c.data();
  Kokkos::parallel_for("ndmini::gemm_panels", Range(0, count * p.count), [=](const int task) {
    const int i = task / p.count, first = task % p.count * p.size;
    const int len = std::min(p.size, (p.rows ? m : n) - first);
    const real* ai = ap + i * stride_a;
    const real* bi = bp + i * stride_b;
    real* ci = cp + i * stride_c;
    int pm = m, pn = n;
    if (p.rows) {
      ai += ta ? first : static_cast<std::size_t>(first) * lda;
      ci += static_cast<std::size_t>(first) * ldc;
      pm = len;
    } else {
      bi += tb ? static_cast<std::size_t>(first) * ldb : first;
      ci += first;
      pn = len;
    }
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
    F77_BLAS_MANGLE(sgemm, SGEMM)(&op_b, &op_a, &pn, &pm, &k, &alpha, bi, &ldb, ai, &lda, &beta, ci, &ldc);
  });
}
#endif

void product(const char* transa, const char* transb, real alpha, ConstSlice2D a, std::size_t stride_a, ConstSlice2D b,
             std::size_t stride_b, real beta, Slice2D c, std::size_t stride_c, int count, GemmClass cls) {
#ifdef NDMINI_HAVE_ONEDNN
  const std::size_t k = transposed(transa) ? a.extent(0) : a.extent(1);
  if (use_onednn_fp32(cls)) {
    use_rank_threads();
    onednn::gemm(transa[0], transb[0], static_cast<int>(c.extent(0)), static_cast<int>(c.extent(1)),
                 static_cast<int>(k), alpha, onednn::Type::f32, operand(a.data(), a.stride(0), stride_a),
                 operand(b.data(), b.stride(0), stride_b), beta, onednn::Type::f32,
                 {c.data(), static_cast<int>(c.stride(0)), static_cast<long long>(stride_c)}, count);
    return;
  }
#endif
  (void)cls;
#ifdef NDMINI_HOST_PANELS
  product_in_panels(transa, transb, alpha, a, stride_a, b, stride_b, beta, c, stride_c, count);
  return;
#endif
  // One BLAS call per matrix: on a CPU core a batch gains nothing over a loop.
  for (int i = 0; i < count; ++i) {
    const ConstSlice2D ai(a.data() + i * stride_a, a.extent(0), a.extent(1));
    const ConstSlice2D bi(b.data() + i * stride_b, b.extent(0), b.extent(1));
    const Slice2D ci(c.data() + i * stride_c, c.extent(0), c.extent(1));
    KokkosBlas::gemm(transa, transb, alpha, ai, bi, beta, ci);
  }
}
#endif

// A [1, n] row of ones for column sums, kept between calls and grown when
// needed: allocating it per call would cost a cudaMalloc and a cudaFree (a
// device-wide synchronisation) per bias gradient on a GPU. Released when
// Kokkos finalizes, as no View may outlive it.
View1D& ones_buffer() {
  static View1D ones;
  return ones;
}
ConstSlice2D ones_row(std::size_t n) {
  View1D& ones = ones_buffer();
  if (ones.extent(0) < n) {
    static const bool hooked = [] {
      Kokkos::push_finalize_hook([] { ones_buffer() = View1D(); });
      return true;
    }();
    (void)hooked;
    ones = View1D(Kokkos::view_alloc(Kokkos::WithoutInitializing, "ndmini::ones"), n);
    Kokkos::deep_copy(ones, real(1));
  }
  return ConstSlice2D(ones.data(), 1, n);
}

// ---- bf16 products ----------------------------------------------------------

#if !defined(NDMINI_GEMM_CUBLAS)
// The elements a strided batch of `count` matrices spans.
template <class V>
std::size_t batch_span(const V& x, std::size_t stride, int count) {
  return count > 0 ? (count - 1) * stride + x.span() : 0;
}

// Emulation where oneDNN has no bf16 product: widen bf16 to fp32 (exact),
// multiply with the fp32 route, which accumulates in fp32 as oneDNN and cuBLAS do.
// The widened A, B (and C) of a product share one buffer kept for the process,
// grown to the largest product (the memory estimate counts it:
// emulated_linear_floats) and released when Kokkos finalizes.
View1D& widen_buffer() {
  static View1D buffer;
  return buffer;
}
real* widen_workspace(std::size_t n) {
  View1D& buffer = widen_buffer();
  if (buffer.extent(0) < n) {
    static const bool hooked = [] {
      Kokkos::push_finalize_hook([] { widen_buffer() = View1D(); });
      return true;
    }();
    (void)hooked;
    buffer = View1D();  // the old one freed first: the two never live together
    buffer = uninitialized("ndmini::bf16_widened", n);
  }
  return buffer.data();
}
void widen_into(real* out, const bf16* x, std::size_t n) {
  Kokkos::parallel_for(
      "ndmini::bf16_widen", Range(0, n), KOKKOS_LAMBDA(const std::size_t i) { out[i] = static_cast<real>(x[i]); });
}
#endif

template <class CView>
void bf16_product(const char* transa, const char* transb, real alpha, ConstBf16Slice2D a, std::size_t stride_a,
                  ConstBf16Slice2D b, std::size_t stride_b, real beta, CView c, std::size_t stride_c, int count,
                  GemmClass cls) {
  check_shapes(transa, transb, a, b, c);
  if (count <= 0) return;
  constexpr bool bf16_out = std::is_same_v<typename CView::non_const_value_type, bf16>;
#if defined(NDMINI_GEMM_CUBLAS)
  release_handle_at_finalize();
  const int k = static_cast<int>(transposed(transa) ? a.extent(0) : a.extent(1));
  cublas::gemm(ExecSpace().cuda_stream(), transa[0], transb[0], static_cast<int>(c.extent(0)),
               static_cast<int>(c.extent(1)), k, alpha, cublas::Type::bf16, operand(a, stride_a), operand(b, stride_b),
               beta, bf16_out ? cublas::Type::bf16 : cublas::Type::f32, c.data(), static_cast<int>(c.stride(0)),
               static_cast<long long>(stride_c), count);
  (void)cls;
#else
#if defined(NDMINI_HAVE_ONEDNN)  // never with cuBLAS: the build links oneDNN for host memory only
  if (gemm_library(cls, true) == GemmLibrary::onednn) {
    const int k = static_cast<int>(transposed(transa) ? a.extent(0) : a.extent(1));
    use_rank_threads();
    onednn::gemm(transa[0], transb[0], static_cast<int>(c.extent(0)), static_cast<int>(c.extent(1)), k, alpha,
                 onednn::Type::bf16, operand(a.data(), a.stride(0), stride_a), operand(b.data(), b.stride(0), stride_b),
                 beta, bf16_out ? onednn::Type::bf16 : onednn::Type::f32,
                 {c.data(), static_cast<int>(c.stride(0)), static_cast<long long>(stride_c)}, count);
    return;
  }
#endif
  // The class picks the fp32 route of the emulation.
  const std::size_t na = batch_span(a, stride_a, count), nb = batch_span(b, stride_b, count);
  const std::size_t nc = bf16_out ? batch_span(c, stride_c, count) : 0;
  real* const wa = widen_workspace(na + nb + nc);
  real* const wb = wa + na;
  widen_into(wa, a.data(), na);
  widen_into(wb, b.data(), nb);
  const ConstSlice2D fa(wa, a.extent(0), a.extent(1)), fb(wb, b.extent(0), b.extent(1));
  if constexpr (bf16_out) {
    // C widened too (beta may read it), multiplied in fp32, rounded once.
    real* const wc = wb + nb;
    if (beta != 0) widen_into(wc, c.data(), nc);
    product(transa, transb, alpha, fa, stride_a, fb, stride_b, beta, Slice2D(wc, c.extent(0), c.extent(1)), stride_c,
            count, cls);
    // Only the matrices' own elements: what lies between them belongs to someone else.
    bf16* cp = c.data();
    const real* wcp = wc;
    const std::size_t rows = c.extent(0), cols = c.extent(1), ld = c.stride(0);
    Kokkos::parallel_for(
        "ndmini::bf16_narrow", Range(0, count * rows * cols), KOKKOS_LAMBDA(const std::size_t i) {
          const std::size_t at = i / (rows * cols) * stride_c + i % (rows * cols) / cols * ld + i % cols;
          cp[at] = bf16(wcp[at]);
        });
  } else {
    product(transa, transb, alpha, fa, stride_a, fb, stride_b, beta, c, stride_c, count, cls);
  }
#endif
}

}  // namespace

void set_host_gemm_route(HostGemmRoute route) { g_route = route; }

void release_emulated_bf16() {
#if !defined(NDMINI_GEMM_CUBLAS)
  widen_buffer() = View1D();
#endif
}

void gemm_bf16(const char* transa, const char* transb, real alpha, ConstBf16Slice2D a, ConstBf16Slice2D b, real beta,
               Slice2D c) {
  bf16_product(transa, transb, alpha, a, 0, b, 0, beta, c, 0, 1, GemmClass::linear);
}
void gemm_bf16(const char* transa, const char* transb, real alpha, ConstBf16Slice2D a, ConstBf16Slice2D b, real beta,
               Bf16Slice2D c) {
  bf16_product(transa, transb, alpha, a, 0, b, 0, beta, c, 0, 1, GemmClass::linear);
}
void gemm_bf16_strided_batched(const char* transa, const char* transb, real alpha, ConstBf16Slice2D a,
                               std::size_t stride_a, ConstBf16Slice2D b, std::size_t stride_b, real beta, Slice2D c,
                               std::size_t stride_c, int count) {
  bf16_product(transa, transb, alpha, a, stride_a, b, stride_b, beta, c, stride_c, count, GemmClass::heads);
}
void gemm_bf16_strided_batched(const char* transa, const char* transb, real alpha, ConstBf16Slice2D a,
                               std::size_t stride_a, ConstBf16Slice2D b, std::size_t stride_b, real beta, Bf16Slice2D c,
                               std::size_t stride_c, int count) {
  bf16_product(transa, transb, alpha, a, stride_a, b, stride_b, beta, c, stride_c, count, GemmClass::heads);
}

void gemm(const char* transa, const char* transb, real alpha, ConstSlice2D a, ConstSlice2D b, real beta, Slice2D c) {
  check_shapes(transa, transb, a, b, c);
  product(transa, transb, alpha, a, 0, b, 0, beta, c, 0, 1, GemmClass::linear);
}

void gemm_strided_batched(const char* transa, const char* transb, real alpha, ConstSlice2D a, std::size_t stride_a,
                          ConstSlice2D b, std::size_t stride_b, real beta, Slice2D c, std::size_t stride_c, int count) {
  check_shapes(transa, transb, a, b, c);
  if (count > 0) product(transa, transb, alpha, a, stride_a, b, stride_b, beta, c, stride_c, count, GemmClass::heads);
}

namespace {

// Seeds y with residual + bias, so that GEMM adds x W^T on top (the beta it
// returns: 1, or 0 with neither): no separate pass over the output for either.
real seed_linear_output(Slice2D y, ConstSlice1D bias, ConstSlice2D residual) {
  const std::size_t out = y.extent(1);
  const bool has_bias = bias.extent(0) > 0, has_residual = residual.extent(0) > 0;
  real beta = 0;
  if (has_bias || has_residual) {
    real* yp = y.data();
    const real* rp = residual.data();
    const real* bp = bias.data();
    if constexpr (kDeviceMemory) {
      // One thread per element: neighbouring threads touch neighbouring floats.
      Kokkos::parallel_for(
          "ndmini::linear_seed", Range(0, y.extent(0) * out), KOKKOS_LAMBDA(const std::size_t i) {
            yp[i] = (has_residual ? rp[i] : real(0)) + (has_bias ? bp[i % out] : real(0));
          });
    } else {
      // One row per iteration: the inner loops vectorize.
      Kokkos::parallel_for(
          "ndmini::linear_seed", Range(0, y.extent(0)), KOKKOS_LAMBDA(const std::size_t row) {
            real* yr = yp + row * out;
            const real* rr = has_residual ? rp + row * out : nullptr;
            if (has_residual && has_bias) {
              for (std::size_t j = 0; j < out; ++j) yr[j] = rr[j] + bp[j];
            } else if (has_residual) {
              for (std::size_t j = 0; j < out; ++j) yr[j] = rr[j];
            } else {
              for (std::size_t j = 0; j < out; ++j) yr[j] = bp[j];
            }
          });
    }
    beta = 1;
  }
  return beta;
}

// One product of T operands into an fp32 C: the fp32 route or the bf16 one.
template <class T>
void product_of(const char* transa, const char* transb, ConstMatrix<T> a, ConstMatrix<T> b, real beta, Slice2D c) {
  if constexpr (std::is_same_v<T, bf16>)
    gemm_bf16(transa, transb, real(1), a, b, beta, c);
  else
    gemm(transa, transb, real(1), a, b, beta, c);
}

}  // namespace

template <class T>
void linear_forward(Slice2D y, named_t<ConstMatrix<T>> x, named_t<ConstMatrix<T>> weight, ConstSlice1D bias,
                    ConstSlice2D residual) {
  product_of<T>("N", "T", x, weight, seed_linear_output(y, bias, residual), y);
}

template <class T>
void linear_backward(Slice2D dx, Slice2D dweight, Slice1D dbias, ConstSlice2D dy, named_t<ConstMatrix<T>> x,
                     named_t<ConstMatrix<T>> weight, named_t<Matrix<T>> dy_rounded, real dx_beta) {
  ConstMatrix<T> dy_operand;
  if constexpr (std::is_same_v<T, bf16>) {
    if (dy_rounded.extent(0) != dy.extent(0) || dy_rounded.extent(1) != dy.extent(1) || dy.stride(0) != dy.extent(1))
      throw InternalError("linear_backward: dy_rounded must hold a contiguous dy");
    round_to_bf16(Bf16Slice1D(dy_rounded.data(), dy.size()), ConstSlice1D(dy.data(), dy.size()));
    dy_operand = dy_rounded;
  } else {
    dy_operand = dy;
  }
  product_of<T>("T", "N", dy_operand, x, real(1), dweight);
  if (dbias.extent(0) > 0) bias_backward(dbias, dy);  // from fp32 dy: a column sum, not a product
  if (dx.extent(0) > 0) product_of<T>("N", "N", dy_operand, weight, dx_beta, dx);
}

template void linear_forward<real>(Slice2D, ConstSlice2D, ConstSlice2D, ConstSlice1D, ConstSlice2D);
template void linear_forward<bf16>(Slice2D, ConstBf16Slice2D, ConstBf16Slice2D, ConstSlice1D, ConstSlice2D);
template void linear_backward<real>(Slice2D, Slice2D, Slice1D, ConstSlice2D, ConstSlice2D, ConstSlice2D, Slice2D, real);
template void linear_backward<bf16>(Slice2D, Slice2D, Slice1D, ConstSlice2D, ConstBf16Slice2D, ConstBf16Slice2D,
                                    Bf16Slice2D, real);

void bias_backward(Slice1D dbias, ConstSlice2D dy) {
  // Column sums of dy as a [1, N] x [N, out] GEMM with a ones row: BLAS
  // streams dy once (KokkosBlas' own GEMV would be used for a LayoutRight gemv).
  gemm("N", "N", real(1), ones_row(dy.extent(0)), dy, real(1), Slice2D(dbias.data(), 1, dbias.extent(0)));
}

}  // namespace ndmini::kernels
