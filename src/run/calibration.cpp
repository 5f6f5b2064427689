// SPDX-License-Identifier: BSD-3-Clause
#include "run/calibration.hpp"

#include <algorithm>
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

PeakFlops peak_flops(const PerfConfig& perf, MPI_Comm comm, Precision precision) {
  if (perf.peak_gflops > 0) return {perf.peak_gflops * 1e9, "given in the deck (perf.peak_gflops)", {}};
  GemmCalibration cal = calibrate_gemm(precision);
  double flops = cal.best_flops;
  mpi_all_reduce(MPI_IN_PLACE, &flops, 1, MPI_DOUBLE, MPI_MAX, comm, "the GEMM calibration");
  const std::string what = precision == Precision::bf16 ? "bf16 GEMM" : "SGEMM";
  return {flops,
          "measured (1024^3 " + what + " calibration, NT/TN/NN, best of " + std::to_string(cal.run_flops.size()) +
              " runs" + (cal.thread_cpu_time ? " timed by the thread's CPU time" : "") + ", fastest rank)",
          std::move(cal.run_flops)};
}

}  // namespace ndmini
