// SPDX-License-Identifier: BSD-3-Clause
#include "model/gpt.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "kernels/kernels.hpp"

namespace ndmini {
namespace {

// Parameter offsets are rounded up to 64 bytes so every tensor starts on a
// cache line (and a SIMD boundary) of the flat buffer.
constexpr std::size_t kAlign = 16;

std::size_t round_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

View1D alloc(const std::string& label, std::size_t n) { return View1D("ndmini::" + label, n); }

}  // namespace

std::vector<ParamInfo> gpt_param_layout(const ModelConfig& m) {
  const std::int64_t C = m.channels, V = m.vocab, T = m.seq_len;
  std::vector<ParamInfo> out;
  std::size_t offset = 0;
  auto add = [&](std::string name, std::vector<std::int64_t> shape) {
    std::size_t size = 1;
    for (auto d : shape) size *= static_cast<std::size_t>(d);
    const bool decay = shape.size() == 2;
    out.push_back({std::move(name), std::move(shape), offset, size, decay});
    offset += round_up(size);
  };
  add("wte", {V, C});
  add("wpe", {T, C});
  for (int l = 0; l < m.layers; ++l) {
    const std::string p = "h/" + std::to_string(l) + "/";
    add(p + "ln_1/weight", {C});
    add(p + "ln_1/bias", {C});
    add(p + "attn/c_attn/weight", {3 * C, C});
    add(p + "attn/c_attn/bias", {3 * C});
    add(p + "attn/c_proj/weight", {C, C});
    add(p + "attn/c_proj/bias", {C});
    add(p + "ln_2/weight", {C});
    add(p + "ln_2/bias", {C});
    add(p + "mlp/c_fc/weight", {4 * C, C});
    add(p + "mlp/c_fc/bias", {4 * C});
    add(p + "mlp/c_proj/weight", {C, 4 * C});
    add(p + "mlp/c_proj/bias", {C});
  }
  add("ln_f/weight", {C});
  add("ln_f/bias", {C});
  return out;
}

std::int64_t gpt_param_count(const ModelConfig& m) {
  std::int64_t n = 0;
  for (const auto& p : gpt_param_layout(m)) n += p.size;
  return n;
}

std::int64_t gpt_flops_param_count(const ModelConfig& m) {
  return gpt_param_count(m) - static_cast<std::int64_t>(m.seq_len) * m.channels;
}

double gpt_flops_per_token(const ModelConfig& m) {
  return 6.0 * gpt_flops_param_count(m) + 12.0 * m.layers * m.channels * m.seq_len;
}

std::int64_t gpt_state_bytes(const ModelConfig& m) {
  // parameters, gradients, exp_avg, exp_avg_sq
  return 4 * gpt_param_count(m) * static_cast<std::int64_t>(sizeof(real));
}

std::int64_t gpt_activation_bytes(const ModelConfig& m, int micro_batch) {
  const std::int64_t B = micro_batch, T = m.seq_len, C = m.channels, H = m.heads, L = m.layers, V = m.vocab;
  const std::int64_t N = B * T;
  const std::int64_t per_layer = 16 * N * C + B * H * T * T + 4 * N;
  const std::int64_t kept = N * C + L * per_layer + N * C + 2 * N + N * V + N;
  const std::int64_t scratch = 3 * N * C + N * C + N * C + N * C + 4 * N * C + 3 * N * C + N * C + N * C +
                               3 * N * C + T * T;
  return (kept + scratch) * static_cast<std::int64_t>(sizeof(real));
}

GPT::GPT(const ModelConfig& m, int micro_batch) : cfg_(m), batch_(micro_batch), layout_(gpt_param_layout(m)) {
  const std::size_t total = layout_.back().offset + round_up(layout_.back().size);
  params_ = alloc("params", total);
  grads_ = alloc("grads", total);
  const std::size_t N = static_cast<std::size_t>(batch_) * m.seq_len, C = m.channels, T = m.seq_len;
  const std::size_t att = static_cast<std::size_t>(batch_) * m.heads * T * T;
  encoded_ = alloc("encoded", N * C);
  layers_.resize(m.layers);
  for (auto& a : layers_) {
    a.ln1 = alloc("ln1", N * C);
    a.ln1_mean = alloc("ln1_mean", N);
    a.ln1_rstd = alloc("ln1_rstd", N);
    a.qkvh = alloc("qkvh", 3 * N * C);
    a.att = alloc("att", att);
    a.atty = alloc("atty", N * C);
    a.res2 = alloc("res2", N * C);
    a.ln2 = alloc("ln2", N * C);
    a.ln2_mean = alloc("ln2_mean", N);
    a.ln2_rstd = alloc("ln2_rstd", N);
    a.fch = alloc("fch", 4 * N * C);
    a.fch_gelu = alloc("fch_gelu", 4 * N * C);
    a.res3 = alloc("res3", N * C);
  }
  lnf_ = alloc("lnf", N * C);
  lnf_mean_ = alloc("lnf_mean", N);
  lnf_rstd_ = alloc("lnf_rstd", N);
  logits_ = alloc("logits", N * m.vocab);
  losses_ = alloc("losses", N);
  qkv_ = alloc("qkv", 3 * N * C);
  att_y_ = alloc("att_y", N * C);
  dres_ = alloc("dres", N * C);
  dln_ = alloc("dln", N * C);
  dfc_ = alloc("dfc", 4 * N * C);
  dqkv_ = alloc("dqkv", 3 * N * C);
  datty_ = alloc("datty", N * C);
  dscratch_dy_ = alloc("dscratch_dy", N * C);
  dscratch_qkvh_ = alloc("dscratch_qkvh", 3 * N * C);
  dscratch_att_ = alloc("dscratch_att", T * T);
}

const ParamInfo& GPT::param(const std::string& name) const {
  for (const auto& p : layout_)
    if (p.name == name) return p;
  throw Error("internal: no parameter named '" + name + "'");
}

Slice2D GPT::w(const std::string& name) const {
  const auto& p = param(name);
  return Slice2D(params_.data() + p.offset, p.shape[0], p.shape[1]);
}
Slice1D GPT::v(const std::string& name) const {
  const auto& p = param(name);
  return Slice1D(params_.data() + p.offset, p.size);
}
Slice2D GPT::gw(const std::string& name) const {
  const auto& p = param(name);
  return Slice2D(grads_.data() + p.offset, p.shape[0], p.shape[1]);
}
Slice1D GPT::gv(const std::string& name) const {
  const auto& p = param(name);
  return Slice1D(grads_.data() + p.offset, p.size);
}

void GPT::init(std::uint64_t seed) {
  const real std_proj = static_cast<real>(0.02 / std::sqrt(2.0 * cfg_.layers));
  for (const auto& p : layout_) {
    Slice1D x(params_.data() + p.offset, p.size);
    const bool is_bias = p.name.size() >= 4 && p.name.compare(p.name.size() - 4, 4, "bias") == 0;
    const bool is_ln = p.name.find("ln_") != std::string::npos;
    if (is_ln) {
      kernels::fill(x, is_bias ? real(0) : real(1));
    } else if (is_bias) {
      kernels::fill(x, 0);
    } else {
      const bool is_proj = p.name.find("c_proj/weight") != std::string::npos;
      kernels::init_normal(x, rng::stream_key(seed, p.name), 0, is_proj ? std_proj : real(0.02));
    }
  }
  Kokkos::deep_copy(grads_, real(0));
}

namespace {
// [rows, cols] view of a flat activation buffer.
Slice2D mat(const View1D& v, std::size_t rows, std::size_t cols) { return Slice2D(v.data(), rows, cols); }
}  // namespace

void GPT::forward(ConstTokenView tokens) {
  const int T = cfg_.seq_len, C = cfg_.channels;
  const std::size_t N = static_cast<std::size_t>(batch_) * T;
  const kernels::AttentionShape shape{batch_, T, C, cfg_.heads};
  kernels::embedding_forward(mat(encoded_, N, C), tokens, w("wte"), w("wpe"), T);
  View1D x = encoded_;
  for (int l = 0; l < cfg_.layers; ++l) {
    auto& a = layers_[l];
    const std::string p = "h/" + std::to_string(l) + "/";
    kernels::layernorm_forward(mat(a.ln1, N, C), a.ln1_mean, a.ln1_rstd, mat(x, N, C), v(p + "ln_1/weight"),
                               v(p + "ln_1/bias"));
    kernels::linear_forward(mat(qkv_, N, 3 * C), mat(a.ln1, N, C), w(p + "attn/c_attn/weight"),
                            v(p + "attn/c_attn/bias"));
    kernels::attention_forward(mat(a.atty, N, C), a.qkvh, a.att, att_y_, mat(qkv_, N, 3 * C), shape);
    kernels::linear_forward(mat(a.res2, N, C), mat(a.atty, N, C), w(p + "attn/c_proj/weight"),
                            v(p + "attn/c_proj/bias"), mat(x, N, C));
    kernels::layernorm_forward(mat(a.ln2, N, C), a.ln2_mean, a.ln2_rstd, mat(a.res2, N, C), v(p + "ln_2/weight"),
                               v(p + "ln_2/bias"));
    kernels::linear_forward(mat(a.fch, N, 4 * C), mat(a.ln2, N, C), w(p + "mlp/c_fc/weight"), v(p + "mlp/c_fc/bias"));
    kernels::gelu_forward(mat(a.fch_gelu, N, 4 * C), mat(a.fch, N, 4 * C));
    kernels::linear_forward(mat(a.res3, N, C), mat(a.fch_gelu, N, 4 * C), w(p + "mlp/c_proj/weight"),
                            v(p + "mlp/c_proj/bias"), mat(a.res2, N, C));
    x = a.res3;
  }
  kernels::layernorm_forward(mat(lnf_, N, C), lnf_mean_, lnf_rstd_, mat(x, N, C), v("ln_f/weight"), v("ln_f/bias"));
  // The LM head is tied to the token embedding: logits = lnf wte^T.
  kernels::linear_forward(mat(logits_, N, cfg_.vocab), mat(lnf_, N, C), w("wte"), Slice1D());
}

void GPT::backward(ConstTokenView tokens) {
  const int T = cfg_.seq_len, C = cfg_.channels;
  const std::size_t N = static_cast<std::size_t>(batch_) * T;
  const kernels::AttentionShape shape{batch_, T, C, cfg_.heads};
  const View1D& last = cfg_.layers > 0 ? layers_.back().res3 : encoded_;
  // logits_ already holds dlogits (fused into the loss).
  kernels::linear_backward(mat(dln_, N, C), gw("wte"), Slice1D(), mat(logits_, N, cfg_.vocab), mat(lnf_, N, C),
                           w("wte"));
  Kokkos::deep_copy(dres_, real(0));
  kernels::layernorm_backward(mat(dres_, N, C), gv("ln_f/weight"), gv("ln_f/bias"), mat(dln_, N, C), mat(last, N, C),
                              v("ln_f/weight"), lnf_mean_, lnf_rstd_);
  for (int l = cfg_.layers - 1; l >= 0; --l) {
    auto& a = layers_[l];
    const View1D& x = l > 0 ? layers_[l - 1].res3 : encoded_;
    const std::string p = "h/" + std::to_string(l) + "/";
    // dres is d(res3); res3 = res2 + mlp(ln2(res2)), so d(res2) starts as a copy.
    kernels::linear_backward(mat(dfc_, N, 4 * C), gw(p + "mlp/c_proj/weight"), gv(p + "mlp/c_proj/bias"),
                             mat(dres_, N, C), mat(a.fch_gelu, N, 4 * C), w(p + "mlp/c_proj/weight"));
    kernels::gelu_backward(mat(dfc_, N, 4 * C), mat(a.fch, N, 4 * C), mat(dfc_, N, 4 * C));
    kernels::linear_backward(mat(dln_, N, C), gw(p + "mlp/c_fc/weight"), gv(p + "mlp/c_fc/bias"),
                             mat(dfc_, N, 4 * C), mat(a.ln2, N, C), w(p + "mlp/c_fc/weight"));
    kernels::layernorm_backward(mat(dres_, N, C), gv(p + "ln_2/weight"), gv(p + "ln_2/bias"), mat(dln_, N, C),
                                mat(a.res2, N, C), v(p + "ln_2/weight"), a.ln2_mean, a.ln2_rstd);
    // dres is now d(res2); res2 = x + attn(ln1(x)).
    kernels::linear_backward(mat(datty_, N, C), gw(p + "attn/c_proj/weight"), gv(p + "attn/c_proj/bias"),
                             mat(dres_, N, C), mat(a.atty, N, C), w(p + "attn/c_proj/weight"));
    kernels::attention_backward(mat(dqkv_, N, 3 * C), dscratch_dy_, dscratch_qkvh_, dscratch_att_,
                                mat(datty_, N, C), a.qkvh, a.att, shape);
    kernels::linear_backward(mat(dln_, N, C), gw(p + "attn/c_attn/weight"), gv(p + "attn/c_attn/bias"),
                             mat(dqkv_, N, 3 * C), mat(a.ln1, N, C), w(p + "attn/c_attn/weight"));
    kernels::layernorm_backward(mat(dres_, N, C), gv(p + "ln_1/weight"), gv(p + "ln_1/bias"), mat(dln_, N, C),
                                mat(x, N, C), v(p + "ln_1/weight"), a.ln1_mean, a.ln1_rstd);
  }
  kernels::embedding_backward(gw("wte"), gw("wpe"), mat(dres_, N, C), tokens, T);
}

double GPT::forward_backward(ConstTokenView tokens, ConstTokenView targets, real loss_scale) {
  forward(tokens);
  const std::size_t N = static_cast<std::size_t>(batch_) * cfg_.seq_len;
  const double loss_sum = kernels::softmax_cross_entropy(mat(logits_, N, cfg_.vocab), losses_, targets, loss_scale);
  backward(tokens);
  return loss_sum;
}

double GPT::forward_loss(ConstTokenView tokens, ConstTokenView targets) {
  forward(tokens);
  const std::size_t N = static_cast<std::size_t>(batch_) * cfg_.seq_len;
  return kernels::cross_entropy_loss(mat(logits_, N, cfg_.vocab), targets);
}

}  // namespace ndmini
