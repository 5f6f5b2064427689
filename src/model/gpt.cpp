// SPDX-License-Identifier: BSD-3-Clause
#include "model/gpt.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "kernels/kernels.hpp"

namespace ndmini {
namespace {

// Parameter offsets are rounded up to 16 floats (64 bytes) so every tensor
// starts on a cache line (and a SIMD boundary) of the flat buffer.
constexpr std::size_t kAlign = 16;

std::size_t round_up(std::size_t n, std::size_t multiple) { return (n + multiple - 1) / multiple * multiple; }

View1D alloc(const std::string& label, std::size_t n) { return View1D("ndmini::" + label, n); }

// [rows, cols] view of a flat buffer.
Slice2D mat(const View1D& v, std::size_t rows, std::size_t cols) { return Slice2D(v.data(), rows, cols); }

}  // namespace

ParamLayout gpt_param_layout(const ModelConfig& m, int tp, int tp_rank, std::size_t pad) {
  const std::int64_t C = m.channels, V = m.vocab, T = m.seq_len;
  ParamLayout layout;
  layout.tp_rank = tp_rank;
  layout.tp_size = tp;
  std::size_t offset = 0;
  auto add = [&](std::string name, std::vector<std::int64_t> global, TpSplit split, int sections, int unit) {
    std::vector<std::int64_t> local = global;
    if (split == TpSplit::rows) local[0] /= tp;
    if (split == TpSplit::cols) local[1] /= tp;
    std::size_t size = 1;
    for (auto d : local) size *= static_cast<std::size_t>(d);
    const bool decay = global.size() == 2;
    layout.params.push_back(
        {std::move(name), std::move(global), std::move(local), split, sections, unit, offset, size, decay});
    offset += round_up(size, kAlign);
  };
  auto close_unit = [&](std::size_t unit_begin) {
    offset = unit_begin + round_up(offset - unit_begin, round_up(pad, kAlign));
    layout.unit_offset.push_back(unit_begin);
    layout.unit_size.push_back(offset - unit_begin);
  };
  // Unit 0, the root: what the embedding and the tied LM head use.
  add("wte", {V, C}, TpSplit::rows, 1, 0);
  add("wpe", {T, C}, TpSplit::replicated, 1, 0);
  add("ln_f/weight", {C}, TpSplit::replicated, 1, 0);
  add("ln_f/bias", {C}, TpSplit::replicated, 1, 0);
  close_unit(0);
  for (int l = 0; l < m.layers; ++l) {
    const std::size_t begin = offset;
    const std::string p = "h/" + std::to_string(l) + "/";
    const int u = l + 1;
    add(p + "ln_1/weight", {C}, TpSplit::replicated, 1, u);
    add(p + "ln_1/bias", {C}, TpSplit::replicated, 1, u);
    add(p + "attn/c_attn/weight", {3 * C, C}, TpSplit::rows, 3, u);
    add(p + "attn/c_attn/bias", {3 * C}, TpSplit::rows, 3, u);
    add(p + "attn/c_proj/weight", {C, C}, TpSplit::cols, 1, u);
    add(p + "attn/c_proj/bias", {C}, TpSplit::replicated, 1, u);
    add(p + "ln_2/weight", {C}, TpSplit::replicated, 1, u);
    add(p + "ln_2/bias", {C}, TpSplit::replicated, 1, u);
    add(p + "mlp/c_fc/weight", {4 * C, C}, TpSplit::rows, 1, u);
    add(p + "mlp/c_fc/bias", {4 * C}, TpSplit::rows, 1, u);
    add(p + "mlp/c_proj/weight", {C, 4 * C}, TpSplit::cols, 1, u);
    add(p + "mlp/c_proj/bias", {C}, TpSplit::replicated, 1, u);
    close_unit(begin);
  }
  layout.total = offset;
  return layout;
}

std::int64_t gpt_param_count(const ModelConfig& m) {
  // Closed form of the sizes gpt_param_layout lists (wte, wpe, ln_f; per layer
  // 12 C^2 + 13 C), so counting allocates nothing. Callers bound the deck first
  // (train/budget.hpp): a billion layers of C = 64 still fits an int64 here.
  const std::int64_t C = m.channels;
  return (static_cast<std::int64_t>(m.vocab) + m.seq_len + 2) * C + m.layers * (12 * C * C + 13 * C);
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
  const std::int64_t scratch =
      3 * N * C + N * C + N * C + N * C + 4 * N * C + 3 * N * C + N * C + N * C + 3 * N * C + T * T;
  return (kept + scratch) * static_cast<std::int64_t>(sizeof(real));
}

GPT::GPT(const ModelConfig& m, int micro_batch, const ModelParallel& par) : cfg_(m), batch_(micro_batch) {
  if (par.tp != nullptr && par.tp->size() > 1) {
    tp_ = par.tp;
    tp_size_ = tp_->size();
    tp_rank_ = tp_->rank();
    sp_ = par.sequence_parallel;
  }
  const std::size_t T = m.seq_len, C = m.channels, B = batch_;
  rows_ = B * T;
  local_rows_ = sp_ ? rows_ / tp_size_ : rows_;
  require(
      m.heads % tp_size_ == 0 && (4 * C) % tp_size_ == 0 && m.vocab % tp_size_ == 0 && (!sp_ || rows_ % tp_size_ == 0),
      "internal: the model shape does not divide over tp (the mesh should have refused it)");
  // The store learns tp and sequence parallelism from here: one source of truth.
  DataParallelGroups groups = par.data;
  groups.tp = tp_;
  groups.sequence_parallel = sp_;
  const int fsdp = groups.fsdp != nullptr ? groups.fsdp->size() : 1;
  store_ = std::make_unique<ParamStore>(gpt_param_layout(m, tp_size_, tp_rank_, fsdp * kAlign), groups);
  for (int k = 0; k < static_cast<int>(params().size()); ++k) index_[params()[k].name] = k;

  const std::size_t N = rows_, Nr = local_rows_, Cl = C / tp_size_, F = 4 * C / tp_size_, Q = 3 * C / tp_size_;
  const std::size_t att = B * (m.heads / tp_size_) * T * T;
  encoded_ = alloc("encoded", Nr * C);
  layers_.resize(m.layers);
  for (auto& a : layers_) {
    a.ln1 = alloc("ln1", N * C);
    a.ln1_mean = alloc("ln1_mean", Nr);
    a.ln1_rstd = alloc("ln1_rstd", Nr);
    a.qkvh = alloc("qkvh", N * Q);
    a.att = alloc("att", att);
    a.atty = alloc("atty", N * Cl);
    a.res2 = alloc("res2", Nr * C);
    a.ln2 = alloc("ln2", N * C);
    a.ln2_mean = alloc("ln2_mean", Nr);
    a.ln2_rstd = alloc("ln2_rstd", Nr);
    a.fch = alloc("fch", N * F);
    a.fch_gelu = alloc("fch_gelu", N * F);
    a.res3 = alloc("res3", Nr * C);
  }
  lnf_ = alloc("lnf", N * C);
  lnf_mean_ = alloc("lnf_mean", Nr);
  lnf_rstd_ = alloc("lnf_rstd", Nr);
  logits_ = alloc("logits", N * (m.vocab / tp_size_));
  losses_ = alloc("losses", N);
  qkv_ = alloc("qkv", N * Q);
  att_y_ = alloc("att_y", N * Cl);
  dres_ = alloc("dres", Nr * C);
  dln_ = alloc("dln", N * C);
  dfc_ = alloc("dfc", N * F);
  dqkv_ = alloc("dqkv", N * Q);
  datty_ = alloc("datty", N * Cl);
  dscratch_dy_ = alloc("dscratch_dy", N * Cl);
  dscratch_qkvh_ = alloc("dscratch_qkvh", N * Q);
  dscratch_att_ = alloc("dscratch_att", T * T);
  if (tp_size_ > 1) {
    xent_max_ = alloc("xent_max", N);
    xent_stats_ = alloc("xent_stats", 2 * N);
    partial_ = alloc("partial", N * C);
  }
  if (sp_) {
    ln_local_ = alloc("ln_local", Nr * C);
    dres_full_ = alloc("dres_full", N * C);
    dln_local_ = alloc("dln_local", Nr * C);
  }
}

const ParamInfo& GPT::param(const std::string& name) const {
  const auto it = index_.find(name);
  require(it != index_.end(), "internal: no parameter named '" + name + "'");
  return params()[it->second];
}

Slice2D GPT::w(const std::string& name) {
  const auto& p = param(name);
  const std::size_t at = p.offset - store_->layout().unit_offset[p.unit];
  return Slice2D(store_->params(p.unit) + at, p.shape[0], p.shape[1]);
}
Slice1D GPT::v(const std::string& name) {
  const auto& p = param(name);
  return Slice1D(store_->params(p.unit) + (p.offset - store_->layout().unit_offset[p.unit]), p.size);
}
Slice2D GPT::gw(const std::string& name) {
  const auto& p = param(name);
  const std::size_t at = p.offset - store_->layout().unit_offset[p.unit];
  return Slice2D(store_->grads(p.unit) + at, p.shape[0], p.shape[1]);
}
Slice1D GPT::gv(const std::string& name) {
  const auto& p = param(name);
  return Slice1D(store_->grads(p.unit) + (p.offset - store_->layout().unit_offset[p.unit]), p.size);
}

void GPT::init(std::uint64_t seed) {
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
    for (const auto& b : global_blocks(p, tp_rank_, piece.local_begin, piece.local_begin + piece.length)) {
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

void GPT::layernorm_to_full(const View1D& full, const View1D& mean, const View1D& rstd, const View1D& x,
                            const std::string& prefix) {
  const std::size_t C = cfg_.channels;
  if (!sp_) {
    kernels::layernorm_forward(mat(full, rows_, C), mean, rstd, mat(x, rows_, C), v(prefix + "/weight"),
                               v(prefix + "/bias"));
    return;
  }
  kernels::layernorm_forward(mat(ln_local_, local_rows_, C), mean, rstd, mat(x, local_rows_, C), v(prefix + "/weight"),
                             v(prefix + "/bias"));
  tp_->all_gather(ln_local_.data(), full.data(), local_rows_ * C);
}

void GPT::row_parallel_forward(const View1D& y, const View1D& in, int in_cols, const std::string& prefix,
                               const View1D& residual) {
  const std::size_t C = cfg_.channels;
  const Slice2D weight = w(prefix + "/weight");
  const Slice1D bias = v(prefix + "/bias");
  if (tp_size_ == 1) {
    kernels::linear_forward(mat(y, rows_, C), mat(in, rows_, in_cols), weight, bias, mat(residual, rows_, C));
  } else if (!sp_) {
    // Rank 0 seeds the residual and the bias; the all-reduce adds every rank's partial product.
    if (tp_rank_ == 0)
      kernels::linear_forward(mat(y, rows_, C), mat(in, rows_, in_cols), weight, bias, mat(residual, rows_, C));
    else
      kernels::linear_forward(mat(y, rows_, C), mat(in, rows_, in_cols), weight, Slice1D());
    tp_->all_reduce(y.data(), rows_ * C);
  } else {
    kernels::linear_forward(mat(partial_, rows_, C), mat(in, rows_, in_cols), weight, Slice1D());
    tp_->reduce_scatter(partial_.data(), y.data(), local_rows_ * C);
    kernels::add_residual_bias(mat(y, local_rows_, C), mat(residual, local_rows_, C), bias);
  }
}

View1D GPT::reduce_input_grad(const View1D& partial) {
  if (tp_size_ == 1) return partial;
  if (!sp_) {
    tp_->all_reduce(partial.data(), rows_ * cfg_.channels);
    return partial;
  }
  tp_->reduce_scatter(partial.data(), dln_local_.data(), local_rows_ * cfg_.channels);
  return dln_local_;
}

View1D GPT::full_dres() {
  if (!sp_) return dres_;
  tp_->all_gather(dres_.data(), dres_full_.data(), local_rows_ * cfg_.channels);
  return dres_full_;
}

void GPT::forward(ConstTokenView tokens) {
  const std::size_t T = cfg_.seq_len, C = cfg_.channels, N = rows_, Nr = local_rows_;
  const std::size_t Cl = C / tp_size_, F = 4 * C / tp_size_, Q = 3 * C / tp_size_;
  const int vocab_start = tp_rank_ * (cfg_.vocab / tp_size_);
  const kernels::AttentionShape shape{batch_, cfg_.seq_len, static_cast<int>(Cl), cfg_.heads / tp_size_};
  store_->gather(0);
  store_->prefetch(1);
  if (tp_size_ == 1) {
    kernels::embedding_forward(mat(encoded_, N, C), tokens, w("wte"), w("wpe"), T);
  } else {
    // Vocabulary-parallel lookup: each rank fills the rows of its tokens,
    // zeros elsewhere; the sum over tp is the embedding (exact: one non-zero term).
    if (sp_) {
      kernels::embedding_forward(mat(partial_, N, C), tokens, w("wte"), Slice2D(), T, vocab_start);
      tp_->reduce_scatter(partial_.data(), encoded_.data(), Nr * C);
    } else {
      kernels::embedding_forward(mat(encoded_, N, C), tokens, w("wte"), Slice2D(), T, vocab_start);
      tp_->all_reduce(encoded_.data(), N * C);
    }
    kernels::position_embedding_forward(mat(encoded_, Nr, C), w("wpe"), T, sp_ ? tp_rank_ * Nr : 0);
  }
  View1D x = encoded_;
  for (int l = 0; l < cfg_.layers; ++l) {
    const int unit = l + 1;
    store_->gather(unit);
    store_->prefetch(unit + 1);  // the next block's all-gather overlaps this block
    auto& a = layers_[l];
    const std::string p = "h/" + std::to_string(l) + "/";
    layernorm_to_full(a.ln1, a.ln1_mean, a.ln1_rstd, x, p + "ln_1");
    kernels::linear_forward(mat(qkv_, N, Q), mat(a.ln1, N, C), w(p + "attn/c_attn/weight"), v(p + "attn/c_attn/bias"));
    kernels::attention_forward(mat(a.atty, N, Cl), a.qkvh, a.att, att_y_, mat(qkv_, N, Q), shape);
    row_parallel_forward(a.res2, a.atty, Cl, p + "attn/c_proj", x);
    layernorm_to_full(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p + "ln_2");
    kernels::linear_forward(mat(a.fch, N, F), mat(a.ln2, N, C), w(p + "mlp/c_fc/weight"), v(p + "mlp/c_fc/bias"));
    kernels::gelu_forward(mat(a.fch_gelu, N, F), mat(a.fch, N, F));
    row_parallel_forward(a.res3, a.fch_gelu, F, p + "mlp/c_proj", a.res2);
    if (store_->reshard_after_forward()) store_->release(unit);
    x = a.res3;
  }
  layernorm_to_full(lnf_, lnf_mean_, lnf_rstd_, x, "ln_f");
  // The LM head is tied to the token embedding: logits = lnf wte^T (this rank's vocabulary).
  kernels::linear_forward(mat(logits_, N, cfg_.vocab / tp_size_), mat(lnf_, N, C), w("wte"), Slice1D());
}

double GPT::loss(ConstTokenView targets, real grad_scale) {
  const std::size_t N = rows_;
  const Slice2D logits = mat(logits_, N, cfg_.vocab / tp_size_);
  if (tp_size_ == 1)
    return grad_scale != 0 ? kernels::softmax_cross_entropy(logits, losses_, targets, grad_scale)
                           : kernels::cross_entropy_loss(logits, targets);
  const int vocab_start = tp_rank_ * (cfg_.vocab / tp_size_);
  kernels::row_max(xent_max_, logits);
  tp_->all_reduce(xent_max_.data(), N, ReduceOp::max);
  kernels::vocab_parallel_xent_partials(xent_stats_, logits, xent_max_, targets, vocab_start);
  tp_->all_reduce(xent_stats_.data(), 2 * N);
  return kernels::vocab_parallel_xent_finish(logits, losses_, xent_max_, xent_stats_, targets, vocab_start, grad_scale);
}

void GPT::backward(ConstTokenView tokens, bool last_micro_batch) {
  const std::size_t T = cfg_.seq_len, C = cfg_.channels, N = rows_, Nr = local_rows_;
  const std::size_t Cl = C / tp_size_, F = 4 * C / tp_size_, Q = 3 * C / tp_size_;
  const int vocab_start = tp_rank_ * (cfg_.vocab / tp_size_);
  const kernels::AttentionShape shape{batch_, cfg_.seq_len, static_cast<int>(Cl), cfg_.heads / tp_size_};
  const View1D& last = cfg_.layers > 0 ? layers_.back().res3 : encoded_;
  store_->begin_grads(0);
  // logits_ already holds dlogits (fused into the loss).
  kernels::linear_backward(mat(dln_, N, C), gw("wte"), Slice1D(), mat(logits_, N, cfg_.vocab / tp_size_),
                           mat(lnf_, N, C), w("wte"));
  Kokkos::deep_copy(dres_, real(0));
  View1D g = reduce_input_grad(dln_);
  kernels::layernorm_backward(mat(dres_, Nr, C), gv("ln_f/weight"), gv("ln_f/bias"), mat(g, Nr, C), mat(last, Nr, C),
                              v("ln_f/weight"), lnf_mean_, lnf_rstd_);
  for (int l = cfg_.layers - 1; l >= 0; --l) {
    const int unit = l + 1;
    store_->gather(unit);
    store_->prefetch(unit - 1 >= 1 ? unit - 1 : -1);  // the block before is next
    store_->begin_grads(unit);
    store_->poll();
    auto& a = layers_[l];
    const View1D& x = l > 0 ? layers_[l - 1].res3 : encoded_;
    const std::string p = "h/" + std::to_string(l) + "/";
    // dres is d(res3); res3 = res2 + mlp(ln2(res2)), so d(res2) starts as a copy.
    View1D dfull = full_dres();
    // With sequence parallelism the bias sits in the sharded region: its
    // gradient sums this rank's rows only (completed over tp by the ParamStore).
    kernels::linear_backward(mat(dfc_, N, F), gw(p + "mlp/c_proj/weight"), sp_ ? Slice1D() : gv(p + "mlp/c_proj/bias"),
                             mat(dfull, N, C), mat(a.fch_gelu, N, F), w(p + "mlp/c_proj/weight"));
    if (sp_) kernels::bias_backward(gv(p + "mlp/c_proj/bias"), mat(dres_, Nr, C));
    kernels::gelu_backward(mat(dfc_, N, F), mat(a.fch, N, F), mat(dfc_, N, F));
    kernels::linear_backward(mat(dln_, N, C), gw(p + "mlp/c_fc/weight"), gv(p + "mlp/c_fc/bias"), mat(dfc_, N, F),
                             mat(a.ln2, N, C), w(p + "mlp/c_fc/weight"));
    g = reduce_input_grad(dln_);
    kernels::layernorm_backward(mat(dres_, Nr, C), gv(p + "ln_2/weight"), gv(p + "ln_2/bias"), mat(g, Nr, C),
                                mat(a.res2, Nr, C), v(p + "ln_2/weight"), a.ln2_mean, a.ln2_rstd);
    // dres is now d(res2); res2 = x + attn(ln1(x)).
    dfull = full_dres();
    kernels::linear_backward(mat(datty_, N, Cl), gw(p + "attn/c_proj/weight"),
                             sp_ ? Slice1D() : gv(p + "attn/c_proj/bias"), mat(dfull, N, C), mat(a.atty, N, Cl),
                             w(p + "attn/c_proj/weight"));
    if (sp_) kernels::bias_backward(gv(p + "attn/c_proj/bias"), mat(dres_, Nr, C));
    kernels::attention_backward(mat(dqkv_, N, Q), dscratch_dy_, dscratch_qkvh_, dscratch_att_, mat(datty_, N, Cl),
                                a.qkvh, a.att, shape);
    kernels::linear_backward(mat(dln_, N, C), gw(p + "attn/c_attn/weight"), gv(p + "attn/c_attn/bias"),
                             mat(dqkv_, N, Q), mat(a.ln1, N, C), w(p + "attn/c_attn/weight"));
    // The key bias cannot change any output (it adds q . b_k to every score of
    // a softmax row), so its gradient is exactly zero. Store that zero, not
    // the rounding noise of a column sum, which Adam would amplify into
    // updates that differ between layouts.
    kernels::fill(Slice1D(gv(p + "attn/c_attn/bias").data() + Cl, Cl), 0);
    g = reduce_input_grad(dln_);
    kernels::layernorm_backward(mat(dres_, Nr, C), gv(p + "ln_1/weight"), gv(p + "ln_1/bias"), mat(g, Nr, C),
                                mat(x, Nr, C), v(p + "ln_1/weight"), a.ln1_mean, a.ln1_rstd);
    store_->end_grads(unit, last_micro_batch);
    store_->release(unit);
  }
  kernels::position_embedding_backward(gw("wpe"), mat(dres_, Nr, C), T, sp_ ? tp_rank_ * Nr : 0);
  const View1D dfull = full_dres();
  kernels::token_embedding_backward(gw("wte"), mat(dfull, N, C), tokens, vocab_start);
  store_->end_grads(0, last_micro_batch);
  store_->release(0);
}

double GPT::forward_backward(ConstTokenView tokens, ConstTokenView targets, real loss_scale, bool last_micro_batch) {
  forward(tokens);
  const double loss_sum = loss(targets, loss_scale);
  backward(tokens, last_micro_batch);
  return loss_sum;
}

double GPT::forward_loss(ConstTokenView tokens, ConstTokenView targets) {
  forward(tokens);
  const double loss_sum = loss(targets, 0);
  for (int u = 0; u < store_->units(); ++u) store_->release(u);
  return loss_sum;
}

}  // namespace ndmini
