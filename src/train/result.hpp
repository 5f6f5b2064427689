// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// What a run produced, in one record. The training loop (trainer.hpp) fills
// it, the closing PERFORMANCE block and the metrics file's summary object
// (report.hpp) print it, and train() returns it.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "run/calibration.hpp"

namespace ndmini {

// One step's figures reduced over the world: times are the slowest rank's
// (MPI_MAX) but exposed_min_ms (the least-blocked rank's, MPI_MIN); calls and
// bytes rank 0's.
struct StepStats {
  double step_ms = 0;
  std::vector<std::pair<std::string, CommStats>> comm;  // every reported group, in report order
  std::vector<double> bubble_ms;                        // time each pipeline stage waited for its neighbours
  double recompute_ms = 0;                              // re-running block forwards (recompute = block)
  double exposed_comm_ms() const;
};

// One step's routing over every MoE block: the tokens each expert received
// (summed over the ranks), their least, mean and most over every block's
// experts, and imbalance = most / mean (the worst block's: every block routes
// the same tokens, so all share the mean).
struct MoeLoad {
  std::int64_t min = 0, max = 0;
  double mean = 0, imbalance = 0;
  std::optional<double> aux_loss;  // the auxiliary losses' sum (train.moe_z_loss, train.moe_seq_aux), when on
  // The sigmoid router's selection bias over every MoE block, after this
  // step's move (train.moe_bias_rate), when on.
  std::optional<double> bias_min, bias_max;
};

struct TrainResult {
  std::int64_t first_step = 0;  // the step the run started at (after a resume, the checkpoint's)
  std::vector<double> losses;   // per step run, in order
  // (step, validation loss) where evaluated (train.eval_every): the held-out
  // loss of the parameters that step's loss was computed with.
  std::vector<std::pair<std::int64_t, double>> val_losses;
  std::vector<StepStats> timed;    // steps after the warm-up step
  std::vector<MoeLoad> moe_loads;  // an MoE run: each step's expert load, in order
  double median_step_ms = 0, tokens_per_s = 0, mfu = 0;
  PeakFlops peak;
  double io_ms = 0;  // checkpoint saves and loads, rank 0's time (for async saves, what training waited)
  // checkpoint.async: saves committed, their background writes (the slowest
  // rank's write and sync), and how long rank 0 waited for its thread.
  int async_saves = 0;
  double async_written_ms = 0, async_waited_ms = 0;
  std::int64_t staged_bytes = 0;  // the async save's host copy of the state
  double eval_ms = 0;             // all validation losses, rank 0's time
  double ideal_bubble = 0;
  std::int64_t state_bytes = 0, mem_bytes = 0;      // this rank's model state; the estimate of the busiest stage
  std::vector<std::int64_t> peak_activation_bytes;  // per pipeline stage, the most its ranks held in flight
  // 0, or signal_exit_status() of the stop signal (core/signals.hpp) the
  // ranks agreed on, at a step boundary or after the last step; the same on
  // every rank.
  int exit_status = 0;

  std::int64_t steps_run() const { return static_cast<std::int64_t>(losses.size()); }
  std::optional<double> final_loss() const;
  // The median over the timed steps of what `stage` waited for its neighbours.
  double median_bubble_ms(int stage) const;
};

double median(std::vector<double> v);

}  // namespace ndmini
