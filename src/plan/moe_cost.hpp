// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// The cost of a Mixture-of-Experts block (docs/planner.md, "Mixture-of-Experts"):
// what it adds to, and takes from, a dense block's predicted time and
// memory on one rank: the router, the experts' products at the deck's
// assumed imbalance (perf.moe_imbalance), the shared expert, the token
// permutation, the all-to-alls of the dispatch and the combine inside the
// expert group (mesh/dims.hpp), and the experts' state per rank.
#include "config/config.hpp"
#include "model/moe.hpp"  // ParallelDims (mesh/dims.hpp) through the model
#include "plan/cluster.hpp"

namespace ndmini {

// One MoE block, one micro-batch, one rank. Zero for a dense model.
struct MoeBlockCost {
  double rows = 0;          // token rows the rank routes: micro_batch x T / cp (/ tp under sequence parallelism)
  double a2a_bytes = 0;     // one all-to-all (dispatch or combine) of the rank: rows x k x C x activation bytes
  bool inter_node = false;  // the expert group spans nodes
  double a2a_ms = 0;        // one all-to-all: the bytes that leave the rank over its links
  double imbalance = 1;     // the busiest rank's routed rows over the mean (perf.moe_imbalance)
  // Forward milliseconds; the backward is twice each product's and the same all-to-alls again.
  double router_ms = 0, experts_ms = 0, shared_ms = 0, permute_ms = 0;
  double forward_ms = 0, backward_ms = 0;  // compute and the two all-to-alls, which block it
  double dense_mlp_ms = 0;                 // the forward of the dense MLP the block replaces
  // Elements of this rank's shard of the block's MoE part (its E / ep
  // experts sharded over the expert fsdp group, the router and the shared
  // expert over fsdp, the shared expert over tp), each with a gradient and
  // AdamW's moments; and of the dense MLP it replaces.
  double shard_elements = 0;
  double dense_mlp_shard_elements = 0;
  double expert_params_per_rank = 0;  // elements of the experts this rank holds of one block (before FSDP)
};

MoeBlockCost moe_block_cost(const Config& cfg, const ParallelDims& d, const ClusterSpec& cluster, Precision precision);

// One all-to-all of `bytes` per rank (each rank sends bytes / n to each
// member, itself included) over `n` consecutive ranks: the (n - 1) / n that
// leaves the rank at the point-to-point bandwidth, inside a node, and where
// the group spans nodes its off-node part at the inter-node bandwidth, both
// at once; one latency (grouped sends and receives).
double all_to_all_ms(double bytes, int n, const ClusterSpec& cluster);

}  // namespace ndmini
