// SPDX-License-Identifier: BSD-3-Clause
#include "parallel/data_parallel.hpp"

namespace ndmini {

void DataParallel::reduce_bucket(real* grads, std::size_t n) { buckets_.push_back(group_.iall_reduce(grads, n)); }

void DataParallel::poll() {
  for (auto& r : buckets_)
    if (r.active()) r.test();
}

void DataParallel::finish(const View1D& shards) {
  for (auto& r : buckets_) r.wait();
  buckets_.clear();
  if (shards.extent(0) > 0) group_.all_reduce(shards.data(), shards.extent(0));
}

}  // namespace ndmini
