// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Sizes bounded before anything is allocated: the memory one rank of a run
// needs, estimated from the deck and the layout alone (in floating point, so
// absurd decks cannot overflow the arithmetic), and the refusal of a deck that
// cannot fit, naming the keys that make it large. `ndmini check` and `train`
// both call it before any model memory exists.
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "mesh/mesh.hpp"

namespace ndmini {

struct MemoryEstimate {
  // One part of the estimate: bytes per rank and the deck keys it grows with.
  struct Part {
    std::string keys;  // e.g. "model.layers = 12 x model.channels = 768"
    std::string kind;  // "model state", "activations" or "data"
    double bytes = 0;
  };
  std::vector<Part> parts;
  double state() const { return sum("model state"); }
  double activations() const { return sum("activations"); }
  double data() const { return sum("data"); }
  double total() const;
  const Part& largest() const;

 private:
  double sum(const std::string& kind) const;
};

// Per rank: parameters, gradients and AdamW moments (this rank's tp part of
// its FSDP shard, plus the units FSDP gathers), the activations of one
// micro-batch (this rank's tp share), and the tokens of a file source.
MemoryEstimate estimate_memory(const Config& cfg, const MeshShape& shape);

// The memory one rank may use: perf.memory_per_rank_gib when set, else the
// node's MemAvailable divided by `ranks_on_node`; 0 when unknown. *how says which.
double memory_per_rank(const Config& cfg, int ranks_on_node, std::string* how);

// Throws Error naming the keys of the largest part when the estimate exceeds
// what one rank may use.
void require_memory_fits(const Config& cfg, const MeshShape& shape, int ranks_on_node);

// Bytes of one checkpoint of the model: parameters and both AdamW moments.
std::uint64_t checkpoint_bytes(const ModelConfig& m);

// "1.5 GiB"
std::string bytes_text(double bytes);

}  // namespace ndmini
