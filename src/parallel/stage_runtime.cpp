// SPDX-License-Identifier: BSD-3-Clause
// StageRuntime: the records of the micro-batches in flight, FSDP scopes
// around each unit of GptModel, and the gradient finalisation.
#include "parallel/stage_runtime.hpp"

#include <algorithm>
#include <cmath>
#include <deque>

#include "core/error.hpp"
#include "core/profiling.hpp"
#include "core/timer.hpp"
#include "kernels/kernels.hpp"
#include "parallel/fsdp.hpp"

namespace ndmini {
namespace {

int size_of(const Communicator* c) { return c != nullptr ? c->size() : 1; }

// The chunks the stage runs; none given: the whole model as one chunk.
std::vector<Chunk> chunks_or_whole_model(const std::vector<Chunk>& chunks, int layers) {
  if (!chunks.empty()) return chunks;
  return {Chunk{0, 0, layers, true, true}};
}

// Fsdp's allocations, replayed without data: the bytes it holds and their peak.
class FsdpReplay {
 public:
  // gathered_bytes: per element of a gathered unit (fp32, and under bf16
  // the bf16 values the gather brings); wire_bytes: per element of a
  // reduce-scatter's buffers (fp32, or 2 with comm.reduce_dtype = "bf16").
  FsdpReplay(const ParamLayout& layout, int shards, std::size_t gathered_bytes, std::size_t wire_bytes = sizeof(real))
      : units_(layout.unit_size),
        shards_(shards),
        gathered_bytes_(gathered_bytes),
        wire_bytes_(wire_bytes),
        gathered_(units_.size(), false),
        open_(units_.size(), false) {}
  void gather(int u) {  // and prefetch
    if (u < 0 || u >= static_cast<int>(units_.size()) || gathered_[u]) return;
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
    const std::size_t part = units_[u] / shards_;
    if (wire_bytes_ != sizeof(real)) {  // Fsdp::end_grads: the bf16 copy, then the fp32 gradients go
      grow(units_[u] * wire_bytes_);
      held_ -= units_[u] * sizeof(real);
    }
    grow(part * wire_bytes_);
    traffic_.reduce_scatter_floats += static_cast<double>(units_[u]);
    ++traffic_.reduce_scatters;
    reductions_.push_back((units_[u] + part) * wire_bytes_);
    while (reductions_.size() > Fsdp::kReductionsInFlight) {
      held_ -= reductions_.front();
      reductions_.pop_front();
    }
  }
  // The unit scopes of StageRuntime::forward() (with head()) and backward(), in their order.
  void forward(const Chunk& c, const ChunkUnits& u, bool reshard_after_forward) {
    if (c.embedding) {
      gather(u.wte);
      gather(u.wpe);
      gather(u.blocks.front());
      release(u.wpe);
      if (!c.head) release(u.wte);
    }
    for (std::size_t i = 0; i < u.blocks.size(); ++i) {
      gather(u.blocks[i]);
      gather(i + 1 < u.blocks.size() ? u.blocks[i + 1] : u.ln_f);
      if (reshard_after_forward) release(u.blocks[i]);
    }
    if (c.head) {
      gather(u.ln_f);
      gather(u.wte);
      begin_grads(u.wte);
      begin_grads(u.ln_f);
      end_grads(u.ln_f);
      if (!c.embedding) {
        end_grads(u.wte);
        release(u.wte);
      }
      release(u.ln_f);
    }
  }
  void backward(const Chunk& c, const ChunkUnits& u) {
    for (int i = static_cast<int>(u.blocks.size()) - 1; i >= 0; --i) {
      gather(u.blocks[i]);
      gather(i > 0 ? u.blocks[i - 1] : -1);
      begin_grads(u.blocks[i]);
      end_grads(u.blocks[i]);
      release(u.blocks[i]);
    }
    if (c.embedding) {
      begin_grads(u.wte);
      begin_grads(u.wpe);
      end_grads(u.wpe);
      end_grads(u.wte);
      if (c.head) release(u.wte);
    }
  }
  std::size_t peak_bytes() const { return peak_; }
  const StageRuntime::FsdpTraffic& traffic() const { return traffic_; }

 private:
  void grow(std::size_t bytes) { peak_ = std::max(peak_, held_ += bytes); }

  std::vector<std::size_t> units_;  // floats of each unit
  std::size_t shards_, gathered_bytes_, wire_bytes_;
  std::vector<bool> gathered_, open_;
  std::deque<std::size_t> reductions_;  // bytes of full gradients + shard part of each reduce-scatter in flight
  std::size_t held_ = 0, peak_ = 0;
  StageRuntime::FsdpTraffic traffic_;
};

// Replays `actions` of a stage of `chunks` through `fsdp`.
void replay(FsdpReplay& fsdp, const std::vector<Chunk>& chunks, const std::vector<PipelineAction>& actions,
            bool reshard_after_forward) {
  const std::vector<ChunkUnits> all_units = gpt_chunk_units(chunks);
  for (const PipelineAction& a : actions) {
    std::size_t k = 0;
    while (k < chunks.size() && chunks[k].index != a.chunk) ++k;
    if (k == chunks.size()) continue;
    if (a.kind == PipelineAction::Kind::forward)
      fsdp.forward(chunks[k], all_units[k], reshard_after_forward);
    else
      fsdp.backward(chunks[k], all_units[k]);
  }
}

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
double bf16_wire_bytes(const ParamLayout& layout, const ParallelDims& split, const std::vector<Chunk>& chunks,
                       std::size_t shard) {
  const int fsdp = split.fsdp();
  std::size_t most = split.dp_replicate > 1 ? shard : 0;
  if (split.tp > 1 && split.sequence_parallel)
    for (const ParamStore::Piece& piece : ParamStore::pieces_of(layout, fsdp, 0))
      if (layout.params[piece.param].split == TpSplit::replicated) most = std::max(most, piece.length);
  if (split.pp > 1)
    for (const ChunkUnits& u : gpt_chunk_units(chunks))
      if (u.wte >= 0) most = std::max(most, layout.unit_size[u.wte] / fsdp);
  return 1.0 * most * sizeof(bf16);
}

}  // namespace

std::size_t StageRuntime::fsdp_peak_bytes(const ParamLayout& layout, const std::vector<Chunk>& chunks, int shards,
                                          const std::vector<PipelineAction>& actions, bool reshard_after_forward,
                                          Precision precision, Precision reduce_dtype) {
  if (shards <= 1) return 0;
  FsdpReplay fsdp(layout, shards, sizeof(real) + ParamStore::transient_working_bytes_per_element(precision),
                  reduce_dtype == Precision::bf16 ? sizeof(bf16) : sizeof(real));
  replay(fsdp, chunks, actions, reshard_after_forward);
  return fsdp.peak_bytes();
}

StageRuntime::FsdpTraffic StageRuntime::fsdp_traffic(const ParamLayout& layout, const std::vector<Chunk>& chunks,
                                                     int shards, const std::vector<PipelineAction>& actions,
                                                     bool reshard_after_forward) {
  if (shards <= 1) return {};
  FsdpReplay fsdp(layout, shards, sizeof(real));
  replay(fsdp, chunks, actions, reshard_after_forward);
  return fsdp.traffic();
}

MemoryEstimate gpt_memory_estimate(const ModelConfig& m, const ParallelDims& split, int micro_batch,
                                   const std::vector<Chunk>& chunks, int in_flight, Recompute recompute,
                                   const std::vector<PipelineAction>& actions, bool reshard_after_forward,
                                   Precision precision, Precision reduce_dtype) {
  const int fsdp = split.fsdp();
  // Doubles first: a deck may describe a model whose bytes overflow 64 bits.
  const double C = m.channels, V = m.vocab, T = m.seq_len, B = micro_batch, tp = split.tp;
  const double N = B * T / split.cp;
  double params = 0;
  for (const Chunk& c : chunks) {
    if (c.embedding || c.head) params += V * C / tp;
    if (c.embedding) params += T * C;
    if (c.head) params += 2 * C;
    params += c.layers() * (12 * C * C / tp + 13 * C);
  }
  if (params > kMostElements || N * std::max(C, V) > kMostElements || m.layers > kMostLayers)
    return rough_estimate(m, params / fsdp, N, tp, in_flight);
  // From here on the sizes the runtime, the model and the layers allocate.
  MemoryEstimate e;
  const ParamLayout layout = gpt_param_layout(m, chunks, split.tp, 0, fsdp);
  // Parameters and gradients (ParamStore's shards), AdamW's two moments of the same size.
  const std::size_t shard = ParamStore::shard_elements(layout, fsdp);
  // Under bf16 the parameters add their working copy (ParamStore).
  e.param_bytes =
      saturated_bytes(1.0 * shard * (sizeof(real) + ParamStore::working_bytes_per_element(precision, fsdp > 1)));
  e.grad_bytes = saturated_bytes(1.0 * shard * sizeof(real));
  e.optimizer_bytes = saturated_bytes(2.0 * shard * sizeof(real));
  e.state_bytes = e.param_bytes + e.grad_bytes + e.optimizer_bytes;
  const BlockSizes block =
      GptModel::block_sizes_of(m, micro_batch, split.tp, split.sequence_parallel, split.cp, precision);
  // Records: freed ones are kept for reuse per chunk, so the stage holds, of
  // each chunk, the most of its micro-batches the schedule has in flight at once.
  double records = 0, record_bytes = 0, largest = 0;
  for (std::size_t k = 0; k < chunks.size(); ++k) {
    const double bytes = static_cast<double>(StageRuntime::record_bytes(chunks[k], block, recompute));
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
  double scratch = static_cast<double>(
      GptModel::buffer_sizes(m, micro_batch, chunks.back().head, split.tp, split.sequence_parallel, split.cp, precision)
          .bytes());
  if (recompute == Recompute::block) scratch += block.activation_bytes(false);
  // FSDP's pattern repeats once the schedule's warm-up is over: a few rounds of it suffice.
  const std::size_t replayed = std::min(actions.size(), 4 * (static_cast<std::size_t>(in_flight) + 1) * chunks.size());
  const double fsdp_bytes = static_cast<double>(StageRuntime::fsdp_peak_bytes(
      layout, chunks, fsdp, std::vector<PipelineAction>(actions.begin(), actions.begin() + replayed),
      reshard_after_forward, precision, reduce_dtype));
  const double wire_bytes = reduce_dtype == Precision::bf16 ? bf16_wire_bytes(layout, split, chunks, shard) : 0.0;
  e.scratch_bytes = saturated_bytes(scratch + fsdp_bytes + wire_bytes);
  e.comm_buffer_bytes = saturated_bytes(fsdp_bytes + wire_bytes);
  return e;
}

StageRuntime::StageRuntime(const ModelConfig& m, int micro_batch, const ModelParallel& par, Recompute recompute,
                           Precision precision)
    : model_(m, micro_batch, chunks_or_whole_model(par.chunks, m.layers), par.tp, par.sequence_parallel, par.cp,
             precision),
      recompute_(recompute),
      tied_(par.tied_embedding) {
  // The store learns the FSDP group size here: every unit is padded to split evenly over it.
  store_ = std::make_unique<ParamStore>(model_.param_layout(size_of(par.data.fsdp)), par.data, precision);
  std::size_t units = 0;
  for (const ChunkUnits& u : model_.units()) {
    units += (u.wte >= 0) + (u.wpe >= 0) + (u.ln_f >= 0) + u.blocks.size();
    if (u.wte >= 0) wte_unit_ = u.wte;
  }
  if (units != static_cast<std::size_t>(store_->units()))
    throw InternalError("the chunks' units do not match the parameter layout");
  spare_.resize(chunks().size());
  if (recompute_ == Recompute::block) recomputed_ = model_.allocate_block(false);
}

StageRuntime::~StageRuntime() = default;

int StageRuntime::local_chunk(int chunk) const {
  const std::vector<Chunk>& chunks = model_.chunks();
  for (std::size_t i = 0; i < chunks.size(); ++i)
    if (chunks[i].index == chunk) return static_cast<int>(i);
  throw InternalError("chunk " + std::to_string(chunk) + " does not run on this pipeline stage");
}

std::size_t StageRuntime::record_bytes(const Chunk& chunk, const BlockSizes& block, Recompute recompute) {
  const std::size_t n = block.local_rows * block.channels;  // the chunk's input and the gradient of its output
  return 2 * n * sizeof(real) + (chunk.embedding ? block.rows * sizeof(token_t) : 0) +
         chunk.layers() * block.activation_bytes(recompute == Recompute::block);
}

StageRuntime::Record& StageRuntime::record(int chunk, int micro_batch) {
  const int k = local_chunk(chunk);
  auto it = records_.find({k, micro_batch});
  if (it != records_.end()) return it->second;
  Record r;
  if (!spare_[k].empty()) {
    r = std::move(spare_[k].back());
    spare_[k].pop_back();
  } else {
    const Chunk& c = chunks()[k];
    const bool output_only = recompute_ == Recompute::block;
    const std::size_t n = activation_elements();
    r.input = uninitialized("ndmini::chunk_input", n);
    r.grad = uninitialized("ndmini::chunk_output_grad", n);
    if (c.embedding) r.tokens = TokenView("ndmini::tokens", model_.rows());
    for (int l = 0; l < c.layers(); ++l) r.layers.push_back(model_.allocate_block(output_only));
    r.bytes = record_bytes(c, model_.block_sizes(), recompute_);
  }
  activation_bytes_ += r.bytes;
  peak_activation_bytes_ = std::max(peak_activation_bytes_, activation_bytes_);
  return records_.emplace(std::make_pair(k, micro_batch), std::move(r)).first->second;
}

StageRuntime::Record& StageRuntime::find_record(int chunk, int micro_batch) {
  const auto it = records_.find({local_chunk(chunk), micro_batch});
  if (it == records_.end())
    throw InternalError("micro-batch " + std::to_string(micro_batch) + " of chunk " + std::to_string(chunk) +
                        " has no forward record");
  return it->second;
}

void StageRuntime::free_record(int chunk, int micro_batch) {
  const int k = local_chunk(chunk);
  auto it = records_.find({k, micro_batch});
  activation_bytes_ -= it->second.bytes;
  spare_[k].push_back(std::move(it->second));
  records_.erase(it);
}

void StageRuntime::init(std::uint64_t seed) {
  real* base = store_->shard_params().data();
  const int tp_rank = store_->layout().tp_rank;
  for (const auto& piece : store_->pieces())
    gpt_init_param(config(), params()[piece.param], tp_rank, piece.local_begin,
                   Slice1D(base + piece.shard_offset, piece.length), seed);
  Kokkos::deep_copy(store_->shard_grads(), real(0));
  store_->params_changed();
}

real* StageRuntime::input_buffer(int chunk, int micro_batch) { return record(chunk, micro_batch).input.data(); }

double StageRuntime::head(ConstSlice2D x, ConstTokenView targets, real loss_scale, const ChunkUnits& u, Slice2D dx,
                          bool last_micro_batch, bool owns_wte) {
  ParamStore& s = *store_;
  // With the embedding in the same chunk, wte stays gathered (and its
  // gradients open) until the embedding's backward.
  const UnitParams ln_f(s, u.ln_f);
  const UnitParams wte(s, u.wte, -1, !owns_wte);
  const double loss = model_.head_forward(ln_f.data(), wte.weights(), x, targets, loss_scale);
  if (loss_scale != 0) {
    const UnitGrads dwte(s, u.wte, last_micro_batch, !owns_wte);
    const UnitGrads dln_f(s, u.ln_f, last_micro_batch);
    model_.head_backward(ln_f.data(), wte.weights(), dln_f.data(), dwte.data(), x, dx);
  }
  return loss;
}

double StageRuntime::forward(int chunk, int micro_batch, ConstTokenView tokens, ConstTokenView targets, real loss_scale,
                             bool last_micro_batch) {
  const int k = local_chunk(chunk);
  const Chunk& c = chunks()[k];
  const ChunkUnits& u = model_.units()[k];
  ParamStore& s = *store_;
  Record& r = record(chunk, micro_batch);
  const std::size_t Nr = model_.local_rows(), C = config().channels;
  if (c.embedding) {
    const ProfileRegion region("ndmini::embedding forward");
    const UnitParams wte(s, u.wte, -1, !c.head);  // the head of the same chunk uses it too
    const UnitParams wpe(s, u.wpe, u.blocks.front());
    Kokkos::deep_copy(r.tokens, tokens);
    model_.embedding_forward(as_matrix(r.input, Nr, C), r.tokens, wte.data(), wpe.data());
  }
  const View1D* x = &r.input;
  for (std::size_t i = 0; i < u.blocks.size(); ++i) {
    const int unit = u.blocks[i];
    const ProfileRegion region([&] { return "ndmini::block " + std::to_string(c.first_layer + i) + " forward"; });
    const int next = i + 1 < u.blocks.size() ? u.blocks[i + 1] : u.ln_f;  // its all-gather overlaps this block
    const UnitParams params(s, unit, next, s.reshard_after_forward());
    BlockActivations& a = r.layers[i];
    if (recompute_ == Recompute::block) {
      // Only the block output is kept; the rest goes to the shared buffers
      // and is computed again in the backward.
      BlockActivations work = recomputed_;
      work.res3 = a.res3;
      model_.block_forward(params.weights(), as_matrix(*x, Nr, C), work);
    } else {
      model_.block_forward(params.weights(), as_matrix(*x, Nr, C), a);
    }
    x = &a.res3;
  }
  if (!c.head) return 0;
  const ProfileRegion region("ndmini::head forward and backward");
  return head(as_matrix(*x, Nr, C), targets, loss_scale, u, as_matrix(r.grad, Nr, C), last_micro_batch, c.embedding);
}

const real* StageRuntime::output(int chunk, int micro_batch) {
  return find_record(chunk, micro_batch).layers.back().res3.data();
}

real* StageRuntime::output_grad_buffer(int chunk, int micro_batch) {
  return find_record(chunk, micro_batch).grad.data();
}

void StageRuntime::backward(int chunk, int micro_batch, real* input_grad, bool last_micro_batch) {
  const int k = local_chunk(chunk);
  const Chunk& c = chunks()[k];
  const ChunkUnits& u = model_.units()[k];
  ParamStore& s = *store_;
  Record& r = find_record(chunk, micro_batch);
  const std::size_t Nr = model_.local_rows(), C = config().channels;
  // r.grad holds d(output) and becomes, block by block, d(input).
  const Slice2D dres = as_matrix(r.grad, Nr, C);
  for (int i = static_cast<int>(u.blocks.size()) - 1; i >= 0; --i) {
    const int unit = u.blocks[i];
    const ProfileRegion region([&] { return "ndmini::block " + std::to_string(c.first_layer + i) + " backward"; });
    const UnitParams params(s, unit, i > 0 ? u.blocks[i - 1] : -1);  // the block before is next
    const UnitGrads grads(s, unit, last_micro_batch);
    s.poll();
    const View1D& x = i > 0 ? r.layers[i - 1].res3 : r.input;
    if (recompute_ == Recompute::block) {
      BlockActivations work = recomputed_;
      ExecSpace().fence();
      const auto t0 = Clock::now();
      {
        const ProfileRegion again([&] { return "ndmini::block " + std::to_string(c.first_layer + i) + " recompute"; });
        model_.block_forward(params.weights(), as_matrix(x, Nr, C), work);
        ExecSpace().fence();
      }
      recompute_ms_ += ms_since(t0);
      model_.block_backward(params.weights(), grads.data(), as_matrix(x, Nr, C), work, dres);
    } else {
      model_.block_backward(params.weights(), grads.data(), as_matrix(x, Nr, C), r.layers[i], dres);
    }
  }
  if (c.embedding) {
    const ProfileRegion region("ndmini::embedding backward");
    {
      const UnitGrads dwte(s, u.wte, last_micro_batch);
      const UnitGrads dwpe(s, u.wpe, last_micro_batch);
      model_.embedding_backward(dwte.data(), dwpe.data(), dres, r.tokens);
    }
    if (c.head) s.release(u.wte);  // gathered since this micro-batch's embedding forward
  } else {
    Kokkos::deep_copy(Kokkos::View<real*, MemSpace, Unmanaged>(input_grad, Nr * C), r.grad);
  }
  free_record(chunk, micro_batch);
}

void StageRuntime::end_evaluation() {
  for (int u = 0; u < store_->units(); ++u) store_->release(u);
}

void StageRuntime::finish_grads() {
  ParamStore& s = *store_;
  s.finish_grads();
  // With SP the tp-replicated tensors' gradients are partial sums over tp.
  for (const ParamStore::Piece& piece : s.pieces())
    if (s.layout().params[piece.param].split == TpSplit::replicated)
      model_.sum_replicated_grads(s.shard_grads().data() + piece.shard_offset, piece.length, s.reduce_dtype());
  if (wte_unit_ >= 0)
    tied_.reduce_grads(s.shard_grads().data() + s.shard_offset(wte_unit_), s.shard_size(wte_unit_), s.reduce_dtype());
}

bool StageRuntime::tied_wte_identical() {
  if (wte_unit_ < 0) return true;
  return tied_.identical(store_->shard_params().data() + store_->shard_offset(wte_unit_),
                         store_->shard_size(wte_unit_));
}

double StageRuntime::forward_backward(ConstTokenView tokens, ConstTokenView targets, real loss_scale,
                                      bool last_micro_batch) {
  if (chunks().size() != 1 || !chunks().front().embedding || !chunks().front().head)
    throw InternalError("forward_backward needs the whole model on this rank (pp = 1)");
  const double loss = forward(0, 0, tokens, targets, loss_scale, last_micro_batch);
  backward(0, 0, nullptr, last_micro_batch);
  return loss;
}

double StageRuntime::forward_loss(ConstTokenView tokens, ConstTokenView targets) {
  if (chunks().size() != 1 || !chunks().front().embedding || !chunks().front().head)
    throw InternalError("forward_loss needs the whole model on this rank (pp = 1)");
  // No backward: drop the record and every unit FSDP still holds.
  const double loss = forward(0, 0, tokens, targets, 0, false);
  discard(0, 0);
  end_evaluation();
  return loss;
}

}  // namespace ndmini
