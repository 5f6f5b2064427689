// SPDX-License-Identifier: BSD-3-Clause
#include "model/block.hpp"

#include <string>
#include <type_traits>
#include <utility>

#include "core/error.hpp"
#include "kernels/kernels.hpp"

namespace ndmini {

const std::array<BlockTensorSpec, 40> kBlockTensors = {{
    {"ln_1/weight", &BlockTensors::ln1_w, nullptr, nullptr},
    {"ln_1/bias", &BlockTensors::ln1_b, nullptr, nullptr},
    {"attn/c_attn/weight", nullptr, &BlockTensors::attn_w, &BlockMatricesBf16::attn_w},
    {"attn/c_attn/bias", &BlockTensors::attn_b, nullptr, nullptr},
    // Grouped-query attention: q, k and v side by side make c_attn's rows.
    {"attn/c_q/weight", nullptr, &BlockTensors::attn_w, &BlockMatricesBf16::attn_w},
    {"attn/c_k/weight", nullptr, &BlockTensors::attn_w, &BlockMatricesBf16::attn_w},
    {"attn/c_v/weight", nullptr, &BlockTensors::attn_w, &BlockMatricesBf16::attn_w},
    {"attn/c_q/bias", &BlockTensors::attn_b, nullptr, nullptr},
    {"attn/c_k/bias", &BlockTensors::attn_b, nullptr, nullptr},
    {"attn/c_v/bias", &BlockTensors::attn_b, nullptr, nullptr},
    {"attn/c_proj/weight", nullptr, &BlockTensors::attn_proj_w, &BlockMatricesBf16::attn_proj_w},
    {"attn/c_proj/bias", &BlockTensors::attn_proj_b, nullptr, nullptr},
    {"ln_2/weight", &BlockTensors::ln2_w, nullptr, nullptr},
    {"ln_2/bias", &BlockTensors::ln2_b, nullptr, nullptr},
    {"mlp/c_fc/weight", nullptr, &BlockTensors::fc_w, &BlockMatricesBf16::fc_w},
    {"mlp/c_fc/bias", &BlockTensors::fc_b, nullptr, nullptr},
    {"mlp/c_gate/weight", nullptr, &BlockTensors::fc_w, &BlockMatricesBf16::fc_w},
    {"mlp/c_gate/bias", &BlockTensors::fc_b, nullptr, nullptr},
    {"mlp/c_up/weight", nullptr, &BlockTensors::up_w, &BlockMatricesBf16::up_w},
    {"mlp/c_up/bias", &BlockTensors::up_b, nullptr, nullptr},
    {"mlp/c_proj/weight", nullptr, &BlockTensors::mlp_proj_w, &BlockMatricesBf16::mlp_proj_w},
    {"mlp/c_proj/bias", &BlockTensors::mlp_proj_b, nullptr, nullptr},
    // An MoE block: the router and the routed experts (the layer's ExpertTensors) ...
    {"mlp/router/weight", nullptr, &BlockTensors::router_w, nullptr},
    {"mlp/router/selection_bias", &BlockTensors::selection_bias, nullptr, nullptr},
    {"mlp/experts/c_fc/weight", nullptr, &BlockTensors::expert_fc_w, &BlockMatricesBf16::expert_fc_w},
    {"mlp/experts/c_fc/bias", &BlockTensors::expert_fc_b, nullptr, nullptr},
    {"mlp/experts/c_gate/weight", nullptr, &BlockTensors::expert_fc_w, &BlockMatricesBf16::expert_fc_w},
    {"mlp/experts/c_gate/bias", &BlockTensors::expert_fc_b, nullptr, nullptr},
    {"mlp/experts/c_up/weight", nullptr, &BlockTensors::expert_up_w, &BlockMatricesBf16::expert_up_w},
    {"mlp/experts/c_up/bias", &BlockTensors::expert_up_b, nullptr, nullptr},
    {"mlp/experts/c_proj/weight", nullptr, &BlockTensors::expert_proj_w, &BlockMatricesBf16::expert_proj_w},
    {"mlp/experts/c_proj/bias", &BlockTensors::expert_proj_b, nullptr, nullptr},
    // ... and its shared expert: the dense MLP's members, computed by the dense MLP's code.
    {"mlp/shared/c_fc/weight", nullptr, &BlockTensors::fc_w, &BlockMatricesBf16::fc_w},
    {"mlp/shared/c_fc/bias", &BlockTensors::fc_b, nullptr, nullptr},
    {"mlp/shared/c_gate/weight", nullptr, &BlockTensors::fc_w, &BlockMatricesBf16::fc_w},
    {"mlp/shared/c_gate/bias", &BlockTensors::fc_b, nullptr, nullptr},
    {"mlp/shared/c_up/weight", nullptr, &BlockTensors::up_w, &BlockMatricesBf16::up_w},
    {"mlp/shared/c_up/bias", &BlockTensors::up_b, nullptr, nullptr},
    {"mlp/shared/c_proj/weight", nullptr, &BlockTensors::mlp_proj_w, &BlockMatricesBf16::mlp_proj_w},
    {"mlp/shared/c_proj/bias", &BlockTensors::mlp_proj_b, nullptr, nullptr},
}};

ExpertTensors expert_tensors(const BlockTensors& t) {
  return {t.router_w,      t.selection_bias, t.expert_fc_w, t.expert_up_w,
          t.expert_proj_w, t.expert_fc_b,    t.expert_up_b, t.expert_proj_b};
}

void swap_routing(MoeActivations& to, MoeActivations& from) {
  std::swap(to.expert, from.expert);
  std::swap(to.weight, from.weight);
  std::swap(to.logit, from.logit);
  std::swap(to.score, from.score);
  std::swap(to.counts, from.counts);
  std::swap(to.sequence_load, from.sequence_load);
  std::swap(to.routed, from.routed);
}

namespace {

const BlockTensorSpec& spec_of(const std::string& name) {
  // The name after "h/<layer>/".
  const std::size_t slash = name.find('/', 2);
  const std::string suffix = slash == std::string::npos ? name : name.substr(slash + 1);
  for (const BlockTensorSpec& s : kBlockTensors)
    if (suffix == s.suffix) return s;
  throw InternalError("a block unit holds " + name + ", a tensor no block computes with");
}

bool same_member(const BlockTensorSpec& a, const BlockTensorSpec& b) {
  return a.vector != nullptr ? a.vector == b.vector : a.matrix == b.matrix;
}

}  // namespace

BlockLayout::BlockLayout(const ParamLayout& layout, int unit) {
  const int experts = layout.experts_unit[static_cast<std::size_t>(unit)];
  for (const ParamInfo& p : layout.params) {
    if (p.unit != unit && p.unit != experts) continue;
    const BlockTensorSpec& spec = spec_of(p.name);
    // A matrix's rows: all its dimensions but the last (experts [E, rows,
    // cols] are [E rows, cols]); a vector member views every element.
    std::size_t rows = p.size, cols = 1;
    if (spec.vector == nullptr) {
      cols = static_cast<std::size_t>(p.shape.back());
      rows = p.size / cols;
    }
    const std::size_t offset = p.offset - layout.unit_offset[p.unit];
    Place* joined = nullptr;
    for (Place& q : places_)
      if (same_member(*q.spec, spec)) joined = &q;
    if (joined == nullptr) {
      places_.push_back({&spec, p.unit == experts, offset, rows, cols});
      continue;
    }
    // c_k and c_v extend c_q's rows: one matrix only if nothing lies between.
    if (joined->in_experts_unit != (p.unit == experts) || joined->cols != cols ||
        joined->offset + joined->rows * joined->cols != offset)
      throw InternalError(p.name + " does not follow " + joined->spec->suffix + " in its unit without a gap");
    joined->rows += rows;
  }
  if (places_.empty()) throw InternalError("a block unit holds no tensor");
}

template <class P>
P* BlockLayout::base_of(const Place& p, P* unit_base, P* experts_base) {
  P* base = p.in_experts_unit ? experts_base : unit_base;
  if (base == nullptr) throw InternalError(std::string(p.spec->suffix) + ": its unit was not given");
  return base + p.offset;
}

BlockTensors BlockLayout::view(real* unit_base, real* experts_base) const {
  BlockTensors t;
  for (const Place& p : places_) {
    if (p.spec->vector != nullptr)
      t.*p.spec->vector = Slice1D(base_of(p, unit_base, experts_base), p.rows);
    else
      t.*p.spec->matrix = Slice2D(base_of(p, unit_base, experts_base), p.rows, p.cols);
  }
  return t;
}

BlockMatricesBf16 BlockLayout::view_bf16(const bf16* unit_base, const bf16* experts_base) const {
  BlockMatricesBf16 t;
  for (const Place& p : places_)
    if (p.spec->bf16_matrix != nullptr)
      t.*p.spec->bf16_matrix = ConstBf16Slice2D(base_of(p, unit_base, experts_base), p.rows, p.cols);
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
    // An MoE block without a shared expert has no MLP hidden (F = 0): nothing allocated.
    if (!t.kept_by(*this, output_only) || (this->*t.elements)() == 0) continue;
    const std::size_t element = t.operand != nullptr && bf16 ? sizeof(ndmini::bf16) : sizeof(real);
    kept.push_back({t.name, (this->*t.elements)() * element});
  }
  // The routed experts' operands; with recomputation only the routing, on the host.
  if (moe && !output_only) kept.push_back({"moe", moe_kept});
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

TransformerBlock::TransformerBlock(const ModelConfig& m, TensorParallel& tp, ContextParallelAttention& attention,
                                   ConstTokenView positions, bool bf16, ExpertParallel* experts)
    : tp_(tp),
      attention_(attention),
      experts_(experts),
      sizes_{
          static_cast<std::size_t>(m.channels), tp.rows(), tp.local_rows(), tp.size(), attention.local_shape(), bf16},
      norm_{m.norm == NormKind::rmsnorm, static_cast<real>(m.norm_eps)},
      rope_(!m.learned_positions()),
      rope_theta_(static_cast<real>(m.rope_theta)),
      positions_(positions),
      head_size_(m.head_size()) {
  if (experts_ != nullptr)
    sizes_.set_moe_widths(m, experts_->sizes());
  else
    sizes_.set_widths(m);
  C_ = m.channels;
  Cl_ = C_ / tp.size();
  KVl_ = sizes_.kv_width / tp.size();
  F_ = sizes_.ffn / tp.size();
  Q_ = attention.local_shape().qkv_width();  // (H + 2 KV) hs / tp: q, then k and v of the kv heads
  if (Q_ != sizes_.qkv_width / tp.size() || Q_ != Cl_ + 2 * KVl_)
    throw InternalError("the attention's q, k and v widths are not the block's");
  if (rope_ && positions_.extent(0) != tp.rows())
    throw InternalError("RoPE needs the position of each of the block's rows");
  const BlockSizes& n = sizes_;
  qkv_ = uninitialized("ndmini::qkv", n.qkv());
  dln_ = uninitialized("ndmini::dln", n.full());
  if (n.hidden() > 0) dfc_ = uninitialized("ndmini::dfc", n.hidden());
  if (n.gated && n.hidden() > 0) dup_ = uninitialized("ndmini::dup", n.hidden());
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
    if (n == 0) continue;  // an MoE block without a shared expert: no MLP hidden
    if (t.fp32 != nullptr)
      a.*t.fp32 = uninitialized(label, n);
    else if (sizes_.bf16)
      (a.*t.operand).bf16 = uninitialized_bf16(label + "_bf16", n);
    else
      (a.*t.operand).fp32 = uninitialized(label, n);
  }
  if (experts_ != nullptr && !output_only) a.moe = experts_->allocate();
  return a;
}

MoeRouteStats TransformerBlock::forward(const BlockWeights& w, ConstSlice2D x, BlockActivations& a) {
  if (sizes_.bf16) return forward_as<bf16>(w, x, a);
  return forward_as<real>(w, x, a);
}

void TransformerBlock::backward(const BlockWeights& w, const BlockTensors& g, ConstSlice2D x, const BlockActivations& a,
                                Slice2D dres, real loss_scale) {
  if (sizes_.bf16)
    backward_as<bf16>(w, g, x, a, dres, loss_scale);
  else
    backward_as<real>(w, g, x, a, dres, loss_scale);
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
    return {w.attn_w, w.attn_proj_w, w.fc_w, w.up_w, w.mlp_proj_w, w.expert_fc_w, w.expert_up_w, w.expert_proj_w};
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
ConstMatrix<T> TransformerBlock::routed_rows(const KeptOperand& full) const {
  const Matrix<T> all = full.as<T>(tp_.rows(), C_);
  return ConstMatrix<T>(all.data() + tp_.first_local_row() * C_, tp_.local_rows(), C_);
}

template <class T>
MoeRouteStats TransformerBlock::forward_as(const BlockWeights& weights, ConstSlice2D x, BlockActivations& a) {
  const BlockTensors& w = weights.w;
  const BlockMatrices<T> m = operands<T>(weights);
  const std::size_t N = tp_.rows(), Nr = tp_.local_rows();
  const Matrix<T> ln1 = a.ln1.as<T>(N, C_);
  tp_.norm_enter<T>(ln1, a.ln1_mean, a.ln1_rstd, x, w.ln1_w, w.ln1_b, norm_);
  const Slice2D qkv = as_matrix(qkv_, N, Q_);
  kernels::linear_forward<T>(qkv, ln1, m.attn_w, w.attn_b);
  // RoPE turns q and k (this rank's heads of each, side by side), not v.
  if (rope_) kernels::rope_forward(qkv, positions_, static_cast<int>(Cl_ + KVl_), head_size_, rope_theta_);
  const Slice2D atty = landing<T>(a.atty, datty_, N, Cl_);
  attention_.forward(atty, qkv, saved(a));
  keep<T>(a.atty, atty);
  tp_.row_parallel_forward<T>(as_matrix(a.res2, Nr, C_), a.atty.as<T>(N, Cl_), m.attn_proj_w, w.attn_proj_b, x);
  const Matrix<T> ln2 = a.ln2.as<T>(N, C_);
  tp_.norm_enter<T>(ln2, a.ln2_mean, a.ln2_rstd, as_matrix(a.res2, Nr, C_), w.ln2_w, w.ln2_b, norm_);
  // res3 = res2 + the MLP (an MoE block: the shared expert, if any) ...
  if (F_ > 0)
    mlp_forward<T>(weights, a);
  else
    Kokkos::deep_copy(a.res3, a.res2);
  if (experts_ == nullptr) return {};
  // ... + the routed experts of the rows this rank holds (its residual rows).
  return experts_->forward<T>(as_matrix(a.res3, Nr, C_), routed_rows<T>(a.ln2), expert_tensors(w), m.experts(), a.moe);
}

template <class T>
void TransformerBlock::mlp_forward(const BlockWeights& weights, BlockActivations& a) {
  const BlockTensors& w = weights.w;
  const BlockMatrices<T> m = operands<T>(weights);
  const std::size_t N = tp_.rows(), Nr = tp_.local_rows();
  const Matrix<T> ln2 = a.ln2.as<T>(N, C_);
  // The MLP's input of the down projection (c_proj): gelu(c_fc x), or
  // silu(c_gate x) * (c_up x). Gate and up are two products (the same FLOPs
  // as one of twice the rows): each output stays a contiguous [N, F/tp]
  // operand, kept as such for the backward.
  const KeptOperand& down_input = sizes_.gated ? a.fch_swiglu : a.fch_gelu;
  const Slice2D fch = landing<T>(a.fch, dfc_, N, F_);
  kernels::linear_forward<T>(fch, ln2, m.fc_w, w.fc_b);
  if (sizes_.gated) {
    const Slice2D up = landing<T>(a.fch_up, dup_, N, F_);
    kernels::linear_forward<T>(up, ln2, m.up_w, w.up_b);
    kernels::swiglu_forward(a.fch_swiglu.as<T>(N, F_), fch, up);
    keep<T>(a.fch_up, up);
  } else {
    kernels::gelu_forward(a.fch_gelu.as<T>(N, F_), fch);
  }
  keep<T>(a.fch, fch);
  tp_.row_parallel_forward<T>(as_matrix(a.res3, Nr, C_), down_input.as<T>(N, F_), m.mlp_proj_w, w.mlp_proj_b,
                              as_matrix(a.res2, Nr, C_));
}

template <class T>
void TransformerBlock::mlp_backward(const BlockWeights& weights, const BlockTensors& g, const BlockActivations& a,
                                    Slice2D dres) {
  const BlockMatrices<T> m = operands<T>(weights);
  const std::size_t N = tp_.rows();
  ConstSlice2D dfull = tp_.gather_output_grad(dres);
  const Slice2D dfc = as_matrix(dfc_, N, F_);
  const KeptOperand& down_input = sizes_.gated ? a.fch_swiglu : a.fch_gelu;
  kernels::linear_backward<T>(dfc, g.mlp_proj_w, Slice1D(), dfull, down_input.as<T>(N, F_), m.mlp_proj_w,
                              dy_rounded<T>(C_));
  tp_.row_parallel_bias_backward(g.mlp_proj_b, dfull, dres);
  if (sizes_.gated) {
    // d(gate) in place of d(product) in dfc_, d(up) in dup_; d(ln2) sums both products' input gradients.
    const Slice2D dup = as_matrix(dup_, N, F_);
    kernels::swiglu_backward(dfc, dup, a.fch.as<T>(N, F_), a.fch_up.as<T>(N, F_), dfc);
    kernels::linear_backward<T>(as_matrix(dln_, N, C_), g.fc_w, g.fc_b, dfc, a.ln2.as<T>(N, C_), m.fc_w,
                                dy_rounded<T>(F_));
    kernels::linear_backward<T>(as_matrix(dln_, N, C_), g.up_w, g.up_b, dup, a.ln2.as<T>(N, C_), m.up_w,
                                dy_rounded<T>(F_), real(1));
  } else {
    kernels::gelu_backward(dfc, a.fch.as<T>(N, F_), dfc);
    kernels::linear_backward<T>(as_matrix(dln_, N, C_), g.fc_w, g.fc_b, dfc, a.ln2.as<T>(N, C_), m.fc_w,
                                dy_rounded<T>(F_));
  }
}

template <class T>
void TransformerBlock::backward_as(const BlockWeights& weights, const BlockTensors& g, ConstSlice2D x,
                                   const BlockActivations& a, Slice2D dres, real loss_scale) {
  const BlockTensors& w = weights.w;
  const BlockMatrices<T> m = operands<T>(weights);
  const std::size_t N = tp_.rows(), Nr = tp_.local_rows();
  // dres is d(res3); res3 = res2 + mlp(ln2(res2)), so d(res2) starts as a copy
  // (the norm's backward adds into it). d(ln2) over all N rows lands in dln_.
  if (F_ > 0)
    mlp_backward<T>(weights, g, a, dres);
  else
    kernels::fill(Slice1D(dln_.data(), N * C_), 0);  // only the routed rows' d(ln2) is added below
  if (experts_ != nullptr) {
    // The routed experts add d(ln2) of this rank's rows; the sum over tp below
    // brings every rank's rows together (zero elsewhere).
    const Slice2D dln_rows(dln_.data() + tp_.first_local_row() * C_, Nr, C_);
    experts_->backward<T>(dln_rows, expert_tensors(g), dres, routed_rows<T>(a.ln2), expert_tensors(w), m.experts(),
                          a.moe, loss_scale);
  }
  ConstSlice2D gin = tp_.reduce_input_grad(as_matrix(dln_, N, C_));
  kernels::norm_backward(dres, g.ln2_w, g.ln2_b, gin, as_matrix(a.res2, Nr, C_), w.ln2_w, a.ln2_mean, a.ln2_rstd,
                         norm_);
  // dres is now d(res2); res2 = x + attn(ln1(x)).
  ConstSlice2D dfull = tp_.gather_output_grad(dres);
  kernels::linear_backward<T>(as_matrix(datty_, N, Cl_), g.attn_proj_w, Slice1D(), dfull, a.atty.as<T>(N, Cl_),
                              m.attn_proj_w, dy_rounded<T>(C_));
  tp_.row_parallel_bias_backward(g.attn_proj_b, dfull, dres);
  const Slice2D dqkv = as_matrix(dqkv_, N, Q_);
  attention_.backward(dqkv, as_matrix(datty_, N, Cl_), attention_output<T>(a.atty), saved(a));
  // d(q) and d(k) back through the rotation (its transpose).
  if (rope_) kernels::rope_backward(dqkv, positions_, static_cast<int>(Cl_ + KVl_), head_size_, rope_theta_);
  kernels::linear_backward<T>(as_matrix(dln_, N, C_), g.attn_w, g.attn_b, dqkv, a.ln1.as<T>(N, C_), m.attn_w,
                              dy_rounded<T>(Q_));
  // The key bias cannot change any output (it adds q . b_k to every score of
  // a softmax row), so its gradient is exactly zero. Store that zero, not
  // the rounding noise of a column sum, which Adam would amplify into
  // updates that differ between layouts. (Under RoPE the rotated key bias
  // does change the scores: its gradient is a real one.)
  if (g.attn_b.extent(0) > 0 && !rope_) kernels::fill(Slice1D(g.attn_b.data() + Cl_, KVl_), 0);
  gin = tp_.reduce_input_grad(as_matrix(dln_, N, C_));
  kernels::norm_backward(dres, g.ln1_w, g.ln1_b, gin, x, w.ln1_w, a.ln1_mean, a.ln1_rstd, norm_);
}

}  // namespace ndmini
