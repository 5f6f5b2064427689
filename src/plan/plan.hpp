// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// ndmini plan evaluates the deck's layout on a cluster, or searches every
// valid layout of a world size and ranks them by predicted step time
// (plan/cost_model.hpp). It prints a table, or JSON (docs/planner.md).
#include <string>
#include <vector>

#include "config/config.hpp"
#include "plan/cluster.hpp"
#include "plan/cost_model.hpp"
#include "run/layout.hpp"

namespace ndmini {

struct PlanCandidate {
  Config cfg;  // the deck with this layout's settings
  RunLayout layout;
  StepPrediction prediction;
};

struct PlanSearch {
  std::vector<PlanCandidate> fitting;  // fastest first
  long long considered = 0;            // layouts tried
  long long valid = 0;                 // of which divide the world and the model
  long long evaluated = 0;             // of which were examined (memory, then time); the rest cannot be in the top
  double least_bytes = 0;              // a bound below the memory per device of every valid layout
};

// Whether the deck asks for a search: all five degrees 0.
bool degrees_unset(const ParallelConfig& p);

// Every layout of `world` devices: the five degrees, sequence parallelism,
// recompute, the micro-batch size (so the count), the schedule and the
// virtual stages. Keeps those that resolve (resolve_layout) and fit the
// cluster's device memory, fastest first: at least the `top` fastest (a
// layout whose lower bound, step_ms_lower_bound, exceeds the top-th
// fastest prediction is not evaluated further).
PlanSearch search_layouts(const Config& cfg, int world, const ClusterSpec& cluster, Precision precision,
                          std::size_t top, const Implementation& code = {});

// What `ndmini plan DECK --cluster FILE --world N` asks.
struct PlanRequest {
  std::string deck;
  std::vector<std::string> overrides;  // --set
  std::string cluster;
  int world = 0;
  std::size_t top = 10;
  bool json = false;
  bool search = false;  // also when the deck's five degrees are all 0
  // "fp32" or "bf16": the precision of the matrix products to plan for;
  // empty: the deck's train.precision.
  std::string precision;
  // The code whose run is predicted, where it is not ndmini
  // (--stored-attention-scores, --pp-scatter-gather).
  Implementation code;
};
// The report (text or JSON). Throws Error naming the key or file for a bad
// deck or cluster file, a layout that does not resolve (evaluation), or a
// world no layout divides or fits (search).
std::string run_plan(const PlanRequest& request);

// What a report says it planned: the request, the batch, and the notes on
// what limits or skews the answer (printed as `note:` lines, and `notes`).
struct PlanContext {
  std::string deck;
  ClusterSpec cluster;  // with device.memory_gib as the plan applies it
  int world = 0;
  Precision precision = Precision::fp32;
  int global_batch = 0, micro_batch = 0, seq_len = 0;  // the deck's (a search varies micro_batch)
  bool searched = false;
  std::size_t top = 1;
  Implementation code;
  std::vector<std::string> notes;
};

// The human report and the JSON document (keys in docs/planner.md).
std::string plan_text(const PlanContext& context, const PlanSearch& search);
std::string plan_json(const PlanContext& context, const PlanSearch& search);

}  // namespace ndmini
