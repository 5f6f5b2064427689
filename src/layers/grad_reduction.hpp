// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Gradient sums over a group in the wire format of comm.reduce_dtype. Under
// fp32 the gradients travel as they are. Under bf16 they are rounded to
// nearest even into a bf16 buffer, summed in bf16 (Communicator's bf16 sum,
// half the bytes) and widened back into the fp32 gradients. Only the transfer
// changes; what the gradients accumulate into stays fp32. The tensor-parallel
// layers and parallel/ (data parallelism, the tied embedding) share these.
#include <cstddef>

#include "comm/communicator.hpp"
#include "core/types.hpp"

namespace ndmini {

// Blocking: grads (n floats) become their sum over `group`.
void all_reduce_grads(Communicator& group, real* grads, std::size_t n, Precision wire);

// Non-blocking: issued at construction; grads stay untouched until finish(),
// after which they hold the sum.
class GradAllReduce {
 public:
  GradAllReduce(Communicator& group, real* grads, std::size_t n, Precision wire);
  GradAllReduce(GradAllReduce&&) = default;
  GradAllReduce& operator=(GradAllReduce&&) = default;
  void poll();    // lets the transfer progress
  void finish();  // waits, and under bf16 widens the sum into grads

 private:
  real* grads_;
  Bf16View1D wire_;      // bf16: the rounded gradients, then their sum
  CommRequest request_;  // after wire_: destroyed (so waited for) first
};

}  // namespace ndmini
