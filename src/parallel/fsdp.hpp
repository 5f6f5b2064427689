// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Fully sharded data parallelism (FSDP / ZeRO-3) over the fsdp group
// (dp_shard x cp): each rank keeps 1/n of every unit -- its shard of the
// parameters, gradients and optimizer state -- and a unit's full parameters
// exist only between gather() and release(). The gradients of a unit are
// reduce-scattered into the shard after each micro-batch's backward.
//
// Life cycle of a unit u during one micro-batch (the model calls these
// through ParamStore): prefetch(u) starts the all-gather early, gather(u)
// waits for it; release(u) frees the full parameters; begin_grads(u) gives a
// zeroed full gradient buffer, end_grads(u) starts its reduce-scatter. At
// most two reduce-scatters stay in flight; finish() completes them all.
// With a bf16 wire (comm.reduce_dtype) end_grads rounds the full gradients
// to bf16 and frees the fp32 ones, the reduce-scatter sums bf16, and the
// sum is widened into the fp32 shard gradients (which accumulate the
// micro-batches in fp32).
#include <deque>
#include <vector>

#include "comm/communicator.hpp"
#include "config/config.hpp"
#include "core/types.hpp"
#include "model/param_layout.hpp"

namespace ndmini {

// The bytes Fsdp instances hold for gathered units and gradients, now and
// at most: one count shared by a store's two (the dense units', the experts').
struct TransientBytes {
  std::size_t now = 0, peak = 0;
};

class Fsdp {
 public:
  // `group` shards the units of `layout`; shard_params/shard_grads are this
  // rank's shards (unit u's at shard_offset[u], unit_size[u] / n elements).
  // With `shard_bf16` (bf16 mixed precision: the shard's masters rounded,
  // kept current by the caller) the gathers move it instead, half the bytes,
  // and params() are its values widened back to fp32. `transient` counts
  // what it holds beyond the shards.
  Fsdp(Communicator& group, const ParamLayout& layout, std::vector<std::size_t> shard_offset, View1D shard_params,
       View1D shard_grads, TransientBytes& transient, Bf16View1D shard_bf16 = {},
       Precision reduce_dtype = Precision::fp32);
  Fsdp(const Fsdp&) = delete;
  Fsdp& operator=(const Fsdp&) = delete;

  real* params(int u);             // full parameters of a gathered unit
  const bf16* params_bf16(int u);  // the same as bf16 (with shard_bf16 only)
  real* grads(int u);              // full gradients between begin_grads and end_grads
  void prefetch(int u);
  void gather(int u);
  void release(int u);
  void begin_grads(int u);
  void end_grads(int u);
  void poll();
  void finish();

  // Reduce-scatters kept in flight: two overlap the next unit's backward;
  // more would only hold memory.
  static constexpr std::size_t kReductionsInFlight = 2;

 private:
  struct PendingReduction {
    int unit;
    View1D full_grads, shard_part;          // kept alive until the request completes (fp32 wire)
    Bf16View1D full_grads_bf16, part_bf16;  // the same on a bf16 wire
    CommRequest request;                    // last: destroyed (and so waited for) before the buffers
  };
  void complete(PendingReduction& r);
  void add_transient(std::size_t bytes);
  void drop_transient(std::size_t bytes) { transient_.now -= bytes; }
  bool gathers_bf16() const { return shard_bf16_.extent(0) > 0; }

  Communicator& group_;
  const ParamLayout& layout_;
  std::vector<std::size_t> shard_offset_;
  View1D shard_params_, shard_grads_;
  Bf16View1D shard_bf16_;
  Precision reduce_dtype_;
  std::vector<View1D> full_params_, full_grads_;
  std::vector<Bf16View1D> full_bf16_;
  std::vector<bool> widened_;  // bf16: full_params_[u] holds the gathered values widened
  std::vector<CommRequest> gathers_;
  std::deque<PendingReduction> reductions_;
  TransientBytes& transient_;
};

}  // namespace ndmini
