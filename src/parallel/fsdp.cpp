// SPDX-License-Identifier: BSD-3-Clause
#include "parallel/fsdp.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "kernels/kernels.hpp"

namespace ndmini {
namespace {

// y += x over n elements.
void add_into(real* y, const real* x, std::size_t n) {
  Kokkos::parallel_for(
      "ndmini::accumulate_shard", Kokkos::RangePolicy<ExecSpace>(0, n),
      KOKKOS_LAMBDA(const std::size_t i) { y[i] += x[i]; });
}

// y += float(x) over n elements: a bf16 sum accumulated in fp32.
void add_widened_into(real* y, const bf16* x, std::size_t n) {
  Kokkos::parallel_for(
      "ndmini::accumulate_shard_bf16", Kokkos::RangePolicy<ExecSpace>(0, n),
      KOKKOS_LAMBDA(const std::size_t i) { y[i] += static_cast<real>(x[i]); });
}

}  // namespace

Fsdp::Fsdp(Communicator& group, const ParamLayout& layout, std::vector<std::size_t> shard_offset, View1D shard_params,
           View1D shard_grads, TransientBytes& transient, Bf16View1D shard_bf16, Precision reduce_dtype)
    : group_(group),
      layout_(layout),
      shard_offset_(std::move(shard_offset)),
      shard_params_(shard_params),
      shard_grads_(shard_grads),
      shard_bf16_(shard_bf16),
      reduce_dtype_(reduce_dtype),
      transient_(transient) {
  const std::size_t n = layout_.unit_size.size();
  full_params_.resize(n);
  full_grads_.resize(n);
  full_bf16_.resize(n);
  widened_.resize(n, false);
  gathers_.resize(n);
}

void Fsdp::add_transient(std::size_t bytes) {
  transient_.now += bytes;
  transient_.peak = std::max(transient_.peak, transient_.now);
}

real* Fsdp::params(int u) {
  if (full_params_[u].extent(0) == 0 || (gathers_bf16() && !widened_[u]))
    throw InternalError("parameters of unit " + std::to_string(u) + " used before gather");
  return full_params_[u].data();
}

const bf16* Fsdp::params_bf16(int u) {
  if (full_bf16_[u].extent(0) == 0 || !widened_[u])
    throw InternalError("bf16 parameters of unit " + std::to_string(u) + " used before gather");
  return full_bf16_[u].data();
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
  add_transient(size * sizeof(real));
  if (gathers_bf16()) {
    full_bf16_[u] = uninitialized_bf16("ndmini::gathered_params_bf16", size);
    add_transient(size * sizeof(bf16));
    gathers_[u] = group_.iall_gather(shard_bf16_.data() + shard_offset_[u], full_bf16_[u].data(), size / group_.size());
  } else {
    gathers_[u] =
        group_.iall_gather(shard_params_.data() + shard_offset_[u], full_params_[u].data(), size / group_.size());
  }
}

void Fsdp::gather(int u) {
  prefetch(u);
  if (gathers_[u].active()) gathers_[u].wait();
  if (gathers_bf16() && !widened_[u]) {
    const std::size_t size = layout_.unit_size[u];
    kernels::widen_bf16(Slice1D(full_params_[u].data(), size), ConstBf16Slice1D(full_bf16_[u].data(), size));
    widened_[u] = true;
  }
}

void Fsdp::release(int u) {
  if (full_params_[u].extent(0) == 0) return;
  if (gathers_[u].active()) gathers_[u].wait();
  drop_transient(full_params_[u].extent(0) * sizeof(real) + full_bf16_[u].extent(0) * sizeof(bf16));
  full_params_[u] = View1D();
  full_bf16_[u] = Bf16View1D();
  widened_[u] = false;
}

void Fsdp::begin_grads(int u) {
  if (full_grads_[u].extent(0) > 0) return;  // still open (the tied wte spans the whole backward)
  full_grads_[u] = View1D("ndmini::full_grads", layout_.unit_size[u]);
  add_transient(full_grads_[u].extent(0) * sizeof(real));
}

void Fsdp::end_grads(int u) {
  const std::size_t size = layout_.unit_size[u], part = size / group_.size();
  // Reduce-scatter instead of all-reduce: each rank only updates its shard.
  PendingReduction r{u, full_grads_[u], View1D(), Bf16View1D(), Bf16View1D(), CommRequest()};
  if (reduce_dtype_ == Precision::bf16) {
    // The bf16 copy is what travels: the fp32 full gradients can go at once.
    r.full_grads_bf16 = uninitialized_bf16("ndmini::full_grads_bf16", size);
    add_transient(size * sizeof(bf16));
    kernels::round_to_bf16(r.full_grads_bf16, r.full_grads);
    drop_transient(size * sizeof(real));
    r.full_grads = View1D();
    full_grads_[u] = View1D();  // freed before the next allocation (FsdpReplay counts it so)
    r.part_bf16 = uninitialized_bf16("ndmini::grad_shard_part_bf16", part);
    add_transient(part * sizeof(bf16));
    r.request = group_.ireduce_scatter(r.full_grads_bf16.data(), r.part_bf16.data(), part);
  } else {
    r.shard_part = uninitialized("ndmini::grad_shard_part", part);
    add_transient(part * sizeof(real));
    r.request = group_.ireduce_scatter(r.full_grads.data(), r.shard_part.data(), part);
  }
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
  real* shard = shard_grads_.data() + shard_offset_[r.unit];
  if (r.part_bf16.extent(0) > 0)
    add_widened_into(shard, r.part_bf16.data(), r.part_bf16.extent(0));
  else
    add_into(shard, r.shard_part.data(), r.shard_part.extent(0));
  drop_transient((r.full_grads.extent(0) + r.shard_part.extent(0)) * sizeof(real) +
                 (r.full_grads_bf16.extent(0) + r.part_bf16.extent(0)) * sizeof(bf16));
  r.full_grads = View1D();
  r.shard_part = View1D();
  r.full_grads_bf16 = Bf16View1D();
  r.part_bf16 = Bf16View1D();
}

void Fsdp::finish() {
  while (!reductions_.empty()) {
    complete(reductions_.front());
    reductions_.pop_front();
  }
}

}  // namespace ndmini
