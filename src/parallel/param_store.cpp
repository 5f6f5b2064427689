// SPDX-License-Identifier: BSD-3-Clause
#include "parallel/param_store.hpp"

#include <algorithm>
#include <exception>

#include "core/error.hpp"
#include "kernels/kernels.hpp"

namespace ndmini {

ParamStore::ParamStore(ParamLayout layout, const DataParallelGroups& groups, Precision precision)
    : layout_(std::move(layout)), groups_(groups), precision_(precision) {
  int shard_rank = 0;
  if (groups_.fsdp != nullptr && groups_.fsdp->size() > 1) {
    shards_ = groups_.fsdp->size();
    shard_rank = groups_.fsdp->rank();
  }
  replica_ = groups_.dp_replicate != nullptr && groups_.dp_replicate->rank() > 0;
  const int n_units = units();
  shard_offset_.resize(n_units);
  std::size_t total = 0;
  for (int u = 0; u < n_units; ++u) {
    if (layout_.unit_size[u] % shards_ != 0) throw InternalError("unit sizes must be padded to the FSDP group size");
    shard_offset_[u] = total;
    total += layout_.unit_size[u] / shards_;
  }
  if (total != shard_elements(layout_, shards_)) throw InternalError("the shard sizes do not add up");
  shard_params_ = View1D("ndmini::params", total);
  shard_grads_ = View1D("ndmini::grads", total);

  pieces_ = pieces_of(layout_, shards_, shard_rank);
  if (precision_ == Precision::bf16) {
    working_bf16_ = uninitialized_bf16("ndmini::working_params_bf16", total);
    if (shards_ == 1) working_rounded_ = uninitialized("ndmini::working_params", total);
    working_version_.assign(shards_ > 1 ? 1 : n_units, 0);
  }
  if (shards_ > 1)
    fsdp_ = std::make_unique<Fsdp>(*groups_.fsdp, layout_, shard_offset_, shard_params_, shard_grads_, working_bf16_,
                                   groups_.reduce_dtype);
  if (groups_.dp_replicate != nullptr && groups_.dp_replicate->size() > 1)
    dp_ = std::make_unique<DataParallel>(*groups_.dp_replicate, groups_.reduce_dtype);
}

std::size_t ParamStore::working_bytes_per_element(Precision precision, bool sharded) {
  if (precision != Precision::bf16) return 0;
  return (sharded ? 0 : sizeof(real)) + sizeof(bf16);
}

void ParamStore::refresh_working_unit(int u) {
  if (precision_ != Precision::bf16 || fsdp_ || working_version_[u] == version_) return;
  const std::size_t at = shard_offset_[u], n = layout_.unit_size[u];
  kernels::round_to_bf16(Bf16Slice1D(working_bf16_.data() + at, n), ConstSlice1D(shard_params_.data() + at, n));
  kernels::widen_bf16(Slice1D(working_rounded_.data() + at, n), ConstBf16Slice1D(working_bf16_.data() + at, n));
  working_version_[u] = version_;
}

void ParamStore::refresh_working_shard() {
  if (precision_ != Precision::bf16 || !fsdp_ || working_version_[0] == version_) return;
  kernels::round_to_bf16(Bf16Slice1D(working_bf16_.data(), working_bf16_.extent(0)),
                         ConstSlice1D(shard_params_.data(), shard_params_.extent(0)));
  working_version_[0] = version_;
}

real* ParamStore::params(int u) {
  if (fsdp_) return fsdp_->params(u);  // bf16: the gathered working copy, widened
  if (precision_ != Precision::bf16) return shard_params_.data() + shard_offset_[u];
  refresh_working_unit(u);
  return working_rounded_.data() + shard_offset_[u];
}

const bf16* ParamStore::params_bf16(int u) {
  if (precision_ != Precision::bf16) return nullptr;
  if (fsdp_) return fsdp_->params_bf16(u);
  refresh_working_unit(u);
  return working_bf16_.data() + shard_offset_[u];
}

std::size_t ParamStore::shard_elements(const ParamLayout& layout, int shards) {
  return layout.total / shards;  // every unit is padded to split evenly
}

std::vector<ParamStore::Piece> ParamStore::pieces_of(const ParamLayout& layout, int shards, int shard_rank) {
  std::vector<std::size_t> shard_offset(layout.unit_size.size());
  for (std::size_t u = 1; u < shard_offset.size(); ++u)
    shard_offset[u] = shard_offset[u - 1] + layout.unit_size[u - 1] / shards;
  // Each parameter's part of this rank's shard of its unit.
  std::vector<Piece> pieces;
  for (int k = 0; k < static_cast<int>(layout.params.size()); ++k) {
    const ParamInfo& p = layout.params[k];
    const std::size_t unit_begin = layout.unit_offset[p.unit];
    const std::size_t part = layout.unit_size[p.unit] / shards;
    const std::size_t shard_begin = shard_rank * part, shard_end = shard_begin + part;
    const std::size_t p_begin = p.offset - unit_begin, p_end = p_begin + p.size;
    const std::size_t lo = std::max(shard_begin, p_begin), hi = std::min(shard_end, p_end);
    if (lo < hi) pieces.push_back({k, shard_offset[p.unit] + (lo - shard_begin), lo - p_begin, hi - lo});
  }
  return pieces;
}

void ParamStore::prefetch(UnitId u) {
  if (!fsdp_ || u.is_none()) return;
  refresh_working_shard();
  fsdp_->prefetch(u.index());
}

void ParamStore::gather(UnitId u) {
  if (!fsdp_) return;
  refresh_working_shard();
  fsdp_->gather(u.index());
}

void ParamStore::release(UnitId u) {
  if (fsdp_) fsdp_->release(u.index());
}

void ParamStore::begin_grads(UnitId u) {
  if (fsdp_) fsdp_->begin_grads(u.index());
}

void ParamStore::end_grads(UnitId u, bool last_micro_batch) {
  if (fsdp_)
    fsdp_->end_grads(u.index());
  else if (dp_ && last_micro_batch)
    dp_->reduce_bucket(grads(u.index()), layout_.unit_size[u.index()]);
}

void ParamStore::poll() {
  if (fsdp_) fsdp_->poll();
  if (dp_) dp_->poll();
}

void ParamStore::finish_grads() {
  if (fsdp_) fsdp_->finish();
  // HSDP: the shards are summed over the fsdp group; replicas of a shard
  // still need the sum over dp_replicate.
  if (dp_) dp_->finish(fsdp_ ? shard_grads_ : View1D());
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
