// SPDX-License-Identifier: BSD-3-Clause
#include "train/prediction.hpp"

#include <cstdio>

#include "core/error.hpp"

namespace ndmini {

double RunPrediction::compute_ms() const {
  return step.compute_ms + step.recompute_ms + step.kernels_ms + step.optimizer_ms;
}

double RunPrediction::exposed_ms(const std::string& name) const {
  for (const GroupTraffic& g : step.comm)
    if (g.name == name) return g.exposed_ms + (name == "pp" ? step.bubble_ms : 0.0);
  return 0;
}

std::optional<RunPrediction> predict_run(const Config& cfg, const RunLayout& layout, int ranks_per_node) {
  if (cfg.perf.cluster.empty()) return std::nullopt;
  RunPrediction p;
  try {
    p.cluster = load_cluster(cfg.perf.cluster);
  } catch (const Error& e) {
    throw Error(std::string("perf.cluster: ") + e.what());
  }
  // Which groups cross nodes follows from where this run's ranks are, not the file's node size.
  p.cluster.devices_per_node = ranks_per_node;
  p.step = predict_step(cfg, layout, p.cluster, cfg.train.precision);
  return p;
}

std::string prediction_line(const Config& cfg, const RunPrediction& p) {
  const StepPrediction& s = p.step;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "prediction: %.1f ms/step, %.0f tok/s, MFU %.1f%% of the cluster's peak | compute %.1f ms, exposed "
                "comm %.1f ms, bubble %.1f ms | on %s (perf.cluster = %s, %d ranks per node)",
                s.step_ms, s.tokens_per_s, 100 * s.mfu, p.compute_ms(), s.exposed_comm_ms, s.bubble_ms,
                p.cluster.name.c_str(), cfg.perf.cluster.c_str(), p.cluster.devices_per_node);
  return buf;
}

nlohmann::json prediction_json(const RunPrediction& p) {
  const StepPrediction& s = p.step;
  nlohmann::json exposed = nlohmann::json::object();
  for (const GroupTraffic& g : s.comm) exposed[g.name] = p.exposed_ms(g.name);
  nlohmann::json j;
  j["cluster"] = p.cluster.name;
  j["cluster_file"] = p.cluster.origin;
  j["step_ms"] = s.step_ms;
  // compute_ms is the sum of the three after it: what `ndmini plan --fit` rescales.
  j["compute_ms"] = p.compute_ms();
  j["products_ms"] = s.compute_ms + s.recompute_ms;
  j["kernels_ms"] = s.kernels_ms;
  j["optimizer_ms"] = s.optimizer_ms;
  j["recompute_ms"] = s.recompute_ms;
  j["exposed_comm_ms"] = exposed;
  j["bubble_ms"] = s.bubble_ms;
  j["tokens_per_s"] = s.tokens_per_s;
  j["mfu"] = s.mfu;
  j["mem_bytes"] = s.memory.total();
  return j;
}

}  // namespace ndmini
