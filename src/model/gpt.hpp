// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// GPT-2 (DESIGN section 2) with Megatron-style tensor parallelism and
// optional sequence parallelism, on parameters held by a ParamStore (which
// does FSDP and data-parallel gradient reduction).
//
// Tensor parallelism over the tp group: c_attn and c_fc are column-parallel
// (each rank holds its heads' q, k, v rows and 4C/tp rows of c_fc), both
// c_proj are row-parallel (partial sums all-reduced), wte is split over the
// vocabulary (embedding and cross-entropy are vocabulary-parallel: the full
// logits are never gathered). With sequence_parallel the LayerNorm and
// residual regions compute only N/tp of the rows (the all-gathered LayerNorm
// outputs are kept whole for the backward), and all-gather / reduce-scatter
// replace each all-reduce.
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "comm/communicator.hpp"
#include "config/config.hpp"
#include "core/types.hpp"
#include "parallel/param_layout.hpp"
#include "parallel/param_store.hpp"

namespace ndmini {

// Parameter names, shapes and flat-buffer places for a configuration, for tp
// rank `tp_rank` of `tp`; every unit padded to a multiple of `pad` elements.
ParamLayout gpt_param_layout(const ModelConfig& m, int tp = 1, int tp_rank = 0, std::size_t pad = 16);

// All parameters, and N for MFU: all but wpe (the LM head is tied to wte).
std::int64_t gpt_param_count(const ModelConfig& m);
std::int64_t gpt_flops_param_count(const ModelConfig& m);
// Model FLOPs per trained token: 6N + 12 L C T (forward and backward).
double gpt_flops_per_token(const ModelConfig& m);
// Bytes of parameters + gradients + AdamW state on one rank, and of
// activations and scratch for one micro-batch of `micro_batch` sequences.
std::int64_t gpt_state_bytes(const ModelConfig& m);
std::int64_t gpt_activation_bytes(const ModelConfig& m, int micro_batch);

// How this rank's model is distributed. All null/false: one rank.
struct ModelParallel {
  Communicator* tp = nullptr;  // tensor-parallel group
  bool sequence_parallel = false;
  DataParallelGroups data;  // FSDP and data-parallel groups (see ParamStore)
};

class GPT {
 public:
  GPT(const ModelConfig& m, int micro_batch, const ModelParallel& par = {});

  const ModelConfig& config() const { return cfg_; }
  ParamStore& store() { return *store_; }
  const ParamStore& store() const { return *store_; }
  const std::vector<ParamInfo>& params() const { return store_->layout().params; }
  const ParamInfo& param(const std::string& name) const;
  // This rank's persistent parameters and gradients: the whole flat buffer
  // when unsharded (indexed by ParamInfo::offset), else its FSDP shard.
  View1D param_buffer() const { return store_->shard_params(); }
  View1D grad_buffer() const { return store_->shard_grads(); }

  // Deterministic init (DESIGN section 2): global element i of parameter
  // `name` is drawn from the counter-based RNG at (seed, name, i), so every
  // layout builds the same global model.
  void init(std::uint64_t seed);

  // Forward and backward over one micro-batch of micro_batch x seq_len
  // tokens (tokens and targets on the device, row b*T + t). Gradients are
  // ADDED scaled by loss_scale (1 / tokens of the global batch gives the
  // global mean); `last_micro_batch` lets data parallelism start reducing.
  // Returns the sum of this micro-batch's per-token losses.
  double forward_backward(ConstTokenView tokens, ConstTokenView targets, real loss_scale, bool last_micro_batch = true);

  // Forward only: the sum of per-token losses (for evaluation and tests).
  double forward_loss(ConstTokenView tokens, ConstTokenView targets);

 private:
  struct LayerActivations {
    View1D ln1, ln1_mean, ln1_rstd, qkvh, att, atty, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu, res3;
  };
  void forward(ConstTokenView tokens);
  double loss(ConstTokenView targets, real grad_scale);
  void backward(ConstTokenView tokens, bool last_micro_batch);
  // The LayerNorm of the residual rows x into `full` [N, C]: in place
  // without sequence parallelism, else local rows then an all-gather.
  void layernorm_to_full(const View1D& full, const View1D& mean, const View1D& rstd, const View1D& x,
                         const std::string& prefix);
  // y [rows, C] = residual + in W^T + bias for a row-parallel layer (partial
  // sums over tp reduced), or a plain linear layer without tp.
  void row_parallel_forward(const View1D& y, const View1D& in, int in_cols, const std::string& prefix,
                            const View1D& residual);
  // Gradient of the input of a column-parallel layer: the partial sums [N, C]
  // over tp reduced (all-reduce in place, or reduce-scatter with sequence
  // parallelism); returns the buffer holding this rank's rows.
  View1D reduce_input_grad(const View1D& partial);
  // d(residual) for all N rows: dres itself, or all-gathered with sequence parallelism.
  View1D full_dres();
  Slice2D w(const std::string& name);   // a 2-D parameter
  Slice1D v(const std::string& name);   // a 1-D parameter
  Slice2D gw(const std::string& name);  // its gradient
  Slice1D gv(const std::string& name);

  ModelConfig cfg_;
  int batch_;
  Communicator* tp_ = nullptr;
  int tp_size_ = 1, tp_rank_ = 0;
  bool sp_ = false;
  std::size_t rows_ = 0, local_rows_ = 0;  // B*T, and the rows of the residual stream on this rank
  std::unique_ptr<ParamStore> store_;
  std::unordered_map<std::string, int> index_;
  // Activations kept for backward, and scratch reused by every layer.
  View1D encoded_;
  std::vector<LayerActivations> layers_;
  View1D lnf_, lnf_mean_, lnf_rstd_, logits_, losses_, xent_max_, xent_stats_;
  View1D qkv_, att_y_, partial_, ln_local_, dres_, dres_full_, dln_, dln_local_, dfc_, dqkv_, datty_, dscratch_dy_,
      dscratch_qkvh_, dscratch_att_;
};

}  // namespace ndmini
