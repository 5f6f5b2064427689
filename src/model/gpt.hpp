// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// GPT-2 (DESIGN section 2) on one rank: named parameters in one flat buffer,
// the activations one micro-batch needs, and forward/backward passes.
#include <cstdint>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "core/types.hpp"

namespace ndmini {

// One named parameter tensor: a slice [offset, offset + size) of the flat
// parameter (and gradient, and optimizer state) buffers.
struct ParamInfo {
  std::string name;                   // DESIGN name, e.g. "h/3/mlp/c_fc/weight"
  std::vector<std::int64_t> shape;    // global shape, row-major
  std::size_t offset = 0;
  std::size_t size = 0;
  bool decay = false;  // weight decay applies to 2-D tensors only
};

// Parameter names and shapes of a configuration, in flat-buffer order.
std::vector<ParamInfo> gpt_param_layout(const ModelConfig& m);

// All parameters, and N for MFU: all but wpe (the LM head is tied to wte).
std::int64_t gpt_param_count(const ModelConfig& m);
std::int64_t gpt_flops_param_count(const ModelConfig& m);
// Model FLOPs per trained token: 6N + 12 L C T (forward and backward).
double gpt_flops_per_token(const ModelConfig& m);
// Bytes of parameters + gradients + AdamW state, and of activations and
// scratch for one micro-batch of `micro_batch` sequences.
std::int64_t gpt_state_bytes(const ModelConfig& m);
std::int64_t gpt_activation_bytes(const ModelConfig& m, int micro_batch);

class GPT {
 public:
  GPT(const ModelConfig& m, int micro_batch);

  const ModelConfig& config() const { return cfg_; }
  const std::vector<ParamInfo>& params() const { return layout_; }
  const ParamInfo& param(const std::string& name) const;
  View1D param_buffer() const { return params_; }
  View1D grad_buffer() const { return grads_; }

  // Deterministic init (DESIGN section 2): element i of parameter `name` is
  // drawn from the counter-based RNG at (seed, name, i).
  void init(std::uint64_t seed);

  // Forward and backward over one micro-batch of micro_batch x seq_len tokens
  // (tokens and targets on the device, row b*T + t). Gradients are ADDED to
  // grad_buffer() scaled by loss_scale (1 / tokens of the global batch gives
  // the global mean). Returns the sum of the per-token losses.
  double forward_backward(ConstTokenView tokens, ConstTokenView targets, real loss_scale);

  // Forward only: the sum of per-token losses (for evaluation and tests).
  double forward_loss(ConstTokenView tokens, ConstTokenView targets);

 private:
  struct LayerActivations {
    View1D ln1, ln1_mean, ln1_rstd, qkvh, att, atty, res2, ln2, ln2_mean, ln2_rstd, fch, fch_gelu, res3;
  };
  void forward(ConstTokenView tokens);
  void backward(ConstTokenView tokens);
  Slice2D w(const std::string& name) const;   // a 2-D parameter
  Slice1D v(const std::string& name) const;   // a 1-D parameter
  Slice2D gw(const std::string& name) const;  // its gradient
  Slice1D gv(const std::string& name) const;

  ModelConfig cfg_;
  int batch_;
  std::vector<ParamInfo> layout_;
  View1D params_, grads_;
  // Activations kept for backward, and scratch reused by every layer.
  View1D encoded_;
  std::vector<LayerActivations> layers_;
  View1D lnf_, lnf_mean_, lnf_rstd_, logits_, losses_;
  View1D qkv_, att_y_, dres_, dln_, dfc_, dqkv_, datty_, dscratch_dy_, dscratch_qkvh_, dscratch_att_;
};

}  // namespace ndmini
