// SPDX-License-Identifier: BSD-3-Clause
#include "plan/fit.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/regular_file.hpp"
#include "plan/cluster.hpp"

namespace ndmini {
namespace {

// The summary is the last line; the step records before it are not needed.
constexpr std::uint64_t kSummaryMaxBytes = std::uint64_t{1} << 20;
// Groups whose exposed time is the network's: not pp (mostly the bubble,
// waiting for a stage), batch and norm (one scalar each: waiting for the
// slowest rank, not moving bytes).
constexpr const char* kNetworkGroups[] = {"dp_replicate", "fsdp", "tp", "cp", "tied_wte"};

// What one run measured and what it was predicted to take, by part.
struct FitRun {
  std::string file, mesh;
  double step = 0, compute = 0, network = 0;                   // measured, ms
  double predicted_step = 0, products = 0, fixed_compute = 0;  // fixed: kernels and the optimizer
  double predicted_network = 0;
};

nlohmann::json last_line_json(const std::string& path) {
  const FileUse use{"metrics file '" + path + "'", "name the --metrics file of a finished ndmini train run"};
  RegularFile file(path, use);
  const std::uint64_t size = file.size(), from = size > kSummaryMaxBytes ? size - kSummaryMaxBytes : 0;
  std::string text(size - from, '\0');
  file.read_exact(from, text.data(), text.size());
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  const std::size_t start = text.rfind('\n');
  const std::string line = start == std::string::npos ? text : text.substr(start + 1);
  nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.value("summary", false))
    throw Error(use.name + ": its last line is not a run's summary (did the run finish?); " + use.fix);
  return j;
}

// The number at `key` of `j` (a summary or its prediction); throws Error
// naming the key and the file where it is absent or not a number.
double number_at(const nlohmann::json& j, const char* key, const std::string& name, const char* where) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number())
    throw Error(name + ": its summary has no number " + where + key +
                " (a summary of another ndmini version, or edited?); train again with this build");
  return it->get<double>();
}

FitRun read_run(const std::string& path, const ClusterSpec& cluster) {
  const nlohmann::json s = last_line_json(path);
  const std::string name = "metrics file '" + path + "'";
  static const nlohmann::json kNone;
  const auto found = s.find("predicted");
  const nlohmann::json& p = found == s.end() ? kNone : *found;
  if (!p.is_object())
    throw Error(name + ": its run has no prediction; train with --set perf.cluster=" + cluster.origin);
  if (p.value("cluster", std::string()) != cluster.name)
    throw Error(name + ": its run was predicted on cluster '" + p.value("cluster", std::string()) +
                "', not on --cluster '" + cluster.origin + "' ('" + cluster.name + "')");
  if (!p.contains("products_ms"))
    throw Error(name + ": its summary predates ndmini plan --fit (no predicted products_ms); train again");
  FitRun r;
  r.file = path;
  r.mesh = s.value("mesh", std::string());
  r.step = number_at(s, "median_step_ms", name, "");
  r.compute = number_at(s, "compute_ms", name, "");
  r.predicted_step = number_at(p, "step_ms", name, "predicted.");
  r.products = number_at(p, "products_ms", name, "predicted.");
  r.fixed_compute = number_at(p, "kernels_ms", name, "predicted.") + number_at(p, "optimizer_ms", name, "predicted.");
  const auto exposed = s.find("exposed_comm_ms"), predicted_exposed = p.find("exposed_comm_ms");
  if (exposed == s.end() || !exposed->is_object())
    throw Error(name + ": its summary has no object exposed_comm_ms; train again with this build");
  if (predicted_exposed == p.end() || !predicted_exposed->is_object())
    throw Error(name + ": its summary has no object predicted.exposed_comm_ms; train again with this build");
  for (const char* g : kNetworkGroups) {
    const auto m = exposed->find(g), q = predicted_exposed->find(g);
    if (m != exposed->end() && m->is_number()) r.network += m->get<double>();
    if (q != predicted_exposed->end() && q->is_number()) r.predicted_network += q->get<double>();
  }
  return r;
}

// The scale x minimising sum(((a x + b - m) / m)^2): relative errors, so a
// long run does not outweigh a short one. 0 when no run has a > 0.
double relative_least_squares(const std::vector<double>& a, const std::vector<double>& b,
                              const std::vector<double>& m) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i] > 0 && m[i] > 0) {
      num += a[i] * (m[i] - b[i]) / (m[i] * m[i]);
      den += a[i] * a[i] / (m[i] * m[i]);
    }
  return den > 0 ? num / den : 0;
}

}  // namespace

std::string run_fit(const FitRequest& request) {
  if (request.metrics.empty()) throw Error("ndmini plan --fit needs at least one metrics file");
  if (request.cluster.empty())
    throw Error("ndmini plan --fit needs --cluster FILE: the cluster file the runs were predicted on");
  const ClusterSpec before = load_cluster(request.cluster);
  std::vector<FitRun> runs;
  for (const std::string& path : request.metrics) runs.push_back(read_run(path, before));

  // Predicted products take 1 / efficiency.compute, predicted exposed
  // network time about 1 / efficiency.network: fit the scale of each.
  std::vector<double> products, fixed, compute, network_pred, zero, network;
  for (const FitRun& r : runs) {
    products.push_back(r.products);
    fixed.push_back(r.fixed_compute);
    compute.push_back(r.compute);
    network_pred.push_back(r.predicted_network);
    zero.push_back(0);
    network.push_back(r.network);
  }
  const double compute_scale = relative_least_squares(products, fixed, compute);
  const double network_scale = relative_least_squares(network_pred, zero, network);
  if (compute_scale <= 0)
    throw Error("ndmini plan --fit: no run measured compute beyond its kernels and optimizer; nothing to fit");
  ClusterSpec after = before;
  // Its own name, so runs predicted on the refitted file are not taken for runs of this one.
  const std::string fitted = ", fitted by ndmini plan --fit";
  if (after.name.size() < fitted.size() || after.name.compare(after.name.size() - fitted.size(), fitted.size(), fitted))
    after.name += fitted;
  std::string report;
  char line[512];
  // Efficiencies are fractions of the peak: at most 1, whatever the runs say.
  auto refit = [&](const char* key, double& efficiency, double scale, const char* basis) {
    const double old = efficiency;
    if (scale > 0) efficiency = std::min(1.0, old / scale);
    std::snprintf(line, sizeof line, "%-28s %.4g -> %.4g  (%s%s)\n", key, old, efficiency, basis,
                  scale <= 0 ? "; no run exposed any: kept" : (old / scale > 1 ? "; capped at 1" : ""));
    report += line;
  };
  std::snprintf(line, sizeof line, "fitted on %zu run(s) predicted on %s ('%s'):\n", runs.size(),
                request.cluster.c_str(), before.name.c_str());
  report += line;
  refit("efficiency.compute", after.compute_efficiency, compute_scale,
        "measured compute = predicted products / scale + kernels + optimizer");
  refit("efficiency.attention", after.attention_efficiency, compute_scale, "with the products' scale");
  for (Precision precision : {Precision::fp32, Precision::bf16})
    for (int k = 0; k < kGemmClasses; ++k)
      if (after.gemm_key(GemmClass(k), precision) > 0) {  // the shape classes the file has
        refit(gemm_key_path(GemmClass(k), precision).c_str(), after.gemm_key(GemmClass(k), precision), compute_scale,
              "with the products' scale");
      }
  refit("efficiency.network", after.network_efficiency, network_scale,
        "measured exposed dp_replicate, fsdp, tp, cp, tied_wte time = predicted x scale");

  // Each run's step with the parts rescaled (the bubble and pp as predicted).
  report +=
      "run                                  mesh                                        measured   predicted  refit\n";
  double error_before = 0, error_after = 0;
  const double c = before.compute_efficiency / after.compute_efficiency;
  const double n = before.network_efficiency / after.network_efficiency;
  for (const FitRun& r : runs) {
    const double refitted = r.predicted_step + r.products * (c - 1) + r.predicted_network * (n - 1);
    error_before += std::abs(r.predicted_step - r.step) / r.step;
    error_after += std::abs(refitted - r.step) / r.step;
    std::snprintf(line, sizeof line, "%-36s %-43s %8.1f ms %8.1f ms %8.1f ms\n", r.file.c_str(), r.mesh.c_str(), r.step,
                  r.predicted_step, refitted);
    report += line;
  }
  std::snprintf(line, sizeof line,
                "mean |error| of the step: %.1f%% with the file's constants, %.1f%% refitted (the parts rescaled; "
                "ndmini plan with the refitted file gives the whole model's figure)\n",
                100 * error_before / runs.size(), 100 * error_after / runs.size());
  report += line;
  if (!request.out.empty()) {
    std::string header = "# Written by `ndmini plan --fit` (docs/planner.md): " + request.cluster +
                         " with efficiency.compute and efficiency.network fitted to the runs of\n";
    for (const FitRun& r : runs) header += "#   " + r.file + "\n";
    write_cluster_file(request.out, cluster_toml(after, header));
    report += "wrote " + request.out + "\n";
  }
  return report;
}

}  // namespace ndmini
