// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Pipeline parallelism, part 3: the tied token embedding. wte is used by the
// embedding (first stage) and by the LM head (last stage), so with pp > 1
// both ends hold a copy. Their gradients are summed over the pair every step,
// so the two copies take the same AdamW update from the same state and stay
// bitwise equal; the last stage's copy is a replica (not written to
// checkpoints, not counted in the gradient norm).
#include <cstddef>

#include "comm/communicator.hpp"
#include "config/config.hpp"
#include "core/types.hpp"

namespace ndmini {

class TiedEmbedding {
 public:
  // pair: the first and the last stage of this pipeline (mesh: pipeline
  // ends); null where there is none (pp = 1, or a middle stage).
  explicit TiedEmbedding(Communicator* pair) : pair_(pair) {}

  // Sums this rank's shard of the wte gradients (n floats) over the pair,
  // in the wire format of comm.reduce_dtype (layers/grad_reduction.hpp).
  void reduce_grads(real* grads, std::size_t n, Precision wire);
  // Whether this rank's shard of wte (n floats) equals the other end's, bit
  // for bit. Collective over the pair; true where there is none.
  bool identical(const real* params, std::size_t n);

 private:
  Communicator* pair_;
};

}  // namespace ndmini
