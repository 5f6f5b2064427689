// SPDX-License-Identifier: BSD-3-Clause
// The cuBLAS layer of the GEMM wrapper (kernels/gemm_cublas.hpp) on device
// buffers, against a naive double-precision product: every transpose pair,
// one product and strided batches, row strides wider than the rows, k = 0.
// Label gpu: without a GPU the program exits 77, which CTest reports as
// skipped. It needs no Kokkos, so every build with the CUDA toolkit runs it.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "kernels/gemm_cublas.hpp"

namespace ndmini {
namespace {

// fp32 products of length k against a double reference: rounding grows
// about like sqrt(k) ulps; this bound leaves a wide margin and still fails
// on any wrong element (those are off by O(1)).
constexpr double kRelTol = 1e-5;

class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<float>& host) : n_(host.size()) {
    if (cudaMalloc(reinterpret_cast<void**>(&p_), std::max<std::size_t>(n_, 1) * sizeof(float)) != cudaSuccess)
      throw Error("cudaMalloc failed");
    if (n_ > 0 && cudaMemcpy(p_, host.data(), n_ * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess)
      throw Error("cudaMemcpy to device failed");
  }
  ~DeviceArray() { cudaFree(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  float* data() { return p_; }
  std::vector<float> download() const {
    std::vector<float> host(n_);
    if (n_ > 0 && cudaMemcpy(host.data(), p_, n_ * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess)
      throw Error("cudaMemcpy to host failed");
    return host;
  }

 private:
  float* p_ = nullptr;
  std::size_t n_;
};

std::vector<float> random_values(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(gen);
  return v;
}

struct Case {
  char ta, tb;
  int m, n, k, count;
  int pad;  // extra floats at the end of every row (ld = width + pad)
  float alpha, beta;
};

std::string name_of(const Case& c) {
  return std::string(1, c.ta) + c.tb + " m" + std::to_string(c.m) + " n" + std::to_string(c.n) + " k" +
         std::to_string(c.k) + " x" + std::to_string(c.count) + " pad" + std::to_string(c.pad);
}

void run_case(const Case& c) {
  SCOPED_TRACE(name_of(c));
  // Stored shapes (row-major): A is [m, k] or, transposed, [k, m]; B is [k, n] or [n, k].
  const int a_rows = c.ta == 'N' ? c.m : c.k, a_cols = c.ta == 'N' ? c.k : c.m;
  const int b_rows = c.tb == 'N' ? c.k : c.n, b_cols = c.tb == 'N' ? c.n : c.k;
  const int lda = a_cols + c.pad, ldb = b_cols + c.pad, ldc = c.n + c.pad;
  // Batches spaced wider than a matrix, so a stride mix-up reads the gap.
  const std::size_t sa = static_cast<std::size_t>(a_rows) * lda + 7, sb = static_cast<std::size_t>(b_rows) * ldb + 5,
                    sc = static_cast<std::size_t>(c.m) * ldc + 3;
  const auto ha = random_values(sa * c.count, 1), hb = random_values(sb * c.count, 2),
             hc = random_values(sc * c.count, 3);
  DeviceArray a(ha), b(hb), d(hc);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  kernels::cublas::gemm(stream, c.ta, c.tb, c.m, c.n, c.k, c.alpha, {a.data(), lda, static_cast<long long>(sa)},
                        {b.data(), ldb, static_cast<long long>(sb)}, c.beta, d.data(), ldc, static_cast<long long>(sc),
                        c.count);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaStreamDestroy(stream);
  const auto got = d.download();

  for (int i = 0; i < c.count; ++i)
    for (int r = 0; r < c.m; ++r)
      for (int col = 0; col < ldc; ++col) {
        const std::size_t at = i * sc + static_cast<std::size_t>(r) * ldc + col;
        if (col >= c.n) {  // the padding of C is never written
          ASSERT_EQ(got[at], hc[at]) << "padding of C written at batch " << i << " row " << r;
          continue;
        }
        double want = 0, scale = 0;
        for (int p = 0; p < c.k; ++p) {
          const double x = c.ta == 'N' ? ha[i * sa + static_cast<std::size_t>(r) * lda + p]
                                       : ha[i * sa + static_cast<std::size_t>(p) * lda + r];
          const double y = c.tb == 'N' ? hb[i * sb + static_cast<std::size_t>(p) * ldb + col]
                                       : hb[i * sb + static_cast<std::size_t>(col) * ldb + p];
          want += x * y;
          scale += std::fabs(x * y);
        }
        want = c.alpha * want + c.beta * static_cast<double>(hc[at]);
        scale = std::fabs(c.alpha) * scale + std::fabs(c.beta * hc[at]) + 1e-30;
        ASSERT_LE(std::fabs(got[at] - want), kRelTol * scale)
            << "batch " << i << " C(" << r << ", " << col << ") = " << got[at] << ", want " << want;
      }
  // The gaps between batches of C stay untouched.
  for (int i = 0; i < c.count; ++i)
    for (std::size_t g = static_cast<std::size_t>(c.m) * ldc; g < sc; ++g)
      ASSERT_EQ(got[i * sc + g], hc[i * sc + g]) << "gap after batch " << i << " written";
}

TEST(Cublas, EveryTransposePairOneProduct) {
  for (char ta : {'N', 'T'})
    for (char tb : {'N', 'T'}) run_case({ta, tb, 37, 19, 53, 1, 0, 1.0f, 0.0f});
}

TEST(Cublas, AlphaBetaAndWideRows) {
  for (char ta : {'N', 'T'})
    for (char tb : {'N', 'T'}) run_case({ta, tb, 16, 33, 8, 1, 5, -0.5f, 1.0f});
}

TEST(Cublas, StridedBatchesLikeAttentionHeads) {
  // The attention products: S = Q K^T (N, T), O += P V (N, N), dK += dS^T Q (T, N).
  run_case({'N', 'T', 32, 96, 64, 6, 0, 0.125f, 0.0f});
  run_case({'N', 'N', 32, 64, 96, 6, 0, 1.0f, 1.0f});
  run_case({'T', 'N', 96, 64, 32, 6, 0, 1.0f, 1.0f});
  run_case({'T', 'T', 5, 7, 3, 4, 2, 2.0f, -1.0f});
}

TEST(Cublas, EmptyInnerDimensionScalesC) { run_case({'N', 'N', 4, 5, 0, 2, 0, 1.0f, 0.5f}); }

TEST(Cublas, EmptyOutputIsANoOp) {
  kernels::cublas::gemm(nullptr, 'N', 'N', 0, 5, 3, 1.0f, {nullptr, 3, 0}, {nullptr, 5, 0}, 0.0f, nullptr, 5, 0, 1);
}

TEST(Cublas, BadTransposeFlagIsAnInternalError) {
  std::vector<float> one(1, 1.0f);
  DeviceArray a(one), b(one), c(one);
  EXPECT_THROW(kernels::cublas::gemm(nullptr, 'X', 'N', 1, 1, 1, 1.0f, {a.data(), 1, 0}, {b.data(), 1, 0}, 0.0f,
                                     c.data(), 1, 0, 1),
               InternalError);
}

}  // namespace
}  // namespace ndmini

// CTest's SKIP_RETURN_CODE for this test.
constexpr int kSkip = 77;

int main(int argc, char** argv) {
  if (!ndmini::kernels::cublas::device_available()) {
    std::printf("no GPU: skipping the cuBLAS tests\n");
    return kSkip;
  }
  ::testing::InitGoogleTest(&argc, argv);
  const int result = RUN_ALL_TESTS();
  ndmini::kernels::cublas::release_handle();
  return result;
}
