// SPDX-License-Identifier: BSD-3-Clause
#include "train/calibration.hpp"

#include <algorithm>

#include "comm/mpi/mpi_calls.hpp"
#include "core/timer.hpp"
#include "core/types.hpp"
#include "kernels/kernels.hpp"

namespace ndmini {

double calibrate_gemm_flops() {
  // A square SGEMM the size of the larger model GEMMs; best of a few runs
  // after one warm-up, about 0.2 s in total at 100 GFLOP/s. Best, not
  // median: a busy core can only make a run slower.
  constexpr int kN = 1024, kRuns = 12;
  View2D a("ndmini::calib_a", kN, kN), b("ndmini::calib_b", kN, kN), c("ndmini::calib_c", kN, kN);
  Kokkos::deep_copy(a, 0.5f);
  Kokkos::deep_copy(b, 0.25f);
  double best = 0;
  for (int rep = 0; rep < kRuns; ++rep) {
    Kokkos::fence();
    const auto t0 = Clock::now();
    kernels::gemm("N", "T", 1.0f, a, b, 0.0f, c);  // the model's GEMM path (cuBLAS on a GPU)
    Kokkos::fence();
    const double s = seconds_since(t0);
    if (rep > 0) best = std::max(best, 2.0 * kN * kN * kN / s);
  }
  return best;
}

PeakFlops peak_flops(const PerfConfig& perf, MPI_Comm comm) {
  if (perf.peak_gflops > 0) return {perf.peak_gflops * 1e9, "given in the deck (perf.peak_gflops)"};
  double flops = calibrate_gemm_flops();
  mpi_all_reduce(MPI_IN_PLACE, &flops, 1, MPI_DOUBLE, MPI_MAX, comm, "the GEMM calibration");
  return {flops, "measured (1024^3 SGEMM calibration, fastest rank)"};
}

}  // namespace ndmini
