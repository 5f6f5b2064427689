// SPDX-License-Identifier: BSD-3-Clause
// GptModel: the embedding, block and head units of one rank's chunks, each a
// forward and a backward over given parameters and activations.
#include "model/gpt.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "kernels/gemm_library.hpp"
#include "kernels/kernels.hpp"

namespace ndmini {
namespace {

int size_of(const Communicator* c) { return c != nullptr ? c->size() : 1; }

// This rank's part of the attention: its tokens (T/cp), its query heads
// (H/tp) and its key/value heads (kv_heads/tp).
kernels::AttentionShape attention_shape(const ModelConfig& m, int micro_batch, int tp, int cp) {
  return {micro_batch, m.seq_len / cp, m.channels / tp, m.heads / tp, m.kv() / tp};
}

// The position of each row of a micro-batch here, in the sequence: rows are
// sequence-major, each sequence holding this cp rank's tokens (cp's
// load-balanced chunks: not contiguous). Learned positions: the residual rows
// (the embedding adds wpe to them; with SP this tp rank's slice); RoPE: all
// N rows the blocks compute on (gathered over tp with SP).
std::vector<int> positions_of(const CpLayout& cpl, std::size_t first, std::size_t rows) {
  const int Tl = cpl.local_len();
  std::vector<int> out(rows);
  for (std::size_t r = 0; r < rows; ++r) out[r] = cpl.position(static_cast<int>((first + r) % Tl));
  return out;
}
// The residual rows' positions: the balanced router's token ids.
std::vector<int> residual_positions(const TensorParallel& tp, const CpLayout& cpl) {
  return positions_of(cpl, tp.first_local_row(), tp.local_rows());
}
TokenView row_positions(const ModelConfig& m, const TensorParallel& tp, const CpLayout& cpl) {
  const std::vector<int> rows = m.learned_positions() ? residual_positions(tp, cpl) : positions_of(cpl, 0, tp.rows());
  TokenView positions("ndmini::positions", rows.size());
  auto h = Kokkos::create_mirror_view(positions);
  for (std::size_t r = 0; r < rows.size(); ++r) h(r) = rows[r];
  Kokkos::deep_copy(positions, h);
  return positions;
}

}  // namespace

bool has_moe_block(const ModelConfig& m, const std::vector<Chunk>& chunks) {
  for (const Chunk& c : chunks)
    for (int l = c.first_layer; l < c.end_layer; ++l)
      if (m.moe_block(l)) return true;
  return false;
}

GptModel::GptModel(const ModelConfig& m, int micro_batch, std::vector<Chunk> chunks, Communicator* tp,
                   bool sequence_parallel, Communicator* cp, Precision precision, Communicator* experts,
                   double moe_max_load, double moe_z_loss, double moe_seq_aux)
    : cfg_(m),
      precision_(precision),
      chunks_(std::move(chunks)),
      units_(gpt_chunk_units(m, chunks_)),
      tp_(tp, sequence_parallel, static_cast<std::size_t>(micro_batch) * m.seq_len / size_of(cp), m.channels, m.vocab,
          precision == Precision::bf16),
      attention_(cp, attention_shape(m, micro_batch, size_of(tp), size_of(cp)), m.seq_len, true,
                 precision == Precision::bf16),
      positions_(row_positions(m, tp_, attention_.layout())),
      block_(m, tp_, attention_, positions_, precision == Precision::bf16),
      norm_{m.norm == NormKind::rmsnorm, static_cast<real>(m.norm_eps)} {
  const bool bf16 = precision == Precision::bf16;
  const MoeSplit moe{has_moe_block(m, chunks_), size_of(experts), moe_max_load};
  if (moe.blocks) {
    // Each rank routes its residual rows; the group exchanges them (none to exchange at ep = 1).
    experts_ = std::make_unique<ExpertParallel>(m, moe_max_load, moe.ep > 1 ? experts : nullptr, tp_.local_rows(),
                                                residual_positions(tp_, attention_.layout()), bf16);
    moe_block_ = std::make_unique<TransformerBlock>(m, tp_, attention_, positions_, bf16, experts_.get());
    if (moe_z_loss != 0 || moe_seq_aux != 0) {
      // The rows are sequence-major, T/cp of each sequence here; a
      // sequence's other rows are on its cp ranks and, with SP, tp ranks.
      MoeAuxLosses aux;
      aux.z_loss = moe_z_loss;
      aux.seq_aux = moe_seq_aux;
      aux.micro_batch = micro_batch;
      aux.seq_len = m.seq_len;
      aux.sequences = routed_sequences();
      aux.sequence_groups = {cp, tp_.sequence_parallel() ? tp : nullptr};
      experts_->set_aux_losses(std::move(aux));
    }
  }
  const ParamLayout layout = param_layout(1, 1);
  for (const ParamInfo& p : layout.params)
    if (p.name == "ln_f/bias") lnf_bias_offset_ = p.offset - layout.unit_offset[p.unit];
  // Every block of a kind has its tensors at the same offsets in its unit: the first one's layout serves all.
  bool dense_seen = false, moe_seen = false;
  for (std::size_t k = 0; k < chunks_.size(); ++k)
    for (int i = 0; i < chunks_[k].layers(); ++i) {
      const bool is_moe = m.moe_block(chunks_[k].first_layer + i);
      bool& seen = is_moe ? moe_seen : dense_seen;
      if (!seen) (is_moe ? moe_layout_ : block_layout_) = BlockLayout(layout, units_[k].blocks[i]);
      seen = true;
    }

  const Buffers sizes = buffer_sizes(m, micro_batch, chunks_.back().head, tp_.size(), tp_.sequence_parallel(),
                                     attention_.layout().cp, precision, moe);
  if (positions_.extent(0) != sizes.positions) throw InternalError("the positions are not the size counted");

  if (chunks_.back().head) {
    if (sizes.lnf > 0) lnf_.fp32 = uninitialized("ndmini::lnf", sizes.lnf);
    // None under RMSNorm: a zero-length View is still an allocation (128
    // bytes here), which the estimate does not count.
    if (sizes.lnf_mean > 0) lnf_mean_ = uninitialized("ndmini::lnf_mean", sizes.lnf_mean);
    lnf_rstd_ = uninitialized("ndmini::lnf_rstd", sizes.lnf_stats);
    logits_ = uninitialized("ndmini::logits", sizes.logits);
    losses_ = uninitialized("ndmini::losses", sizes.losses);
    dln_ = uninitialized("ndmini::head_dln", sizes.head_dln);
    if (precision == Precision::bf16) {
      lnf_.bf16 = uninitialized_bf16("ndmini::lnf_bf16", sizes.lnf_bf16);
      dlogits_bf16_ = uninitialized_bf16("ndmini::dlogits_bf16", sizes.dlogits_bf16);
    }
  }
}

std::size_t GptModel::emulated_bf16_floats(const ModelConfig& m, const BlockSizes& block, bool has_head) {
  if (!block.bf16 || !kernels::bf16_products_emulated()) return 0;
  const std::size_t N = block.rows, C = block.channels, tp = block.tp;
  const std::size_t Cl = C / tp, Q = block.qkv() / N, F = block.hidden() / N;
  std::size_t floats = std::max({kernels::emulated_linear_floats(N, C, Q), kernels::emulated_linear_floats(N, Cl, C),
                                 kernels::emulated_linear_floats(N, C, F), kernels::emulated_linear_floats(N, F, C)});
  if (has_head) floats = std::max(floats, kernels::emulated_linear_floats(N, C, m.vocab / tp));
  return floats;
}

std::size_t GptModel::emulated_bf16_floats(const ModelConfig& m, const LayerSizes& blocks, const MoeSizes& experts,
                                           bool has_head) {
  const std::size_t floats = emulated_bf16_floats(m, blocks.dense, has_head);
  if (floats == 0 || experts.experts == 0) return floats;
  // An MoE block: its shared expert's products, and each expert's (at most `capacity` rows).
  const std::size_t rows = experts.capacity, C = experts.channels, F = experts.hidden;
  return std::max({floats, emulated_bf16_floats(m, blocks.moe, has_head), kernels::emulated_linear_floats(rows, C, F),
                   kernels::emulated_linear_floats(rows, F, C)});
}

GptModel::Buffers GptModel::buffer_sizes(const ModelConfig& m, int micro_batch, bool has_head, int tp,
                                         bool sequence_parallel, int cp, Precision precision, const MoeSplit& moe) {
  const bool sp = sequence_parallel && tp > 1;
  const LayerSizes blocks = layer_sizes_of(m, micro_batch, tp, sequence_parallel, cp, precision, moe);
  const BlockSizes& block = blocks.dense;
  const std::size_t N = block.rows, Nr = block.local_rows, C = block.channels;
  const kernels::AttentionShape att = block.attention;
  Buffers b;
  MoeSizes experts;
  if (moe.blocks) {
    // The MoE blocks' own TransformerBlock, and the routed experts' scratch (one ExpertParallel).
    experts = ExpertParallel::sizes_of(m, moe.max_load, moe.ep, Nr, block.bf16);
    b.layers_bytes += blocks.moe.scratch_bytes() + experts.scratch_bytes();
  }
  // The layers' scratch, and the GEMM's row of ones for bias gradients
  // (kernels/gemm.cpp), as long as the most rows: N, or an expert's (at most capacity).
  b.layers_bytes += TensorParallel::buffer_sizes(tp, sp, N, m.channels, block.bf16).bytes() +
                    std::max(N, experts.capacity) * sizeof(real) +
                    ContextParallelAttention::buffer_sizes(att, cp, block.bf16).bytes() + block.scratch_bytes();
  // bf16 emulated through the fp32 route (no bf16 products on this CPU):
  // the widened operands of the largest Linear product (kernels/gemm.cpp
  // keeps one buffer, grown to the largest product).
  b.emulated_bf16 = emulated_bf16_floats(m, blocks, experts, has_head);
  b.layers_bytes += b.emulated_bf16 * sizeof(real);
  b.positions = m.learned_positions() ? Nr : N;  // row_positions
  if (has_head) {
    b.lnf_stats = Nr;
    b.lnf_mean = m.norm == NormKind::layernorm ? Nr : 0;  // RMSNorm keeps no mean
    b.logits = N * (m.vocab / tp);
    b.losses = N;
    b.head_dln = N * C;
    if (precision == Precision::bf16) {  // the final LayerNorm's output in bf16 only
      b.lnf_bf16 = N * C;
      b.dlogits_bf16 = b.logits;
    } else {
      b.lnf = N * C;
    }
  }
  return b;
}

BlockSizes GptModel::block_sizes_of(const ModelConfig& m, int micro_batch, int tp, bool sequence_parallel, int cp,
                                    Precision precision) {
  const std::size_t N = static_cast<std::size_t>(micro_batch) * m.seq_len / cp;
  const bool sp = sequence_parallel && tp > 1;
  BlockSizes b{static_cast<std::size_t>(m.channels), N, sp ? N / tp : N, tp, attention_shape(m, micro_batch, tp, cp),
               precision == Precision::bf16};
  b.set_widths(m);
  return b;
}

LayerSizes GptModel::layer_sizes_of(const ModelConfig& m, int micro_batch, int tp, bool sequence_parallel, int cp,
                                    Precision precision, const MoeSplit& moe) {
  LayerSizes s;
  s.dense = block_sizes_of(m, micro_batch, tp, sequence_parallel, cp, precision);
  for (int l = 0; l < m.layers; ++l) s.is_moe.push_back(m.moe_block(l));
  if (m.moe()) {
    s.moe = s.dense;
    s.moe.set_moe_widths(m, ExpertParallel::sizes_of(m, moe.max_load, moe.ep, s.dense.local_rows, s.dense.bf16));
  }
  return s;
}

LayerSizes GptModel::layer_sizes() const {
  LayerSizes s{block_.sizes(), moe_block_ ? moe_block_->sizes() : BlockSizes{}, {}};
  for (int l = 0; l < cfg_.layers; ++l) s.is_moe.push_back(cfg_.moe_block(l));
  return s;
}

GptModel::~GptModel() { kernels::release_emulated_bf16(); }

ParamLayout GptModel::param_layout(int shards, int expert_shards) const {
  const ExpertSplit experts{experts_ ? experts_->ep() : 1, experts_ ? experts_->ep_rank() : 0, expert_shards};
  return gpt_param_layout(cfg_, chunks_, tp_.size(), tp_.rank(), shards, experts);
}

Slice2D GptModel::wte(real* unit_base) const {
  return Slice2D(unit_base, tp_.local_vocab(), cfg_.channels);  // wte is alone in its unit
}
template <class T>
ConstMatrix<T> GptModel::wte_operand(UnitWeights params) const {
  if constexpr (std::is_same_v<T, bf16>)
    return ConstBf16Slice2D(params.bf16_values, tp_.local_vocab(), cfg_.channels);
  else
    return wte(params.values);
}

void gpt_init_param(const ModelConfig& m, const ParamInfo& p, int tp_rank, std::size_t local_begin, Slice1D data,
                    std::uint64_t seed) {
  const std::size_t length = data.extent(0);
  const bool is_bias = p.name.size() >= 4 && p.name.compare(p.name.size() - 4, 4, "bias") == 0;
  if (p.name.find("ln_") != std::string::npos) {
    kernels::fill(data, is_bias ? real(0) : real(1));
    return;
  }
  if (is_bias) {
    kernels::fill(data, 0);
    return;
  }
  const real std_proj = static_cast<real>(0.02 / std::sqrt(2.0 * m.layers));
  const real stddev = p.name.find("c_proj/weight") != std::string::npos ? std_proj : real(0.02);
  const std::uint64_t key = rng::stream_key(seed, p.name);
  // Each run of elements with consecutive GLOBAL indices is one kernel.
  for (const auto& b : global_blocks(p, tp_rank, local_begin, local_begin + length)) {
    real* at = data.data() + (b.local_begin - local_begin);
    const BlockRows r = block_rows(p, b);
    if (r.cols == r.stride) {
      kernels::init_normal(Slice1D(at, r.rows * r.cols), key, r.first, stddev);
    } else {
      for (std::uint64_t i = 0; i < r.rows; ++i)
        kernels::init_normal(Slice1D(at + i * r.local_cols, r.cols), key, r.first + i * r.stride, stddev);
    }
  }
}

Slice1D GptModel::lnf_bias(real* unit_base) const {
  return lnf_bias_offset_ > 0 ? Slice1D(unit_base + lnf_bias_offset_, cfg_.channels) : Slice1D();
}

Slice2D GptModel::wpe(real* unit_base) const {
  return unit_base != nullptr ? Slice2D(unit_base, cfg_.seq_len, cfg_.channels) : Slice2D();
}

void GptModel::embedding_forward(Slice2D out, ConstTokenView tokens, real* wte_params, real* wpe_params) {
  tp_.embedding_forward(out, tokens, wte(wte_params), wpe(wpe_params), positions_);
}

void GptModel::embedding_backward(real* dwte, real* dwpe, ConstSlice2D dres, ConstTokenView tokens) {
  tp_.embedding_backward(wte(dwte), wpe(dwpe), dres, tokens, positions_);
}

namespace {

// A unit's bf16 operands must be given exactly when the model runs in bf16.
void check_weights(const UnitWeights& w, Precision precision) {
  if ((w.bf16_values != nullptr) != (precision == Precision::bf16))
    throw InternalError("a unit's bf16 working copy must be given exactly under bf16 mixed precision");
}

}  // namespace

bool GptModel::is_moe(int layer) const {
  if (cfg_.moe_block(layer) && !moe_block_)
    throw InternalError("block " + std::to_string(layer) + " is an MoE block this stage does not hold");
  return cfg_.moe_block(layer);
}
const TransformerBlock& GptModel::block(int layer) const { return is_moe(layer) ? *moe_block_ : block_; }
TransformerBlock& GptModel::block(int layer) { return is_moe(layer) ? *moe_block_ : block_; }

BlockWeights GptModel::block_weights(int layer, const BlockParams& params) const {
  check_weights(params.unit, precision_);
  if (is_moe(layer)) check_weights(params.experts, precision_);
  const BlockLayout& layout = layout_of(layer);
  BlockWeights w{layout.view(params.unit.values, params.experts.values), {}};
  if (params.unit.bf16_values != nullptr)
    w.bf16 = layout.view_bf16(params.unit.bf16_values, params.experts.bf16_values);
  return w;
}

// Each routed row's sequence in its micro-batch: the rows are sequence-major, T/cp of each sequence here.
std::vector<int> GptModel::routed_sequences() const {
  const std::size_t per_sequence = static_cast<std::size_t>(attention_.layout().local_len());
  std::vector<int> out;
  for (std::size_t r = 0; r < tp_.local_rows(); ++r)
    out.push_back(static_cast<int>((tp_.first_local_row() + r) / per_sequence));
  return out;
}

void GptModel::set_moe_routing_log(MoeRoutingLog* log) {
  moe_log_ = log;
  if (experts_) experts_->set_routing_log(log, routed_sequences());
}

MoeRouteStats GptModel::block_forward(int layer, const BlockParams& params, ConstSlice2D x, BlockActivations& a) {
  if (moe_log_ != nullptr) moe_log_->next.layer = layer;
  return block(layer).forward(block_weights(layer, params), x, a);
}

void GptModel::block_backward(int layer, const BlockParams& params, const BlockGrads& grads, ConstSlice2D x,
                              const BlockActivations& a, Slice2D dres, real loss_scale) {
  block(layer).backward(block_weights(layer, params), layout_of(layer).view(grads.unit, grads.experts), x, a, dres,
                        loss_scale);
}

double GptModel::head_forward(real* ln_f, UnitWeights wte_params, ConstSlice2D x, ConstTokenView targets,
                              real grad_scale) {
  check_weights(wte_params, precision_);
  if (precision_ == Precision::bf16) return head_forward_as<bf16>(ln_f, wte_params, x, targets, grad_scale);
  return head_forward_as<real>(ln_f, wte_params, x, targets, grad_scale);
}

void GptModel::head_backward(real* ln_f, UnitWeights wte_params, real* dln_f, real* dwte, ConstSlice2D x, Slice2D dx) {
  check_weights(wte_params, precision_);
  if (precision_ == Precision::bf16)
    head_backward_as<bf16>(ln_f, wte_params, dln_f, dwte, x, dx);
  else
    head_backward_as<real>(ln_f, wte_params, dln_f, dwte, x, dx);
}

template <class T>
double GptModel::head_forward_as(real* ln_f, UnitWeights wte_params, ConstSlice2D x, ConstTokenView targets,
                                 real grad_scale) {
  const std::size_t N = tp_.rows(), C = cfg_.channels;
  // logits = lnf W^T (this rank's vocabulary), W = wte (tied head) or lm_head.
  const Slice2D logits = as_matrix(logits_, N, tp_.local_vocab());
  const Matrix<T> lnf = lnf_.as<T>(N, C);
  tp_.norm_enter<T>(lnf, lnf_mean_, lnf_rstd_, x, Slice1D(ln_f, C), lnf_bias(ln_f), norm_);
  kernels::linear_forward<T>(logits, lnf, wte_operand<T>(wte_params), Slice1D());
  // With grad_scale != 0 logits now hold dlogits: the head's backward runs at
  // once, so the logits are never kept per micro-batch.
  return tp_.cross_entropy(logits, losses_, targets, grad_scale);
}

template <class T>
void GptModel::head_backward_as(real* ln_f, UnitWeights wte_params, real* dln_f, real* dwte, ConstSlice2D x,
                                Slice2D dx) {
  const std::size_t N = tp_.rows(), Nr = tp_.local_rows(), C = cfg_.channels;
  const Slice2D dlogits = as_matrix(logits_, N, tp_.local_vocab());
  Matrix<T> dlogits_rounded;
  if constexpr (std::is_same_v<T, bf16>) dlogits_rounded = as_matrix(dlogits_bf16_, N, tp_.local_vocab());
  kernels::linear_backward<T>(as_matrix(dln_, N, C), wte(dwte), Slice1D(), dlogits, lnf_.as<T>(N, C),
                              wte_operand<T>(wte_params), dlogits_rounded);
  ConstSlice2D gin = tp_.reduce_input_grad(as_matrix(dln_, N, C));
  kernels::fill(Slice1D(dx.data(), Nr * C), 0);
  kernels::norm_backward(dx, Slice1D(dln_f, C), lnf_bias(dln_f), gin, x, Slice1D(ln_f, C), lnf_mean_, lnf_rstd_, norm_);
}

}  // namespace ndmini
