// SPDX-License-Identifier: BSD-3-Clause
#include "train/optimizer.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/kernels.hpp"

namespace ndmini {

double learning_rate(const TrainConfig& t, std::int64_t step) {
  if (step < t.warmup_steps) return t.lr * static_cast<double>(step + 1) / t.warmup_steps;
  const double span = std::max(1, t.steps - 1 - t.warmup_steps);
  const double progress = std::min(1.0, static_cast<double>(step - t.warmup_steps) / span);
  return t.min_lr + 0.5 * (1 + std::cos(M_PI * progress)) * (t.lr - t.min_lr);
}

double grad_norm_squared(const ParamStore& store, Communicator& norm_group) {
  double local = 0;
  bool every_piece_counts = true;
  for (const auto& piece : store.pieces()) every_piece_counts = every_piece_counts && store.counts_in_norm(piece);
  if (every_piece_counts) {
    local = kernels::sum_squares(store.shard_grads());  // padding is zero
  } else {
    double left_out = 0;
    for (const auto& piece : store.pieces()) {
      const double s = kernels::sum_squares(Slice1D(store.shard_grads().data() + piece.shard_offset, piece.length));
      (store.counts_in_norm(piece) ? local : left_out) += s;
    }
    // A copy left out of the norm (the last stage's tied wte; replicated
    // tensors on tp ranks other than 0) is still applied: a non-finite value
    // there must make the norm non-finite too.
    if (!std::isfinite(left_out)) local = left_out;
  }
  return norm_group.all_reduce_scalar(local);
}

AdamW::AdamW(const ParamStore& store)
    : exp_avg("ndmini::exp_avg", store.shard_params().extent(0)),
      exp_avg_sq("ndmini::exp_avg_sq", store.shard_params().extent(0)) {}

void AdamW::step(ParamStore& store, const TrainConfig& t, double lr, double grad_scale, std::int64_t step_number) {
  const kernels::AdamWStep st{static_cast<real>(lr),
                              kBeta1,
                              kBeta2,
                              kEps,
                              static_cast<real>(t.weight_decay),
                              static_cast<real>(grad_scale),
                              static_cast<int>(step_number)};
  for (const auto& piece : store.pieces()) {
    auto slice = [&](const View1D& buf) { return Slice1D(buf.data() + piece.shard_offset, piece.length); };
    kernels::adamw_update(slice(store.shard_params()), slice(store.shard_grads()), slice(exp_avg), slice(exp_avg_sq),
                          st, store.layout().params[piece.param].decay);
  }
  store.params_changed();  // under bf16 the working copy follows the new masters
}

}  // namespace ndmini
