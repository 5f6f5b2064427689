// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// The Cartesian mesh: the world as an MPI_Cart_create over the axes
// pp, dp_replicate, dp_shard, cp, tp (outermost to innermost, rank order kept,
// so tp is fastest-varying and lands on consecutive ranks), one
// sub-communicator per axis, and the flattened groups the layers need.
//
// Which ranks reduce what is defined HERE, once:
//   fsdp()        dp_shard x cp       parameters, gradients and optimizer state are sharded over it
//                                     (gradients reduce-scattered)
//   axis(dp_replicate)                gradients all-reduced (pure DP, and the replicate half of HSDP)
//   batch()       pp x dp_replicate x dp_shard x cp
//                                     ranks whose losses are distinct: the loss is summed over it
//                                     (only the last pipeline stage holds losses; the others add 0)
//   norm()        pp x dp_shard x cp x tp
//                                     ranks that hold distinct parameter elements (tp-replicated
//                                     tensors counted on tp rank 0 only, the tied wte on the first
//                                     stage only): the squared gradient norm is summed over it
//   pipeline_ends()                   the first and the last stage of one pipeline (same
//                                     coordinates but pp); null on middle stages and when pp = 1
//                                     (the model's tied embedding is summed over it)
//
// The mesh knows no model: whether a layout fits the model (heads, sequence,
// layers) is the model's rule, checked where the layout is resolved.
#include <mpi.h>

#include <array>
#include <string>

#include "config/config.hpp"

namespace ndmini {

enum class Axis : int { pp = 0, dp_replicate = 1, dp_shard = 2, cp = 3, tp = 4 };
inline constexpr int kNumAxes = 5;
inline constexpr std::array<Axis, kNumAxes> kAxes = {Axis::pp, Axis::dp_replicate, Axis::dp_shard, Axis::cp, Axis::tp};
const char* axis_name(Axis a);  // "pp", "dp_replicate", ...

// Degrees per axis and the rank <-> coordinate arithmetic; no MPI needed, so
// a layout can be checked for N ranks on a laptop (ndmini check --world N).
struct MeshShape {
  std::array<int, kNumAxes> degree{1, 1, 1, 1, 1};

  int size() const;  // product of the degrees
  int degree_of(Axis a) const { return degree[static_cast<int>(a)]; }
  std::array<int, kNumAxes> coords_of(int rank) const;  // row-major, tp fastest
  int rank_of(const std::array<int, kNumAxes>& coords) const;
  std::string str() const;  // "pp=1 dp_replicate=2 dp_shard=1 cp=1 tp=2"
};

// Resolves -1 ("what is left of the world") and checks the degrees against the
// world size: each at least 1, their product equal to `world`. Throws Error
// with one clear message naming the key and the fix.
MeshShape resolve_mesh(const ParallelConfig& p, int world);

// Human-readable mesh: degrees, then (with details) each rank's coordinates
// and the rank groups of each axis.
std::string describe_mesh(const MeshShape& shape, bool details);

class Mesh {
 public:
  // Collective over `world`. Builds the Cartesian communicator and the
  // sub-communicators; warns on rank 0 when a tp group spans nodes.
  Mesh(const MeshShape& shape, MPI_Comm world);
  ~Mesh();
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  const MeshShape& shape() const { return shape_; }
  int rank() const { return rank_; }  // rank in the Cartesian communicator (== world rank: no reorder)
  int size() const { return shape_.size(); }
  int degree(Axis a) const { return shape_.degree_of(a); }
  int coord(Axis a) const { return coords_[static_cast<int>(a)]; }

  MPI_Comm cart() const { return cart_; }
  MPI_Comm axis(Axis a) const { return axis_[static_cast<int>(a)]; }
  MPI_Comm fsdp() const { return fsdp_; }
  MPI_Comm batch() const { return batch_; }
  MPI_Comm norm() const { return norm_; }
  MPI_Comm pipeline_ends() const { return ends_; }  // MPI_COMM_NULL on middle stages and when pp = 1

  int ranks_per_node() const { return ranks_per_node_; }  // on this rank's node
  // Whether any tp (or cp) group, not just this rank's, spans nodes; the same on every rank.
  bool tp_spans_nodes() const { return spans_nodes_[0]; }
  bool cp_spans_nodes() const { return spans_nodes_[1]; }

 private:
  MeshShape shape_;
  int rank_ = 0;
  std::array<int, kNumAxes> coords_{};
  MPI_Comm cart_ = MPI_COMM_NULL;
  std::array<MPI_Comm, kNumAxes> axis_{};
  MPI_Comm fsdp_ = MPI_COMM_NULL, batch_ = MPI_COMM_NULL, norm_ = MPI_COMM_NULL, ends_ = MPI_COMM_NULL;
  int ranks_per_node_ = 1;
  std::array<bool, 2> spans_nodes_{};  // tp, cp
};

}  // namespace ndmini
