// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Mixture-of-Experts blocks, their sizes and rules, computed without building
// them (docs/model.md, "Mixture-of-Experts"): the tensors of an MoE block,
// total and active parameter counts, FLOPs per token, the split over the
// expert groups (mesh/dims.hpp). The block itself is model/block.hpp's with
// the routed experts of layers/expert_parallel.hpp.
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "mesh/dims.hpp"
#include "model/gpt.hpp"

namespace ndmini {

// The tensors of block `layer`, in unit (and checkpoint) order: a dense
// block's (gpt_block_tensors), or an MoE block's, where the dense MLP is
// replaced by mlp/router/weight [E, C] (replicated over tp), the routed
// experts mlp/experts/<the dense MLP's matrix>/{weight [E, rows, cols], bias
// [E, rows]} as global tensors with the global expert index first (split over
// ep, never over tp), and a shared expert mlp/shared/<matrix> as the dense
// MLP of width model.moe_shared_hidden (split over tp as the dense MLP).
std::vector<BlockTensorShape> layer_tensors(const ModelConfig& m, int layer);

// The MoE blocks among layers [first, end), counted without walking them (a
// deck may have 1e9 layers); the first MoE block (-1: none).
std::int64_t moe_blocks_in(const ModelConfig& m, std::int64_t first, std::int64_t end);
int first_moe_block(const ModelConfig& m);

// The model's global tensors in checkpoint order: gpt_global_tensors, which
// takes each block's tensors from layer_tensors.
std::vector<GlobalTensor> model_global_tensors(const ModelConfig& m);

// Parameters of one MoE block's MoE part: its router [E, C], one routed
// expert, all E of them with the router and the shared expert (`mlp`), the
// shared expert alone (0 without one), and the dense MLP the block replaces.
struct MoeBlockParams {
  std::int64_t router = 0, expert = 0, mlp = 0, shared = 0, dense_mlp = 0;
};
MoeBlockParams moe_block_params(const ModelConfig& m);

// The model's counts: all parameters; the active ones (those one token
// meets: all but E - k routed experts of each MoE block); MFU's N (the active
// ones less the lookup tables, as gpt_flops_param_count); and the model
// FLOPs per token 6N + 12 L C T. For a dense model: gpt_param_count (twice),
// gpt_flops_param_count and gpt_flops_per_token.
struct ModelCounts {
  std::int64_t total = 0, active = 0, flops_params = 0;
  double flops_per_token = 0;
};
ModelCounts model_counts(const ModelConfig& m);

// The rules of the MoE split over the resolved mesh (ep divides the experts:
// the deck's rule, config.cpp; and dp_shard x cp x tp: resolve_mesh): with tp > 1 an MoE block needs
// sequence parallelism (each rank routes the rows it holds); tp divides the
// shared expert's width. Throws Error naming the key and the fix.
void check_moe_split(const ModelConfig& m, const ParallelDims& split);

// "moe: 8 experts, top-2 (softmax, learned router), blocks 1, 3 of 4 ...":
// the MoE blocks, the parameters (total, active), the experts per ep rank.
std::string describe_moe(const ModelConfig& m, const ParallelDims& split);

}  // namespace ndmini
