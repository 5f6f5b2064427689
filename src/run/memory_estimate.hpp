// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// What a pipeline stage holds per rank, estimated from the sizes the
// runtime and the model allocate, without allocating. FSDP's share replays
// the stage's unit events (parallel/unit_events.hpp), the same list
// StageRuntime executes. The deck's check refuses what does not fit, and the
// planner prices FSDP's collectives from the same replay.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "config/config.hpp"
#include "mesh/dims.hpp"
#include "model/chunk.hpp"
#include "model/param_layout.hpp"
#include "parallel/pipeline/schedule.hpp"

namespace ndmini {

// Bytes per rank. State: parameters, gradients and AdamW state. Records:
// in_flight records of (chunk, micro-batch), activation_bytes_per_micro_batch
// each on average. Scratch: the layers' buffers, the head's, and the most
// FSDP holds at once over split.fsdp(). `in_flight` is the most records the
// schedule keeps at once on the stage. MoE blocks: their routed experts
// split over split.ep, an expert's rows bounded by moe_max_load (train.moe_max_load).
struct MemoryEstimate {
  std::int64_t state_bytes = 0;
  std::int64_t activation_bytes_per_micro_batch = 0;
  std::int64_t in_flight = 0;
  std::int64_t scratch_bytes = 0;
  // checkpoint.async's host copy of the parameters and both AdamW moments
  // (train/checkpoint_state.hpp: three shards of fp32), counted in total()
  // when the run saves asynchronously (async_checkpoint, set by the caller).
  std::int64_t async_checkpoint_bytes = 0;
  bool async_checkpoint = false;
  std::int64_t total() const {
    return state_bytes + in_flight * activation_bytes_per_micro_batch + scratch_bytes +
           (async_checkpoint ? async_checkpoint_bytes : 0);
  }
  // The same bytes by category (ndmini plan's table). state_bytes is
  // parameters + gradients + optimizer state. comm_buffer_bytes is the part
  // of scratch_bytes that communication holds (FSDP's gathered units, full
  // gradients and reduce-scatters in flight; the pipeline's send buffers);
  // the rest of scratch is workspace.
  std::int64_t param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0, comm_buffer_bytes = 0;
};
// `actions`: the stage's schedule for one step, or its first micro-batches
// when the step has very many (the records of each chunk, FSDP's gathered
// units and open gradients follow it).
MemoryEstimate gpt_memory_estimate(const ModelConfig& m, const ParallelDims& split, int micro_batch,
                                   const std::vector<Chunk>& chunks, int in_flight, Recompute recompute,
                                   const std::vector<PipelineAction>& actions, bool reshard_after_forward,
                                   Precision precision = Precision::fp32, Precision reduce_dtype = Precision::fp32,
                                   double moe_max_load = 0);

// The floats FSDP all-gathers and reduce-scatters (gathered sizes) when a
// stage of `chunks` of model `m` (its architecture decides the units:
// gpt_chunk_units), its units sharded as `layout` pads them, runs `actions`;
// and the collectives' count. (Under bf16 the all-gathers move bf16 values:
// half the bytes.)
struct FsdpTraffic {
  double all_gather_floats = 0, reduce_scatter_floats = 0;
  std::int64_t all_gathers = 0, reduce_scatters = 0;
};
FsdpTraffic fsdp_traffic(const ModelConfig& m, const ParamLayout& layout, const std::vector<Chunk>& chunks,
                         const std::vector<PipelineAction>& actions, bool reshard_after_forward);

}  // namespace ndmini
