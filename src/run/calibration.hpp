// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// The peak MFU is measured against. The deck gives it (perf.peak_gflops), or
// a short GEMM calibration on every rank measures it at start-up, in the
// precision the run's matrix products use.
#include <mpi.h>

#include <string>
#include <vector>

#include "config/config.hpp"

namespace ndmini {

struct GemmCalibration {
  double best_flops = 0;          // the peak: the fastest of the timed runs
  std::vector<double> run_flops;  // every timed run (the warm-up excluded), in order
  bool thread_cpu_time = false;   // runs timed by the calling thread's CPU time (products on it alone)
};
// Times `runs` products of 1024 x 1024 matrices in `precision` (bf16: bf16
// inputs, fp32 accumulation, as the model's bf16 products) through the
// model's GEMM route (cuBLAS on a GPU), C = A B^T, A^T B and A B in turn (the
// model's three uses of a weight), after an untimed warm-up of each, and
// keeps the BEST: a busy core can only make a run slower, so the best run is
// the closest to what the hardware does, and no run of the calibration reads
// above it (MFU <= 1 for it by construction).
GemmCalibration calibrate_gemm(Precision precision = Precision::fp32, int runs = 12);
// calibrate_gemm(precision).best_flops.
double calibrate_gemm_flops(Precision precision = Precision::fp32);

struct PeakFlops {
  double flops_per_rank = 0;
  std::string source;             // for the report: where the figure comes from
  std::vector<double> run_flops;  // this rank's calibration runs; empty when the deck gave the peak
};
// Collective over comm when it calibrates: the fastest rank sets the peak,
// so a calibration slowed by a busy core cannot flatter the MFU. With
// perf.peak_gflops > 0 nothing is measured (and nothing communicated).
PeakFlops peak_flops(const PerfConfig& perf, MPI_Comm comm, Precision precision = Precision::fp32);

}  // namespace ndmini
