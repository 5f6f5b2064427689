// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// The tokens one rank feeds its stage's model (MicroBatchFeed), and that
// model as the pipeline runner sees it, fed with them (TrainingStage).
#include <cstddef>
#include <cstdint>

#include "core/types.hpp"
#include "layers/context_parallel.hpp"
#include "parallel/pipeline/pipeline.hpp"
#include "parallel/stage_runtime.hpp"
#include "run/feed_sizes.hpp"
#include "train/data.hpp"

namespace ndmini {

// The tokens of one micro-batch on this rank: its data-parallel share of the
// global batch, and of each sequence the tokens its cp rank holds.
class MicroBatchFeed {
 public:
  MicroBatchFeed(const DataSource& data, const CpLayout& cp, int micro_batch, int first_sequence);

  // Micro-batch `index` of `step`, unless it is loaded already.
  void load(std::int64_t step, int index);
  ConstTokenView tokens() const { return in_; }
  ConstTokenView targets() const { return tg_; }
  // The global batch's sequence that micro-batch `index` starts with.
  std::int64_t first_sequence(int index) const {
    return first_sequence_ + static_cast<std::int64_t>(index) * micro_batch_;
  }

 private:
  const DataSource& data_;
  CpLayout cp_;
  int micro_batch_, first_sequence_;
  FeedSizes sizes_;
  HostTokenView full_in_, full_tg_, h_in_, h_tg_;
  TokenView in_, tg_;
  std::int64_t step_ = -1;
  int index_ = -1;
};

// The model as the pipeline runner sees it, fed with this step's data.
// Micro-batch mb is micro-batch mb mod m of step + mb / m (m micro-batches
// per step), so one forward-only run can cover several batches (the
// validation loss); loss_scale 0: the head computes no gradient.
class TrainingStage final : public PipelineStage {
 public:
  TrainingStage(StageRuntime& model, MicroBatchFeed& feed, real loss_scale, int micro_batches)
      : model_(model), feed_(feed), loss_scale_(loss_scale), micro_batches_(micro_batches) {}
  void set_step(std::int64_t step) { step_ = step; }

  std::size_t activation_elements() const override { return model_.activation_elements(); }
  real* input_buffer(int chunk, int mb) override { return model_.input_buffer(chunk, mb); }
  double forward(int chunk, int mb, bool last) override;
  const real* output(int chunk, int mb) override { return model_.output(chunk, mb); }
  real* output_grad_buffer(int chunk, int mb) override { return model_.output_grad_buffer(chunk, mb); }
  void backward(int chunk, int mb, real* input_grad, bool last) override {
    model_.backward(chunk, mb, input_grad, last);
  }
  void discard(int chunk, int mb) override { model_.discard(chunk, mb); }

 private:
  StageRuntime& model_;
  MicroBatchFeed& feed_;
  real loss_scale_;
  int micro_batches_;
  std::int64_t step_ = 0;
};

}  // namespace ndmini
