// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// The run's own layout predicted by the planner's cost model
// (plan/cost_model.hpp) on the cluster file the deck names (perf.cluster),
// so the banner, the PERFORMANCE block and the metrics summary set each
// predicted part beside the measured one (docs/output.md).
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "config/config.hpp"
#include "plan/cluster.hpp"
#include "plan/cost_model.hpp"
#include "run/layout.hpp"

namespace ndmini {

struct RunPrediction {
  ClusterSpec cluster;  // as the file says, but the ranks per node the run really has
  StepPrediction step;

  // The parts as the run measures them: compute is everything but the
  // exposed communication (products, memory-bound kernels, recomputation,
  // the optimizer); pp's exposed time includes the bubble (waiting for a
  // neighbour stage is waiting in a pp transfer).
  double compute_ms() const;
  // The predicted exposed time of the reported group `name`; 0 for a group the prediction does not name.
  double exposed_ms(const std::string& name) const;
};

// Nothing without perf.cluster. Throws Error naming perf.cluster and the
// file for a cluster file that cannot be read or has a bad value.
std::optional<RunPrediction> predict_run(const Config& cfg, const RunLayout& layout, int ranks_per_node);

// The banner's line: "prediction: 9.5 ms/step, ..."
std::string prediction_line(const Config& cfg, const RunPrediction& p);

// The metrics summary's "predicted" object (docs/output.md#metrics).
nlohmann::json prediction_json(const RunPrediction& p);

}  // namespace ndmini
