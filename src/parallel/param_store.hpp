// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// The model's parameters, gradients and their data-parallel life cycle.
//
// Parameters live in a flat tp-local buffer cut into units (the root: wte,
// wpe, ln_f; then one unit per block). Without FSDP the flat buffers are the
// persistent state and every unit is always available. With FSDP (the fsdp
// group has n > 1 ranks) each rank keeps only 1/n of every unit -- its shard
// of parameters, gradients and optimizer state -- and a unit's full
// parameters exist only between gather() and release(); its gradients are
// reduce-scattered back into the shard after each micro-batch.
//
// Pure data parallelism (dp_replicate) all-reduces each unit's gradients as
// soon as the last micro-batch's backward has produced them, so the
// reduction of one unit overlaps the backward of the next (bucket = unit).
#include <deque>
#include <vector>

#include "comm/communicator.hpp"
#include "core/types.hpp"
#include "parallel/param_layout.hpp"

namespace ndmini {

struct DataParallelGroups {
  Communicator* fsdp = nullptr;          // parameters sharded over it (dp_shard x cp); null: none
  Communicator* dp_replicate = nullptr;  // gradients all-reduced over it; null: none
  Communicator* tp = nullptr;            // for sequence-parallel gradient sums; null: none
  bool sequence_parallel = false;        // tp-replicated tensors get partial gradients per tp rank
  bool reshard_after_forward = true;     // FSDP: free a block's parameters after its forward
};

class ParamStore {
 public:
  ParamStore(ParamLayout layout, const DataParallelGroups& groups);
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  const ParamLayout& layout() const { return layout_; }
  int units() const { return static_cast<int>(layout_.unit_size.size()); }
  bool sharded() const { return shards_ > 1; }

  // Full (tp-local) parameters and gradients of unit u, indexed like the
  // flat layout from layout().unit_offset[u].
  real* params(int u);
  real* grads(int u);

  // FSDP life cycle; all are no-ops without FSDP.
  void prefetch(int u);  // start the all-gather of unit u
  void gather(int u);    // make unit u's parameters available (waits for a prefetch)
  void release(int u);   // drop them (FSDP with reshard_after_forward, or after backward)
  bool reshard_after_forward() const { return groups_.reshard_after_forward; }

  // Gradient life cycle of one micro-batch's backward, unit by unit.
  void begin_grads(int u);                       // zeroed full gradients (FSDP)
  void end_grads(int u, bool last_micro_batch);  // reduce-scatter (FSDP) / start the all-reduce (DP)
  void poll();                                   // lets in-flight reductions progress
  // Completes every reduction: afterwards the shard gradients are the global
  // sums over all data-parallel ranks (and over tp for sequence-parallel
  // partial sums).
  void finish_grads();

  // Persistent state of this rank: its shard of the flat buffer (all of it
  // without FSDP). Units follow each other; padding is zero.
  View1D shard_params() const { return shard_params_; }
  View1D shard_grads() const { return shard_grads_; }

  // One parameter's elements within the shard.
  struct Piece {
    int param;                 // index into layout().params
    std::size_t shard_offset;  // where they are in the shard buffers
    std::size_t local_begin;   // first element, in the tp-local tensor
    std::size_t length;
  };
  const std::vector<Piece>& pieces() const { return pieces_; }
  // Counts in the global gradient norm: each unique element once, so
  // tp-replicated tensors count on tp rank 0 only.
  bool counts_in_norm(const Piece& piece) const;
  // Held but not owned: a copy that another rank also holds (data-parallel
  // replicas, tp-replicated tensors on tp ranks other than 0). Checkpoints
  // write owners only.
  bool is_replica(const Piece& piece) const;

  // Bytes this rank holds persistently (parameters and gradients), and the
  // most it held transiently for gathered units.
  std::size_t persistent_bytes() const;
  std::size_t peak_transient_bytes() const { return peak_transient_; }

 private:
  struct PendingReduction {
    int unit;
    View1D full_grads, shard_part;  // kept alive until the request completes
    CommRequest request;            // last: destroyed (and so waited for) before the buffers
  };
  void complete(PendingReduction& r);

  ParamLayout layout_;
  DataParallelGroups groups_;
  int shards_ = 1, shard_rank_ = 0;
  std::vector<std::size_t> shard_offset_;  // of each unit in the shard buffers
  View1D shard_params_, shard_grads_;
  std::vector<Piece> pieces_;
  // FSDP: gathered parameters and full gradients of units in use.
  std::vector<View1D> full_params_, full_grads_;
  std::vector<CommRequest> gathers_;
  std::deque<PendingReduction> reductions_;
  std::size_t transient_ = 0, peak_transient_ = 0;
};

}  // namespace ndmini
