// SPDX-License-Identifier: BSD-3-Clause
#include "model/block.hpp"

#include "core/error.hpp"
#include "kernels/kernels.hpp"

namespace ndmini {

const std::array<BlockTensorSpec, 12> kBlockTensors = {{
    {"ln_1/weight", 1, 0, TpSplit::replicated, 1, &BlockTensors::ln1_w, nullptr, nullptr},
    {"ln_1/bias", 1, 0, TpSplit::replicated, 1, &BlockTensors::ln1_b, nullptr, nullptr},
    {"attn/c_attn/weight", 3, 1, TpSplit::rows, 3, nullptr, &BlockTensors::attn_w, &BlockMatricesBf16::attn_w},
    {"attn/c_attn/bias", 3, 0, TpSplit::rows, 3, &BlockTensors::attn_b, nullptr, nullptr},
    {"attn/c_proj/weight", 1, 1, TpSplit::cols, 1, nullptr, &BlockTensors::attn_proj_w,
     &BlockMatricesBf16::attn_proj_w},
    {"attn/c_proj/bias", 1, 0, TpSplit::replicated, 1, &BlockTensors::attn_proj_b, nullptr, nullptr},
    {"ln_2/weight", 1, 0, TpSplit::replicated, 1, &BlockTensors::ln2_w, nullptr, nullptr},
    {"ln_2/bias", 1, 0, TpSplit::replicated, 1, &BlockTensors::ln2_b, nullptr, nullptr},
    {"mlp/c_fc/weight", 4, 1, TpSplit::rows, 1, nullptr, &BlockTensors::fc_w, &BlockMatricesBf16::fc_w},
    {"mlp/c_fc/bias", 4, 0, TpSplit::rows, 1, &BlockTensors::fc_b, nullptr, nullptr},
    {"mlp/c_proj/weight", 1, 4, TpSplit::cols, 1, nullptr, &BlockTensors::mlp_proj_w, &BlockMatricesBf16::mlp_proj_w},
    {"mlp/c_proj/bias", 1, 0, TpSplit::replicated, 1, &BlockTensors::mlp_proj_b, nullptr, nullptr},
}};

BlockLayout::BlockLayout(const ParamLayout& layout, int unit) {
  std::size_t k = 0;
  for (const ParamInfo& p : layout.params) {
    if (p.unit != unit) continue;
    if (k >= places_.size()) throw InternalError("a block unit holds more than 12 tensors");
    places_[k++] = {p.offset - layout.unit_offset[unit], static_cast<std::size_t>(p.shape[0]),
                    p.shape.size() == 2 ? static_cast<std::size_t>(p.shape[1]) : 1};
  }
  if (k != places_.size()) throw InternalError("a block unit must hold 12 tensors");
}

BlockTensors BlockLayout::view(real* base) const {
  BlockTensors t;
  for (std::size_t k = 0; k < places_.size(); ++k) {
    const Place& p = places_[k];
    if (kBlockTensors[k].vector != nullptr)
      t.*kBlockTensors[k].vector = Slice1D(base + p.offset, p.rows);
    else
      t.*kBlockTensors[k].matrix = Slice2D(base + p.offset, p.rows, p.cols);
  }
  return t;
}

BlockMatricesBf16 BlockLayout::view_bf16(const bf16* base) const {
  BlockMatricesBf16 t;
  for (std::size_t k = 0; k < places_.size(); ++k) {
    const Place& p = places_[k];
    if (kBlockTensors[k].bf16_matrix != nullptr)
      t.*kBlockTensors[k].bf16_matrix = ConstBf16Slice2D(base + p.offset, p.rows, p.cols);
  }
  return t;
}

std::vector<BlockSizes::Kept> BlockSizes::kept_tensors(bool output_only) const {
  // What TransformerBlock::allocate takes; under bf16 the products' inputs
  // (ln1, q k v, atty, ln2, fch_gelu) and fch take 2 bytes each.
  const std::size_t half = bf16 ? sizeof(ndmini::bf16) : sizeof(real), single = sizeof(real);
  std::vector<Kept> kept = {{"res3", residual() * single}};
  if (output_only) return kept;
  kept.insert(kept.end(), {{"ln1", full() * half},
                           {"ln1_mean", stats() * single},
                           {"ln1_rstd", stats() * single},
                           {"qkvh", ContextParallelAttention::qkvh_size(attention) * half},
                           {"lse", ContextParallelAttention::lse_size(attention) * single},
                           {"atty", attention_out() * half},
                           {"res2", residual() * single},
                           {"ln2", full() * half},
                           {"ln2_mean", stats() * single},
                           {"ln2_rstd", stats() * single},
                           {"fch", hidden() * half},
                           {"fch_gelu", hidden() * half}});
  return kept;
}

std::size_t BlockSizes::activation_bytes(bool output_only) const {
  std::size_t bytes = 0;
  for (const Kept& k : kept_tensors(output_only)) bytes += k.bytes;
  return bytes;
}

std::size_t BlockSizes::scratch_bytes() const {
  const std::size_t fp32 = 2 * qkv() + full() + hidden() + attention_out();
  if (!bf16) return fp32 * sizeof(real);
  return (fp32 + attention_out()) * sizeof(real) + largest_output() * sizeof(ndmini::bf16);
}

TransformerBlock::TransformerBlock(int channels, TensorParallel& tp, ContextParallelAttention& attention, bool bf16)
    : tp_(tp),
      attention_(attention),
      sizes_{static_cast<std::size_t>(channels), tp.rows(), tp.local_rows(), tp.size(), attention.local_shape(), bf16} {
  C_ = channels;
  Cl_ = C_ / tp.size();
  F_ = 4 * C_ / tp.size();
  Q_ = 3 * C_ / tp.size();
  const BlockSizes& n = sizes_;
  qkv_ = uninitialized("ndmini::qkv", n.qkv());
  dln_ = uninitialized("ndmini::dln", n.full());
  dfc_ = uninitialized("ndmini::dfc", n.hidden());
  dqkv_ = uninitialized("ndmini::dqkv", n.qkv());
  datty_ = uninitialized("ndmini::datty", n.attention_out());
  if (n.bf16) {
    atty_ = uninitialized("ndmini::atty_widened", n.attention_out());
    dy_bf16_ = uninitialized_bf16("ndmini::dy_bf16", n.largest_output());
  }
}

BlockActivations TransformerBlock::allocate(bool output_only) const {
  const BlockSizes& n = sizes_;
  BlockActivations a;
  a.res3 = uninitialized("ndmini::res3", n.residual());
  if (output_only) return a;
  if (n.bf16) {
    a.ln1_bf16 = uninitialized_bf16("ndmini::ln1_bf16", n.full());
    a.atty_bf16 = uninitialized_bf16("ndmini::atty_bf16", n.attention_out());
    a.ln2_bf16 = uninitialized_bf16("ndmini::ln2_bf16", n.full());
    a.fch_bf16 = uninitialized_bf16("ndmini::fch_bf16", n.hidden());
    a.fch_gelu_bf16 = uninitialized_bf16("ndmini::fch_gelu_bf16", n.hidden());
  } else {
    a.ln1 = uninitialized("ndmini::ln1", n.full());
    a.atty = uninitialized("ndmini::atty", n.attention_out());
    a.ln2 = uninitialized("ndmini::ln2", n.full());
    a.fch = uninitialized("ndmini::fch", n.hidden());
    a.fch_gelu = uninitialized("ndmini::fch_gelu", n.hidden());
  }
  a.ln1_mean = uninitialized("ndmini::ln1_mean", n.stats());
  a.ln1_rstd = uninitialized("ndmini::ln1_rstd", n.stats());
  if (n.bf16)
    a.qkvh_bf16 = uninitialized_bf16("ndmini::qkvh_bf16", ContextParallelAttention::qkvh_size(n.attention));
  else
    a.qkvh = uninitialized("ndmini::qkvh", ContextParallelAttention::qkvh_size(n.attention));
  a.lse = uninitialized("ndmini::lse", ContextParallelAttention::lse_size(n.attention));
  a.res2 = uninitialized("ndmini::res2", n.residual());
  a.ln2_mean = uninitialized("ndmini::ln2_mean", n.stats());
  a.ln2_rstd = uninitialized("ndmini::ln2_rstd", n.stats());
  return a;
}

void TransformerBlock::forward(const BlockWeights& weights, ConstSlice2D x, BlockActivations& a) {
  if (sizes_.bf16) return forward_bf16(weights, x, a);
  const BlockTensors& w = weights.w;
  const std::size_t N = tp_.rows(), Nr = tp_.local_rows();
  tp_.layernorm_enter(as_matrix(a.ln1, N, C_), a.ln1_mean, a.ln1_rstd, x, w.ln1_w, w.ln1_b);
  kernels::linear_forward(as_matrix(qkv_, N, Q_), as_matrix(a.ln1, N, C_), w.attn_w, w.attn_b);
  attention_.forward(as_matrix(a.atty, N, Cl_), as_matrix(qkv_, N, Q_), {a.qkvh, a.lse, {}});
  tp_.row_parallel_forward(as_matrix(a.res2, Nr, C_), as_matrix(a.atty, N, Cl_), w.attn_proj_w, w.attn_proj_b, x);
  tp_.layernorm_enter(as_matrix(a.ln2, N, C_), a.ln2_mean, a.ln2_rstd, as_matrix(a.res2, Nr, C_), w.ln2_w, w.ln2_b);
  kernels::linear_forward(as_matrix(a.fch, N, F_), as_matrix(a.ln2, N, C_), w.fc_w, w.fc_b);
  kernels::gelu_forward(as_matrix(a.fch_gelu, N, F_), as_matrix(a.fch, N, F_));
  tp_.row_parallel_forward(as_matrix(a.res3, Nr, C_), as_matrix(a.fch_gelu, N, F_), w.mlp_proj_w, w.mlp_proj_b,
                           as_matrix(a.res2, Nr, C_));
}

void TransformerBlock::backward(const BlockWeights& weights, const BlockTensors& g, ConstSlice2D x,
                                const BlockActivations& a, Slice2D dres) {
  if (sizes_.bf16) return backward_bf16(weights, g, x, a, dres);
  const BlockTensors& w = weights.w;
  const std::size_t N = tp_.rows(), Nr = tp_.local_rows();
  // dres is d(res3); res3 = res2 + mlp(ln2(res2)), so d(res2) starts as a copy
  // (the LayerNorm backward adds into it).
  ConstSlice2D dfull = tp_.gather_output_grad(dres);
  kernels::linear_backward(as_matrix(dfc_, N, F_), g.mlp_proj_w, Slice1D(), dfull, as_matrix(a.fch_gelu, N, F_),
                           w.mlp_proj_w);
  tp_.row_parallel_bias_backward(g.mlp_proj_b, dfull, dres);
  kernels::gelu_backward(as_matrix(dfc_, N, F_), as_matrix(a.fch, N, F_), as_matrix(dfc_, N, F_));
  kernels::linear_backward(as_matrix(dln_, N, C_), g.fc_w, g.fc_b, as_matrix(dfc_, N, F_), as_matrix(a.ln2, N, C_),
                           w.fc_w);
  ConstSlice2D gin = tp_.reduce_input_grad(as_matrix(dln_, N, C_));
  kernels::layernorm_backward(dres, g.ln2_w, g.ln2_b, gin, as_matrix(a.res2, Nr, C_), w.ln2_w, a.ln2_mean, a.ln2_rstd);
  // dres is now d(res2); res2 = x + attn(ln1(x)).
  dfull = tp_.gather_output_grad(dres);
  kernels::linear_backward(as_matrix(datty_, N, Cl_), g.attn_proj_w, Slice1D(), dfull, as_matrix(a.atty, N, Cl_),
                           w.attn_proj_w);
  tp_.row_parallel_bias_backward(g.attn_proj_b, dfull, dres);
  attention_.backward(as_matrix(dqkv_, N, Q_), as_matrix(datty_, N, Cl_), as_matrix(a.atty, N, Cl_),
                      {a.qkvh, a.lse, {}});
  kernels::linear_backward(as_matrix(dln_, N, C_), g.attn_w, g.attn_b, as_matrix(dqkv_, N, Q_), as_matrix(a.ln1, N, C_),
                           w.attn_w);
  // The key bias cannot change any output (it adds q . b_k to every score of
  // a softmax row), so its gradient is exactly zero. Store that zero, not
  // the rounding noise of a column sum, which Adam would amplify into
  // updates that differ between layouts.
  kernels::fill(Slice1D(g.attn_b.data() + Cl_, Cl_), 0);
  gin = tp_.reduce_input_grad(as_matrix(dln_, N, C_));
  kernels::layernorm_backward(dres, g.ln1_w, g.ln1_b, gin, x, w.ln1_w, a.ln1_mean, a.ln1_rstd);
}

// ---- bf16 mixed precision ------------------------------------------------
// The same computation, step for step, with the products' inputs rounded to
// bf16 once, when they are made, and kept so for the backward: the
// LayerNorms write bf16 (gathered as bf16 with SP); the attention output and
// the MLP's hidden land in fp32 in the backward's scratch (free during a
// forward) and are rounded into the activation. Statistics, residuals and
// the attention's softmax stay fp32.

ConstBf16Slice2D TransformerBlock::keep_bf16(const Bf16View1D& out, const View1D& in, std::size_t rows,
                                             std::size_t cols) const {
  kernels::round_to_bf16(Bf16Slice1D(out.data(), rows * cols), ConstSlice1D(in.data(), rows * cols));
  return as_matrix(out, rows, cols);
}

void TransformerBlock::forward_bf16(const BlockWeights& weights, ConstSlice2D x, BlockActivations& a) {
  const BlockTensors& w = weights.w;
  const BlockMatricesBf16& m = weights.bf16;
  const std::size_t N = tp_.rows(), Nr = tp_.local_rows();
  const Bf16Slice2D ln1 = as_matrix(a.ln1_bf16, N, C_);
  tp_.layernorm_enter(ln1, a.ln1_mean, a.ln1_rstd, x, w.ln1_w, w.ln1_b);
  kernels::linear_forward(as_matrix(qkv_, N, Q_), ln1, m.attn_w, w.attn_b);
  attention_.forward(as_matrix(datty_, N, Cl_), as_matrix(qkv_, N, Q_), {{}, a.lse, a.qkvh_bf16});
  const ConstBf16Slice2D atty = keep_bf16(a.atty_bf16, datty_, N, Cl_);
  tp_.row_parallel_forward(as_matrix(a.res2, Nr, C_), atty, m.attn_proj_w, w.attn_proj_b, x);
  const Bf16Slice2D ln2 = as_matrix(a.ln2_bf16, N, C_);
  tp_.layernorm_enter(ln2, a.ln2_mean, a.ln2_rstd, as_matrix(a.res2, Nr, C_), w.ln2_w, w.ln2_b);
  kernels::linear_forward(as_matrix(dfc_, N, F_), ln2, m.fc_w, w.fc_b);
  kernels::gelu_forward(as_matrix(a.fch_gelu_bf16, N, F_), as_matrix(dfc_, N, F_));
  keep_bf16(a.fch_bf16, dfc_, N, F_);
  tp_.row_parallel_forward(as_matrix(a.res3, Nr, C_), as_matrix(a.fch_gelu_bf16, N, F_), m.mlp_proj_w, w.mlp_proj_b,
                           as_matrix(a.res2, Nr, C_));
}

void TransformerBlock::backward_bf16(const BlockWeights& weights, const BlockTensors& g, ConstSlice2D x,
                                     const BlockActivations& a, Slice2D dres) {
  const BlockTensors& w = weights.w;
  const BlockMatricesBf16& m = weights.bf16;
  const std::size_t N = tp_.rows(), Nr = tp_.local_rows();
  const auto kept = [N](const Bf16View1D& v, std::size_t cols) { return ConstBf16Slice2D(v.data(), N, cols); };
  ConstSlice2D dfull = tp_.gather_output_grad(dres);
  kernels::linear_backward(as_matrix(dfc_, N, F_), g.mlp_proj_w, Slice1D(), dfull, dy_bf16(C_),
                           kept(a.fch_gelu_bf16, F_), m.mlp_proj_w);
  tp_.row_parallel_bias_backward(g.mlp_proj_b, dfull, dres);
  kernels::gelu_backward(as_matrix(dfc_, N, F_), kept(a.fch_bf16, F_), as_matrix(dfc_, N, F_));
  kernels::linear_backward(as_matrix(dln_, N, C_), g.fc_w, g.fc_b, as_matrix(dfc_, N, F_), dy_bf16(F_),
                           kept(a.ln2_bf16, C_), m.fc_w);
  ConstSlice2D gin = tp_.reduce_input_grad(as_matrix(dln_, N, C_));
  kernels::layernorm_backward(dres, g.ln2_w, g.ln2_b, gin, as_matrix(a.res2, Nr, C_), w.ln2_w, a.ln2_mean, a.ln2_rstd);
  dfull = tp_.gather_output_grad(dres);
  kernels::linear_backward(as_matrix(datty_, N, Cl_), g.attn_proj_w, Slice1D(), dfull, dy_bf16(C_),
                           kept(a.atty_bf16, Cl_), m.attn_proj_w);
  tp_.row_parallel_bias_backward(g.attn_proj_b, dfull, dres);
  // The attention's backward reads its output (for rowsum(dO * O)): the kept bf16 one, widened.
  kernels::widen_bf16(Slice1D(atty_.data(), N * Cl_), ConstBf16Slice1D(a.atty_bf16.data(), N * Cl_));
  attention_.backward(as_matrix(dqkv_, N, Q_), as_matrix(datty_, N, Cl_), as_matrix(atty_, N, Cl_),
                      {{}, a.lse, a.qkvh_bf16});
  kernels::linear_backward(as_matrix(dln_, N, C_), g.attn_w, g.attn_b, as_matrix(dqkv_, N, Q_), dy_bf16(Q_),
                           kept(a.ln1_bf16, C_), m.attn_w);
  kernels::fill(Slice1D(g.attn_b.data() + Cl_, Cl_), 0);  // the key bias: see backward()
  gin = tp_.reduce_input_grad(as_matrix(dln_, N, C_));
  kernels::layernorm_backward(dres, g.ln1_w, g.ln1_b, gin, x, w.ln1_w, a.ln1_mean, a.ln1_rstd);
}

}  // namespace ndmini
