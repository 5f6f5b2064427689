// SPDX-License-Identifier: BSD-3-Clause
// The GEMM entry points beyond fp32 BLAS: bf16 products (oneDNN, or the fp32
// emulation without it) and fp32 through oneDNN, against double-precision
// references on odd shapes, every transpose, alpha/beta and strided batches;
// and what the banner says about the GEMM libraries.
//
// Bound: fp32 accumulation of k products errs by at most k u sum|a b|
// (u = 2^-24, each step rounded once; bf16 x bf16 products are exact in fp32),
// so an element may be off by (k + 2) u (|alpha| sum_p |a_ip b_pj| + |beta c_ij|);
// a bf16 C adds one rounding, 2^-8 of the value. A negative control shows the
// bound is tight: against the reference on the UNROUNDED inputs, the same
// product is off by far more than it.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "core/rng.hpp"
#include "core/types.hpp"
#include "kernels/gemm_library.hpp"
#include "kernels/kernels.hpp"
#ifdef NDMINI_HAVE_ONEDNN
#include "kernels/gemm_onednn.hpp"
#endif

using namespace ndmini;
namespace kn = ndmini::kernels;

namespace {

constexpr double kU32 = 1.0 / 16777216.0;  // fp32 unit roundoff 2^-24
constexpr double kU16 = 1.0 / 256.0;       // bf16 unit roundoff 2^-8

struct Case {
  const char *ta, *tb;
  int m, n, k, count;
  float alpha, beta;
};

// Odd sizes, every transpose pair, accumulation (beta = 1) as the backward
// passes use, a scale as attention's QK^T uses, and batches as its heads.
const Case kCases[] = {
    {"N", "T", 37, 29, 64, 1, 1.0f, 0.0f},
    {"T", "N", 33, 17, 45, 1, 1.0f, 1.0f},
    {"N", "N", 19, 23, 31, 1, 1.0f, 0.5f},
    {"T", "T", 7, 11, 13, 1, -0.75f, 0.0f},
    {"N", "T", 16, 16, 8, 5, 0.125f, 0.0f},
    {"T", "N", 9, 8, 16, 3, 1.0f, 1.0f},
    {"N", "N", 12, 8, 16, 4, 1.0f, 1.0f},
    // Several panels of an OpenMP build's fp32 products (at least 128 rows or columns each, the last
    // one short): rows of C for a tall C, columns for a wide one, every transpose, batched.
    {"N", "T", 300, 140, 20, 1, 1.0f, 1.0f},
    {"T", "N", 90, 290, 24, 1, 0.5f, 0.0f},
    {"T", "T", 260, 70, 9, 2, 1.0f, 0.5f},
    {"N", "N", 50, 270, 11, 2, 1.0f, 1.0f},
};

// One operand of a batch on the host: `count` row-major [rows, cols]
// matrices, matrix i at i * stride (stride > rows * cols: a gap, so a wrong
// batch stride reads the gap's garbage).
struct Batch {
  int rows, cols, count;
  std::size_t stride;
  std::vector<float> v;
  Batch(int r, int c, int n, std::uint64_t seed, float gap_value)
      : rows(r), cols(c), count(n), stride(static_cast<std::size_t>(r) * c + 5), v(stride * n, gap_value) {
    for (int b = 0; b < n; ++b)
      for (int i = 0; i < r * c; ++i) {
        const double u = static_cast<double>(rng::bits(seed, b * stride + i) >> 40) / 16777216.0;
        v[b * stride + i] = static_cast<float>(2 * u - 1);
      }
  }
};

std::vector<float> rounded(const std::vector<float>& x) {
  std::vector<float> r(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) r[i] = static_cast<float>(bf16(x[i]));
  return r;
}

template <class T>
Kokkos::View<T*, MemSpace> device_copy(const std::vector<float>& x) {
  Kokkos::View<T*, MemSpace> d("operand", x.size());
  auto h = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < x.size(); ++i) h(i) = T(x[i]);
  Kokkos::deep_copy(d, h);
  return d;
}
template <class T>
std::vector<float> host_copy(const Kokkos::View<T*, MemSpace>& d) {
  auto h = Kokkos::create_mirror_view_and_copy(HostSpace(), d);
  std::vector<float> x(d.extent(0));
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(h(i));
  return x;
}

bool is_t(const char* t) { return t[0] == 'T'; }

// Largest |got - ref| / bound over the elements of every matrix of c, where
// ref = alpha op(A) op(B) + beta C0 in double on the given operand values.
double worst_ratio(const Case& c, const Batch& a, const Batch& b, const std::vector<float>& a_vals,
                   const std::vector<float>& b_vals, const Batch& c0, const std::vector<float>& c0_vals,
                   const std::vector<float>& got, bool bf16_out) {
  double worst = 0;
  for (int bt = 0; bt < c.count; ++bt)
    for (int i = 0; i < c.m; ++i)
      for (int j = 0; j < c.n; ++j) {
        double sum = 0, abs_sum = 0;
        for (int p = 0; p < c.k; ++p) {
          const std::size_t ia = is_t(c.ta) ? p * a.cols + i : i * a.cols + p;
          const std::size_t ib = is_t(c.tb) ? j * b.cols + p : p * b.cols + j;
          const double prod = static_cast<double>(a_vals[bt * a.stride + ia]) * b_vals[bt * b.stride + ib];
          sum += prod;
          abs_sum += std::fabs(prod);
        }
        const std::size_t ic = bt * c0.stride + i * c.n + j;
        const double ref = c.alpha * sum + c.beta * static_cast<double>(c0_vals[ic]);
        double bound = (c.k + 2) * kU32 * (std::fabs(c.alpha) * abs_sum + std::fabs(c.beta * c0_vals[ic]));
        if (bf16_out) bound = kU16 * std::fabs(ref) + (1 + kU16) * bound;
        worst = std::max(worst, std::fabs(got[ic] - ref) / std::max(bound, 1e-30));
      }
  return worst;
}

template <class CType>
void check_bf16_products() {
  constexpr bool bf16_out = std::is_same_v<CType, bf16>;
  int seed = 10;
  for (const Case& c : kCases) {
    SCOPED_TRACE(std::string(c.ta) + c.tb + " m " + std::to_string(c.m) + " n " + std::to_string(c.n) + " k " +
                 std::to_string(c.k) + " batch " + std::to_string(c.count) + " beta " + std::to_string(c.beta));
    const Batch a(is_t(c.ta) ? c.k : c.m, is_t(c.ta) ? c.m : c.k, c.count, seed++, 1e30f);
    const Batch b(is_t(c.tb) ? c.n : c.k, is_t(c.tb) ? c.k : c.n, c.count, seed++, 1e30f);
    const Batch c0(c.m, c.n, c.count, seed++, 42.0f);
    const std::vector<float> ar = rounded(a.v), br = rounded(b.v);
    const std::vector<float> c0v = bf16_out ? rounded(c0.v) : c0.v;
    auto da = device_copy<bf16>(a.v);  // rounded to bf16 on the way in
    auto db = device_copy<bf16>(b.v);
    auto dc = device_copy<CType>(c0.v);
    const ConstBf16Slice2D sa(da.data(), a.rows, a.cols), sb(db.data(), b.rows, b.cols);
    const Kokkos::View<CType**, Kokkos::LayoutRight, MemSpace, Unmanaged> sc(dc.data(), c.m, c.n);
    if (c.count == 1)
      kn::gemm_bf16(c.ta, c.tb, c.alpha, sa, sb, c.beta, sc);
    else
      kn::gemm_bf16_strided_batched(c.ta, c.tb, c.alpha, sa, a.stride, sb, b.stride, c.beta, sc, c0.stride, c.count);
    Kokkos::fence();
    const std::vector<float> got = host_copy(dc);
    const double ratio = worst_ratio(c, a, b, ar, br, c0, c0v, got, bf16_out);
    EXPECT_LE(ratio, 1.0) << "worst error / bound";
    // The gaps between batch matrices are left alone.
    for (int bt = 0; bt < c.count; ++bt)
      for (std::size_t g = c0.stride * bt + c.m * c.n; g < c0.stride * (bt + 1); ++g) ASSERT_EQ(got[g], 42.0f);
    if (!bf16_out) {
      // Negative control: the bound sees whether the inputs were rounded to bf16.
      const double unrounded = worst_ratio(c, a, b, a.v, b.v, c0, c0v, got, false);
      EXPECT_GT(unrounded, 10.0) << "the bound cannot tell bf16 inputs from fp32 ones";
    }
  }
}

}  // namespace

TEST(Gemm, Bf16ProductsWithFp32OutputMatchDoubleReference) { check_bf16_products<float>(); }

TEST(Gemm, Bf16ProductsWithBf16OutputMatchDoubleReference) { check_bf16_products<bf16>(); }

// The bits of a rank's oneDNN products do not depend on its thread count:
// oneDNN runs each product on one thread whatever the rank's threads
// (OMP_NUM_THREADS=2 in the 2threads variant of a threaded build), as its
// own split of a product reorders sums (with AMX, 1 and 2 threads gave a
// 1536x384x1024 TN bf16 product different bits). The model's shapes, each
// product twice: the same bits, and not all zero.
TEST(Gemm, OnednnProductsRunOnOneThreadWhateverTheRanksThreads) {
#ifndef NDMINI_HAVE_ONEDNN
  GTEST_SKIP() << "a build without oneDNN emulates bf16 products through the fp32 route";
#else
  if constexpr (kDeviceMemory) GTEST_SKIP() << "oneDNN runs host products only";
  if (!kn::onednn::has_bf16()) GTEST_SKIP() << "no oneDNN bf16 products on this CPU";
  kn::use_rank_threads();
  const std::string described = kn::onednn::describe();
  if (described.find("(OpenMP)") != std::string::npos)
    EXPECT_NE(described.find(", 1 thread (OpenMP)"), std::string::npos) << described;
  EXPECT_TRUE(kn::host_products_on_one_thread(true));
  struct Shape {
    const char *ta, *tb;
    int m, n, k, count;
  };
  for (const Shape& s :
       {Shape{"N", "T", 1024, 1536, 384, 1}, Shape{"T", "N", 1536, 384, 1024, 1}, Shape{"N", "N", 32, 64, 96, 12}}) {
    const std::size_t ra = s.ta[0] == 'N' ? s.m : s.k, ca = s.ta[0] == 'N' ? s.k : s.m;
    const std::size_t rb = s.tb[0] == 'N' ? s.k : s.n, cb = s.tb[0] == 'N' ? s.n : s.k;
    const std::size_t sa = ra * ca, sb = rb * cb, sc = static_cast<std::size_t>(s.m) * s.n;
    Bf16View1D a("a", sa * s.count), b("b", sb * s.count);
    auto ha = Kokkos::create_mirror_view(a);
    auto hb = Kokkos::create_mirror_view(b);
    for (std::size_t i = 0; i < ha.extent(0); ++i) ha(i) = bf16(static_cast<float>(std::sin(0.37 * i)));
    for (std::size_t i = 0; i < hb.extent(0); ++i) hb(i) = bf16(static_cast<float>(std::cos(0.11 * i)));
    Kokkos::deep_copy(a, ha);
    Kokkos::deep_copy(b, hb);
    std::vector<std::vector<float>> outputs;
    for (int run = 0; run < 2; ++run) {
      Kokkos::View<float*, MemSpace> c("c", sc * s.count);
      kn::gemm_bf16_strided_batched(s.ta, s.tb, 1.0f, ConstBf16Slice2D(a.data(), ra, ca), sa,
                                    ConstBf16Slice2D(b.data(), rb, cb), sb, 0.0f, Slice2D(c.data(), s.m, s.n), sc,
                                    s.count);
      Kokkos::fence();
      outputs.push_back(host_copy(c));
    }
    EXPECT_EQ(outputs[0], outputs[1]) << s.ta << s.tb << " " << s.m << "x" << s.n << "x" << s.k << " x" << s.count;
    EXPECT_NE(outputs[0], std::vector<float>(outputs[0].size(), 0.0f)) << "the product computed nothing";
  }
#endif
}

TEST(Gemm, Bf16ShapesAreChecked) {
  Kokkos::View<bf16*, MemSpace> x("x", 64);
  View2D c("c", 4, 4);
  const ConstBf16Slice2D a(x.data(), 4, 3), b(x.data(), 4, 4);  // inner sizes 3 and 4 disagree
  EXPECT_THROW(kn::gemm_bf16("N", "N", 1.0f, a, b, 0.0f, c), InternalError);
}

// fp32 through each host route against the double reference, with the same
// bound: oneDNN's fp32 matmul is a drop-in for BLAS. Every library forced
// (set_host_gemm_route, as the benchmarks do), and every library sent each
// class of products by the route the calibration sets (set_gemm_library: the
// Linear layers' single products, the heads' batched ones), so the class a
// product belongs to reaches the library chosen for it.
TEST(Gemm, Fp32RoutesMatchDoubleReference) {
  if constexpr (kDeviceMemory) GTEST_SKIP() << "a CUDA build multiplies with cuBLAS";
  struct Route {
    std::string name;
    kn::HostGemmRoute forced;
    kn::GemmLibrary linear, heads;
  };
  std::vector<Route> routes = {{"forced blas", kn::HostGemmRoute::blas, kn::GemmLibrary::blas, kn::GemmLibrary::blas}};
#ifdef NDMINI_HAVE_ONEDNN
  routes.push_back({"forced onednn", kn::HostGemmRoute::onednn, kn::GemmLibrary::blas, kn::GemmLibrary::blas});
#endif
  for (kn::GemmLibrary linear : kn::gemm_libraries(false))
    for (kn::GemmLibrary heads : kn::gemm_libraries(false))
      routes.push_back({std::string("linear ") + kn::name_of(linear) + ", heads " + kn::name_of(heads),
                        kn::HostGemmRoute::by_shape, linear, heads});
  int seed = 100;
  for (const Route& route : routes) {
    kn::set_host_gemm_route(route.forced);
    kn::set_gemm_library(kn::GemmClass::linear, route.linear);
    kn::set_gemm_library(kn::GemmClass::heads, route.heads);
    EXPECT_EQ(kn::gemm_library(kn::GemmClass::linear, false), route.linear) << route.name;
    EXPECT_EQ(kn::gemm_library(kn::GemmClass::heads, false), route.heads) << route.name;
    for (const Case& c : kCases) {
      SCOPED_TRACE("route " + route.name + " " + c.ta + c.tb + " m " + std::to_string(c.m) + " batch " +
                   std::to_string(c.count));
      const Batch a(is_t(c.ta) ? c.k : c.m, is_t(c.ta) ? c.m : c.k, c.count, seed++, 1e30f);
      const Batch b(is_t(c.tb) ? c.n : c.k, is_t(c.tb) ? c.k : c.n, c.count, seed++, 1e30f);
      const Batch c0(c.m, c.n, c.count, seed++, 42.0f);
      auto da = device_copy<float>(a.v), db = device_copy<float>(b.v), dc = device_copy<float>(c0.v);
      const ConstSlice2D sa(da.data(), a.rows, a.cols), sb(db.data(), b.rows, b.cols);
      const Slice2D sc(dc.data(), c.m, c.n);
      if (c.count == 1)
        kn::gemm(c.ta, c.tb, c.alpha, sa, sb, c.beta, sc);
      else
        kn::gemm_strided_batched(c.ta, c.tb, c.alpha, sa, a.stride, sb, b.stride, c.beta, sc, c0.stride, c.count);
      const std::vector<float> got = host_copy(dc);
      EXPECT_LE(worst_ratio(c, a, b, a.v, b.v, c0, c0.v, got, false), 1.0) << "worst error / bound";
    }
  }
  kn::set_host_gemm_route(kn::HostGemmRoute::by_shape);
  kn::set_gemm_library(kn::GemmClass::linear, kn::GemmLibrary::blas);
  kn::set_gemm_library(kn::GemmClass::heads, kn::GemmLibrary::blas);
}

#ifdef NDMINI_HAVE_ONEDNN
// The two libraries do not round alike: a route that sends a class to one
// library really runs it there (else the test above could pass on BLAS alone).
TEST(Gemm, EachClassRunsOnTheLibraryItIsSent) {
  if constexpr (kDeviceMemory) GTEST_SKIP() << "a CUDA build multiplies with cuBLAS";
  const int m = 64, n = 48, k = 777, count = 3;
  const Batch a(m, k, count, 7, 1e30f), b(n, k, count, 8, 1e30f);
  auto da = device_copy<float>(a.v), db = device_copy<float>(b.v);
  const ConstSlice2D sa(da.data(), m, k), sb(db.data(), n, k);
  std::vector<std::vector<float>> out[2];  // [class][library]
  for (kn::GemmLibrary lib : {kn::GemmLibrary::blas, kn::GemmLibrary::onednn}) {
    kn::set_gemm_library(kn::GemmClass::linear, lib);
    kn::set_gemm_library(kn::GemmClass::heads, lib);
    Kokkos::View<float*, MemSpace> c1("c1", m * n), cb("cb", m * n * count);
    kn::gemm("N", "T", 1.0f, sa, sb, 0.0f, Slice2D(c1.data(), m, n));
    kn::gemm_strided_batched("N", "T", 1.0f, sa, a.stride, sb, b.stride, 0.0f, Slice2D(cb.data(), m, n), m * n, count);
    Kokkos::fence();
    out[0].push_back(host_copy(c1));
    out[1].push_back(host_copy(cb));
  }
  kn::set_gemm_library(kn::GemmClass::linear, kn::GemmLibrary::blas);
  kn::set_gemm_library(kn::GemmClass::heads, kn::GemmLibrary::blas);
  EXPECT_NE(out[0][0], out[0][1]) << "the linear class gave BLAS's bits on oneDNN";
  EXPECT_NE(out[1][0], out[1][1]) << "the heads class gave BLAS's bits on oneDNN";
}
#endif

TEST(GemmLibrary, WarnsWhenOpenBlasRunsAnOldKernel) {
  kn::CpuFeatures avx512_bf16{true, true, true, false}, avx512{true, true, false, false},
      avx2{true, false, false, false};
  // The case the banner exists for: Debian's OpenBLAS on a newer Xeon.
  const std::string w = kn::blas_kernel_warning("Prescott", avx512_bf16);
  EXPECT_NE(w.find("Prescott"), std::string::npos) << w;
  EXPECT_NE(w.find("OPENBLAS_CORETYPE=Cooperlake"), std::string::npos) << w;
  EXPECT_NE(kn::blas_kernel_warning("Nehalem", avx512).find("OPENBLAS_CORETYPE=SkylakeX"), std::string::npos);
  EXPECT_NE(kn::blas_kernel_warning("Core2", avx2).find("OPENBLAS_CORETYPE=Haswell"), std::string::npos);
  // AVX2 kernels on an AVX-512 CPU leave half the vector width idle.
  EXPECT_NE(kn::blas_kernel_warning("Haswell", avx512).find("OPENBLAS_CORETYPE=SkylakeX"), std::string::npos);
  // Matching kernels, a CPU without AVX2, or a BLAS that is not OpenBLAS: silence.
  EXPECT_EQ(kn::blas_kernel_warning("Cooperlake", avx512_bf16), "");
  EXPECT_EQ(kn::blas_kernel_warning("SkylakeX", avx512), "");
  EXPECT_EQ(kn::blas_kernel_warning("Haswell", avx2), "");
  // The warning matters only where a class of the run goes to BLAS.
  kn::GemmRouteReport route;
  EXPECT_TRUE(kn::route_uses_blas(route));  // the default: BLAS everywhere
  for (auto& precision : route.library)
    for (auto& library : precision) library = kn::GemmLibrary::onednn;
  EXPECT_FALSE(kn::route_uses_blas(route));
  route.library[1][1] = kn::GemmLibrary::blas;
  EXPECT_TRUE(kn::route_uses_blas(route));
  EXPECT_EQ(kn::blas_kernel_warning("Zen", avx2), "");
  EXPECT_EQ(kn::blas_kernel_warning("Prescott", kn::CpuFeatures{}), "");
  EXPECT_EQ(kn::blas_kernel_warning("", avx512_bf16), "");
}

TEST(GemmLibrary, NamesTheLibrariesAndKernels) {
  const std::string d = kn::describe_gemm_libraries();
  std::printf("%s", kn::gemm_machine_lines().c_str());
  EXPECT_EQ(d.rfind("gemm: ", 0), 0u) << d;
  if constexpr (!kDeviceMemory) {
    if (!kn::openblas_core().empty()) EXPECT_NE(d.find("kernel " + kn::openblas_core()), std::string::npos) << d;
#ifdef NDMINI_HAVE_ONEDNN
    // oneDNN's own dispatch: AMX where the CPU has it, else AVX512-BF16.
    const kn::CpuFeatures cpu = kn::cpu_features();
    if (cpu.amx_bf16)
      EXPECT_NE(d.find("ISA avx512_core_amx"), std::string::npos) << d;
    else if (cpu.avx512_bf16)
      EXPECT_NE(d.find("ISA avx512_core_bf16"), std::string::npos) << d;
    // No oversubscription: oneDNN's OpenMP products use the rank's host
    // threads (1 in a Serial build), not every core of the node, whatever
    // OMP_NUM_THREADS says.
    if (d.find("(OpenMP)") != std::string::npos) {
      const int threads = Kokkos::DefaultHostExecutionSpace().concurrency();
      const std::string want = ", " + std::to_string(threads) + (threads == 1 ? " thread" : " threads") + " (OpenMP)";
      EXPECT_NE(d.find(want), std::string::npos) << d << " (expected '" << want << "')";
#ifdef KOKKOS_ENABLE_SERIAL
      if (std::is_same_v<Kokkos::DefaultHostExecutionSpace, Kokkos::Serial>) EXPECT_EQ(threads, 1) << d;
#endif
    }
#endif
#ifdef NDMINI_HOST_PANELS
    // fp32 panels on Kokkos' threads, BLAS on one thread each: N threads, not N x N.
    const int threads = Kokkos::DefaultHostExecutionSpace().concurrency();
    const std::string panels = "fp32 in panels on " + std::to_string(threads) + " " +
                               Kokkos::DefaultHostExecutionSpace::name() + (threads == 1 ? " thread" : " threads");
    EXPECT_NE(d.find(panels), std::string::npos) << d << " (expected '" << panels << "')";
    if (!kn::openblas_core().empty()) EXPECT_NE(d.find(kn::openblas_core() + ", 1 thread,"), std::string::npos) << d;
#endif
  }
}
