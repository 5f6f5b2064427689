// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Replicated data parallelism over dp_replicate: every replica holds the
// same parameters and the gradients are summed over the group.
//
// Unsharded (pure DP): each unit is one bucket, all-reduced as soon as the
// backward of the last micro-batch has produced its gradients, so the
// reduction of one unit overlaps the backward of the next; poll() between
// units lets MPI progress them. Sharded (HSDP): the shards, already summed
// over the fsdp group, are all-reduced over dp_replicate at the end.
#include <vector>

#include "comm/communicator.hpp"
#include "core/types.hpp"

namespace ndmini {

class DataParallel {
 public:
  explicit DataParallel(Communicator& group) : group_(group) {}

  // Starts the all-reduce of one unit's gradients (n elements at grads);
  // the buffer must stay untouched until finish().
  void reduce_bucket(real* grads, std::size_t n);
  void poll();
  // Completes every bucket; with `shards` (HSDP) then all-reduces them.
  void finish(const View1D& shards = View1D());

 private:
  Communicator& group_;
  std::vector<CommRequest> buckets_;
};

}  // namespace ndmini
