// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// The training loop: data, forward/backward with gradient accumulation,
// global-norm clipping, AdamW with warm-up + cosine schedule, logging,
// metrics and checkpoints.
#include <mpi.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "config/config.hpp"

namespace ndmini {

// Learning rate of step s: linear warm-up over warmup_steps, then cosine
// decay from lr to min_lr at the last step.
double learning_rate(const TrainConfig& t, std::int64_t step);

// Global tensors captured from a run, for comparing layouts (tests): every
// rank receives the full tensors, assembled from the owners' blocks.
struct TrainCapture {
  std::map<std::string, std::vector<float>> first_step_grads;  // after reduction, before clipping
  std::map<std::string, std::vector<float>> final_params;
};

struct TrainOptions {
  std::string metrics_path;                 // JSON lines; empty: none
  bool resume = false;                      // --resume
  std::optional<std::int64_t> resume_step;  // --resume STEP; nullopt: latest
  TrainCapture* capture = nullptr;          // tests: fill with global gradients and parameters
  bool quiet = false;                       // no banner, progress lines or PERFORMANCE block
  bool show_mesh = false;                   // --show-mesh: the banner prints the rank-to-coordinate map
};

struct TrainResult {
  std::vector<double> losses;  // per step run, in order
  std::int64_t first_step = 0;
  double median_step_ms = 0;
  double tokens_per_s = 0;
  double mfu = 0;
  double peak_flops = 0;  // per rank, FLOP/s
};

// Trains on the ranks of `comm` as the deck says. Throws Error on bad input,
// missing files and non-finite losses.
TrainResult train(const Config& cfg, const TrainOptions& opts, MPI_Comm comm);

// Measures the GEMM rate (FLOP/s) with a short SGEMM calibration.
double calibrate_gemm_flops();

}  // namespace ndmini
