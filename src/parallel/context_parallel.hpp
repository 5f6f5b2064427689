// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// TEMPORARY stand-in (cp = 1 only) for the context-parallel attention being
// written on the `attention` branch; replaced by it at merge.
#include "comm/communicator.hpp"
#include "core/types.hpp"
#include "kernels/kernels.hpp"

namespace ndmini {

// Which tokens of a sequence a cp rank holds: chunks i and 2cp-1-i of 2cp.
struct CpLayout {
  int cp = 1, rank = 0, seq_len = 0;
  int local_len() const { return seq_len / cp; }
  int chunk() const { return seq_len / (2 * cp); }
  int position(int local_t) const {
    const int c = chunk();
    return local_t < c ? rank * c + local_t : (2 * cp - 1 - rank) * c + (local_t - c);
  }
};

class ContextParallelAttention {
 public:
  struct Saved {
    View1D qkvh, att;
  };
  ContextParallelAttention(Communicator* cp, const kernels::AttentionShape& local, int seq_len_global);
  Saved make_saved() const;
  // Bytes one forward keeps for its backward (what make_saved allocates).
  static std::size_t saved_bytes(const kernels::AttentionShape& local);
  void forward(Slice2D out, ConstSlice2D qkv, Saved& saved);
  void backward(Slice2D dqkv, ConstSlice2D dout, ConstSlice2D out, const Saved& saved);

 private:
  kernels::AttentionShape s_;
  View1D scratch_y_, scratch_dy_, scratch_dqkvh_, scratch_datt_;
};

}  // namespace ndmini
