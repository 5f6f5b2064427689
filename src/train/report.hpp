// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// What a run prints on rank 0 (docs/output.md): the banner, one progress
// line per logged step (train/metrics.hpp), and the closing PERFORMANCE
// block, whose machine-readable twin is the metrics file's summary object.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "parallel/context.hpp"
#include "train/calibration.hpp"
#include "train/layout.hpp"

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

// Collective over the world: reduces this rank's figures; resets the comm stats.
StepStats reduce_step(ParallelContext& ctx, double step_ms, double bubble_ms, double recompute_ms);

// Everything the closing report needs, gathered by the training loop.
struct RunSummary {
  std::vector<StepStats> timed;  // steps after the warm-up step
  double median_step_ms = 0, tokens_per_s = 0, mfu = 0;
  double io_ms = 0;
  double ideal_bubble = 0;
  std::int64_t state_bytes = 0, mem_bytes = 0;
  std::vector<std::int64_t> peak_activation_bytes;  // per pipeline stage, the most its ranks held in flight
  PeakFlops peak;
  std::optional<std::pair<std::int64_t, double>> val_loss;  // the last (step, validation loss), if any
  double eval_ms = 0;                                       // all validation losses, rank 0's time
};

double median(std::vector<double> v);

// `ndmini check`: the resolved deck, the model's sizes, the batch split,
// the pipeline's stages, the cp chunks, the memory estimate per stage and
// what one of the `ranks_on_node` ranks of a node may use.
void print_check(const Config& cfg, const RunLayout& layout, int ranks_on_node);
// `validation`: what the validation loss reads and when; "" without one.
void print_banner(const Config& cfg, const RunLayout& layout, const ParallelContext& ctx, const std::string& data,
                  const std::string& validation, const PeakFlops& peak, bool show_mesh);
void print_performance(const RunLayout& layout, const ParallelContext& ctx, const RunSummary& s);
// The metrics file's last line: {"summary": true, ...}.
std::string summary_json(const RunLayout& layout, const ParallelContext& ctx, const RunSummary& s, std::int64_t steps,
                         std::optional<double> final_loss);
// The line a run ends with when a stop signal (core/signals.hpp) reached it:
// the signal, the steps done, the checkpoint saved or why none, the exit
// status (signal_exit_status(), also when the run is complete: a script
// never takes a signalled run for an undisturbed one). `saved_step`: the
// step saved at the stop, -1: none; `interrupted`: steps were left (else the
// signal came after the last step).
std::string stop_line(const Config& cfg, int signal_number, std::int64_t steps_done, std::int64_t saved_step,
                      bool interrupted);

}  // namespace ndmini
