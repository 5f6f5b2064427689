// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Replicated data parallelism over dp_replicate. Every replica holds the
// same parameters, and the gradients are summed over the group.
//
// Unsharded (pure DP): each unit is one bucket, all-reduced as soon as the
// backward of the last micro-batch has produced its gradients, so the
// reduction of one unit overlaps the backward of the next; poll() between
// units lets MPI progress them. Sharded (HSDP): the shards, already summed
// over the fsdp group, are all-reduced over dp_replicate at the end. Both
// move the wire format of comm.reduce_dtype (layers/grad_reduction.hpp).
#include <vector>

#include "comm/communicator.hpp"
#include "config/config.hpp"
#include "core/types.hpp"
#include "layers/grad_reduction.hpp"

namespace ndmini {

class DataParallel {
 public:
  DataParallel(Communicator& group, Precision wire) : group_(group), wire_(wire) {}

  // Starts the all-reduce of one unit's gradients (n elements at grads);
  // the buffer must stay untouched until finish().
  void reduce_bucket(real* grads, std::size_t n);
  void poll();
  // Completes every bucket; with `shards` (HSDP) then all-reduces them.
  void finish(const View1D& shards = View1D());

 private:
  Communicator& group_;
  Precision wire_;
  std::vector<GradAllReduce> buckets_;
};

}  // namespace ndmini
