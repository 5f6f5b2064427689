// SPDX-License-Identifier: BSD-3-Clause
// GptStage: the chunks of one pipeline stage, their micro-batch records, the
// embedding and head units, and the FSDP unit life cycle around each block.
#include "model/gpt.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "core/profiling.hpp"
#include "core/rng.hpp"
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

}  // namespace

GptStage::GptStage(const ModelConfig& m, int micro_batch, const ModelParallel& par, Recompute recompute)
    : cfg_(m),
      micro_batch_(micro_batch),
      recompute_(recompute),
      chunks_(chunks_or_whole_model(par.chunks, m.layers)),
      tied_(par.tied_embedding),
      tp_(par.tp, par.sequence_parallel, static_cast<std::size_t>(micro_batch) * m.seq_len / size_of(par.cp),
          m.channels, m.vocab),
      attention_shape_{micro_batch, m.seq_len / size_of(par.cp), m.channels / size_of(par.tp),
                       m.heads / size_of(par.tp)},
      attention_(par.cp, attention_shape_, m.seq_len),
      block_(m.channels, tp_, attention_) {
  // The store learns the FSDP group size here: every unit is padded to split evenly over it.
  const int fsdp = size_of(par.data.fsdp);
  store_ = std::make_unique<ParamStore>(gpt_param_layout(m, chunks_, tp_.size(), tp_.rank(), fsdp), par.data);

  // Which units each chunk uses, in the layout's order.
  const ParamLayout& layout = store_->layout();
  int unit = 0;
  for (const Chunk& c : chunks_) {
    ChunkUnits u;
    if (c.embedding || c.head) u.wte = unit++;
    if (c.embedding) u.wpe = unit++;
    for (int l = c.first_layer; l < c.end_layer; ++l) u.blocks.push_back(unit++);
    if (c.head) u.ln_f = unit++;
    units_.push_back(std::move(u));
  }
  if (unit != store_->units()) throw InternalError("the chunks' units do not match the parameter layout");
  for (const ChunkUnits& u : units_)
    if (u.wte >= 0) wte_unit_ = u.wte;
  for (const ParamInfo& p : layout.params)
    if (p.name == "ln_f/bias") lnf_bias_offset_ = p.offset - layout.unit_offset[p.unit];
  block_layout_ = BlockLayout(layout, units_.front().blocks.front());
  spare_.resize(chunks_.size());

  // Absolute position of every residual row: rows are sequence-major, each
  // sequence holding this cp rank's tokens; with SP this tp rank's slice.
  const CpLayout& cp = attention_.layout();
  const int Tl = cp.local_len();
  positions_ = TokenView("ndmini::positions", tp_.local_rows());
  auto h = Kokkos::create_mirror_view(positions_);
  for (std::size_t r = 0; r < tp_.local_rows(); ++r)
    h(r) = cp.position(static_cast<int>((tp_.first_local_row() + r) % Tl));
  Kokkos::deep_copy(positions_, h);

  const std::size_t N = tp_.rows(), Nr = tp_.local_rows(), C = m.channels;
  if (chunks_.back().head) {
    lnf_ = uninitialized("ndmini::lnf", N * C);
    lnf_mean_ = uninitialized("ndmini::lnf_mean", Nr);
    lnf_rstd_ = uninitialized("ndmini::lnf_rstd", Nr);
    logits_ = uninitialized("ndmini::logits", N * tp_.local_vocab());
    losses_ = uninitialized("ndmini::losses", N);
    dln_ = uninitialized("ndmini::head_dln", N * C);
  }
  if (recompute_ == Recompute::block) recomputed_ = block_.allocate(false);
}

GptStage::~GptStage() = default;

std::size_t GptStage::activation_elements() const { return tp_.local_rows() * cfg_.channels; }

int GptStage::local_chunk(int chunk) const {
  for (std::size_t i = 0; i < chunks_.size(); ++i)
    if (chunks_[i].index == chunk) return static_cast<int>(i);
  throw InternalError("chunk " + std::to_string(chunk) + " does not run on this pipeline stage");
}

GptStage::Record& GptStage::record(int chunk, int micro_batch) {
  const int k = local_chunk(chunk);
  auto it = records_.find({k, micro_batch});
  if (it != records_.end()) return it->second;
  Record r;
  if (!spare_[k].empty()) {
    r = std::move(spare_[k].back());
    spare_[k].pop_back();
  } else {
    const bool output_only = recompute_ == Recompute::block;
    const std::size_t n = activation_elements();
    r.input = uninitialized("ndmini::chunk_input", n);
    r.grad = uninitialized("ndmini::chunk_output_grad", n);
    if (chunks_[k].embedding) r.tokens = TokenView("ndmini::tokens", tp_.rows());
    for (int l = 0; l < chunks_[k].layers(); ++l) r.layers.push_back(block_.allocate(output_only));
    r.bytes = (2 * n + (chunks_[k].embedding ? tp_.rows() : 0)) * sizeof(real) +
              chunks_[k].layers() * block_activation_bytes(cfg_.channels, tp_.size(), tp_.rows(), tp_.local_rows(),
                                                           attention_shape_, output_only);
  }
  activation_bytes_ += r.bytes;
  peak_activation_bytes_ = std::max(peak_activation_bytes_, activation_bytes_);
  return records_.emplace(std::make_pair(k, micro_batch), std::move(r)).first->second;
}

GptStage::Record& GptStage::find_record(int chunk, int micro_batch) {
  const auto it = records_.find({local_chunk(chunk), micro_batch});
  if (it == records_.end())
    throw InternalError("micro-batch " + std::to_string(micro_batch) + " of chunk " + std::to_string(chunk) +
                        " has no forward record");
  return it->second;
}

void GptStage::free_record(int chunk, int micro_batch) {
  const int k = local_chunk(chunk);
  auto it = records_.find({k, micro_batch});
  activation_bytes_ -= it->second.bytes;
  spare_[k].push_back(std::move(it->second));
  records_.erase(it);
}

Slice2D GptStage::wte(real* unit_base) const {
  return Slice2D(unit_base, tp_.local_vocab(), cfg_.channels);  // wte is alone in its unit
}

void GptStage::init(std::uint64_t seed) {
  const real std_proj = static_cast<real>(0.02 / std::sqrt(2.0 * cfg_.layers));
  real* base = store_->shard_params().data();
  for (const auto& piece : store_->pieces()) {
    const ParamInfo& p = params()[piece.param];
    real* data = base + piece.shard_offset;
    const bool is_bias = p.name.size() >= 4 && p.name.compare(p.name.size() - 4, 4, "bias") == 0;
    if (p.name.find("ln_") != std::string::npos) {
      kernels::fill(Slice1D(data, piece.length), is_bias ? real(0) : real(1));
      continue;
    }
    if (is_bias) {
      kernels::fill(Slice1D(data, piece.length), 0);
      continue;
    }
    const real stddev = p.name.find("c_proj/weight") != std::string::npos ? std_proj : real(0.02);
    const std::uint64_t key = rng::stream_key(seed, p.name);
    // Each run of elements with consecutive GLOBAL indices is one kernel.
    const std::uint64_t cols_global = p.global_shape.size() == 2 ? p.global_shape[1] : 1;
    const std::size_t cols_local = p.shape.size() == 2 ? p.shape[1] : 1;
    for (const auto& b : global_blocks(p, tp_.rank(), piece.local_begin, piece.local_begin + piece.length)) {
      real* at = data + (b.local_begin - piece.local_begin);
      const std::uint64_t rows = b.count[0], cols = b.count.size() == 2 ? b.count[1] : 1;
      const std::uint64_t first = b.offset[0] * cols_global + (b.offset.size() == 2 ? b.offset[1] : 0);
      if (cols == cols_global) {
        kernels::init_normal(Slice1D(at, rows * cols), key, first, stddev);
      } else {
        for (std::uint64_t r = 0; r < rows; ++r)
          kernels::init_normal(Slice1D(at + r * cols_local, cols), key, first + r * cols_global, stddev);
      }
    }
  }
  Kokkos::deep_copy(store_->shard_grads(), real(0));
}

real* GptStage::input_buffer(int chunk, int micro_batch) { return record(chunk, micro_batch).input.data(); }

double GptStage::head(ConstSlice2D x, ConstTokenView targets, real grad_scale, const ChunkUnits& u, Slice2D dx,
                      bool last_micro_batch, bool owns_wte) {
  const std::size_t N = tp_.rows(), Nr = tp_.local_rows(), C = cfg_.channels;
  const bool backward = grad_scale != 0;
  ParamStore& s = *store_;
  s.gather(u.ln_f);
  s.gather(u.wte);
  real* lnf = s.params(u.ln_f);
  const Slice1D lnf_w(lnf, C), lnf_b(lnf + lnf_bias_offset_, C);
  tp_.layernorm_enter(as_matrix(lnf_, N, C), lnf_mean_, lnf_rstd_, x, lnf_w, lnf_b);
  // The LM head is tied to the token embedding: logits = lnf wte^T (this rank's vocabulary).
  const Slice2D logits = as_matrix(logits_, N, tp_.local_vocab());
  kernels::linear_forward(logits, as_matrix(lnf_, N, C), wte(s.params(u.wte)), Slice1D());
  const double loss = tp_.cross_entropy(logits, losses_, targets, grad_scale);
  if (backward) {
    // The head's backward runs at once, so the logits are never kept per
    // micro-batch: the record holds only d(x). logits now holds dlogits.
    s.begin_grads(u.ln_f);
    s.begin_grads(u.wte);
    kernels::linear_backward(as_matrix(dln_, N, C), wte(s.grads(u.wte)), Slice1D(), logits, as_matrix(lnf_, N, C),
                             wte(s.params(u.wte)));
    ConstSlice2D gin = tp_.reduce_input_grad(as_matrix(dln_, N, C));
    real* g = s.grads(u.ln_f);
    kernels::fill(Slice1D(dx.data(), Nr * C), 0);
    kernels::layernorm_backward(dx, Slice1D(g, C), Slice1D(g + lnf_bias_offset_, C), gin, x, lnf_w, lnf_mean_,
                                lnf_rstd_);
    s.end_grads(u.ln_f, last_micro_batch);
    if (!owns_wte) s.end_grads(u.wte, last_micro_batch);
  }
  s.release(u.ln_f);
  if (!owns_wte) s.release(u.wte);
  return loss;
}

double GptStage::forward(int chunk, int micro_batch, ConstTokenView tokens, ConstTokenView targets, real loss_scale,
                         bool last_micro_batch) {
  const int k = local_chunk(chunk);
  const Chunk& c = chunks_[k];
  const ChunkUnits& u = units_[k];
  ParamStore& s = *store_;
  Record& r = record(chunk, micro_batch);
  const std::size_t Nr = tp_.local_rows(), C = cfg_.channels;
  if (c.embedding) {
    const ProfileRegion region("ndmini::embedding forward");
    s.gather(u.wte);
    s.gather(u.wpe);
    s.prefetch(u.blocks.front());
    Kokkos::deep_copy(r.tokens, tokens);
    tp_.embedding_forward(as_matrix(r.input, Nr, C), r.tokens, wte(s.params(u.wte)),
                          Slice2D(s.params(u.wpe), cfg_.seq_len, C), positions_);
    s.release(u.wpe);
    if (!c.head) s.release(u.wte);
  }
  const View1D* x = &r.input;
  for (std::size_t i = 0; i < u.blocks.size(); ++i) {
    const int unit = u.blocks[i];
    const ProfileRegion region([&] { return "ndmini::block " + std::to_string(c.first_layer + i) + " forward"; });
    s.gather(unit);
    s.prefetch(i + 1 < u.blocks.size() ? u.blocks[i + 1] : u.ln_f);  // the next unit's all-gather overlaps this block
    BlockActivations& a = r.layers[i];
    if (recompute_ == Recompute::block) {
      // Only the block output is kept; the rest goes to the shared buffers
      // and is computed again in the backward.
      BlockActivations work = recomputed_;
      work.res3 = a.res3;
      block_.forward(block_params(unit), as_matrix(*x, Nr, C), work);
    } else {
      block_.forward(block_params(unit), as_matrix(*x, Nr, C), a);
    }
    if (s.reshard_after_forward()) s.release(unit);
    x = &a.res3;
  }
  if (!c.head) return 0;
  const ProfileRegion region("ndmini::head forward and backward");
  return head(as_matrix(*x, Nr, C), targets, loss_scale, u, as_matrix(r.grad, Nr, C), last_micro_batch, c.embedding);
}

const real* GptStage::output(int chunk, int micro_batch) {
  return find_record(chunk, micro_batch).layers.back().res3.data();
}

real* GptStage::output_grad_buffer(int chunk, int micro_batch) { return find_record(chunk, micro_batch).grad.data(); }

void GptStage::backward(int chunk, int micro_batch, real* input_grad, bool last_micro_batch) {
  const int k = local_chunk(chunk);
  const Chunk& c = chunks_[k];
  const ChunkUnits& u = units_[k];
  ParamStore& s = *store_;
  Record& r = find_record(chunk, micro_batch);
  const std::size_t Nr = tp_.local_rows(), C = cfg_.channels;
  // r.grad holds d(output) and becomes, block by block, d(input).
  const Slice2D dres = as_matrix(r.grad, Nr, C);
  for (int i = static_cast<int>(u.blocks.size()) - 1; i >= 0; --i) {
    const int unit = u.blocks[i];
    const ProfileRegion region([&] { return "ndmini::block " + std::to_string(c.first_layer + i) + " backward"; });
    s.gather(unit);
    s.prefetch(i > 0 ? u.blocks[i - 1] : -1);  // the block before is next
    s.begin_grads(unit);
    s.poll();
    const View1D& x = i > 0 ? r.layers[i - 1].res3 : r.input;
    if (recompute_ == Recompute::block) {
      BlockActivations work = recomputed_;
      ExecSpace().fence();
      const auto t0 = Clock::now();
      {
        const ProfileRegion again([&] { return "ndmini::block " + std::to_string(c.first_layer + i) + " recompute"; });
        block_.forward(block_params(unit), as_matrix(x, Nr, C), work);
        ExecSpace().fence();
      }
      recompute_ms_ += ms_since(t0);
      block_.backward(block_params(unit), block_grads(unit), as_matrix(x, Nr, C), work, dres);
    } else {
      block_.backward(block_params(unit), block_grads(unit), as_matrix(x, Nr, C), r.layers[i], dres);
    }
    s.end_grads(unit, last_micro_batch);
    s.release(unit);
  }
  if (c.embedding) {
    const ProfileRegion region("ndmini::embedding backward");
    s.begin_grads(u.wte);
    s.begin_grads(u.wpe);
    tp_.embedding_backward(wte(s.grads(u.wte)), Slice2D(s.grads(u.wpe), cfg_.seq_len, C), dres, r.tokens, positions_);
    s.end_grads(u.wpe, last_micro_batch);
    s.end_grads(u.wte, last_micro_batch);
    if (c.head) s.release(u.wte);
  } else {
    Kokkos::deep_copy(Kokkos::View<real*, MemSpace, Unmanaged>(input_grad, Nr * C), r.grad);
  }
  free_record(chunk, micro_batch);
}

void GptStage::end_evaluation() {
  for (int u = 0; u < store_->units(); ++u) store_->release(u);
}

void GptStage::finish_grads() {
  store_->finish_grads();
  tp_.reduce_replicated_grads(*store_);
  if (wte_unit_ >= 0)
    tied_.reduce_grads(store_->shard_grads().data() + store_->shard_offset(wte_unit_), store_->shard_size(wte_unit_));
}

bool GptStage::tied_wte_identical() {
  if (wte_unit_ < 0) return true;
  return tied_.identical(store_->shard_params().data() + store_->shard_offset(wte_unit_),
                         store_->shard_size(wte_unit_));
}

double GptStage::forward_backward(ConstTokenView tokens, ConstTokenView targets, real loss_scale,
                                  bool last_micro_batch) {
  if (chunks_.size() != 1 || !chunks_.front().embedding || !chunks_.front().head)
    throw InternalError("forward_backward needs the whole model on this rank (pp = 1)");
  const double loss = forward(0, 0, tokens, targets, loss_scale, last_micro_batch);
  backward(0, 0, nullptr, last_micro_batch);
  return loss;
}

double GptStage::forward_loss(ConstTokenView tokens, ConstTokenView targets) {
  if (chunks_.size() != 1 || !chunks_.front().embedding || !chunks_.front().head)
    throw InternalError("forward_loss needs the whole model on this rank (pp = 1)");
  // No backward: drop the record and every unit FSDP still holds.
  const double loss = forward(0, 0, tokens, targets, 0, false);
  discard(0, 0);
  end_evaluation();
  return loss;
}

}  // namespace ndmini
