// SPDX-License-Identifier: BSD-3-Clause
// StageRuntime: the records of the micro-batches in flight, the unit events
// executed around each unit of GptModel, and the gradient finalisation.
#include "parallel/stage_runtime.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "core/profiling.hpp"
#include "core/timer.hpp"
#include "kernels/kernels.hpp"

namespace ndmini {
namespace {

int size_of(const Communicator* c) { return c != nullptr ? c->size() : 1; }

// The chunks the stage runs; none given: the whole model as one chunk.
std::vector<Chunk> chunks_or_whole_model(const std::vector<Chunk>& chunks, int layers) {
  if (!chunks.empty()) return chunks;
  return {Chunk{0, 0, layers, true, true}};
}

// The profile region of each part; the recompute nests in its block's backward.
enum class Region { none, embedding_forward, block_forward, head, block_backward, embedding_backward };
Region region_of(Part p) {
  switch (p) {
    case Part::embedding_forward:
      return Region::embedding_forward;
    case Part::block_forward:
      return Region::block_forward;
    case Part::head_forward:
    case Part::head_backward:
      return Region::head;
    case Part::block_recompute:
    case Part::block_backward:
      return Region::block_backward;
    case Part::embedding_backward:
      return Region::embedding_backward;
    case Part::end_of_evaluation:
      return Region::none;
  }
  return Region::none;
}
std::string region_name(Region r, int layer) {
  switch (r) {
    case Region::embedding_forward:
      return "ndmini::embedding forward";
    case Region::block_forward:
      return "ndmini::block " + std::to_string(layer) + " forward";
    case Region::head:
      return "ndmini::head forward and backward";
    case Region::block_backward:
      return "ndmini::block " + std::to_string(layer) + " backward";
    case Region::embedding_backward:
      return "ndmini::embedding backward";
    case Region::none:
      break;
  }
  return "";
}

// The profile region of the part being run, switched as parts follow each other.
class PartRegions {
 public:
  PartRegions() = default;
  PartRegions(const PartRegions&) = delete;
  PartRegions& operator=(const PartRegions&) = delete;
  ~PartRegions() { leave(); }
  void enter(Region r, int layer) {
    if (r == region_ && layer == layer_) return;
    leave();
    region_ = r;
    layer_ = layer;
    if (r != Region::none && Kokkos::Tools::profileLibraryLoaded()) {
      Kokkos::Tools::pushRegion(region_name(r, layer));
      pushed_ = true;
    }
  }

 private:
  void leave() {
    if (pushed_) Kokkos::Tools::popRegion();
    pushed_ = false;
  }
  Region region_ = Region::none;
  int layer_ = 0;
  bool pushed_ = false;
};

// A block's parameters and gradients: its unit's and its routed experts' (ParamLayout::experts_unit).
BlockParams block_params(ParamStore& s, UnitId unit) {
  const int experts = s.layout().experts_unit[unit.index()];
  return {s.weights(unit.index()), experts >= 0 ? s.weights(experts) : UnitWeights{}};
}
BlockGrads block_grads(ParamStore& s, UnitId unit) {
  const int experts = s.layout().experts_unit[unit.index()];
  return {s.grads(unit.index()), experts >= 0 ? s.grads(experts) : nullptr};
}

}  // namespace

StageRuntime::StageRuntime(const ModelConfig& m, int micro_batch, const ModelParallel& par, Recompute recompute,
                           Precision precision)
    : model_(m, micro_batch, chunks_or_whole_model(par.chunks, m.layers), par.tp, par.sequence_parallel, par.cp,
             precision, par.experts, par.moe_max_load, par.moe_z_loss, par.moe_seq_aux),
      recompute_(recompute),
      tied_(m.tie_embeddings ? par.tied_embedding : nullptr) {  // untied: wte and lm_head, nothing to sum
  // The store learns the FSDP groups' sizes here: every unit is padded to split evenly over its group.
  store_ = std::make_unique<ParamStore>(model_.param_layout(size_of(par.data.fsdp), size_of(par.data.expert_fsdp)),
                                        par.data, precision);
  std::size_t units = 0;
  for (const ChunkUnits& u : model_.units()) {
    units += (u.wte >= 0) + (u.wpe >= 0) + (u.ln_f >= 0) + (u.lm_head >= 0) + u.blocks.size();
    units += std::count_if(u.experts.begin(), u.experts.end(), [](int e) { return e >= 0; });
    if (u.wte >= 0) wte_unit_ = UnitId::of_layout_index(u.wte);
  }
  if (units != static_cast<std::size_t>(store_->units()))
    throw InternalError("the chunks' units do not match the parameter layout");
  const Reshard reshard = reshard_of(store_->reshard_after_forward());
  const UnitPolicy train{reshard, recompute_, Pass::train}, evaluation{reshard, recompute_, Pass::evaluation};
  constexpr auto forward = PipelineAction::Kind::forward, backward = PipelineAction::Kind::backward;
  for (std::size_t k = 0; k < chunks().size(); ++k) {
    const Chunk& c = chunks()[k];
    const ChunkUnits& u = model_.units()[k];
    events_.push_back({unit_events(c, u, forward, train), unit_events(c, u, forward, evaluation),
                       unit_events(c, u, backward, train)});
  }
  end_of_evaluation_ = end_of_evaluation_events(store_->units());
  spare_.resize(chunks().size());
  if (recompute_ == Recompute::block)
    for (const Chunk& c : chunks())
      for (int l = c.first_layer; l < c.end_layer; ++l) {
        BlockActivations& kind = recomputed(l);
        if (!kind.res3.data()) kind = model_.allocate_block(l, false);
      }
  if (m.moe()) routed_rows_.assign(static_cast<std::size_t>(m.layers) * m.moe_experts, 0);
}

std::vector<std::int64_t> StageRuntime::take_routed_rows() {
  std::vector<std::int64_t> out(routed_rows_.size(), 0);
  std::swap(out, routed_rows_);
  return out;
}

StageRuntime::~StageRuntime() = default;

int StageRuntime::local_chunk(int chunk) const {
  const std::vector<Chunk>& chunks = model_.chunks();
  for (std::size_t i = 0; i < chunks.size(); ++i)
    if (chunks[i].index == chunk) return static_cast<int>(i);
  throw InternalError("chunk " + std::to_string(chunk) + " does not run on this pipeline stage");
}

StageRuntime::RecordContents StageRuntime::record_contents(const Chunk& chunk, const BlockSizes& block,
                                                           Recompute recompute) {
  return {block.residual(), chunk.embedding ? block.rows : 0, chunk.layers(), recompute == Recompute::block};
}

std::size_t StageRuntime::record_bytes(const Chunk& chunk, const LayerSizes& blocks, Recompute recompute) {
  const RecordContents r = record_contents(chunk, blocks.dense, recompute);
  std::size_t bytes = 2 * r.activation_floats * sizeof(real) + r.tokens * sizeof(token_t);
  for (int l = chunk.first_layer; l < chunk.end_layer; ++l) bytes += blocks.of(l).activation_bytes(r.output_only);
  return bytes;
}

std::size_t StageRuntime::record_bytes(const Chunk& chunk, const BlockSizes& block, Recompute recompute) {
  return record_bytes(chunk, LayerSizes{block, block, std::vector<bool>(chunk.end_layer, false)}, recompute);
}

std::size_t StageRuntime::recomputed_bytes(const ModelConfig& m, const std::vector<Chunk>& chunks,
                                           const LayerSizes& blocks) {
  bool dense = false, moe = false;
  for (const Chunk& c : chunks)
    for (int l = c.first_layer; l < c.end_layer; ++l) (m.moe_block(l) ? moe : dense) = true;
  return (dense ? blocks.dense.activation_bytes(false) : 0) + (moe ? blocks.moe.activation_bytes(false) : 0);
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
    const LayerSizes sizes = model_.layer_sizes();
    const RecordContents holds = record_contents(c, sizes.dense, recompute_);
    r.input = uninitialized("ndmini::chunk_input", holds.activation_floats);
    r.grad = uninitialized("ndmini::chunk_output_grad", holds.activation_floats);
    if (holds.tokens > 0) r.tokens = TokenView("ndmini::tokens", holds.tokens);
    for (int l = 0; l < holds.layers; ++l)
      r.layers.push_back(model_.allocate_block(c.first_layer + l, holds.output_only));
    r.bytes = record_bytes(c, sizes, recompute_);
  }
  activation_bytes_ += r.bytes;
  peak_activation_bytes_ = std::max(peak_activation_bytes_, activation_bytes_);
  return records_.emplace(std::make_pair(k, micro_batch), std::move(r)).first->second;
}

void StageRuntime::count_routed(int layer, const MoeRouteStats& routed) {
  const std::size_t E = routed.sent.size();
  for (std::size_t e = 0; e < E; ++e) routed_rows_[layer * E + e] += routed.sent[e];
  aux_sums_.z_loss += routed.z_loss_sum;
  aux_sums_.seq_aux += routed.seq_aux_sum;
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

template <class Compute>
void StageRuntime::execute(const std::vector<UnitEvent>& events, int first_layer, bool last_micro_batch,
                           Compute&& compute) {
  ParamStore& s = *store_;
  PartRegions regions;
  for (const UnitEvent& e : events) {
    regions.enter(region_of(e.part), first_layer + e.block);
    switch (e.op) {
      case UnitOp::gather:
        s.gather(e.unit);
        break;
      case UnitOp::prefetch:  // its all-gather overlaps the compute before it
        s.prefetch(e.unit);
        break;
      case UnitOp::release:
        s.release(e.unit);
        break;
      case UnitOp::open_grads:
        s.begin_grads(e.unit);
        break;
      case UnitOp::end_grads:
        s.end_grads(e.unit, last_micro_batch);
        break;
      case UnitOp::poll:
        s.poll();
        break;
      case UnitOp::compute:
        compute(e);
        break;
    }
    if (event_log_ != nullptr) event_log_->push_back(e);
  }
}

double StageRuntime::forward(int chunk, int micro_batch, ConstTokenView tokens, ConstTokenView targets, real loss_scale,
                             bool last_micro_batch) {
  const int k = local_chunk(chunk);
  const Chunk& c = chunks()[k];
  const ChunkUnits& u = model_.units()[k];
  ParamStore& s = *store_;
  Record& r = record(chunk, micro_batch);
  r.loss_scale = loss_scale;
  const std::size_t Nr = model_.local_rows(), C = config().channels;
  const View1D* x = &r.input;                           // the input of the next compute
  const int head = u.lm_head >= 0 ? u.lm_head : u.wte;  // the LM head's matrix: lm_head, or the tied wte
  double loss = 0;
  // A loss scale of 0 is a forward-only pass: the head computes no gradients.
  const std::vector<UnitEvent>& events = loss_scale != 0 ? events_[k].forward : events_[k].evaluation;
  execute(events, c.first_layer, last_micro_batch, [&](const UnitEvent& e) {
    switch (e.part) {
      case Part::embedding_forward:
        Kokkos::deep_copy(r.tokens, tokens);
        model_.embedding_forward(as_matrix(r.input, Nr, C), r.tokens, s.params(u.wte),
                                 u.wpe >= 0 ? s.params(u.wpe) : nullptr);
        return;
      case Part::block_forward: {
        const int layer = c.first_layer + e.block;
        BlockActivations& a = r.layers[e.block];
        MoeRouteStats routed;
        if (recompute_ == Recompute::block) {
          // Only the block output is kept (and an MoE block's routing, which
          // the recompute replays); the rest goes to the shared buffers and is
          // computed again in the backward.
          BlockActivations work = recomputed(layer);
          work.res3 = a.res3;
          work.moe.routed = false;  // a fresh forward routes
          routed = model_.block_forward(layer, block_params(s, e.unit), as_matrix(*x, Nr, C), work);
          swap_routing(a.moe, work.moe);
        } else {
          a.moe.routed = false;
          routed = model_.block_forward(layer, block_params(s, e.unit), as_matrix(*x, Nr, C), a);
        }
        if (loss_scale != 0) count_routed(layer, routed);
        x = &a.res3;
        return;
      }
      case Part::head_forward:
        loss = model_.head_forward(s.params(u.ln_f), s.weights(head), as_matrix(*x, Nr, C), targets, loss_scale);
        return;
      case Part::head_backward:
        model_.head_backward(s.params(u.ln_f), s.weights(head), s.grads(u.ln_f), s.grads(head), as_matrix(*x, Nr, C),
                             as_matrix(r.grad, Nr, C));
        return;
      default:
        throw InternalError("a forward cannot compute " + describe(e));
    }
  });
  return loss;
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
  execute(events_[k].backward, c.first_layer, last_micro_batch, [&](const UnitEvent& e) {
    const int i = e.block, layer = c.first_layer + i;
    const View1D& x = i > 0 ? r.layers[i - 1].res3 : r.input;
    switch (e.part) {
      case Part::block_recompute: {
        ExecSpace().fence();
        const auto t0 = Clock::now();
        {
          const ProfileRegion again([&] { return "ndmini::block " + std::to_string(layer) + " recompute"; });
          // The routing the forward kept: the recompute replays it (routed = true).
          swap_routing(recomputed(layer).moe, r.layers[i].moe);
          model_.block_forward(layer, block_params(s, e.unit), as_matrix(x, Nr, C), recomputed(layer));
          ExecSpace().fence();
        }
        recompute_ms_ += ms_since(t0);
        return;
      }
      case Part::block_backward: {
        const BlockActivations& a = recompute_ == Recompute::block ? recomputed(layer) : r.layers[i];
        model_.block_backward(layer, block_params(s, e.unit), block_grads(s, e.unit), as_matrix(x, Nr, C), a, dres,
                              r.loss_scale);
        return;
      }
      case Part::embedding_backward:
        model_.embedding_backward(s.grads(u.wte), u.wpe >= 0 ? s.grads(u.wpe) : nullptr, dres, r.tokens);
        return;
      default:
        throw InternalError("a backward cannot compute " + describe(e));
    }
  });
  if (!c.embedding) Kokkos::deep_copy(Kokkos::View<real*, MemSpace, Unmanaged>(input_grad, Nr * C), r.grad);
  free_record(chunk, micro_batch);
}

void StageRuntime::end_evaluation() {
  execute(end_of_evaluation_, 0, false, [](const UnitEvent&) {});
}

void StageRuntime::finish_grads() {
  ParamStore& s = *store_;
  s.finish_grads();
  // With SP the tp-replicated tensors' gradients are partial sums over tp.
  for (const ParamStore::Piece& piece : s.pieces())
    if (s.layout().params[piece.param].split == TpSplit::replicated)
      model_.sum_replicated_grads(s.shard_grads().data() + piece.shard_offset, piece.length, s.reduce_dtype());
  if (wte_unit_)
    tied_.reduce_grads(s.shard_grads().data() + s.shard_offset(wte_unit_.index()), s.shard_size(wte_unit_.index()),
                       s.reduce_dtype());
}

bool StageRuntime::tied_wte_identical() {
  if (!wte_unit_) return true;
  return tied_.identical(store_->shard_params().data() + store_->shard_offset(wte_unit_.index()),
                         store_->shard_size(wte_unit_.index()));
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
