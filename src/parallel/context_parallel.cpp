// SPDX-License-Identifier: BSD-3-Clause
#include "parallel/context_parallel.hpp"

#include "core/error.hpp"

namespace ndmini {

ContextParallelAttention::ContextParallelAttention(Communicator* cp, const kernels::AttentionShape& local, int)
    : s_(local) {
  require(cp == nullptr || cp->size() == 1, "internal: ring attention is not merged yet");
  const std::size_t N = static_cast<std::size_t>(s_.batch) * s_.seq_len;
  scratch_y_ = View1D("ndmini::att_y", N * s_.channels);
  scratch_dy_ = View1D("ndmini::att_dy", N * s_.channels);
  scratch_dqkvh_ = View1D("ndmini::att_dqkvh", 3 * N * s_.channels);
  scratch_datt_ = View1D("ndmini::att_datt", static_cast<std::size_t>(s_.seq_len) * s_.seq_len);
}

ContextParallelAttention::Saved ContextParallelAttention::make_saved() const {
  const std::size_t N = static_cast<std::size_t>(s_.batch) * s_.seq_len;
  return {View1D("ndmini::qkvh", 3 * N * s_.channels),
          View1D("ndmini::att", static_cast<std::size_t>(s_.batch) * s_.heads * s_.seq_len * s_.seq_len)};
}

std::size_t ContextParallelAttention::saved_bytes(const kernels::AttentionShape& s) {
  const std::size_t N = static_cast<std::size_t>(s.batch) * s.seq_len;
  return (3 * N * s.channels + static_cast<std::size_t>(s.batch) * s.heads * s.seq_len * s.seq_len) * sizeof(real);
}

void ContextParallelAttention::forward(Slice2D out, ConstSlice2D qkv, Saved& saved) {
  kernels::attention_forward(out, saved.qkvh, saved.att, scratch_y_, qkv, s_);
}

void ContextParallelAttention::backward(Slice2D dqkv, ConstSlice2D dout, ConstSlice2D, const Saved& saved) {
  kernels::attention_backward(dqkv, scratch_dy_, scratch_dqkvh_, scratch_datt_, dout, saved.qkvh, saved.att, s_);
}

}  // namespace ndmini
