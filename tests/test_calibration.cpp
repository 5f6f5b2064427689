// SPDX-License-Identifier: BSD-3-Clause
// The MFU peak: the calibration keeps the best of its runs in each precision,
// so no run of the calibration product reads above the peak (MFU <= 1 for it),
// and a peak given in the deck (--set perf.peak_gflops=N) measures nothing.
//
// Why not "calibrate, then time the product again and expect rate <= peak":
// that races the machine's load. A calibration taken while the other core is
// busy and a later run on a quiet core would read above the peak with no bug.
// What holds whatever the load is a property of the maximum over the SAME
// runs: every run <= best, best == the fastest run. A median or mean (or the
// warm-up counted, or a run dropped) breaks it, so this is what is checked.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>

#include "config/config.hpp"
#include "kernels/gemm_library.hpp"
#include "run/calibration.hpp"

using namespace ndmini;

namespace {

void expect_best_of_runs(Precision precision) {
  SCOPED_TRACE(name_of(precision));
  const GemmCalibration cal = calibrate_gemm(precision, 5);
  ASSERT_EQ(cal.run_flops.size(), 5u) << "one rate per timed run, the warm-up excluded";
  for (double r : cal.run_flops) {
    EXPECT_GT(r, 1e6) << "a 1024^3 product runs at more than 1 MFLOP/s";
    EXPECT_LE(r / cal.best_flops, 1.0) << "a run's MFU against the calibrated peak";
  }
  EXPECT_EQ(cal.best_flops, *std::max_element(cal.run_flops.begin(), cal.run_flops.end()));
}

}  // namespace

TEST(Calibration, PeakIsTheBestOfItsRunsFp32) { expect_best_of_runs(Precision::fp32); }

TEST(Calibration, PeakIsTheBestOfItsRunsBf16) { expect_best_of_runs(Precision::bf16); }

TEST(Calibration, TimesProductsOnOneThreadByItsCpuTime) {
  // With OPENBLAS_NUM_THREADS=1 (fp32) and a Serial build's one oneDNN
  // thread (bf16), products run on the calling thread: its CPU time, which
  // other jobs on the core do not lengthen, times them; the report says so.
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    SCOPED_TRACE(name_of(p));
    const bool one_thread = kernels::host_products_on_one_thread(p == Precision::bf16);
    EXPECT_EQ(calibrate_gemm(p, 3).thread_cpu_time, one_thread);
    const PeakFlops peak = peak_flops(PerfConfig{}, MPI_COMM_WORLD, p);
    EXPECT_EQ(peak.source.find("CPU time") != std::string::npos, one_thread) << peak.source;
  }
}

TEST(Calibration, PeakGivenInTheDeckSkipsCalibration) {
  PerfConfig perf;
  perf.peak_gflops = 123.5;
  for (Precision p : {Precision::fp32, Precision::bf16}) {
    const PeakFlops peak = peak_flops(perf, MPI_COMM_WORLD, p);
    EXPECT_DOUBLE_EQ(peak.flops_per_rank, 123.5e9);
    EXPECT_NE(peak.source.find("perf.peak_gflops"), std::string::npos) << peak.source;
    EXPECT_TRUE(peak.run_flops.empty()) << "nothing may be measured when the deck gives the peak";
  }
}

TEST(Calibration, MeasuredPeakIsTheFastestRank) {
  const PeakFlops peak = peak_flops(PerfConfig{}, MPI_COMM_WORLD, Precision::fp32);
  ASSERT_FALSE(peak.run_flops.empty());
  // At least this rank's best (MPI_MAX over ranks), and no run of this rank above it.
  for (double r : peak.run_flops) EXPECT_LE(r, peak.flops_per_rank);
  EXPECT_NE(peak.source.find("best of"), std::string::npos) << peak.source;
  double mine = *std::max_element(peak.run_flops.begin(), peak.run_flops.end()), fastest = 0;
  MPI_Allreduce(&mine, &fastest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(peak.flops_per_rank, fastest);
}
