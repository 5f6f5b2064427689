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
#include <array>
#include <string>

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
std::string axis_names(const AxisSet& axes);  // "dp_shard x cp"

struct ParallelDims {
  int pp = 1, dp_replicate = 1, dp_shard = 1, cp = 1, tp = 1;
  bool sequence_parallel = false;  // the residual rows split over tp between the blocks' matmuls
  int virtual_stages = 1;          // pipeline chunks per pp rank (interleaved 1F1B)

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

  // Rank <-> coordinates: row-major, tp fastest (MPI_Cart_create without reorder).
  std::array<int, kNumAxes> coords_of(int rank) const;
  int rank_of(const std::array<int, kNumAxes>& coords) const;
  std::string str() const;  // "pp=1 dp_replicate=2 dp_shard=1 cp=1 tp=2"
};

}  // namespace ndmini
