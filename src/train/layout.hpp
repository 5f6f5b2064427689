// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// The layout of a run, resolved and checked once before anything is built:
// the mesh degrees (mesh/), the model's rules for that split (model/), the
// pipeline's rules (parallel/pipeline/) and how the global batch divides.
#include <string>
#include <vector>

#include "config/config.hpp"
#include "mesh/mesh.hpp"
#include "model/gpt.hpp"
#include "parallel/pipeline/schedule.hpp"
#include "parallel/stage_runtime.hpp"

namespace ndmini {

struct RunLayout {
  MeshShape mesh;
  ModelSplit split;
  ScheduleKind schedule = ScheduleKind::none;
  int data_parallel = 1;  // dp_replicate x dp_shard: ranks that take distinct sequences
  int micro_batches = 1;  // per optimizer step, per data-parallel rank (gradient accumulation)
  int fsdp = 1;           // dp_shard x cp: the FSDP group
  Recompute recompute = Recompute::none;
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
