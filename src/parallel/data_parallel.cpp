// SPDX-License-Identifier: BSD-3-Clause
#include "parallel/data_parallel.hpp"

namespace ndmini {

void DataParallel::reduce_bucket(real* grads, std::size_t n) { buckets_.emplace_back(group_, grads, n, wire_); }

void DataParallel::poll() {
  for (auto& r : buckets_) r.poll();
}

void DataParallel::finish(const View1D& shards) {
  for (auto& r : buckets_) r.finish();
  buckets_.clear();
  if (shards.extent(0) > 0) all_reduce_grads(group_, shards.data(), shards.extent(0), wire_);
}

}  // namespace ndmini
