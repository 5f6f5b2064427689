// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// The training loop: each step runs the schedule's forward and backward
// micro-batch actions (parallel/pipeline/), completes the gradient
// reductions, checks the loss and the gradient norm, clips, and takes an
// AdamW step (optimizer.hpp); it logs (report.hpp, metrics.hpp) and saves
// checkpoints (checkpoint_state.hpp, io/).
#include <mpi.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "config/config.hpp"

namespace ndmini {

// Global tensors captured from a run, for comparing layouts (tests): every
// rank receives the full tensors, assembled from the owners' blocks.
struct TrainCapture {
  std::map<std::string, std::vector<float>> first_step_grads;  // after reduction, before clipping
  std::map<std::string, std::vector<float>> final_params;
  bool tied_wte_identical = false;  // after the last step: both pipeline ends hold the same wte, bit for bit
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
  // (step, validation loss) where evaluated (train.eval_every): the held-out
  // loss of the parameters that step's loss was computed with.
  std::vector<std::pair<std::int64_t, double>> val_losses;
  std::int64_t first_step = 0;
  double median_step_ms = 0;
  double tokens_per_s = 0;
  double mfu = 0;
  double peak_flops = 0;                   // per rank, FLOP/s
  std::vector<double> bubble_ms;           // per pipeline stage, median over the timed steps
  std::int64_t peak_activation_bytes = 0;  // the most this rank held in flight
  // 0, or signal_exit_status() of the stop signal (core/signals.hpp) the
  // ranks agreed on, at a step boundary or after the last step; the same on
  // every rank.
  int exit_status = 0;
};

// Trains on the ranks of `comm` as the deck says. Throws Error on bad input,
// missing files and non-finite losses. A stop signal received on any rank
// (core/signals.hpp; the caller installs the handler) stops every rank after
// the same step, with the state saved where the run saves checkpoints.
TrainResult train(const Config& cfg, const TrainOptions& opts, MPI_Comm comm);

}  // namespace ndmini
