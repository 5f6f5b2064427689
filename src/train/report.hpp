// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// What a run prints on rank 0 (docs/output.md). That is the banner, one
// progress line per logged step (train/metrics.hpp), and the closing
// PERFORMANCE block, whose machine-readable twin is the metrics file's
// summary object.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.hpp"
#include "parallel/context.hpp"
#include "run/calibration.hpp"
#include "run/layout.hpp"
#include "train/metrics.hpp"
#include "train/prediction.hpp"
#include "train/result.hpp"

namespace ndmini {

// Collective over the world: reduces this rank's figures; resets the comm stats.
StepStats reduce_step(ParallelContext& ctx, double step_ms, double bubble_ms, double recompute_ms);
// Collective over `world`: the load of the experts from the rows each rank
// routed ([layer E + expert], StageRuntime::take_routed_rows), summed over
// the ranks in place (every rank then holds the step's counts), and the
// auxiliary losses from their sums (StageRuntime::take_aux_sums): the z-loss
// coefficient times its mean over the step's `tokens`, the balance loss
// coefficient times its mean over the step's `sequences`. None for a dense model.
std::optional<MoeLoad> reduce_moe_load(const ModelConfig& m, const TrainConfig& t, std::vector<std::int64_t>& routed,
                                       double z_loss_sum, double seq_aux_sum, double tokens, double sequences,
                                       MPI_Comm world);

// `ndmini check`: the resolved deck, the model's sizes, the batch split,
// the pipeline's stages, the cp chunks, the memory estimate per stage and
// what one of the `ranks_on_node` ranks of a node may use.
// With perf.cluster, also the prediction of the layout's step.
void print_check(const Config& cfg, const RunLayout& layout, int ranks_on_node);
// `validation`: what the validation loss reads and when; "" without one.
void print_banner(const Config& cfg, const RunLayout& layout, const ParallelContext& ctx, const std::string& data,
                  const std::string& validation, const PeakFlops& peak, bool show_mesh,
                  const std::optional<RunPrediction>& prediction);
// Each communication group's line only where the group spans more than one
// rank; with a prediction, each part's predicted time beside it.
void print_performance(const RunLayout& layout, const ParallelContext& ctx, const TrainResult& r,
                       const std::optional<RunPrediction>& prediction);
// The metrics file's last line: {"summary": true, ...}.
std::string summary_json(const RunLayout& layout, const ParallelContext& ctx, const TrainResult& r,
                         const std::optional<RunPrediction>& prediction);
// The line a run ends with when a stop signal (core/signals.hpp) reached it:
// the signal, the steps done, the checkpoint saved or why none, the exit
// status (signal_exit_status(), also when the run is complete: a script
// never takes a signalled run for an undisturbed one). `saved_step`: the
// step saved at the stop, -1: none; `interrupted`: steps were left (else the
// signal came after the last step).
std::string stop_line(const Config& cfg, int signal_number, std::int64_t steps_done, std::int64_t saved_step,
                      bool interrupted);

}  // namespace ndmini
