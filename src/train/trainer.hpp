// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// The training loop (trainer.cpp's Trainer, read top to bottom): setup
// builds the layout, the mesh, the model, the data and resumes; each step()
// runs the schedule's forward and backward micro-batch actions
// (parallel/pipeline/), completes the gradient reductions, checks the loss
// and the gradient norm, clips, and takes an AdamW step (optimizer.hpp);
// evaluate() is the one forward-only loss (the validation loss, the check of
// the final state); finish() saves and reports (report.hpp, metrics.hpp).
#include <mpi.h>

#include <cstdint>
#include <optional>
#include <string>

#include "config/config.hpp"
#include "layers/moe_routing.hpp"
#include "train/result.hpp"

namespace ndmini {

struct TrainCapture;  // tests only: train/capture.hpp

struct TrainOptions {
  std::string metrics_path;                 // JSON lines; empty: none
  bool resume = false;                      // --resume
  std::optional<std::int64_t> resume_step;  // --resume STEP; nullopt: latest
  TrainCapture* capture = nullptr;          // tests: fill with global gradients and parameters
  // Tests: every MoE row takes the experts this routing chose for its token
  // (a run's TrainCapture::routing; layers/moe_routing.hpp) in place of its
  // router's top-k; its scores and gate weights are still its own.
  const MoeRouting* replay_routing = nullptr;
  // Tests: the MoE sums' negative controls (tests/test_equivalence.cpp): the
  // routed experts' gradients multiplied by ep after their reductions (the
  // divisor bug the anchors had), and the selection bias moved from the
  // counts of tp rank 0 only (the tp term left out of its sums).
  struct MoeControls {
    bool expert_grads_times_ep = false;
    bool bias_counts_without_tp = false;
  } moe_controls;
  bool quiet = false;      // no banner, progress lines or PERFORMANCE block
  bool show_mesh = false;  // --show-mesh: the banner prints the rank-to-coordinate map
  std::string deck_path;   // for the metrics header: the deck as given
  std::string git_sha;     // for the metrics header: the commit the binary was built from
};

// Trains on the ranks of `comm` as the deck says. Throws Error on bad input,
// missing files and non-finite losses. A stop signal received on any rank
// (core/signals.hpp; the caller installs the handler) stops every rank after
// the same step, with the state saved where the run saves checkpoints.
TrainResult train(const Config& cfg, const TrainOptions& opts, MPI_Comm comm);

}  // namespace ndmini
