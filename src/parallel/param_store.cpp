// SPDX-License-Identifier: BSD-3-Clause
#include "parallel/param_store.hpp"

#include <algorithm>
#include <exception>

#include "core/error.hpp"
#include "kernels/kernels.hpp"

namespace ndmini {

namespace {

int size_of(const Communicator* c) { return c != nullptr ? c->size() : 1; }
int rank_of(const Communicator* c) { return c != nullptr ? c->rank() : 0; }
constexpr std::size_t kNone = static_cast<std::size_t>(-1);

}  // namespace

ParamStore::ParamStore(ParamLayout layout, const DataParallelGroups& groups, Precision precision)
    : layout_(std::move(layout)), groups_(groups), precision_(precision) {
  if (layout_.shards != size_of(groups_.fsdp) || layout_.expert_shards != size_of(groups_.expert_fsdp))
    throw InternalError("the parameter layout is padded for other FSDP groups than the store's");
  replica_ = groups_.dp_replicate != nullptr && groups_.dp_replicate->rank() > 0;
  const int n_units = units();
  shard_offset_.resize(n_units);
  rounded_offset_.assign(n_units, kNone);
  std::size_t total = 0, whole = 0;
  for (int u = 0; u < n_units; ++u) {
    if (layout_.unit_size[u] % layout_.shards_of(u) != 0)
      throw InternalError("unit sizes must be padded to the FSDP group size");
    shard_offset_[u] = total;
    total += shard_size(u);
    if (layout_.shards_of(u) == 1) {
      rounded_offset_[u] = whole;
      whole += shard_size(u);
    }
  }
  if (total != shard_elements(layout_)) throw InternalError("the shard sizes do not add up");
  shard_params_ = View1D("ndmini::params", total);
  shard_grads_ = View1D("ndmini::grads", total);

  pieces_ = pieces_of(layout_, rank_of(groups_.fsdp), rank_of(groups_.expert_fsdp));
  if (precision_ == Precision::bf16) {
    working_bf16_ = uninitialized_bf16("ndmini::working_params_bf16", total);
    if (whole > 0) working_rounded_ = uninitialized("ndmini::working_params", whole);
    working_version_.assign(n_units, 0);
  }
  if (layout_.shards > 1)
    fsdp_ = std::make_unique<Fsdp>(*groups_.fsdp, layout_, shard_offset_, shard_params_, shard_grads_, transient_,
                                   working_bf16_, groups_.reduce_dtype);
  if (layout_.expert_shards > 1)
    expert_fsdp_ = std::make_unique<Fsdp>(*groups_.expert_fsdp, layout_, shard_offset_, shard_params_, shard_grads_,
                                          transient_, working_bf16_, groups_.reduce_dtype);
  if (groups_.dp_replicate != nullptr && groups_.dp_replicate->size() > 1)
    dp_ = std::make_unique<DataParallel>(*groups_.dp_replicate, groups_.reduce_dtype);
}

std::size_t ParamStore::working_bytes_per_element(Precision precision, bool sharded) {
  if (precision != Precision::bf16) return 0;
  return (sharded ? 0 : sizeof(real)) + sizeof(bf16);
}

std::size_t ParamStore::working_bytes_of(const ParamLayout& layout, Precision precision) {
  std::size_t bytes = 0;
  for (std::size_t u = 0; u < layout.unit_size.size(); ++u) {
    const int shards = layout.shards_of(static_cast<int>(u));
    bytes += layout.unit_size[u] / shards * working_bytes_per_element(precision, shards > 1);
  }
  return bytes;
}

void ParamStore::refresh_working_unit(int u) {
  if (precision_ != Precision::bf16 || fsdp_of(u) != nullptr || working_version_[u] == version_) return;
  const std::size_t at = shard_offset_[u], n = layout_.unit_size[u];
  kernels::round_to_bf16(Bf16Slice1D(working_bf16_.data() + at, n), ConstSlice1D(shard_params_.data() + at, n));
  kernels::widen_bf16(Slice1D(working_rounded_.data() + rounded_offset_[u], n),
                      ConstBf16Slice1D(working_bf16_.data() + at, n));
  working_version_[u] = version_;
}

void ParamStore::refresh_working_shard() {
  // The whole shard buffer: a whole unit's bf16 values round alike.
  if (precision_ != Precision::bf16 || shard_version_ == version_) return;
  kernels::round_to_bf16(Bf16Slice1D(working_bf16_.data(), working_bf16_.extent(0)),
                         ConstSlice1D(shard_params_.data(), shard_params_.extent(0)));
  shard_version_ = version_;
}

real* ParamStore::params(int u) {
  if (Fsdp* f = fsdp_of(u)) return f->params(u);  // bf16: the gathered working copy, widened
  if (precision_ != Precision::bf16) return shard_params_.data() + shard_offset_[u];
  refresh_working_unit(u);
  return working_rounded_.data() + rounded_offset_[u];
}

const bf16* ParamStore::params_bf16(int u) {
  if (precision_ != Precision::bf16) return nullptr;
  if (Fsdp* f = fsdp_of(u)) return f->params_bf16(u);
  refresh_working_unit(u);
  return working_bf16_.data() + shard_offset_[u];
}

real* ParamStore::grads(int u) {
  if (Fsdp* f = fsdp_of(u)) return f->grads(u);
  return shard_grads_.data() + shard_offset_[u];
}

std::size_t ParamStore::shard_elements(const ParamLayout& layout) {
  std::size_t n = 0;  // every unit is padded to split evenly over its group
  for (std::size_t u = 0; u < layout.unit_size.size(); ++u)
    n += layout.unit_size[u] / layout.shards_of(static_cast<int>(u));
  return n;
}

std::vector<ParamStore::Piece> ParamStore::pieces_of(const ParamLayout& layout, int shard_rank, int expert_shard_rank) {
  const std::size_t n_units = layout.unit_size.size();
  std::vector<std::size_t> shard_offset(n_units);
  for (std::size_t u = 1; u < n_units; ++u)
    shard_offset[u] = shard_offset[u - 1] + layout.unit_size[u - 1] / layout.shards_of(static_cast<int>(u - 1));
  // Each parameter's part of this rank's shard of its unit.
  std::vector<Piece> pieces;
  for (int k = 0; k < static_cast<int>(layout.params.size()); ++k) {
    const ParamInfo& p = layout.params[k];
    const std::size_t unit_begin = layout.unit_offset[p.unit];
    const std::size_t part = layout.unit_size[p.unit] / layout.shards_of(p.unit);
    const std::size_t rank = layout.holds_experts[p.unit] ? expert_shard_rank : shard_rank;
    const std::size_t shard_begin = rank * part, shard_end = shard_begin + part;
    const std::size_t p_begin = p.offset - unit_begin, p_end = p_begin + p.size;
    const std::size_t lo = std::max(shard_begin, p_begin), hi = std::min(shard_end, p_end);
    if (lo < hi) pieces.push_back({k, shard_offset[p.unit] + (lo - shard_begin), lo - p_begin, hi - lo});
  }
  return pieces;
}

template <class F>
void ParamStore::with_experts(UnitId u, F&& f) {
  f(u.index());
  const int experts = layout_.experts_unit[u.index()];
  if (experts >= 0) f(experts);
}

void ParamStore::prefetch(UnitId u) {
  if (u.is_none()) return;
  with_experts(u, [&](int x) {
    if (Fsdp* f = fsdp_of(x)) {
      refresh_working_shard();
      f->prefetch(x);
    }
  });
}

void ParamStore::gather(UnitId u) {
  with_experts(u, [&](int x) {
    if (Fsdp* f = fsdp_of(x)) {
      refresh_working_shard();
      f->gather(x);
    }
  });
}

void ParamStore::release(UnitId u) {
  with_experts(u, [&](int x) {
    if (Fsdp* f = fsdp_of(x)) f->release(x);
  });
}

void ParamStore::begin_grads(UnitId u) {
  with_experts(u, [&](int x) {
    if (Fsdp* f = fsdp_of(x)) f->begin_grads(x);
  });
}

void ParamStore::end_grads(UnitId u, bool last_micro_batch) {
  with_experts(u, [&](int x) {
    if (Fsdp* f = fsdp_of(x))
      f->end_grads(x);
    else if (dp_ && last_micro_batch)
      dp_->reduce_bucket(grads(x), layout_.unit_size[x]);
  });
}

void ParamStore::poll() {
  if (fsdp_) fsdp_->poll();
  if (expert_fsdp_) expert_fsdp_->poll();
  if (dp_) dp_->poll();
}

void ParamStore::finish_grads() {
  if (fsdp_) fsdp_->finish();
  if (expert_fsdp_) expert_fsdp_->finish();
  if (!dp_) return;
  // HSDP: the shards are summed over their FSDP group; replicas of a shard
  // still need the sum over dp_replicate (whole units went in end_grads).
  bool every_unit_sharded = true;
  for (int u = 0; u < units(); ++u) every_unit_sharded = every_unit_sharded && fsdp_of(u) != nullptr;
  if (every_unit_sharded) {
    dp_->finish(shard_grads_);
    return;
  }
  for (int u = 0; u < units(); ++u)
    if (fsdp_of(u) != nullptr) dp_->reduce_bucket(shard_grads_.data() + shard_offset_[u], shard_size(u));
  dp_->finish();
}

bool ParamStore::counts_in_norm(const Piece& piece) const {
  const ParamInfo& p = layout_.params[piece.param];
  return !p.tied_copy && (p.split != TpSplit::replicated || layout_.tp_rank == 0);
}

bool ParamStore::is_replica(const Piece& piece) const { return replica_ || !counts_in_norm(piece); }

std::size_t ParamStore::persistent_bytes() const {
  return (shard_params_.extent(0) + shard_grads_.extent(0) + working_rounded_.extent(0)) * sizeof(real) +
         working_bf16_.extent(0) * sizeof(bf16);
}

}  // namespace ndmini
