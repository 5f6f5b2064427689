// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Mixture-of-Experts blocks, their sizes and rules, computed without building
// them (docs/model.md, "Mixture-of-Experts"): the tensors of an MoE block,
// total and active parameter counts, FLOPs per token, the split over the
// expert groups (mesh/dims.hpp). The MoE block's forward and backward are not
// computed yet: train refuses an MoE deck (require_computed_moe); check and
// plan take it.
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

// The model's global tensors in checkpoint order (gpt_global_tensors, with the
// MLP of each MoE block replaced as layer_tensors says).
std::vector<GlobalTensor> model_global_tensors(const ModelConfig& m);

// Parameters of the MoE part of one MoE block: the router, all E experts, the
// shared expert; and of one routed expert.
std::int64_t moe_block_mlp_param_count(const ModelConfig& m);
std::int64_t moe_expert_param_count(const ModelConfig& m);
// Parameters of the shared expert (0 without one), and of the dense MLP an MoE block replaces.
std::int64_t moe_shared_param_count(const ModelConfig& m);
std::int64_t dense_mlp_param_count(const ModelConfig& m);

// All parameters, and the active ones (those one token meets: the router, k
// of the E experts and the shared expert of each MoE block, everything
// else). For a dense model both are gpt_param_count.
std::int64_t model_param_count(const ModelConfig& m);
std::int64_t model_active_param_count(const ModelConfig& m);
// MFU's N: the active parameters less the lookup tables (as
// gpt_flops_param_count), and the model FLOPs per token 6N + 12 L C T.
// For a dense model these are gpt_flops_param_count and gpt_flops_per_token.
std::int64_t model_flops_param_count(const ModelConfig& m);
double model_flops_per_token(const ModelConfig& m);

// The rules of the MoE split over the resolved mesh (ep divides the experts:
// the deck's rule, config.cpp; and dp_shard x cp x tp: resolve_mesh): with tp > 1 an MoE block needs
// sequence parallelism (each rank routes the rows it holds); tp divides the
// shared expert's width. Throws Error naming the key and the fix.
void check_moe_split(const ModelConfig& m, const ParallelDims& split);

// "moe: 8 experts, top-2 (softmax, learned router), blocks 1, 3 of 4 ...":
// the MoE blocks, the parameters (total, active), the experts per ep rank.
std::string describe_moe(const ModelConfig& m, const ParallelDims& split);

// The MoE block is not computed yet: train (and check, after its report)
// refuses an MoE deck with what is missing; plan takes it. Throws Error.
void require_computed_moe(const ModelConfig& m);

}  // namespace ndmini
