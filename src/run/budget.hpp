// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Sizes bounded before anything is allocated. The memory one rank of a run
// needs is the busiest pipeline stage's estimate (run/layout.hpp) plus the
// tokens of a file source. It is set against what one rank may use, and a
// deck that cannot fit is refused, naming the keys that make it large.
// `ndmini check` and `train` both call it before any model memory exists.
// The planner reads its byte counts and the memory one rank may use.
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "run/layout.hpp"

namespace ndmini {

// One part of what a rank needs: bytes and the deck keys it grows with.
struct MemoryPart {
  std::string kind;  // "model state", "activations", "scratch" or "data"
  std::string keys;  // e.g. "model.layers = 12 x model.channels = 768"
  double bytes = 0;
};

// The parts of the busiest stage's estimate, and the data a file source holds.
std::vector<MemoryPart> memory_parts(const Config& cfg, const RunLayout& layout);

// Bytes a file data source holds in memory (its tokens); 0
// for the synthetic source or a file that cannot be read (reported later).
double data_bytes(const Config& cfg);

// The memory one rank may use: perf.memory_per_rank_gib when set, else the
// node's MemAvailable divided by `ranks_on_node`; 0 when unknown. *how says which.
double memory_per_rank(const Config& cfg, int ranks_on_node, std::string* how);

// Throws Error naming the keys of the largest part when the run needs more
// than one rank may use.
void require_memory_fits(const Config& cfg, const RunLayout& layout, int ranks_on_node);

// Bytes of one checkpoint of the model: parameters and both AdamW moments.
std::uint64_t checkpoint_bytes(const ModelConfig& m);

// "1.5 GiB"
std::string bytes_text(double bytes);

}  // namespace ndmini
