// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// The peak MFU is measured against: given in the deck (perf.peak_gflops) or
// measured at start-up by a short SGEMM calibration on every rank.
#include <mpi.h>

#include <string>

#include "config/config.hpp"

namespace ndmini {

// Measures the GEMM rate (FLOP/s) of this rank with a short SGEMM calibration.
double calibrate_gemm_flops();

struct PeakFlops {
  double flops_per_rank = 0;
  std::string source;  // for the report: where the figure comes from
};
// Collective over comm when it calibrates: the fastest rank sets the peak,
// so a calibration slowed by a busy core cannot flatter the MFU.
PeakFlops peak_flops(const PerfConfig& perf, MPI_Comm comm);

}  // namespace ndmini
