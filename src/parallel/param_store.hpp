// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// The parameters, gradients and their data-parallel life cycle on one rank.
//
// Parameters live in a flat tp-local buffer cut into units (see ParamLayout).
// Without FSDP the flat buffers are the persistent state and every unit is
// always available; with FSDP (parallel/fsdp.hpp) each rank keeps only its
// shard of every unit and a unit's full parameters exist only between
// gather() and release(). The routed experts' units shard over the expert
// fsdp group instead (their own Fsdp; whole where that group is one rank)
// and follow their block's unit through every step of the life cycle.
// Gradients of replicas are summed over dp_replicate
// (parallel/data_parallel.hpp). StageRuntime drives the life cycle unit by
// unit, executing the unit events (parallel/unit_events.hpp); which
// strategy does what is decided here, once.
#include <memory>
#include <vector>

#include "comm/communicator.hpp"
#include "config/config.hpp"
#include "core/types.hpp"
#include "model/param_layout.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/fsdp.hpp"
#include "parallel/unit_id.hpp"

namespace ndmini {

struct DataParallelGroups {
  Communicator* fsdp = nullptr;              // parameters sharded over it (dp_shard x cp); null: none
  Communicator* expert_fsdp = nullptr;       // the routed experts' units sharded over it; null: none
  Communicator* dp_replicate = nullptr;      // gradients all-reduced over it; null: none
  bool reshard_after_forward = true;         // FSDP: free a block's parameters after its forward
  Precision reduce_dtype = Precision::fp32;  // gradient reductions' wire format (comm.reduce_dtype)
};

class ParamStore {
 public:
  // precision bf16: the model computes with a working copy of the masters
  // rounded to bf16 (params(), params_bf16()); the masters stay fp32.
  ParamStore(ParamLayout layout, const DataParallelGroups& groups, Precision precision = Precision::fp32);
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  // Floats of this rank's shard of `layout` (each unit split over the
  // ranks it was padded for, ParamLayout::shards_of): the size of the
  // parameter and the gradient buffer (and of each AdamW moment).
  static std::size_t shard_elements(const ParamLayout& layout);

  const ParamLayout& layout() const { return layout_; }
  int units() const { return static_cast<int>(layout_.unit_size.size()); }

  // Full (tp-local) parameters and gradients of unit u, indexed like the
  // flat layout from layout().unit_offset[u]. Under bf16 params() are the
  // working copy: the masters rounded to bf16, held as fp32.
  real* params(int u);
  real* grads(int u);
  // Under bf16 the same working copy as bf16 (the matrix products'
  // operands); null in fp32.
  const bf16* params_bf16(int u);
  // The masters changed (an update, a load, an init): the working copy is
  // refreshed when next used. Without FSDP it is kept between steps, each
  // unit rounded when first used after a change; with FSDP each rank rounds
  // its shard before the next gather, the gathers move bf16 (half the bytes)
  // and a gathered unit is widened once for the fp32 uses.
  void params_changed() { ++version_; }
  Precision precision() const { return precision_; }

  // Both of the above, for the model's matrix products.
  UnitWeights weights(int u) { return {params(u), params_bf16(u)}; }

  // FSDP life cycle, driven by the unit events StageRuntime executes
  // (parallel/unit_events.hpp); all are no-ops without FSDP. Each applies to
  // a block's routed experts' unit too.
  void prefetch(UnitId u);  // start the all-gather of unit u (none: no unit runs next)
  void gather(UnitId u);    // make unit u's parameters available (waits for a prefetch)
  void release(UnitId u);   // drop them
  bool reshard_after_forward() const { return groups_.reshard_after_forward; }
  Precision reduce_dtype() const { return groups_.reduce_dtype; }

  // Gradient life cycle of one micro-batch's backward, unit by unit.
  void begin_grads(UnitId u);                       // FSDP: zeroed full gradients (kept if already open)
  void end_grads(UnitId u, bool last_micro_batch);  // FSDP: reduce-scatter; DP: all-reduce after the last
  void poll();                                      // lets in-flight reductions progress
  // Completes every reduction: afterwards the shard gradients are the sums
  // over all data-parallel ranks (dp_shard x cp, and dp_replicate).
  void finish_grads();

  // Persistent state of this rank: its shard of the flat buffer (all of it
  // without FSDP). Units follow each other; padding is zero.
  View1D shard_params() const { return shard_params_; }
  View1D shard_grads() const { return shard_grads_; }
  // Unit u's part of the shard buffers: [shard_offset(u), + unit_size / n).
  std::size_t shard_offset(int u) const { return shard_offset_[u]; }
  std::size_t shard_size(int u) const { return layout_.unit_size[u] / layout_.shards_of(u); }

  // One parameter's elements within the shard.
  struct Piece {
    int param;                 // index into layout().params
    std::size_t shard_offset;  // where they are in the shard buffers
    std::size_t local_begin;   // first element, in the tp-local tensor
    std::size_t length;
  };
  const std::vector<Piece>& pieces() const { return pieces_; }
  // The pieces of the rank that is shard `shard_rank` of the fsdp group and
  // `expert_shard_rank` of the expert fsdp group (what pieces() holds on
  // that rank; no allocation).
  static std::vector<Piece> pieces_of(const ParamLayout& layout, int shard_rank, int expert_shard_rank = 0);
  // Counts in the global gradient norm: each unique element once, so
  // tp-replicated tensors count on tp rank 0 only and the tied copy of wte
  // not at all (the routed experts: on every rank, each holds its own).
  bool counts_in_norm(const Piece& piece) const;
  // Held but not owned: a copy that another rank also holds (data-parallel
  // replicas, tp-replicated tensors on tp ranks other than 0, the tied copy
  // of wte). Checkpoints write owners only.
  bool is_replica(const Piece& piece) const;

  // Bytes this rank holds persistently: parameters and gradients, and under
  // bf16 the working copy.
  std::size_t persistent_bytes() const;
  // Bytes the working copy holds persistently per element of this rank's
  // shard buffers: 0 in fp32; under bf16 the rounded value in fp32 and in
  // bf16, or for a unit FSDP shards only the shard in bf16 (a gathered unit
  // then holds transient_working_bytes_per_element more per element).
  static std::size_t working_bytes_per_element(Precision precision, bool sharded);
  // The working copy's persistent bytes on a rank of `layout`: each unit's
  // shard times working_bytes_per_element (sharded or not).
  static std::size_t working_bytes_of(const ParamLayout& layout, Precision precision);
  static std::size_t transient_working_bytes_per_element(Precision precision) {
    return precision == Precision::bf16 ? sizeof(bf16) : 0;
  }
  // The most bytes FSDP held at once for gathered units and gradients.
  std::size_t peak_transient_bytes() const { return transient_.peak; }

 private:
  // The Fsdp that shards unit u (null: u is whole here).
  Fsdp* fsdp_of(int u) const { return layout_.holds_experts[u] ? expert_fsdp_.get() : fsdp_.get(); }
  // Calls f(x) for unit u and its routed experts' unit.
  template <class F>
  void with_experts(UnitId u, F&& f);
  // A unit whole here: rounds its masters into the working copy if they
  // changed since. Sharded units: rounds this rank's shard before a gather.
  void refresh_working_unit(int u);
  void refresh_working_shard();

  ParamLayout layout_;
  DataParallelGroups groups_;
  Precision precision_;
  // bf16: the working copy. In bf16 for the whole shard buffer (a sharded
  // unit's gathers move it), and rounded back to fp32 for the units whole
  // here (at rounded_offset_[u]; none for sharded units).
  View1D working_rounded_;
  Bf16View1D working_bf16_;
  std::vector<std::size_t> rounded_offset_;
  std::uint64_t version_ = 1;                   // of the masters
  std::vector<std::uint64_t> working_version_;  // of the masters each whole unit was rounded from
  std::uint64_t shard_version_ = 0;             // ... and the shard's bf16 copy
  bool replica_ = false;                        // a dp_replicate rank other than 0
  std::vector<std::size_t> shard_offset_;
  View1D shard_params_, shard_grads_;
  std::vector<Piece> pieces_;
  TransientBytes transient_;  // before the Fsdps, which count into it
  std::unique_ptr<Fsdp> fsdp_, expert_fsdp_;
  std::unique_ptr<DataParallel> dp_;
};

}  // namespace ndmini
