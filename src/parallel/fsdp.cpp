// SPDX-License-Identifier: BSD-3-Clause
#include "parallel/fsdp.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace ndmini {
namespace {

// y += x over n elements.
void add_into(real* y, const real* x, std::size_t n) {
  Kokkos::parallel_for(
      "ndmini::accumulate_shard", Kokkos::RangePolicy<ExecSpace>(0, n),
      KOKKOS_LAMBDA(const std::size_t i) { y[i] += x[i]; });
}

}  // namespace

Fsdp::Fsdp(Communicator& group, const ParamLayout& layout, std::vector<std::size_t> shard_offset, View1D shard_params,
           View1D shard_grads)
    : group_(group),
      layout_(layout),
      shard_offset_(std::move(shard_offset)),
      shard_params_(shard_params),
      shard_grads_(shard_grads) {
  const std::size_t n = layout_.unit_size.size();
  full_params_.resize(n);
  full_grads_.resize(n);
  gathers_.resize(n);
}

void Fsdp::add_transient(std::size_t elements) {
  transient_ += elements * sizeof(real);
  peak_transient_ = std::max(peak_transient_, transient_);
}

real* Fsdp::params(int u) {
  if (full_params_[u].extent(0) == 0)
    throw InternalError("parameters of unit " + std::to_string(u) + " used before gather");
  return full_params_[u].data();
}

real* Fsdp::grads(int u) {
  if (full_grads_[u].extent(0) == 0)
    throw InternalError("gradients of unit " + std::to_string(u) + " used before begin");
  return full_grads_[u].data();
}

void Fsdp::prefetch(int u) {
  if (u < 0 || u >= static_cast<int>(full_params_.size()) || full_params_[u].extent(0) > 0) return;
  const std::size_t size = layout_.unit_size[u];
  full_params_[u] = uninitialized("ndmini::gathered_params", size);
  add_transient(size);
  gathers_[u] =
      group_.iall_gather(shard_params_.data() + shard_offset_[u], full_params_[u].data(), size / group_.size());
}

void Fsdp::gather(int u) {
  prefetch(u);
  if (gathers_[u].active()) gathers_[u].wait();
}

void Fsdp::release(int u) {
  if (full_params_[u].extent(0) == 0) return;
  if (gathers_[u].active()) gathers_[u].wait();
  transient_ -= full_params_[u].extent(0) * sizeof(real);
  full_params_[u] = View1D();
}

void Fsdp::begin_grads(int u) {
  if (full_grads_[u].extent(0) > 0) return;  // still open (the tied wte spans the whole backward)
  full_grads_[u] = View1D("ndmini::full_grads", layout_.unit_size[u]);
  add_transient(full_grads_[u].extent(0));
}

void Fsdp::end_grads(int u) {
  const std::size_t part = layout_.unit_size[u] / group_.size();
  // Reduce-scatter instead of all-reduce: each rank only updates its shard.
  PendingReduction r{u, full_grads_[u], uninitialized("ndmini::grad_shard_part", part), CommRequest()};
  add_transient(part);
  r.request = group_.ireduce_scatter(r.full_grads.data(), r.shard_part.data(), part);
  full_grads_[u] = View1D();
  reductions_.push_back(std::move(r));
  while (reductions_.size() > kReductionsInFlight) {
    complete(reductions_.front());
    reductions_.pop_front();
  }
}

void Fsdp::poll() {
  for (auto& r : reductions_)
    if (r.request.active()) r.request.test();
}

void Fsdp::complete(PendingReduction& r) {
  if (r.request.active()) r.request.wait();
  add_into(shard_grads_.data() + shard_offset_[r.unit], r.shard_part.data(), r.shard_part.extent(0));
  transient_ -= (r.full_grads.extent(0) + r.shard_part.extent(0)) * sizeof(real);
  r.full_grads = View1D();
  r.shard_part = View1D();
}

void Fsdp::finish() {
  while (!reductions_.empty()) {
    complete(reductions_.front());
    reductions_.pop_front();
  }
}

}  // namespace ndmini
