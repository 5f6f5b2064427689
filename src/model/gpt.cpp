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
TokenView row_positions(const ModelConfig& m, const TensorParallel& tp, const CpLayout& cpl) {
  const bool residual = m.learned_positions();
  const std::size_t rows = residual ? tp.local_rows() : tp.rows(), first = residual ? tp.first_local_row() : 0;
  const int Tl = cpl.local_len();
  TokenView positions("ndmini::positions", rows);
  auto h = Kokkos::create_mirror_view(positions);
  for (std::size_t r = 0; r < rows; ++r) h(r) = cpl.position(static_cast<int>((first + r) % Tl));
  Kokkos::deep_copy(positions, h);
  return positions;
}

}  // namespace

GptModel::GptModel(const ModelConfig& m, int micro_batch, std::vector<Chunk> chunks, Communicator* tp,
                   bool sequence_parallel, Communicator* cp, Precision precision)
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
  const ParamLayout layout = param_layout(1);
  for (const ParamInfo& p : layout.params)
    if (p.name == "ln_f/bias") lnf_bias_offset_ = p.offset - layout.unit_offset[p.unit];
  if (!units_.front().blocks.empty()) block_layout_ = BlockLayout(layout, units_.front().blocks.front());

  const Buffers sizes = buffer_sizes(m, micro_batch, chunks_.back().head, tp_.size(), tp_.sequence_parallel(),
                                     attention_.layout().cp, precision);
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

GptModel::Buffers GptModel::buffer_sizes(const ModelConfig& m, int micro_batch, bool has_head, int tp,
                                         bool sequence_parallel, int cp, Precision precision) {
  const bool sp = sequence_parallel && tp > 1;
  const BlockSizes block = block_sizes_of(m, micro_batch, tp, sequence_parallel, cp, precision);
  const std::size_t N = block.rows, Nr = block.local_rows, C = block.channels;
  const kernels::AttentionShape att = block.attention;
  Buffers b;
  // The layers' scratch, and the GEMM's row of ones for bias gradients
  // (kernels/gemm.cpp), as long as the most rows: N.
  b.layers_bytes = TensorParallel::buffer_sizes(tp, sp, N, m.channels, block.bf16).bytes() + N * sizeof(real) +
                   ContextParallelAttention::buffer_sizes(att, cp, block.bf16).bytes() + block.scratch_bytes();
  // bf16 emulated through the fp32 route (no bf16 products on this CPU):
  // the widened operands of the largest Linear product (kernels/gemm.cpp
  // keeps one buffer, grown to the largest product).
  b.emulated_bf16 = emulated_bf16_floats(m, block, has_head);
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

GptModel::~GptModel() { kernels::release_emulated_bf16(); }

ParamLayout GptModel::param_layout(int shards) const {
  return gpt_param_layout(cfg_, chunks_, tp_.size(), tp_.rank(), shards);
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
  const std::uint64_t cols_global = p.global_shape.size() == 2 ? p.global_shape[1] : 1;
  const std::size_t cols_local = p.shape.size() == 2 ? p.shape[1] : 1;
  for (const auto& b : global_blocks(p, tp_rank, local_begin, local_begin + length)) {
    real* at = data.data() + (b.local_begin - local_begin);
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

BlockWeights GptModel::block_weights(UnitWeights params) const {
  check_weights(params, precision_);
  BlockWeights w{block_layout_.view(params.values), {}};
  if (params.bf16_values != nullptr) w.bf16 = block_layout_.view_bf16(params.bf16_values);
  return w;
}

void GptModel::block_forward(UnitWeights params, ConstSlice2D x, BlockActivations& a) {
  block_.forward(block_weights(params), x, a);
}

void GptModel::block_backward(UnitWeights params, real* grads, ConstSlice2D x, const BlockActivations& a,
                              Slice2D dres) {
  block_.backward(block_weights(params), block_layout_.view(grads), x, a, dres);
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
