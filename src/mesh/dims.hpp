// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// The parallel degrees of a run, once (as torchtitan's ParallelDims). They
// are the five mesh axes pp, dp_replicate, dp_shard, cp, tp (outermost to
// innermost, tp fastest-varying), how the model is split over them (sequence
// parallelism, virtual pipeline stages), and the groups derived from them as
// accessors. They are resolved once from the deck (mesh.hpp resolve_mesh,
// run/layout.hpp); every place that needs a degree reads it from this value.
// There is no MPI here, so a layout can be checked for N ranks on a laptop
// (ndmini check --world N).
//
// The flattened groups, defined HERE once (mesh.hpp builds their communicators):
//   fsdp          dp_shard x cp          parameters, gradients and optimizer state are sharded over it
//   data_parallel dp_replicate x dp_shard ranks that take distinct sequences of the global batch
//   batch         pp x dp_replicate x dp_shard x cp
//                                        ranks whose losses are distinct: the loss is summed over it
//   norm          pp x dp_shard x cp x tp ranks that hold distinct parameter elements: the squared
//                                        gradient norm is summed over it
//   expert        ep consecutive ranks of dp_shard x cp x tp (innermost first, as torchtitan and
//                 Megatron place it; not a mesh axis): an MoE block's experts split over it and its
//                 tokens are exchanged (all-to-all) inside it
//   expert_fsdp   the rest of dp_shard x cp x tp: the ranks of one expert-group position, which
//                 hold the same experts; they are FSDP-sharded over it (and replicated over dp_replicate)
#include <array>
#include <string>
#include <vector>

namespace ndmini {

enum class Axis : int { pp = 0, dp_replicate = 1, dp_shard = 2, cp = 3, tp = 4 };
inline constexpr int kNumAxes = 5;
inline constexpr std::array<Axis, kNumAxes> kAxes = {Axis::pp, Axis::dp_replicate, Axis::dp_shard, Axis::cp, Axis::tp};
const char* axis_name(Axis a);  // "pp", "dp_replicate", ...

// A set of axes (indexed by Axis): the axes a flattened group spans.
using AxisSet = std::array<bool, kNumAxes>;
inline constexpr AxisSet kFsdpAxes = {false, false, true, true, false};
inline constexpr AxisSet kDataParallelAxes = {false, true, true, false, false};
inline constexpr AxisSet kBatchAxes = {true, true, true, true, false};
inline constexpr AxisSet kNormAxes = {true, false, true, true, true};
inline constexpr AxisSet kExpertHostAxes = {false, false, true, true, true};  // the ranks ep splits
std::string axis_names(const AxisSet& axes);                                  // "dp_shard x cp"

struct ParallelDims {
  int pp = 1, dp_replicate = 1, dp_shard = 1, cp = 1, tp = 1;
  bool sequence_parallel = false;  // the residual rows split over tp between the blocks' matmuls
  int virtual_stages = 1;          // pipeline chunks per pp rank (interleaved 1F1B)
  int ep = 1;                      // expert parallelism: divides dp_shard x cp x tp (resolve_mesh checks it)

  // The degrees in axis order (pp first); sequence_parallel and virtual_stages left at their defaults.
  static ParallelDims from_degrees(const std::array<int, kNumAxes>& degrees);
  int degree_of(Axis a) const;
  std::array<int, kNumAxes> degrees() const { return {pp, dp_replicate, dp_shard, cp, tp}; }
  bool enabled(Axis a) const { return degree_of(a) > 1; }
  int size() const;                     // the world: product of the degrees
  int span(const AxisSet& axes) const;  // product of the degrees of `axes`
  int fsdp() const { return span(kFsdpAxes); }
  int data_parallel() const { return span(kDataParallelAxes); }
  int batch() const { return span(kBatchAxes); }
  int norm() const { return span(kNormAxes); }
  int expert_fsdp() const { return span(kExpertHostAxes) / ep; }

  // The expert groups and the experts' FSDP groups (defined above), each in
  // rank order, the groups ordered by their lowest rank. An expert group's
  // member i (its ep rank) holds experts [i E/ep, (i+1) E/ep).
  std::vector<std::vector<int>> expert_groups() const;
  std::vector<std::vector<int>> expert_fsdp_groups() const;
  // A rank's place among dp_shard x cp x tp: (dp_shard x cp + cp) x tp + tp,
  // consecutive world ranks for consecutive places.
  int expert_host_index(int rank) const;
  int ep_rank(int rank) const { return expert_host_index(rank) % ep; }

  // Rank <-> coordinates: row-major, tp fastest (MPI_Cart_create without reorder).
  std::array<int, kNumAxes> coords_of(int rank) const;
  int rank_of(const std::array<int, kNumAxes>& coords) const;
  std::string str() const;  // "pp=1 dp_replicate=2 dp_shard=1 cp=1 tp=2"
};

}  // namespace ndmini
