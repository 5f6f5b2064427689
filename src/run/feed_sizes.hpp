// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// The token buffers one rank's feed allocates (MicroBatchFeed, train/feed.hpp).
// They are sized here, below train/, so the memory estimate (run/layout.hpp)
// counts them without building a feed.
#include <cstddef>

#include "core/types.hpp"

namespace ndmini {

// Elements of the token buffers of one micro-batch's feed.
struct FeedSizes {
  std::size_t whole = 0;  // the micro-batch's whole sequences: inputs and targets, on the host
  std::size_t local = 0;  // this cp rank's tokens of them: inputs and targets, on the host and in MemSpace
  std::size_t bytes() const { return (2 * whole + 4 * local) * sizeof(token_t); }
};

inline FeedSizes feed_sizes(int micro_batch, int seq_len, int cp) {
  FeedSizes s;
  s.whole = static_cast<std::size_t>(micro_batch) * seq_len;
  s.local = static_cast<std::size_t>(micro_batch) * (seq_len / cp);  // CpLayout::local_len()
  return s;
}

}  // namespace ndmini
