// SPDX-License-Identifier: BSD-3-Clause
#include "parallel/param_store.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace ndmini {
namespace {

View1D alloc(const std::string& label, std::size_t n, bool zero) {
  return zero ? View1D(label, n) : View1D(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), n);
}

// y += x over n elements.
void add_into(real* y, const real* x, std::size_t n) {
  Kokkos::parallel_for(
      "ndmini::accumulate_shard", Kokkos::RangePolicy<ExecSpace>(0, n),
      KOKKOS_LAMBDA(const std::size_t i) { y[i] += x[i]; });
}

}  // namespace

ParamStore::ParamStore(ParamLayout layout, const DataParallelGroups& groups)
    : layout_(std::move(layout)), groups_(groups) {
  if (groups_.fsdp != nullptr && groups_.fsdp->size() > 1) {
    shards_ = groups_.fsdp->size();
    shard_rank_ = groups_.fsdp->rank();
  }
  const int n_units = units();
  shard_offset_.resize(n_units);
  std::size_t total = 0;
  for (int u = 0; u < n_units; ++u) {
    require(layout_.unit_size[u] % shards_ == 0, "internal: unit sizes must be padded to the FSDP group size");
    shard_offset_[u] = total;
    total += layout_.unit_size[u] / shards_;
  }
  shard_params_ = alloc("ndmini::params", total, true);
  shard_grads_ = alloc("ndmini::grads", total, true);
  full_params_.resize(n_units);
  full_grads_.resize(n_units);
  gathers_.resize(n_units);

  // Each parameter's part of this rank's shard of its unit.
  for (int k = 0; k < static_cast<int>(layout_.params.size()); ++k) {
    const ParamInfo& p = layout_.params[k];
    const std::size_t unit_begin = layout_.unit_offset[p.unit];
    const std::size_t part = layout_.unit_size[p.unit] / shards_;
    const std::size_t shard_begin = shard_rank_ * part, shard_end = shard_begin + part;
    const std::size_t p_begin = p.offset - unit_begin, p_end = p_begin + p.size;
    const std::size_t lo = std::max(shard_begin, p_begin), hi = std::min(shard_end, p_end);
    if (lo < hi) pieces_.push_back({k, shard_offset_[p.unit] + (lo - shard_begin), lo - p_begin, hi - lo});
  }
}

real* ParamStore::params(int u) {
  if (!sharded()) return shard_params_.data() + shard_offset_[u];
  require(full_params_[u].extent(0) > 0, "internal: parameters of unit " + std::to_string(u) + " used before gather");
  return full_params_[u].data();
}

real* ParamStore::grads(int u) {
  if (!sharded()) return shard_grads_.data() + shard_offset_[u];
  require(full_grads_[u].extent(0) > 0, "internal: gradients of unit " + std::to_string(u) + " used before begin");
  return full_grads_[u].data();
}

void ParamStore::prefetch(int u) {
  if (!sharded() || u < 0 || u >= units() || full_params_[u].extent(0) > 0) return;
  const std::size_t size = layout_.unit_size[u];
  full_params_[u] = alloc("ndmini::gathered_params", size, false);
  transient_ += size * sizeof(real);
  peak_transient_ = std::max(peak_transient_, transient_);
  gathers_[u] =
      groups_.fsdp->iall_gather(shard_params_.data() + shard_offset_[u], full_params_[u].data(), size / shards_);
}

void ParamStore::gather(int u) {
  if (!sharded()) return;
  prefetch(u);
  if (gathers_[u].active()) gathers_[u].wait();
}

void ParamStore::release(int u) {
  if (!sharded() || full_params_[u].extent(0) == 0) return;
  if (gathers_[u].active()) gathers_[u].wait();
  transient_ -= full_params_[u].extent(0) * sizeof(real);
  full_params_[u] = View1D();
}

void ParamStore::begin_grads(int u) {
  if (!sharded()) return;
  full_grads_[u] = alloc("ndmini::full_grads", layout_.unit_size[u], true);
  transient_ += full_grads_[u].extent(0) * sizeof(real);
  peak_transient_ = std::max(peak_transient_, transient_);
}

void ParamStore::end_grads(int u, bool last_micro_batch) {
  const std::size_t size = layout_.unit_size[u];
  if (sharded()) {
    // Reduce-scatter instead of all-reduce: each rank only updates its shard.
    PendingReduction r{u, full_grads_[u], alloc("ndmini::grad_shard_part", size / shards_, false), CommRequest()};
    transient_ += r.shard_part.extent(0) * sizeof(real);
    peak_transient_ = std::max(peak_transient_, transient_);
    r.request = groups_.fsdp->ireduce_scatter(r.full_grads.data(), r.shard_part.data(), size / shards_);
    full_grads_[u] = View1D();
    reductions_.push_back(std::move(r));
    // Two in flight overlap the next unit's backward; more would only hold memory.
    while (reductions_.size() > 2) {
      complete(reductions_.front());
      reductions_.pop_front();
    }
  } else if (last_micro_batch && groups_.dp_replicate != nullptr && groups_.dp_replicate->size() > 1) {
    PendingReduction r{u, View1D(), View1D(), groups_.dp_replicate->iall_reduce(grads(u), size)};
    reductions_.push_back(std::move(r));
  }
}

void ParamStore::poll() {
  for (auto& r : reductions_)
    if (r.request.active()) r.request.test();
}

void ParamStore::complete(PendingReduction& r) {
  if (r.request.active()) r.request.wait();
  if (r.shard_part.extent(0) > 0) {
    add_into(shard_grads_.data() + shard_offset_[r.unit], r.shard_part.data(), r.shard_part.extent(0));
    transient_ -= (r.full_grads.extent(0) + r.shard_part.extent(0)) * sizeof(real);
  }
  r.full_grads = View1D();
  r.shard_part = View1D();
}

void ParamStore::finish_grads() {
  while (!reductions_.empty()) {
    complete(reductions_.front());
    reductions_.pop_front();
  }
  // HSDP: the shards are summed over dp_shard; replicas of a shard still
  // need the sum over dp_replicate.
  if (sharded() && groups_.dp_replicate != nullptr && groups_.dp_replicate->size() > 1)
    groups_.dp_replicate->all_reduce(shard_grads_.data(), shard_grads_.extent(0));
  // Sequence parallelism: each tp rank saw only its rows, so the gradients of
  // tp-replicated tensors (LayerNorms, row-parallel biases, wpe) are partial.
  if (groups_.sequence_parallel && groups_.tp != nullptr && groups_.tp->size() > 1)
    for (const Piece& piece : pieces_)
      if (layout_.params[piece.param].split == TpSplit::replicated)
        groups_.tp->all_reduce(shard_grads_.data() + piece.shard_offset, piece.length);
}

bool ParamStore::counts_in_norm(const Piece& piece) const {
  return layout_.params[piece.param].split != TpSplit::replicated || layout_.tp_rank == 0;
}

bool ParamStore::is_replica(const Piece& piece) const {
  const bool dp_copy = groups_.dp_replicate != nullptr && groups_.dp_replicate->rank() > 0;
  return dp_copy || !counts_in_norm(piece);
}

std::size_t ParamStore::persistent_bytes() const {
  return (shard_params_.extent(0) + shard_grads_.extent(0)) * sizeof(real);
}

}  // namespace ndmini
