// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// The optimizer step: learning-rate schedule, global gradient norm and
// clipping, AdamW on this rank's shard of the parameters.
#include <cstdint>

#include "comm/communicator.hpp"
#include "config/config.hpp"
#include "core/types.hpp"
#include "parallel/param_store.hpp"

namespace ndmini {

// Learning rate of step s: linear warm-up over warmup_steps, then cosine
// decay from lr to min_lr at the last step.
double learning_rate(const TrainConfig& t, std::int64_t step);

// Squared global gradient norm: each unique element once (ParamStore::
// counts_in_norm), summed over the norm group (pp x dp_shard x cp x tp).
double grad_norm_squared(const ParamStore& store, Communicator& norm_group);

// AdamW (beta1 0.9, beta2 0.95, eps 1e-8, weight decay on 2-D tensors only),
// its state in the layout of this rank's parameter shard.
class AdamW {
 public:
  static constexpr float kBeta1 = 0.9f, kBeta2 = 0.95f, kEps = 1e-8f;

  explicit AdamW(const ParamStore& store);
  // One update with learning rate `lr`, the gradients scaled by `grad_scale`
  // (the clipping factor); step_number counts from 1. Zeroes the gradients.
  void step(ParamStore& store, const TrainConfig& t, double lr, double grad_scale, std::int64_t step_number);

  View1D exp_avg, exp_avg_sq;
};

}  // namespace ndmini
