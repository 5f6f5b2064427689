// SPDX-License-Identifier: BSD-3-Clause
// The memory estimate: the runtime's and the model's allocation sizes,
// summed without allocating. FSDP's bytes replay the unit events the
// runtime executes.
#include "run/memory_estimate.hpp"

#include <algorithm>
#include <cmath>
#include <deque>

#include "model/gpt.hpp"
#include "model/moe.hpp"
#include "parallel/fsdp.hpp"
#include "parallel/param_store.hpp"
#include "parallel/stage_runtime.hpp"
#include "parallel/unit_events.hpp"

namespace ndmini {
namespace {

// Fsdp's allocations and collectives, replayed without data: the bytes it
// holds, their peak, and the traffic.
class FsdpReplay {
 public:
  // gathered_bytes: per element of a gathered unit (fp32, and under bf16
  // the bf16 values the gather brings); wire_bytes: per element of a
  // reduce-scatter's buffers (fp32, or 2 with comm.reduce_dtype = "bf16").
  // Each unit sharded over the ranks `layout` pads it for (ParamLayout::shards_of;
  // none over 1), a block's routed experts with their block (ParamStore).
  FsdpReplay(const ParamLayout& layout, std::size_t gathered_bytes, std::size_t wire_bytes = sizeof(real))
      : layout_(layout),
        units_(layout.unit_size),
        gathered_bytes_(gathered_bytes),
        wire_bytes_(wire_bytes),
        gathered_(units_.size(), false),
        open_(units_.size(), false) {}

  void run(const std::vector<UnitEvent>& events) {
    for (const UnitEvent& e : events) {
      const auto each = [&](auto&& f) {
        const int u = e.unit.index(), experts = layout_.experts_unit[u];
        if (layout_.shards_of(u) > 1) f(u);
        if (experts >= 0 && layout_.shards_of(experts) > 1) f(experts);
      };
      switch (e.op) {
        case UnitOp::gather:
        case UnitOp::prefetch:  // a prefetch allocates as the gather would
          if (!e.unit.is_none()) each([&](int u) { gather(u); });
          break;
        case UnitOp::release:
          each([&](int u) { release(u); });
          break;
        case UnitOp::open_grads:
          each([&](int u) { begin_grads(u); });
          break;
        case UnitOp::end_grads:
          each([&](int u) { end_grads(u); });
          break;
        case UnitOp::poll:  // completes reductions early at best: the replay keeps them, an upper bound
        case UnitOp::compute:
          break;
      }
    }
  }
  std::size_t peak_bytes() const { return peak_; }
  const FsdpTraffic& traffic() const { return traffic_; }

 private:
  void gather(int u) {
    if (gathered_[u]) return;
    gathered_[u] = true;
    grow(units_[u] * gathered_bytes_);
    traffic_.all_gather_floats += static_cast<double>(units_[u]);
    ++traffic_.all_gathers;
  }
  void release(int u) {
    if (!gathered_[u]) return;
    gathered_[u] = false;
    held_ -= units_[u] * gathered_bytes_;
  }
  void begin_grads(int u) {
    if (open_[u]) return;
    open_[u] = true;
    grow(units_[u] * sizeof(real));
  }
  void end_grads(int u) {
    open_[u] = false;
    const std::size_t part = units_[u] / layout_.shards_of(u);
    if (wire_bytes_ != sizeof(real)) {  // Fsdp::end_grads: the bf16 copy, then the fp32 gradients go
      grow(units_[u] * wire_bytes_);
      held_ -= units_[u] * sizeof(real);
    }
    grow(part * wire_bytes_);
    traffic_.reduce_scatter_floats += static_cast<double>(units_[u]);
    ++traffic_.reduce_scatters;
    // Each Fsdp (the dense units', the experts') keeps its own in flight.
    std::deque<std::size_t>& in_flight = reductions_[layout_.holds_experts[u] ? 1 : 0];
    in_flight.push_back((units_[u] + part) * wire_bytes_);
    while (in_flight.size() > Fsdp::kReductionsInFlight) {
      held_ -= in_flight.front();
      in_flight.pop_front();
    }
  }
  void grow(std::size_t bytes) { peak_ = std::max(peak_, held_ += bytes); }

  const ParamLayout& layout_;
  std::vector<std::size_t> units_;  // floats of each unit
  std::size_t gathered_bytes_, wire_bytes_;
  std::vector<bool> gathered_, open_;
  // Bytes of full gradients + shard part of each reduce-scatter in flight: the dense units', the experts'.
  std::array<std::deque<std::size_t>, 2> reductions_;
  std::size_t held_ = 0, peak_ = 0;
  FsdpTraffic traffic_;
};

// The most micro-batches of `chunk` that `actions` have forwarded but not yet backwarded.
int most_in_flight(int chunk, const std::vector<PipelineAction>& actions) {
  int now = 0, most = 0;
  for (const PipelineAction& a : actions)
    if (a.chunk == chunk) most = std::max(most, now += a.kind == PipelineAction::Kind::forward ? 1 : -1);
  return most;
}

// Byte counts saturate just below INT64_MAX: a refusal, not an overflow.
std::int64_t saturated_bytes(double bytes) { return static_cast<std::int64_t>(std::min(bytes, 9.0e18)); }

// Absurd decks (more elements than size_t arithmetic survives, or more
// layers than a parameter layout is worth building for): a rough count
// (~20 [N, C] activations per block); refused by the caller anyway.
constexpr double kMostElements = 1e15, kMostLayers = 1e5;
MemoryEstimate rough_estimate(const ModelConfig& m, double params, double N, double tp, int in_flight) {
  constexpr double kRoughFloatsPerRow = 20;
  const double C = m.channels, V = m.vocab;
  MemoryEstimate e;
  e.param_bytes = e.grad_bytes = saturated_bytes(params * sizeof(real));
  e.optimizer_bytes = saturated_bytes(2 * params * sizeof(real));
  e.state_bytes = saturated_bytes(4 * params * sizeof(real));
  e.async_checkpoint_bytes = saturated_bytes(3 * params * sizeof(real));
  e.activation_bytes_per_micro_batch = saturated_bytes(m.layers * N * C * kRoughFloatsPerRow * sizeof(real));
  e.in_flight = in_flight;
  e.scratch_bytes = saturated_bytes(N * (C + V / tp) * 4 * sizeof(real));
  return e;
}

// With comm.reduce_dtype = "bf16", the most bytes the bf16 copies of the
// gradient reductions outside FSDP hold at once (parallel/grad_reduction.hpp).
// They follow each other, so the largest counts: over dp_replicate every
// bucket's copy, in flight together at the end of the backward (or the
// shard's, HSDP); a tp-replicated tensor's piece with SP; the tied wte's shard.
double bf16_wire_bytes(const ModelConfig& m, const ParamLayout& layout, const ParallelDims& split,
                       const std::vector<Chunk>& chunks, std::size_t shard) {
  const int fsdp = split.fsdp();
  std::size_t most = split.dp_replicate > 1 ? shard : 0;
  if (split.tp > 1 && split.sequence_parallel)
    for (const ParamStore::Piece& piece : ParamStore::pieces_of(layout, 0))
      if (layout.params[piece.param].split == TpSplit::replicated) most = std::max(most, piece.length);
  if (split.pp > 1 && m.tie_embeddings)
    for (const ChunkUnits& u : gpt_chunk_units(m, chunks))
      if (u.wte >= 0) most = std::max(most, layout.unit_size[u.wte] / fsdp);
  return 1.0 * most * sizeof(bf16);
}

// The most bytes FSDP holds while a stage's units, sharded as `layout` pads
// them, go through `events`.
std::size_t peak_of(const ParamLayout& layout, const std::vector<UnitEvent>& events, Precision precision,
                    Precision reduce_dtype) {
  FsdpReplay fsdp(layout, sizeof(real) + ParamStore::transient_working_bytes_per_element(precision),
                  reduce_dtype == Precision::bf16 ? sizeof(bf16) : sizeof(real));
  fsdp.run(events);
  return fsdp.peak_bytes();
}

// Training steps; recompute only adds compute events, so the planner's figures need not know it.
UnitPolicy training(bool reshard_after_forward, Recompute recompute = Recompute::none) {
  return {reshard_of(reshard_after_forward), recompute, Pass::train};
}

}  // namespace

FsdpTraffic fsdp_traffic(const ModelConfig& m, const ParamLayout& layout, const std::vector<Chunk>& chunks,
                         const std::vector<PipelineAction>& actions, bool reshard_after_forward) {
  FsdpReplay fsdp(layout, sizeof(real));
  fsdp.run(stage_unit_events(chunks, gpt_chunk_units(m, chunks), actions, training(reshard_after_forward)));
  return fsdp.traffic();
}

MemoryEstimate gpt_memory_estimate(const ModelConfig& m, const ParallelDims& split, int micro_batch,
                                   const std::vector<Chunk>& chunks, int in_flight, Recompute recompute,
                                   const std::vector<PipelineAction>& actions, bool reshard_after_forward,
                                   Precision precision, Precision reduce_dtype, double moe_max_load) {
  const int fsdp = split.fsdp();
  // Doubles first: a deck may describe a model whose bytes overflow 64 bits.
  const double C = m.channels, V = m.vocab, T = m.seq_len, B = micro_batch, tp = split.tp;
  const double N = B * T / split.cp;
  // Per block of each kind: the tensors tp splits divided by tp, the others
  // whole (GPT-2: 12 C^2 / tp + 13 C); counted once, a deck may have 1e9 layers.
  const auto block_params = [&](const std::vector<BlockTensorShape>& tensors) {
    double n = 0;
    for (const BlockTensorShape& t : tensors) {
      double elements = 1;
      for (const std::int64_t d : t.shape) elements *= static_cast<double>(d);
      n += t.split == TpSplit::replicated ? elements : elements / (t.split == TpSplit::experts ? split.ep : tp);
    }
    return n;
  };
  const double dense_params = block_params(gpt_block_tensors(m));
  const double moe_params = m.moe() ? block_params(layer_tensors(m, first_moe_block(m))) : 0;
  const double ln_f = m.norm == NormKind::layernorm && m.bias ? 2 * C : C;
  double params = 0;
  for (const Chunk& c : chunks) {
    if (c.embedding || (c.head && m.tie_embeddings)) params += V * C / tp;  // wte
    if (c.head && !m.tie_embeddings) params += V * C / tp;                  // lm_head
    if (c.embedding && m.learned_positions()) params += T * C;
    if (c.head) params += ln_f;
    const double moe = moe_blocks_in(m, c.first_layer, c.end_layer);
    params += (c.layers() - moe) * dense_params + moe * moe_params;
  }
  if (params > kMostElements || N * std::max(C, V) > kMostElements || m.layers > kMostLayers)
    return rough_estimate(m, params / fsdp, N, tp, in_flight);
  // From here on the sizes the runtime, the model and the layers allocate.
  MemoryEstimate e;
  const ParamLayout layout = gpt_param_layout(m, chunks, split.tp, 0, fsdp, {split.ep, 0, split.expert_fsdp()});
  // Parameters and gradients (ParamStore's shards), AdamW's two moments of the same size.
  const std::size_t shard = ParamStore::shard_elements(layout);
  // Under bf16 the parameters add their working copy (ParamStore).
  e.param_bytes = saturated_bytes(1.0 * shard * sizeof(real) + 1.0 * ParamStore::working_bytes_of(layout, precision));
  e.grad_bytes = saturated_bytes(1.0 * shard * sizeof(real));
  e.optimizer_bytes = saturated_bytes(2.0 * shard * sizeof(real));
  e.state_bytes = e.param_bytes + e.grad_bytes + e.optimizer_bytes;
  e.async_checkpoint_bytes = saturated_bytes(3.0 * shard * sizeof(real));  // CheckpointState's staged copies
  const MoeSplit moe{has_moe_block(m, chunks), split.ep, moe_max_load};
  const LayerSizes blocks =
      GptModel::layer_sizes_of(m, micro_batch, split.tp, split.sequence_parallel, split.cp, precision, moe);
  // Records: freed ones are kept for reuse per chunk, so the stage holds, of
  // each chunk, the most of its micro-batches the schedule has in flight at once.
  double records = 0, record_bytes = 0, largest = 0;
  for (std::size_t k = 0; k < chunks.size(); ++k) {
    const double bytes = static_cast<double>(StageRuntime::record_bytes(chunks[k], blocks, recompute));
    const int most = most_in_flight(chunks[k].index, actions);
    records += most;
    record_bytes += most * bytes;
    largest = std::max(largest, bytes);
  }
  // `actions` may replay only the first micro-batches of a very long step.
  if (records < in_flight) {
    record_bytes += (in_flight - records) * largest;
    records = in_flight;
  }
  e.in_flight = static_cast<std::int64_t>(records);
  e.activation_bytes_per_micro_batch = saturated_bytes(std::ceil(record_bytes / std::max(records, 1.0)));
  // Scratch: the model's own buffers, a recomputed block, what FSDP holds at most.
  double scratch = static_cast<double>(GptModel::buffer_sizes(m, micro_batch, chunks.back().head, split.tp,
                                                              split.sequence_parallel, split.cp, precision, moe)
                                           .bytes());
  if (recompute == Recompute::block) scratch += StageRuntime::recomputed_bytes(m, chunks, blocks);
  // FSDP's pattern repeats once the schedule's warm-up is over: a few rounds of it suffice.
  const std::size_t replayed = std::min(actions.size(), 4 * (static_cast<std::size_t>(in_flight) + 1) * chunks.size());
  const std::vector<PipelineAction> first(actions.begin(), actions.begin() + replayed);
  const double fsdp_bytes = static_cast<double>(peak_of(
      layout, stage_unit_events(chunks, gpt_chunk_units(m, chunks), first, training(reshard_after_forward, recompute)),
      precision, reduce_dtype));
  const double wire_bytes = reduce_dtype == Precision::bf16 ? bf16_wire_bytes(m, layout, split, chunks, shard) : 0.0;
  e.scratch_bytes = saturated_bytes(scratch + fsdp_bytes + wire_bytes);
  e.comm_buffer_bytes = saturated_bytes(fsdp_bytes + wire_bytes);
  return e;
}

}  // namespace ndmini
