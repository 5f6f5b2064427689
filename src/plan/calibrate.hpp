// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// ndmini plan --calibrate measures the cluster file of the machine ndmini
// runs on (docs/planner.md). It holds:
// - the GEMM peak per precision, from the start-up calibration
//   (run/calibration.hpp);
// - what the model's own kernels reach: a block's Linear products and its
//   attention as fractions of the peak, and the memory-bound kernels'
//   bandwidth;
// - the collectives' latency and bandwidth, from a short ping of the comm
//   layer over the launched ranks, inverted through the same cost formula
//   the planner predicts with (plan/cost_model.hpp);
// - how much of a collective hides behind compute.
#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

#include "plan/cluster.hpp"

namespace ndmini {

// Where a calibration stops being a measurement of the machine
// (docs/planner.md, "Sanity checks"); each threshold can be overridden
// through its environment variable (for a test, or a machine known to be
// odd) named in calibration_limits_from_environment.
struct CalibrationLimits {
  double most_pass_spread = 0.25;     // (max - min) / median of a figure's passes
  double most_latency_us = 500;       // per ring step of a 4-byte all-reduce
  double least_bf16_over_fp32 = 1.0;  // the bf16 peak against the fp32 peak, where bf16 is native
  double most_load_per_core = 0.5;    // /proc/loadavg's 1-minute load per online core, before measuring
  std::string loadavg_file = "/proc/loadavg";
  int passes = 3;  // of the kernels and the overlap, each figure the median of its passes
};
// The defaults, with NDMINI_CALIBRATE_MAX_SPREAD, NDMINI_CALIBRATE_MAX_LATENCY_US,
// NDMINI_CALIBRATE_MIN_BF16_RATIO, NDMINI_CALIBRATE_MAX_LOAD_PER_CORE and
// NDMINI_CALIBRATE_LOADAVG (a file read instead of /proc/loadavg) and
// NDMINI_CALIBRATE_PASSES where set. Throws Error naming a variable whose
// value is not a number (for the passes: not a whole number from 1 to 100).
CalibrationLimits calibration_limits_from_environment();

// What the sanity checks look at.
struct CalibrationSamples {
  std::vector<std::pair<std::string, std::vector<double>>> passes;  // each figure's passes
  double latency_us = 0;                                            // the intra-node latency written
  double latency_call_ms = 0;                                       // the 4-byte all-reduce it came from
  double large_call_ms = 0;                                         // the 64 MiB all-reduce beside it
  double peak_fp32 = 0, peak_bf16 = 0;
  bool native_bf16 = true;  // false: bf16 emulated through fp32 (slower by design)
};
// One line per check that fails, empty when all pass.
std::vector<std::string> calibration_warnings(const CalibrationSamples& s, const CalibrationLimits& limits);
// A warning when the 1-minute load per online core of limits.loadavg_file
// exceeds limits.most_load_per_core (the cores are busy with something else);
// empty otherwise. Throws Error naming the file where it cannot be read.
std::string load_warning(const CalibrationLimits& limits, int online_cores);

struct Calibration {
  std::string text;                   // the cluster file (rank 0; empty elsewhere)
  std::vector<std::string> warnings;  // the sanity checks' (every rank)
};
// Collective over `world` (at least 2 ranks, for the ping). `progress` (rank
// 0 only; may be empty) receives one line per phase. Throws Error with one
// rank.
Calibration calibrate_cluster(MPI_Comm world, const CalibrationLimits& limits,
                              const std::function<void(const std::string&)>& progress = {});

}  // namespace ndmini
