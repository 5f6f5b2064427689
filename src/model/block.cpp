// SPDX-License-Identifier: BSD-3-Clause
#include "model/block.hpp"

#include "core/error.hpp"
#include "kernels/kernels.hpp"

namespace ndmini {

const std::array<BlockTensorSpec, 12> kBlockTensors = {{
    {"ln_1/weight", 1, 0, TpSplit::replicated, 1, &BlockTensors::ln1_w, nullptr},
    {"ln_1/bias", 1, 0, TpSplit::replicated, 1, &BlockTensors::ln1_b, nullptr},
    {"attn/c_attn/weight", 3, 1, TpSplit::rows, 3, nullptr, &BlockTensors::attn_w},
    {"attn/c_attn/bias", 3, 0, TpSplit::rows, 3, &BlockTensors::attn_b, nullptr},
    {"attn/c_proj/weight", 1, 1, TpSplit::cols, 1, nullptr, &BlockTensors::attn_proj_w},
    {"attn/c_proj/bias", 1, 0, TpSplit::replicated, 1, &BlockTensors::attn_proj_b, nullptr},
    {"ln_2/weight", 1, 0, TpSplit::replicated, 1, &BlockTensors::ln2_w, nullptr},
    {"ln_2/bias", 1, 0, TpSplit::replicated, 1, &BlockTensors::ln2_b, nullptr},
    {"mlp/c_fc/weight", 4, 1, TpSplit::rows, 1, nullptr, &BlockTensors::fc_w},
    {"mlp/c_fc/bias", 4, 0, TpSplit::rows, 1, &BlockTensors::fc_b, nullptr},
    {"mlp/c_proj/weight", 1, 4, TpSplit::cols, 1, nullptr, &BlockTensors::mlp_proj_w},
    {"mlp/c_proj/bias", 1, 0, TpSplit::replicated, 1, &BlockTensors::mlp_proj_b, nullptr},
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

std::size_t BlockSizes::activation_floats(bool output_only) const {
  if (output_only) return residual();
  // What TransformerBlock::allocate takes, in its order.
  return residual() + full() + 2 * stats() + ContextParallelAttention::qkvh_size(attention) +
         ContextParallelAttention::lse_size(attention) + attention_out() + residual() + full() + 2 * stats() +
         2 * hidden();
}

TransformerBlock::TransformerBlock(int channels, TensorParallel& tp, ContextParallelAttention& attention)
    : tp_(tp),
      attention_(attention),
      sizes_{static_cast<std::size_t>(channels), tp.rows(), tp.local_rows(), tp.size(), attention.local_shape()} {
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
}

BlockActivations TransformerBlock::allocate(bool output_only) const {
  const BlockSizes& n = sizes_;
  BlockActivations a;
  a.res3 = uninitialized("ndmini::res3", n.residual());
  if (output_only) return a;
  a.ln1 = uninitialized("ndmini::ln1", n.full());
  a.ln1_mean = uninitialized("ndmini::ln1_mean", n.stats());
  a.ln1_rstd = uninitialized("ndmini::ln1_rstd", n.stats());
  a.qkvh = uninitialized("ndmini::qkvh", ContextParallelAttention::qkvh_size(n.attention));
  a.lse = uninitialized("ndmini::lse", ContextParallelAttention::lse_size(n.attention));
  a.atty = uninitialized("ndmini::atty", n.attention_out());
  a.res2 = uninitialized("ndmini::res2", n.residual());
  a.ln2 = uninitialized("ndmini::ln2", n.full());
  a.ln2_mean = uninitialized("ndmini::ln2_mean", n.stats());
  a.ln2_rstd = uninitialized("ndmini::ln2_rstd", n.stats());
  a.fch = uninitialized("ndmini::fch", n.hidden());
  a.fch_gelu = uninitialized("ndmini::fch_gelu", n.hidden());
  return a;
}

void TransformerBlock::forward(const BlockTensors& w, ConstSlice2D x, BlockActivations& a) {
  const std::size_t N = tp_.rows(), Nr = tp_.local_rows();
  tp_.layernorm_enter(as_matrix(a.ln1, N, C_), a.ln1_mean, a.ln1_rstd, x, w.ln1_w, w.ln1_b);
  kernels::linear_forward(as_matrix(qkv_, N, Q_), as_matrix(a.ln1, N, C_), w.attn_w, w.attn_b);
  attention_.forward(as_matrix(a.atty, N, Cl_), as_matrix(qkv_, N, Q_), {a.qkvh, a.lse});
  tp_.row_parallel_forward(as_matrix(a.res2, Nr, C_), as_matrix(a.atty, N, Cl_), w.attn_proj_w, w.attn_proj_b, x);
  tp_.layernorm_enter(as_matrix(a.ln2, N, C_), a.ln2_mean, a.ln2_rstd, as_matrix(a.res2, Nr, C_), w.ln2_w, w.ln2_b);
  kernels::linear_forward(as_matrix(a.fch, N, F_), as_matrix(a.ln2, N, C_), w.fc_w, w.fc_b);
  kernels::gelu_forward(as_matrix(a.fch_gelu, N, F_), as_matrix(a.fch, N, F_));
  tp_.row_parallel_forward(as_matrix(a.res3, Nr, C_), as_matrix(a.fch_gelu, N, F_), w.mlp_proj_w, w.mlp_proj_b,
                           as_matrix(a.res2, Nr, C_));
}

void TransformerBlock::backward(const BlockTensors& w, const BlockTensors& g, ConstSlice2D x, const BlockActivations& a,
                                Slice2D dres) {
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
  attention_.backward(as_matrix(dqkv_, N, Q_), as_matrix(datty_, N, Cl_), as_matrix(a.atty, N, Cl_), {a.qkvh, a.lse});
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

}  // namespace ndmini
