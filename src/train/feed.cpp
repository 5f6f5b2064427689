// SPDX-License-Identifier: BSD-3-Clause
#include "train/feed.hpp"

namespace ndmini {

MicroBatchFeed::MicroBatchFeed(const DataSource& data, const CpLayout& cp, int micro_batch, int first_sequence)
    : data_(data),
      cp_(cp),
      micro_batch_(micro_batch),
      first_sequence_(first_sequence),
      sizes_(feed_sizes(micro_batch, cp.seq_len, cp.cp)),
      full_in_("ndmini::inputs_full", sizes_.whole),
      full_tg_("ndmini::targets_full", sizes_.whole),
      h_in_("ndmini::inputs_host", sizes_.local),
      h_tg_("ndmini::targets_host", sizes_.local),
      in_("ndmini::inputs", sizes_.local),
      tg_("ndmini::targets", sizes_.local) {}

void MicroBatchFeed::load(std::int64_t step, int index) {
  if (step == step_ && index == index_) return;
  data_.fill(step, first_sequence_ + index * micro_batch_, micro_batch_, full_in_.data(), full_tg_.data());
  const int T = cp_.seq_len, Tl = cp_.local_len();
  for (int b = 0; b < micro_batch_; ++b)
    for (int t = 0; t < Tl; ++t) {
      const std::size_t from = static_cast<std::size_t>(b) * T + cp_.position(t),
                        to = static_cast<std::size_t>(b) * Tl + t;
      h_in_(to) = full_in_(from);
      h_tg_(to) = full_tg_(from);
    }
  Kokkos::deep_copy(in_, h_in_);
  Kokkos::deep_copy(tg_, h_tg_);
  step_ = step;
  index_ = index;
}

double TrainingStage::forward(int chunk, int mb, bool last) {
  // Tokens for the embedding (chunk 0), targets for the head (the last chunk).
  const Chunk& final_chunk = model_.chunks().back();
  const bool needs_data = chunk == 0 || (final_chunk.head && chunk == final_chunk.index);
  if (needs_data) feed_.load(step_ + mb / micro_batches_, mb % micro_batches_);
  if (MoeRoutingLog* log = model_.moe_routing_log()) {  // the tokens the MoE blocks route (a test hook)
    log->next.batch = step_ + mb / micro_batches_;
    log->next.sequence = feed_.first_sequence(mb % micro_batches_);
  }
  return model_.forward(chunk, mb, feed_.tokens(), feed_.targets(), loss_scale_, last);
}

}  // namespace ndmini
