// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// The layout of a run, resolved and checked once before anything is built.
// It holds the parallel degrees (mesh/dims.hpp), checked against the model's
// rules for that split (model/), how the global batch divides, and the
// pipeline's stage plan and schedule (parallel/pipeline/). These are built
// here once; every other place reads them from the layout. The memory
// estimate of a layout is declared here too.
#include <string>
#include <vector>

#include "config/config.hpp"
#include "mesh/mesh.hpp"
#include "model/gpt.hpp"
#include "parallel/pipeline/schedule.hpp"
#include "parallel/stage_runtime.hpp"
#include "run/memory_estimate.hpp"

namespace ndmini {

struct RunLayout {
  ParallelDims dims;      // the degrees, sequence parallelism, virtual stages; the groups derived from them
  int micro_batches = 1;  // per optimizer step, per data-parallel rank (gradient accumulation)
  Recompute recompute = Recompute::none;
  StagePlan plan;     // which layers each pipeline stage runs
  Schedule schedule;  // the order of its forward and backward actions (`none` when pp = 1)
};

// Throws Error with one message naming the key and the fix.
RunLayout resolve_layout(const Config& cfg, int world);

// Settings of the deck that change nothing in this layout, one sentence each
// (check and train print them as `note:` lines): harmless, so not refused.
std::vector<std::string> settings_without_effect(const Config& cfg, const RunLayout& layout);

// The memory estimate of every pipeline stage of a layout, and of the
// busiest one (no allocation).
std::vector<MemoryEstimate> estimate_memory_per_stage(const Config& cfg, const RunLayout& layout);
MemoryEstimate estimate_memory(const Config& cfg, const RunLayout& layout);

}  // namespace ndmini
