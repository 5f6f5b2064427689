// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// The Cartesian mesh: the world as an MPI_Cart_create over the axes
// pp, dp_replicate, dp_shard, cp, tp (outermost to innermost, rank order kept,
// so tp is fastest-varying and lands on consecutive ranks), one
// sub-communicator per axis, and the flattened groups the layers need.
//
// Which ranks reduce what is defined once, in dims.hpp (fsdp, batch, norm);
// besides those, axis(dp_replicate) all-reduces gradients (pure DP, and the
// replicate half of HSDP), and pipeline_ends() holds the first and the last
// stage of one pipeline (same coordinates but pp; null on middle stages and
// when pp = 1): the model's tied embedding is summed over it.
//
// The mesh knows no model: whether a layout fits the model (heads, sequence,
// layers) is the model's rule, checked where the layout is resolved.
#include <mpi.h>

#include <array>
#include <string>

#include "config/config.hpp"
#include "mesh/dims.hpp"

namespace ndmini {

// The deck's degrees (and its sequence_parallel and virtual_stages): resolves
// -1 ("what is left of the world") and checks the degrees against the world
// size: each at least 1, their product equal to `world`. Throws Error with
// one clear message naming the key and the fix.
ParallelDims resolve_mesh(const ParallelConfig& p, int world);

// "parallel.dp_shard = -1 (the default) fills the world: dp_shard = 4 of 4
// ranks; ...": which degree the -1 of `p` resolved to in `dims`; "" without a -1.
std::string describe_filled_degree(const ParallelConfig& p, const ParallelDims& dims);

// Human-readable mesh: degrees, then (with details) each rank's coordinates
// and the rank groups of each axis.
std::string describe_mesh(const ParallelDims& dims, bool details);

class Mesh {
 public:
  // Collective over `world`. Builds the Cartesian communicator and the
  // sub-communicators; warns on rank 0 when a tp group spans nodes.
  Mesh(const ParallelDims& dims, MPI_Comm world);
  ~Mesh();
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;

  const ParallelDims& dims() const { return dims_; }
  int rank() const { return rank_; }  // rank in the Cartesian communicator (== world rank: no reorder)
  int size() const { return dims_.size(); }
  int degree(Axis a) const { return dims_.degree_of(a); }
  int coord(Axis a) const { return coords_[static_cast<int>(a)]; }

  MPI_Comm cart() const { return cart_; }
  MPI_Comm axis(Axis a) const { return axis_[static_cast<int>(a)]; }
  MPI_Comm fsdp() const { return fsdp_; }
  MPI_Comm batch() const { return batch_; }
  MPI_Comm norm() const { return norm_; }
  MPI_Comm pipeline_ends() const { return ends_; }  // MPI_COMM_NULL on middle stages and when pp = 1
  // This rank's expert group (ParallelDims::expert_groups, ranked by ep
  // rank); MPI_COMM_NULL when ep = 1.
  MPI_Comm expert() const { return expert_; }
  // This rank's expert fsdp group (ParallelDims::expert_fsdp_groups): the
  // ranks that hold the same experts, which shard them.
  MPI_Comm expert_fsdp() const { return expert_fsdp_; }

  int ranks_per_node() const { return ranks_per_node_; }  // on this rank's node
  // Whether any tp (or cp) group, not just this rank's, spans nodes; the same on every rank.
  bool tp_spans_nodes() const { return spans_nodes_[0]; }
  bool cp_spans_nodes() const { return spans_nodes_[1]; }

 private:
  ParallelDims dims_;
  int rank_ = 0;
  std::array<int, kNumAxes> coords_{};
  MPI_Comm cart_ = MPI_COMM_NULL;
  std::array<MPI_Comm, kNumAxes> axis_{};
  MPI_Comm fsdp_ = MPI_COMM_NULL, batch_ = MPI_COMM_NULL, norm_ = MPI_COMM_NULL, ends_ = MPI_COMM_NULL;
  MPI_Comm expert_ = MPI_COMM_NULL, expert_fsdp_ = MPI_COMM_NULL;
  int ranks_per_node_ = 1;
  std::array<bool, 2> spans_nodes_{};  // tp, cp
};

}  // namespace ndmini
