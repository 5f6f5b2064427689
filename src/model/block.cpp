// SPDX-License-Identifier: BSD-3-Clause
#include "model/block.hpp"

#include "core/error.hpp"
#include "kernels/kernels.hpp"

namespace ndmini {
namespace {

View1D alloc(const std::string& label, std::size_t n) {
  return View1D(Kokkos::view_alloc(Kokkos::WithoutInitializing, label), n);
}

Slice2D mat(const View1D& v, std::size_t rows, std::size_t cols) { return Slice2D(v.data(), rows, cols); }

}  // namespace

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
  auto v1 = [&](int i) { return Slice1D(base + places_[i].offset, places_[i].rows); };
  auto v2 = [&](int i) { return Slice2D(base + places_[i].offset, places_[i].rows, places_[i].cols); };
  return {v1(0), v1(1), v2(2), v1(3), v2(4), v1(5), v1(6), v1(7), v2(8), v1(9), v2(10), v1(11)};
}

TransformerBlock::TransformerBlock(int channels, TensorParallel& tp, ContextParallelAttention& attention)
    : tp_(tp), attention_(attention) {
  C_ = channels;
  Cl_ = C_ / tp.size();
  F_ = 4 * C_ / tp.size();
  Q_ = 3 * C_ / tp.size();
  const std::size_t N = tp.rows();
  qkv_ = alloc("ndmini::qkv", N * Q_);
  dln_ = alloc("ndmini::dln", N * C_);
  dfc_ = alloc("ndmini::dfc", N * F_);
  dqkv_ = alloc("ndmini::dqkv", N * Q_);
  datty_ = alloc("ndmini::datty", N * Cl_);
}

BlockActivations TransformerBlock::allocate(bool output_only) const {
  const std::size_t N = tp_.rows(), Nr = tp_.local_rows();
  BlockActivations a;
  a.res3 = alloc("ndmini::res3", Nr * C_);
  if (output_only) return a;
  a.ln1 = alloc("ndmini::ln1", N * C_);
  a.ln1_mean = alloc("ndmini::ln1_mean", Nr);
  a.ln1_rstd = alloc("ndmini::ln1_rstd", Nr);
  a.qkvh = alloc("ndmini::qkvh", ContextParallelAttention::qkvh_size(attention_.local_shape()));
  a.lse = alloc("ndmini::lse", ContextParallelAttention::lse_size(attention_.local_shape()));
  a.atty = alloc("ndmini::atty", N * Cl_);
  a.res2 = alloc("ndmini::res2", Nr * C_);
  a.ln2 = alloc("ndmini::ln2", N * C_);
  a.ln2_mean = alloc("ndmini::ln2_mean", Nr);
  a.ln2_rstd = alloc("ndmini::ln2_rstd", Nr);
  a.fch = alloc("ndmini::fch", N * F_);
  a.fch_gelu = alloc("ndmini::fch_gelu", N * F_);
  return a;
}

std::size_t block_activation_bytes(std::size_t C, int tp, std::size_t N, std::size_t Nr,
                                   const kernels::AttentionShape& attention, bool output_only) {
  // The sizes TransformerBlock::allocate uses.
  const std::size_t out = Nr * C;
  if (output_only) return out * sizeof(real);
  const std::size_t kept = 2 * N * C + 4 * Nr + N * (C / tp) + Nr * C + 2 * N * (4 * C / tp) + out +
                           ContextParallelAttention::qkvh_size(attention) +
                           ContextParallelAttention::lse_size(attention);
  return kept * sizeof(real);
}

void TransformerBlock::forward(const BlockTensors& w, ConstSlice2D x, BlockActivations& a) {
  const std::size_t N = tp_.rows(), Nr = tp_.local_rows();
  tp_.layernorm_enter(mat(a.ln1, N, C_), a.ln1_mean, a.ln1_rstd, x, w.ln1_w, w.ln1_b);
  kernels::linear_forward(mat(qkv_, N, Q_), mat(a.ln1, N, C_), w.attn_w, w.attn_b);
  attention_.forward(mat(a.atty, N, Cl_), mat(qkv_, N, Q_), {a.qkvh, a.lse});
  tp_.row_parallel_forward(mat(a.res2, Nr, C_), mat(a.atty, N, Cl_), w.attn_proj_w, w.attn_proj_b, x);
  tp_.layernorm_enter(mat(a.ln2, N, C_), a.ln2_mean, a.ln2_rstd, mat(a.res2, Nr, C_), w.ln2_w, w.ln2_b);
  kernels::linear_forward(mat(a.fch, N, F_), mat(a.ln2, N, C_), w.fc_w, w.fc_b);
  kernels::gelu_forward(mat(a.fch_gelu, N, F_), mat(a.fch, N, F_));
  tp_.row_parallel_forward(mat(a.res3, Nr, C_), mat(a.fch_gelu, N, F_), w.mlp_proj_w, w.mlp_proj_b,
                           mat(a.res2, Nr, C_));
}

void TransformerBlock::backward(const BlockTensors& w, const BlockTensors& g, ConstSlice2D x, const BlockActivations& a,
                                Slice2D dres) {
  const std::size_t N = tp_.rows(), Nr = tp_.local_rows();
  // dres is d(res3); res3 = res2 + mlp(ln2(res2)), so d(res2) starts as a copy
  // (the LayerNorm backward adds into it).
  ConstSlice2D dfull = tp_.gather_output_grad(dres);
  kernels::linear_backward(mat(dfc_, N, F_), g.mlp_proj_w, Slice1D(), dfull, mat(a.fch_gelu, N, F_), w.mlp_proj_w);
  tp_.row_parallel_bias_backward(g.mlp_proj_b, dfull, dres);
  kernels::gelu_backward(mat(dfc_, N, F_), mat(a.fch, N, F_), mat(dfc_, N, F_));
  kernels::linear_backward(mat(dln_, N, C_), g.fc_w, g.fc_b, mat(dfc_, N, F_), mat(a.ln2, N, C_), w.fc_w);
  ConstSlice2D gin = tp_.reduce_input_grad(mat(dln_, N, C_));
  kernels::layernorm_backward(dres, g.ln2_w, g.ln2_b, gin, mat(a.res2, Nr, C_), w.ln2_w, a.ln2_mean, a.ln2_rstd);
  // dres is now d(res2); res2 = x + attn(ln1(x)).
  dfull = tp_.gather_output_grad(dres);
  kernels::linear_backward(mat(datty_, N, Cl_), g.attn_proj_w, Slice1D(), dfull, mat(a.atty, N, Cl_), w.attn_proj_w);
  tp_.row_parallel_bias_backward(g.attn_proj_b, dfull, dres);
  attention_.backward(mat(dqkv_, N, Q_), mat(datty_, N, Cl_), mat(a.atty, N, Cl_), {a.qkvh, a.lse});
  kernels::linear_backward(mat(dln_, N, C_), g.attn_w, g.attn_b, mat(dqkv_, N, Q_), mat(a.ln1, N, C_), w.attn_w);
  // The key bias cannot change any output (it adds q . b_k to every score of
  // a softmax row), so its gradient is exactly zero. Store that zero, not
  // the rounding noise of a column sum, which Adam would amplify into
  // updates that differ between layouts.
  kernels::fill(Slice1D(g.attn_b.data() + Cl_, Cl_), 0);
  gin = tp_.reduce_input_grad(mat(dln_, N, C_));
  kernels::layernorm_backward(dres, g.ln1_w, g.ln1_b, gin, x, w.ln1_w, a.ln1_mean, a.ln1_rstd);
}

}  // namespace ndmini
