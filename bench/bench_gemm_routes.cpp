// SPDX-License-Identifier: BSD-3-Clause
// The host's matrix products by library, shape by shape: fp32 through BLAS,
// fp32 through oneDNN and bf16 through oneDNN (bf16 A and B, fp32 C), at the
// model's shapes for one micro-batch (1024 rows) of inputs/small.toml and
// inputs/gpt2-124m.toml. Picks the fp32 route (kernels/gemm.cpp) and sizes
// what bf16 can gain; bench/README.md has the figures and the command.
//
// Per Linear weight W [out, in] (as bench_gemm): fwd y = x W^T (NT), dW += dy^T x
// (TN), dx = dy W (NN). Per attention head, batched over the B*H heads of a
// micro-batch (T = 256, head size 64, one head after another in memory):
// S = Q K^T (NT, scaled), O += S V (NN), and in backward dP = dO V^T (NT),
// dV += S^T dO (TN), dK += dP^T Q (TN), dQ += dP K (NN).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "bench_common.hpp"

namespace {

using namespace ndmini;
using namespace ndmini::bench;

enum class Route { blas_fp32, onednn_fp32, onednn_bf16 };
const char* route_name(Route r) {
  return r == Route::blas_fp32 ? "blas_fp32" : r == Route::onednn_fp32 ? "onednn_fp32" : "onednn_bf16";
}

// One product: C [m, n] = alpha op(A) op(B) + beta C, `count` of them one
// after another in memory (count 1: a single product).
struct Product {
  std::string name;
  const char *ta, *tb;
  int m, n, k, count;
  real alpha, beta;
};

using Bf16View1D = Kokkos::View<bf16*, Kokkos::LayoutRight, MemSpace>;

void BM_product(benchmark::State& state, Product p, Route route) {
  const int am = p.ta[0] == 'T' ? p.k : p.m, an = p.ta[0] == 'T' ? p.m : p.k;
  const int bm = p.tb[0] == 'T' ? p.n : p.k, bn = p.tb[0] == 'T' ? p.k : p.n;
  const std::size_t sa = static_cast<std::size_t>(am) * an, sb = static_cast<std::size_t>(bm) * bn,
                    sc = static_cast<std::size_t>(p.m) * p.n;
  View1D a("a", sa * p.count), b("b", sb * p.count), c("c", sc * p.count);
  randomize(a, 1);
  randomize(b, 2);
  randomize(c, 3);
  kernels::set_host_gemm_route(route == Route::blas_fp32 ? kernels::HostGemmRoute::blas
                                                         : kernels::HostGemmRoute::onednn);
  if (route == Route::onednn_bf16) {
    Bf16View1D ah("ah", a.extent(0)), bh("bh", b.extent(0));
    Kokkos::parallel_for(
        "bench::to_bf16", a.extent(0), KOKKOS_LAMBDA(const std::size_t i) { ah(i) = bf16(a(i)); });
    Kokkos::parallel_for(
        "bench::to_bf16", b.extent(0), KOKKOS_LAMBDA(const std::size_t i) { bh(i) = bf16(b(i)); });
    const ConstBf16Slice2D A(ah.data(), am, an), B(bh.data(), bm, bn);
    const Slice2D C(c.data(), p.m, p.n);
    for (auto _ : state)
      time_iteration(state, [&] {
        kernels::gemm_bf16_strided_batched(p.ta, p.tb, p.alpha, A, sa, B, sb, p.beta, C, sc, p.count);
      });
  } else {
    const ConstSlice2D A(a.data(), am, an), B(b.data(), bm, bn);
    const Slice2D C(c.data(), p.m, p.n);
    for (auto _ : state)
      time_iteration(state,
                     [&] { kernels::gemm_strided_batched(p.ta, p.tb, p.alpha, A, sa, B, sb, p.beta, C, sc, p.count); });
  }
  kernels::set_host_gemm_route(kernels::HostGemmRoute::by_shape);
  set_flops(state, 2.0 * p.m * p.n * p.k * p.count);
  state.SetLabel("M=" + std::to_string(p.m) + " N=" + std::to_string(p.n) + " K=" + std::to_string(p.k) +
                 (p.count > 1 ? " batch=" + std::to_string(p.count) : ""));
}

std::vector<Product> products_of(const Deck& d) {
  const int C = d.channels, rows = kRows, T = kSeqLen, hs = C / d.heads, heads = kBatch * d.heads;
  struct Layer {
    const char* name;
    int in, out;
    bool bias;
  };
  const Layer layers[] = {{"c_attn", C, 3 * C, true},
                          {"attn_proj", C, C, true},
                          {"c_fc", C, 4 * C, true},
                          {"mlp_proj", 4 * C, C, true},
                          {"lm_head", C, d.vocab, false}};
  std::vector<Product> v;
  for (const Layer& l : layers) {
    v.push_back({std::string(l.name) + "/fwd_NT", "N", "T", rows, l.out, l.in, 1, 1, l.bias ? real(1) : real(0)});
    v.push_back({std::string(l.name) + "/dW_TN", "T", "N", l.out, l.in, rows, 1, 1, 1});
    v.push_back({std::string(l.name) + "/dx_NN", "N", "N", rows, l.in, l.out, 1, 1, 0});
  }
  const real scale = static_cast<real>(1.0 / std::sqrt(static_cast<double>(hs)));
  v.push_back({"heads/S=QK^T_NT", "N", "T", T, T, hs, heads, scale, 0});
  v.push_back({"heads/O+=SV_NN", "N", "N", T, hs, T, heads, 1, 1});
  v.push_back({"heads/dP=dOV^T_NT", "N", "T", T, T, hs, heads, 1, 0});
  v.push_back({"heads/dV+=S^TdO_TN", "T", "N", T, hs, T, heads, 1, 1});
  v.push_back({"heads/dK+=dP^TQ_TN", "T", "N", T, hs, T, heads, 1, 1});
  v.push_back({"heads/dQ+=dPK_NN", "N", "N", T, hs, T, heads, 1, 1});
  return v;
}

bool register_all() {
#ifdef NDMINI_HAVE_ONEDNN
  const std::vector<Route> routes = {Route::blas_fp32, Route::onednn_fp32, Route::onednn_bf16};
#else
  const std::vector<Route> routes = {Route::blas_fp32};  // nothing to compare with
#endif
  for (const Deck& d : kDecks)
    for (const Product& p : products_of(d))
      for (Route r : routes) {
        const std::string name = std::string("gemm_routes/") + d.name + "/" + p.name + "/" + route_name(r);
        benchmark::RegisterBenchmark(name.c_str(), BM_product, p, r)
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond)
            ->ComputeStatistics("min",
                                [](const std::vector<double>& x) { return *std::min_element(x.begin(), x.end()); })
            ->ComputeStatistics("max",
                                [](const std::vector<double>& x) { return *std::max_element(x.begin(), x.end()); });
      }
  return true;
}

const bool registered = register_all();

}  // namespace
