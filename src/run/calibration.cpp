// SPDX-License-Identifier: BSD-3-Clause
#include "run/calibration.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

#include "comm/mpi/mpi_calls.hpp"
#include "core/timer.hpp"
#include "core/types.hpp"
#include "kernels/gemm_library.hpp"
#include "kernels/kernels.hpp"

namespace ndmini {

GemmCalibration calibrate_gemm(Precision precision, int runs) {
  // Square products the size of the larger model GEMMs: about 0.2 s in all
  // at 100 GFLOP/s in fp32.
  constexpr int kN = 1024;
  View2D a("ndmini::calib_a", kN, kN), b("ndmini::calib_b", kN, kN), c("ndmini::calib_c", kN, kN);
  Kokkos::deep_copy(a, 0.5f);
  Kokkos::deep_copy(b, 0.25f);
  using Bf16View2D = Kokkos::View<bf16**, Kokkos::LayoutRight, MemSpace>;
  Bf16View2D ah, bh;
  if (precision == Precision::bf16) {
    ah = Bf16View2D("ndmini::calib_a_bf16", kN, kN);
    bh = Bf16View2D("ndmini::calib_b_bf16", kN, kN);
    Kokkos::deep_copy(ah, bf16(0.5f));
    Kokkos::deep_copy(bh, bf16(0.25f));
  }
  // The three ways the model uses a Linear weight, in turn: forward x W^T
  // (NT), dW = dy^T x (TN), dx = dy W (NN). Their rates differ by 20% or more
  // with some BLAS kernels, and a peak from only the slowest would let the
  // model's faster products read MFU above 1.
  static const char* const kOps[][2] = {{"N", "T"}, {"T", "N"}, {"N", "N"}};
  GemmCalibration cal;
  // A product on the calling thread alone is timed by that thread's CPU
  // time: a core shared with other jobs then cannot lower the peak (and
  // push MFU above 1 once they stop). Else, wall time.
  cal.thread_cpu_time = kernels::host_products_on_one_thread(precision == Precision::bf16);
  constexpr int kWarmUps = 3;  // one of each: first-touch pages, oneDNN's JIT, BLAS buffers
  for (int rep = -kWarmUps; rep < runs; ++rep) {
    const char* ta = kOps[(rep + kWarmUps) % 3][0];
    const char* tb = kOps[(rep + kWarmUps) % 3][1];
    Kokkos::fence();
    const auto t0 = Clock::now();
    const double cpu0 = thread_cpu_seconds();
    // The model's GEMM path (cuBLAS on a GPU; on the host the route the shape picks).
    if (precision == Precision::bf16)
      kernels::gemm_bf16(ta, tb, 1.0f, ah, bh, 0.0f, c);
    else
      kernels::gemm(ta, tb, 1.0f, a, b, 0.0f, c);
    Kokkos::fence();
    const double s = cal.thread_cpu_time ? thread_cpu_seconds() - cpu0 : seconds_since(t0);
    if (rep < 0) continue;
    cal.run_flops.push_back(2.0 * kN * kN * kN / s);
    cal.best_flops = std::max(cal.best_flops, cal.run_flops.back());
  }
  return cal;
}

double calibrate_gemm_flops(Precision precision) { return calibrate_gemm(precision).best_flops; }

ProductShapes product_shapes(const Config& cfg) {
  const ModelConfig& m = cfg.model;
  const int tp = std::max(1, cfg.parallel.tp), cp = std::max(1, cfg.parallel.cp);
  ProductShapes s;
  s.seq = std::max(1, m.seq_len / cp);
  s.rows = std::clamp(cfg.train.micro_batch * s.seq, 1, 1024);
  s.channels = std::max(1, m.channels);
  s.hidden = std::max(1, 4 * m.channels / tp);
  s.head_size = std::max(1, m.channels / std::max(1, m.heads));
  // A quarter GFLOP per batched product at most: the heads of one micro-batch, or fewer.
  const double per_head = 2.0 * s.seq * s.seq * s.head_size;
  const int heads = std::max(1, cfg.train.micro_batch * m.heads / tp);
  s.heads = std::clamp(static_cast<int>(0.25e9 / per_head), 1, heads);
  return s;
}

namespace {

struct Op {
  const char *ta, *tb;
  int m, n, k;
};

// The class's three products, as the model runs them (see ProductShapes).
std::vector<Op> ops_of(kernels::GemmClass cls, const ProductShapes& s) {
  if (cls == kernels::GemmClass::linear)
    return {{"N", "T", s.rows, s.hidden, s.channels},
            {"T", "N", s.hidden, s.channels, s.rows},
            {"N", "N", s.rows, s.channels, s.hidden}};
  return {{"N", "T", s.seq, s.seq, s.head_size},
          {"N", "N", s.seq, s.head_size, s.seq},
          {"T", "N", s.seq, s.head_size, s.seq}};
}

// The clock both libraries of a comparison are read by: each thread's CPU
// time when every library timed runs on the calling thread alone (a busy
// core then cannot favour one), else wall time.
bool timed_by_thread_cpu(bool bf16) {
  if (bf16) return kernels::host_products_on_one_thread(true);
  bool one = kernels::host_products_on_one_thread(false);
  for (kernels::GemmLibrary l : kernels::gemm_libraries(false))
    if (l == kernels::GemmLibrary::onednn) one = one && kernels::host_products_on_one_thread(true);
  return one;
}

}  // namespace

ClassRate time_gemm_class(bool bf16_operands, kernels::GemmClass cls, kernels::GemmLibrary library,
                          const ProductShapes& shapes, int runs) {
  const std::vector<Op> ops = ops_of(cls, shapes);
  const int count = cls == kernels::GemmClass::heads ? shapes.heads : 1;
  std::size_t most = 0;
  for (const Op& op : ops)
    most = std::max({most, static_cast<std::size_t>(op.m) * op.k, static_cast<std::size_t>(op.k) * op.n,
                     static_cast<std::size_t>(op.m) * op.n});
  most *= count;
  View1D a("ndmini::route_a", most), b("ndmini::route_b", most), c("ndmini::route_c", most);
  Kokkos::deep_copy(a, 0.5f);
  Kokkos::deep_copy(b, 0.25f);
  using Bf16View1D = Kokkos::View<bf16*, Kokkos::LayoutRight, MemSpace>;
  Bf16View1D ah, bh;
  if (bf16_operands) {
    ah = Bf16View1D("ndmini::route_a_bf16", most);
    bh = Bf16View1D("ndmini::route_b_bf16", most);
    Kokkos::deep_copy(ah, bf16(0.5f));
    Kokkos::deep_copy(bh, bf16(0.25f));
  }
  const kernels::GemmLibrary before = kernels::gemm_library(cls, false);
  if (!bf16_operands) kernels::set_gemm_library(cls, library);
  const bool cpu_clock = timed_by_thread_cpu(bf16_operands);
  ClassRate rate;
  double flops = 0, seconds = 0;
  for (const Op& op : ops) {
    const bool ta = op.ta[0] == 'T', tb = op.tb[0] == 'T';
    const std::size_t sa = static_cast<std::size_t>(op.m) * op.k, sb = static_cast<std::size_t>(op.k) * op.n,
                      sc = static_cast<std::size_t>(op.m) * op.n;
    const Slice2D cv(c.data(), op.m, op.n);
    double best = 0;
    for (int rep = -1; rep < runs; ++rep) {  // one untimed warm-up: first touch, oneDNN's JIT, BLAS buffers
      Kokkos::fence();
      const auto t0 = Clock::now();
      const double cpu0 = thread_cpu_seconds();
      if (bf16_operands) {
        const ConstBf16Slice2D av(ah.data(), ta ? op.k : op.m, ta ? op.m : op.k);
        const ConstBf16Slice2D bv(bh.data(), tb ? op.n : op.k, tb ? op.k : op.n);
        if (cls == kernels::GemmClass::heads)
          kernels::gemm_bf16_strided_batched(op.ta, op.tb, 1.0f, av, sa, bv, sb, 0.0f, cv, sc, count);
        else
          kernels::gemm_bf16(op.ta, op.tb, 1.0f, av, bv, 0.0f, cv);
      } else {
        const ConstSlice2D av(a.data(), ta ? op.k : op.m, ta ? op.m : op.k);
        const ConstSlice2D bv(b.data(), tb ? op.n : op.k, tb ? op.k : op.n);
        if (cls == kernels::GemmClass::heads)
          kernels::gemm_strided_batched(op.ta, op.tb, 1.0f, av, sa, bv, sb, 0.0f, cv, sc, count);
        else
          kernels::gemm(op.ta, op.tb, 1.0f, av, bv, 0.0f, cv);
      }
      Kokkos::fence();
      const double s = std::max(1e-9, cpu_clock ? thread_cpu_seconds() - cpu0 : seconds_since(t0));
      if (rep >= 0 && (best == 0 || s < best)) best = s;
    }
    const double f = 2.0 * op.m * op.n * op.k * count;
    flops += f;
    seconds += best;
    rate.best_product_flops = std::max(rate.best_product_flops, f / best);
  }
  if (!bf16_operands) kernels::set_gemm_library(cls, before);
  rate.flops = flops / seconds;
  return rate;
}

kernels::GemmRouteReport choose_gemm_route(const PerfConfig& perf, MPI_Comm comm, Precision precision,
                                           const ProductShapes& shapes) {
  using kernels::GemmClass;
  using kernels::GemmLibrary;
  kernels::GemmRouteReport report;
  report.run_bf16 = precision == Precision::bf16;
  const std::vector<GemmLibrary> fp32_libs = kernels::gemm_libraries(false);
  // A forced library, where the build has it (a GPU build runs cuBLAS whatever the deck says).
  std::vector<GemmLibrary> candidates = fp32_libs;
  if (perf.gemm_route != GemmRoute::automatic) {
    const GemmLibrary forced = perf.gemm_route == GemmRoute::onednn ? GemmLibrary::onednn : GemmLibrary::blas;
    if (std::find(fp32_libs.begin(), fp32_libs.end(), forced) != fp32_libs.end()) candidates = {forced};
    report.how = std::string("perf.gemm_route = ") + name_of(perf.gemm_route);
  }
  const bool timed = perf.peak_gflops <= 0;
  if (timed) {
    for (bool bf16 : {false, true}) {
      if (bf16 && !report.run_bf16) continue;  // an fp32 run's products are all fp32
      for (GemmClass cls : kernels::kGemmClasses)
        for (GemmLibrary l : bf16 ? kernels::gemm_libraries(true) : candidates) {
          const ClassRate r = time_gemm_class(bf16, cls, l, shapes);
          report.rate[bf16][static_cast<int>(cls)][static_cast<int>(l)] = r.flops;
          report.best_product[bf16][static_cast<int>(cls)][static_cast<int>(l)] = r.best_product_flops;
        }
    }
    mpi_all_reduce(MPI_IN_PLACE, &report.rate[0][0][0], 12, MPI_DOUBLE, MPI_MAX, comm, "the GEMM route's timing");
    mpi_all_reduce(MPI_IN_PLACE, &report.best_product[0][0][0], 12, MPI_DOUBLE, MPI_MAX, comm,
                   "the GEMM route's timing");
  }
  for (GemmClass cls : kernels::kGemmClasses) {
    const int c = static_cast<int>(cls);
    GemmLibrary pick = candidates.front();
    if (timed)
      for (GemmLibrary l : candidates)
        if (report.rate[0][c][static_cast<int>(l)] > kRouteMargin * report.rate[0][c][static_cast<int>(pick)]) pick = l;
    kernels::set_gemm_library(cls, pick);
    report.library[0][c] = pick;
    report.library[1][c] = kernels::gemm_library(cls, true);
  }
  if (report.how.empty())
    report.how = timed ? "chosen by timing the run's shapes, fastest rank's rates, BLAS unless another is " +
                             std::to_string(static_cast<int>(std::lround((kRouteMargin - 1) * 100))) + "% faster"
                       : "perf.peak_gflops given: nothing timed, the default route";
  kernels::set_gemm_route_report(report);
  return report;
}

PeakFlops peak_flops(const PerfConfig& perf, MPI_Comm comm, Precision precision, const ProductShapes& shapes) {
  const kernels::GemmRouteReport route = choose_gemm_route(perf, comm, precision, shapes);
  if (perf.peak_gflops > 0) return {perf.peak_gflops * 1e9, "given in the deck (perf.peak_gflops)", {}, route};
  GemmCalibration cal = calibrate_gemm(precision);
  double flops = cal.best_flops;
  // The route's own products (the fastest rank's): a product of the run's
  // shapes faster than the square one would otherwise read MFU above 1.
  const bool bf16 = precision == Precision::bf16;
  for (kernels::GemmClass cls : kernels::kGemmClasses) {
    const int c = static_cast<int>(cls);
    flops = std::max(flops, route.best_product[bf16][c][static_cast<int>(route.library[bf16][c])]);
  }
  mpi_all_reduce(MPI_IN_PLACE, &flops, 1, MPI_DOUBLE, MPI_MAX, comm, "the GEMM calibration");
  const std::string what = bf16 ? "bf16 GEMM" : "SGEMM";
  return {flops,
          "measured (1024^3 " + what + " calibration, NT/TN/NN, best of " + std::to_string(cal.run_flops.size()) +
              " runs" + (cal.thread_cpu_time ? " timed by the thread's CPU time" : "") +
              ", and the run's own products on the route chosen; fastest rank)",
          std::move(cal.run_flops), route};
}

}  // namespace ndmini
