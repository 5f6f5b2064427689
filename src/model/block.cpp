// SPDX-License-Identifier: BSD-3-Clause
#include "model/block.hpp"

#include <string>
#include <type_traits>

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

using Kept = BlockKeptSpec::Kept;
const std::array<BlockKeptSpec, 15> kBlockKept = {{
    {"res3", &BlockSizes::residual, Kept::always, &BlockActivations::res3, nullptr},
    {"ln1", &BlockSizes::full, Kept::without_recompute, nullptr, &BlockActivations::ln1},
    {"ln1_mean", &BlockSizes::stats, Kept::without_recompute, &BlockActivations::ln1_mean, nullptr,
     &BlockSizes::layernorm},
    {"ln1_rstd", &BlockSizes::stats, Kept::without_recompute, &BlockActivations::ln1_rstd, nullptr},
    {"qkvh", &BlockSizes::qkvh, Kept::without_recompute, nullptr, &BlockActivations::qkvh},
    {"lse", &BlockSizes::lse, Kept::without_recompute, &BlockActivations::lse, nullptr},
    {"atty", &BlockSizes::attention_out, Kept::without_recompute, nullptr, &BlockActivations::atty},
    {"res2", &BlockSizes::residual, Kept::without_recompute, &BlockActivations::res2, nullptr},
    {"ln2", &BlockSizes::full, Kept::without_recompute, nullptr, &BlockActivations::ln2},
    {"ln2_mean", &BlockSizes::stats, Kept::without_recompute, &BlockActivations::ln2_mean, nullptr,
     &BlockSizes::layernorm},
    {"ln2_rstd", &BlockSizes::stats, Kept::without_recompute, &BlockActivations::ln2_rstd, nullptr},
    {"fch", &BlockSizes::hidden, Kept::without_recompute, nullptr, &BlockActivations::fch},
    {"fch_gelu", &BlockSizes::hidden, Kept::without_recompute, nullptr, &BlockActivations::fch_gelu, &BlockSizes::gelu},
    {"fch_up", &BlockSizes::hidden, Kept::without_recompute, nullptr, &BlockActivations::fch_up, &BlockSizes::swiglu},
    {"fch_swiglu", &BlockSizes::hidden, Kept::without_recompute, nullptr, &BlockActivations::fch_swiglu,
     &BlockSizes::swiglu},
}};

std::vector<BlockSizes::Kept> BlockSizes::kept_tensors(bool output_only) const {
  std::vector<Kept> kept;
  for (const BlockKeptSpec& t : kBlockKept) {
    if (!t.kept_by(*this, output_only)) continue;
    const std::size_t element = t.operand != nullptr && bf16 ? sizeof(ndmini::bf16) : sizeof(real);
    kept.push_back({t.name, (this->*t.elements)() * element});
  }
  return kept;
}

std::size_t BlockSizes::activation_bytes(bool output_only) const {
  std::size_t bytes = 0;
  for (const Kept& k : kept_tensors(output_only)) bytes += k.bytes;
  return bytes;
}

std::size_t BlockSizes::scratch_bytes() const {
  const std::size_t fp32 = 2 * qkv() + full() + (gated ? 2 : 1) * hidden() + attention_out();
  if (!bf16) return fp32 * sizeof(real);
  return (fp32 + attention_out()) * sizeof(real) + largest_output() * sizeof(ndmini::bf16);
}

TransformerBlock::TransformerBlock(int channels, TensorParallel& tp, ContextParallelAttention& attention, bool bf16)
    : tp_(tp),
      attention_(attention),
      sizes_{static_cast<std::size_t>(channels), tp.rows(), tp.local_rows(), tp.size(), attention.local_shape(), bf16} {
  sizes_.set_gpt2_widths();  // the blocks computed today: GPT-2's (require_trainable_architecture)
  C_ = channels;
  Cl_ = C_ / tp.size();
  F_ = 4 * C_ / tp.size();
  Q_ = attention.local_shape().qkv_width();  // (H + 2 KV) hs / tp: q, then k and v of the kv heads
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
  BlockActivations a;
  for (const BlockKeptSpec& t : kBlockKept) {
    if (!t.kept_by(sizes_, output_only)) continue;
    const std::string label = std::string("ndmini::") + t.name;
    const std::size_t n = (sizes_.*t.elements)();
    if (t.fp32 != nullptr)
      a.*t.fp32 = uninitialized(label, n);
    else if (sizes_.bf16)
      (a.*t.operand).bf16 = uninitialized_bf16(label + "_bf16", n);
    else
      (a.*t.operand).fp32 = uninitialized(label, n);
  }
  return a;
}

void TransformerBlock::forward(const BlockWeights& w, ConstSlice2D x, BlockActivations& a) {
  if (sizes_.bf16)
    forward_as<bf16>(w, x, a);
  else
    forward_as<real>(w, x, a);
}

void TransformerBlock::backward(const BlockWeights& w, const BlockTensors& g, ConstSlice2D x, const BlockActivations& a,
                                Slice2D dres) {
  if (sizes_.bf16)
    backward_as<bf16>(w, g, x, a, dres);
  else
    backward_as<real>(w, g, x, a, dres);
}

// ---- one computation for both precisions ----------------------------------
// Under bf16 the products' inputs are rounded to bf16 once, when they are
// made, and kept so for the backward. The LayerNorms write bf16 (gathered as
// bf16 with SP). The attention output and the MLP's hidden land in fp32 in
// the backward's scratch (free during a forward) and are rounded into the
// activation. Statistics, residuals and the attention's softmax stay fp32.
// In fp32 every helper below is the identity, so the fp32 path does exactly
// the operations it would do written alone.

namespace {

template <class T>
constexpr bool kBf16 = std::is_same_v<T, bf16>;

template <class T>
BlockMatrices<T> operands(const BlockWeights& weights) {
  if constexpr (kBf16<T>) {
    return weights.bf16;
  } else {
    const BlockTensors& w = weights.w;
    return {w.attn_w, w.attn_proj_w, w.fc_w, w.mlp_proj_w};
  }
}

// Where an fp32 result that is kept as an operand is computed: in place in
// fp32, in `scratch` under bf16 (then keep() rounds it into the operand).
template <class T>
Slice2D landing(const KeptOperand& k, const View1D& scratch, std::size_t rows, std::size_t cols) {
  return as_matrix(kBf16<T> ? scratch : k.fp32, rows, cols);
}
template <class T>
void keep(const KeptOperand& k, ConstSlice2D result) {
  if constexpr (kBf16<T>)
    kernels::round_to_bf16(Bf16Slice1D(k.bf16.data(), result.size()), ConstSlice1D(result.data(), result.size()));
}

ContextParallelAttention::Saved saved(const BlockActivations& a) { return {a.qkvh.fp32, a.lse, a.qkvh.bf16}; }

}  // namespace

template <class T>
Matrix<T> TransformerBlock::dy_rounded(std::size_t cols) const {
  if constexpr (kBf16<T>)
    return as_matrix(dy_bf16_, sizes_.rows, cols);
  else
    return {};
}

template <class T>
ConstSlice2D TransformerBlock::attention_output(const KeptOperand& atty) const {
  const std::size_t N = sizes_.rows;
  if constexpr (kBf16<T>) {
    kernels::widen_bf16(Slice1D(atty_.data(), N * Cl_), ConstBf16Slice1D(atty.bf16.data(), N * Cl_));
    return as_matrix(atty_, N, Cl_);
  } else {
    return as_matrix(atty.fp32, N, Cl_);
  }
}

template <class T>
void TransformerBlock::forward_as(const BlockWeights& weights, ConstSlice2D x, BlockActivations& a) {
  const BlockTensors& w = weights.w;
  const BlockMatrices<T> m = operands<T>(weights);
  const std::size_t N = tp_.rows(), Nr = tp_.local_rows();
  const Matrix<T> ln1 = a.ln1.as<T>(N, C_);
  tp_.layernorm_enter<T>(ln1, a.ln1_mean, a.ln1_rstd, x, w.ln1_w, w.ln1_b);
  kernels::linear_forward<T>(as_matrix(qkv_, N, Q_), ln1, m.attn_w, w.attn_b);
  const Slice2D atty = landing<T>(a.atty, datty_, N, Cl_);
  attention_.forward(atty, as_matrix(qkv_, N, Q_), saved(a));
  keep<T>(a.atty, atty);
  tp_.row_parallel_forward<T>(as_matrix(a.res2, Nr, C_), a.atty.as<T>(N, Cl_), m.attn_proj_w, w.attn_proj_b, x);
  const Matrix<T> ln2 = a.ln2.as<T>(N, C_);
  tp_.layernorm_enter<T>(ln2, a.ln2_mean, a.ln2_rstd, as_matrix(a.res2, Nr, C_), w.ln2_w, w.ln2_b);
  const Slice2D fch = landing<T>(a.fch, dfc_, N, F_);
  kernels::linear_forward<T>(fch, ln2, m.fc_w, w.fc_b);
  kernels::gelu_forward(a.fch_gelu.as<T>(N, F_), fch);
  keep<T>(a.fch, fch);
  tp_.row_parallel_forward<T>(as_matrix(a.res3, Nr, C_), a.fch_gelu.as<T>(N, F_), m.mlp_proj_w, w.mlp_proj_b,
                              as_matrix(a.res2, Nr, C_));
}

template <class T>
void TransformerBlock::backward_as(const BlockWeights& weights, const BlockTensors& g, ConstSlice2D x,
                                   const BlockActivations& a, Slice2D dres) {
  const BlockTensors& w = weights.w;
  const BlockMatrices<T> m = operands<T>(weights);
  const std::size_t N = tp_.rows(), Nr = tp_.local_rows();
  // dres is d(res3); res3 = res2 + mlp(ln2(res2)), so d(res2) starts as a copy
  // (the LayerNorm backward adds into it).
  ConstSlice2D dfull = tp_.gather_output_grad(dres);
  kernels::linear_backward<T>(as_matrix(dfc_, N, F_), g.mlp_proj_w, Slice1D(), dfull, a.fch_gelu.as<T>(N, F_),
                              m.mlp_proj_w, dy_rounded<T>(C_));
  tp_.row_parallel_bias_backward(g.mlp_proj_b, dfull, dres);
  kernels::gelu_backward(as_matrix(dfc_, N, F_), a.fch.as<T>(N, F_), as_matrix(dfc_, N, F_));
  kernels::linear_backward<T>(as_matrix(dln_, N, C_), g.fc_w, g.fc_b, as_matrix(dfc_, N, F_), a.ln2.as<T>(N, C_),
                              m.fc_w, dy_rounded<T>(F_));
  ConstSlice2D gin = tp_.reduce_input_grad(as_matrix(dln_, N, C_));
  kernels::layernorm_backward(dres, g.ln2_w, g.ln2_b, gin, as_matrix(a.res2, Nr, C_), w.ln2_w, a.ln2_mean, a.ln2_rstd);
  // dres is now d(res2); res2 = x + attn(ln1(x)).
  dfull = tp_.gather_output_grad(dres);
  kernels::linear_backward<T>(as_matrix(datty_, N, Cl_), g.attn_proj_w, Slice1D(), dfull, a.atty.as<T>(N, Cl_),
                              m.attn_proj_w, dy_rounded<T>(C_));
  tp_.row_parallel_bias_backward(g.attn_proj_b, dfull, dres);
  attention_.backward(as_matrix(dqkv_, N, Q_), as_matrix(datty_, N, Cl_), attention_output<T>(a.atty), saved(a));
  kernels::linear_backward<T>(as_matrix(dln_, N, C_), g.attn_w, g.attn_b, as_matrix(dqkv_, N, Q_), a.ln1.as<T>(N, C_),
                              m.attn_w, dy_rounded<T>(Q_));
  // The key bias cannot change any output (it adds q . b_k to every score of
  // a softmax row), so its gradient is exactly zero. Store that zero, not
  // the rounding noise of a column sum, which Adam would amplify into
  // updates that differ between layouts.
  kernels::fill(Slice1D(g.attn_b.data() + Cl_, Cl_), 0);
  gin = tp_.reduce_input_grad(as_matrix(dln_, N, C_));
  kernels::layernorm_backward(dres, g.ln1_w, g.ln1_b, gin, x, w.ln1_w, a.ln1_mean, a.ln1_rstd);
}

}  // namespace ndmini
