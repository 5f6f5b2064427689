// SPDX-License-Identifier: BSD-3-Clause
// The whole GPT-2 (and a Llama) on one rank: gradient of the mean loss against central
// differences for a sample of every parameter tensor, the init of docs/model.md,
// gradient accumulation, and the parameter/FLOP counts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "core/rng.hpp"
#include "core/types.hpp"
#include "model/gpt.hpp"
#include "parallel/stage_runtime.hpp"

using namespace ndmini;

namespace {

ModelConfig tiny() {
  ModelConfig m;
  m.layers = 2;
  m.channels = 12;
  m.heads = 3;  // head size 4
  m.vocab = 11;
  m.seq_len = 5;
  return m;
}

std::vector<double> host(const View1D& v) {
  auto h = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(h, v);
  return std::vector<double>(h.data(), h.data() + v.size());
}

TokenView tokens_from(const std::vector<int>& t) {
  TokenView v("tokens", t.size());
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < t.size(); ++i) h(i) = t[i];
  Kokkos::deep_copy(v, h);
  return v;
}

// Init, then move every parameter off its init values (biases 0 and LN
// weights 1 are special points) so every gradient term is exercised and
// attention is far from uniform.
void init_perturbed(StageRuntime& gpt, std::uint64_t seed) {
  gpt.init(seed);
  auto p = Kokkos::create_mirror_view(gpt.param_buffer());
  Kokkos::deep_copy(p, gpt.param_buffer());
  for (std::size_t i = 0; i < p.size(); ++i) {
    const double u = static_cast<double>(rng::bits(seed + 1, i) >> 40) / 16777216.0;
    p(i) += static_cast<real>(0.6 * u - 0.3);
  }
  Kokkos::deep_copy(gpt.param_buffer(), p);
}

const ParamInfo& param_named(const StageRuntime& gpt, const std::string& name) {
  for (const auto& p : gpt.params())
    if (p.name == name) return p;
  throw std::runtime_error("no parameter " + name);
}

// The gradient of the mean loss of `m` on one rank against central
// differences, for up to 48 elements of every parameter tensor; each
// tensor's relative error must stay under `bound`. Returns the worst.
double expect_gradients_match_finite_differences(const ModelConfig& m, double bound) {
  const int B = 2, T = m.seq_len;
  StageRuntime gpt(m, B);
  init_perturbed(gpt, 7);
  // Repeated tokens, and targets that differ from the inputs.
  TokenView tokens = tokens_from({1, 4, 1, 9, 0, 10, 4, 4, 2, 1});
  TokenView targets = tokens_from({4, 1, 9, 0, 3, 4, 4, 2, 1, 7});
  const real scale = real(1) / (B * T);

  Kokkos::deep_copy(gpt.grad_buffer(), real(0));  // forward_backward accumulates
  const double loss_sum = gpt.forward_backward(tokens, targets, scale);
  const auto grad = host(gpt.grad_buffer());
  const double fwd = gpt.forward_loss(tokens, targets);
  EXPECT_NEAR(loss_sum, fwd, 1e-5 * fwd) << "forward_backward and forward_loss disagree on the loss";
  EXPECT_GT(fwd / (B * T), 0.5);

  View1D params = gpt.param_buffer();
  auto hp = Kokkos::create_mirror_view(params);
  Kokkos::deep_copy(hp, params);
  const double h = 3e-2;
  // Up to 48 elements per tensor, spread deterministically over it.
  const std::size_t kSample = 48;
  double worst = 0;
  for (const auto& p : gpt.params()) {
    std::vector<double> fd, an;
    const std::size_t count = std::min(p.size, kSample);
    for (std::size_t k = 0; k < count; ++k) {
      const std::size_t i =
          p.offset + (p.size <= kSample ? k : k * p.size / kSample + rng::bits(5, k) % (p.size / kSample));
      const real orig = hp(i);
      // The central difference over [x - s, x + s] (s as the floats hold it).
      auto central = [&](double step) {
        const real up = orig + real(step), dn = orig - real(step);
        hp(i) = up;
        Kokkos::deep_copy(params, hp);
        const double lp = gpt.forward_loss(tokens, targets) / (B * T);
        hp(i) = dn;
        Kokkos::deep_copy(params, hp);
        const double lm = gpt.forward_loss(tokens, targets) / (B * T);
        hp(i) = orig;
        Kokkos::deep_copy(params, hp);
        return (lp - lm) / (double(up) - double(dn));
      };
      // Richardson's extrapolation of the steps h and h/2 cancels the central
      // difference's h^2 term: the norms' curvature near small rows (RMSNorm
      // of a Llama's embedding) would otherwise dominate the error.
      const double coarse = central(h), fine = central(h / 2);
      fd.push_back((4 * fine - coarse) / 3);
      an.push_back(grad[i]);
    }
    double num = 0, den = 0;
    for (std::size_t k = 0; k < fd.size(); ++k) {
      num += (fd[k] - an[k]) * (fd[k] - an[k]);
      den += fd[k] * fd[k];
    }
    const double err = std::sqrt(num / den);
    worst = std::max(worst, err);
    std::printf("  [fd] %-24s |g| %.2e  rel err %.2e\n", p.name.c_str(), std::sqrt(den / fd.size()), err);
    // Every tensor must get a real gradient (a zero one would pass any ratio).
    EXPECT_GT(den, 0.0) << p.name;
    EXPECT_LT(err, bound) << p.name;
  }
  std::printf("  worst rel err %.2e\n", worst);
  return worst;
}

}  // namespace

TEST(Model, GradientMatchesFiniteDifferences) {
  expect_gradients_match_finite_differences(tiny(), 2e-3);  // worst measured 7.4e-5 (h/0/mlp/c_proj/weight)
}

namespace {

// m with Llama's architecture keys (model.family = "llama" in a deck).
ModelConfig llama_of(ModelConfig m) {
  m.family = ModelFamily::llama;
  m.norm = NormKind::rmsnorm;
  m.position = PositionKind::rope;
  m.mlp = MlpKind::swiglu;
  m.bias = false;
  m.tie_embeddings = false;
  return m;
}

// The tiny model as a Llama: RMSNorm, RoPE, SwiGLU (F = 20), 4 query heads
// of size 4 sharing 2 key/value heads, no biases, untied head.
ModelConfig tiny_llama() {
  ModelConfig m = tiny();
  m.channels = 16;  // head size 4: RoPE rotates pairs
  m.heads = 4;
  m.kv_heads = 2;
  m.ffn_hidden = 20;
  return llama_of(m);
}

}  // namespace

TEST(Model, LlamaGradientMatchesFiniteDifferences) {
  // Every tensor of the whole model: RMSNorm, RoPE, SwiGLU, grouped-query
  // attention and the untied head (lm_head, and wte through the embedding only).
  const ModelConfig m = tiny_llama();
  StageRuntime shape(m, 1);
  bool lm_head = false;
  for (const ParamInfo& p : shape.params()) lm_head = lm_head || p.name == "lm_head/weight";
  EXPECT_TRUE(lm_head);
  expect_gradients_match_finite_differences(m, 2e-3);  // worst measured 1.3e-4 (h/1/attn/c_q/weight)
}

TEST(Model, LlamaWithBiasesGradientMatchesFiniteDifferences) {
  // The same with a bias on every linear layer: under RoPE the key bias
  // moves the scores (it is rotated by each key's position), so its
  // gradient is a real one (EXPECT_GT(den, 0) above), not GPT-2's zero.
  ModelConfig m = tiny_llama();
  m.bias = true;
  // Worst measured 1.1e-3: h/1/attn/c_k/bias, whose gradient (|g| 1.4e-3) is
  // near the float loss's rounding noise over the differences' steps.
  expect_gradients_match_finite_differences(m, 2e-3);
}

TEST(Model, ForwardBackwardAccumulates) {
  const ModelConfig m = tiny();
  StageRuntime gpt(m, 2);
  init_perturbed(gpt, 11);
  TokenView tokens = tokens_from({1, 4, 1, 9, 0, 10, 4, 4, 2, 1});
  TokenView targets = tokens_from({4, 1, 9, 0, 3, 4, 4, 2, 1, 7});
  Kokkos::deep_copy(gpt.grad_buffer(), real(0));
  gpt.forward_backward(tokens, targets, 0.1f);
  const auto g1 = host(gpt.grad_buffer());
  gpt.forward_backward(tokens, targets, 0.1f);
  const auto g2 = host(gpt.grad_buffer());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < g1.size(); ++i) {
    num += (g2[i] - 2 * g1[i]) * (g2[i] - 2 * g1[i]);
    den += 4 * g1[i] * g1[i];
  }
  EXPECT_GT(den, 0.0);
  EXPECT_LT(std::sqrt(num / den), 1e-5) << "two micro-batches must add their gradients";
}

TEST(Model, InitIsDeterministic) {
  const ModelConfig m = tiny();
  StageRuntime a(m, 1), b(m, 1), c(m, 1);
  a.init(42);
  b.init(42);
  c.init(43);
  EXPECT_EQ(host(a.param_buffer()), host(b.param_buffer()));
  EXPECT_NE(host(a.param_buffer()), host(c.param_buffer()));
  // Element i of a tensor comes from (seed, name, i), as docs/model.md says,
  // so any layout can rebuild the same model.
  const auto hp = host(a.param_buffer());
  for (const char* name : {"wte", "h/1/attn/c_attn/weight"}) {
    const auto& p = param_named(a, name);
    for (std::size_t i : {std::size_t(0), std::size_t(5), p.size - 1})
      EXPECT_EQ(hp[p.offset + i], static_cast<double>(static_cast<real>(static_cast<real>(0.02) *
                                                                        rng::normal(rng::stream_key(42, name), i))))
          << name << "[" << i << "]";
  }
  // init also clears the gradients.
  Kokkos::deep_copy(a.grad_buffer(), real(3));
  a.init(42);
  for (double g : host(a.grad_buffer())) ASSERT_EQ(g, 0.0);
}

TEST(Model, InitStatistics) {
  ModelConfig m;
  m.layers = 3;
  m.channels = 96;
  m.heads = 4;
  m.vocab = 256;
  m.seq_len = 32;
  StageRuntime gpt(m, 1);
  gpt.init(2024);
  const auto hp = host(gpt.param_buffer());
  const double std_proj = 0.02 / std::sqrt(2.0 * m.layers);
  for (const auto& p : gpt.params()) {
    const bool is_bias = p.name.size() >= 4 && p.name.compare(p.name.size() - 4, 4, "bias") == 0;
    const bool is_ln = p.name.find("ln_") != std::string::npos;
    if (is_ln && !is_bias) {
      for (std::size_t i = 0; i < p.size; ++i) ASSERT_EQ(hp[p.offset + i], 1.0) << p.name;
    } else if (is_bias) {
      for (std::size_t i = 0; i < p.size; ++i) ASSERT_EQ(hp[p.offset + i], 0.0) << p.name;
    } else {
      EXPECT_TRUE(p.decay) << p.name << " is 2-D and should be decayed";
      const double want = p.name.find("c_proj/weight") != std::string::npos ? std_proj : 0.02;
      double sum = 0, sq = 0;
      for (std::size_t i = 0; i < p.size; ++i) sum += hp[p.offset + i], sq += hp[p.offset + i] * hp[p.offset + i];
      const double n = p.size, mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
      // 5 standard errors: mean ~ N(0, s^2/n), sample std ~ s (1 +- 1/sqrt(2n)).
      EXPECT_LT(std::abs(mean), 5 * want / std::sqrt(n)) << p.name;
      EXPECT_LT(std::abs(sd / want - 1), 5 / std::sqrt(2 * n)) << p.name << ": std " << sd << ", want " << want;
    }
    if (is_bias || is_ln) {
      EXPECT_FALSE(p.decay) << p.name << " is 1-D and must not be decayed";
    }
  }
}

TEST(Model, LayoutCoversEveryTensorOnce) {
  const ModelConfig m = tiny();
  StageRuntime gpt(m, 1);
  const auto& ps = gpt.params();
  ASSERT_EQ(ps.size(), 2u + 12u * m.layers + 2u);
  std::int64_t total = 0;
  for (std::size_t k = 0; k < ps.size(); ++k) {
    std::int64_t n = 1;
    for (auto d : ps[k].shape) n *= d;
    EXPECT_EQ(static_cast<std::int64_t>(ps[k].size), n) << ps[k].name;
    if (k > 0) {
      EXPECT_GE(ps[k].offset, ps[k - 1].offset + ps[k - 1].size) << ps[k].name << " overlaps";
    }
    EXPECT_LE(ps[k].offset + ps[k].size, gpt.param_buffer().size());
    total += n;
  }
  EXPECT_EQ(total, gpt_param_count(m));
  EXPECT_EQ(gpt.param_buffer().size(), gpt.grad_buffer().size());
}

TEST(Model, Gpt2SmallCounts) {
  ModelConfig m;
  m.layers = 12;
  m.channels = 768;
  m.heads = 12;
  m.vocab = 50257;
  m.seq_len = 1024;
  // GPT-2 124M with the LM head tied to wte.
  const std::int64_t N = 124439808;
  EXPECT_EQ(gpt_param_count(m), N);
  EXPECT_EQ(gpt_flops_param_count(m), N - 1024 * 768);
  EXPECT_DOUBLE_EQ(gpt_flops_per_token(m), 6.0 * (N - 1024.0 * 768) + 12.0 * 12 * 768 * 1024);
}

// ---- other architectures: the layout and the counts (issue 32) ----------------

namespace {

// A small deck of every architecture key: C = 8, H = 4 (hs 2), kv_heads 2,
// F = 12, V = 11, T = 6, L = 2.
ModelConfig small_of(bool llama) {
  ModelConfig m;
  m.layers = 2;
  m.channels = 8;
  m.heads = 4;
  m.kv_heads = 2;
  m.ffn_hidden = 12;
  m.vocab = 11;
  m.seq_len = 6;
  return llama ? llama_of(m) : m;
}

std::int64_t sum_of_global_tensors(const ModelConfig& m) {
  std::int64_t total = 0;
  for (const GlobalTensor& t : gpt_global_tensors(m)) {
    std::int64_t n = 1;
    for (auto d : t.shape) n *= d;
    total += n;
  }
  return total;
}

bool has_tensor(const ModelConfig& m, const std::string& name) {
  for (const GlobalTensor& t : gpt_global_tensors(m))
    if (t.name == name) return true;
  return false;
}

}  // namespace

TEST(Architecture, Gpt2BlockTensorsAreGpt2s) {
  // gpt_block_tensors writes the layout of every architecture; for GPT-2's
  // it must be GPT-2's twelve tensors in their order (docs/checkpoint-format.md),
  // none packed, so GPT-2's checkpoints and layouts are unchanged.
  struct Want {
    const char* suffix;
    int rows_c, cols_c;  // in multiples of C; cols 0: a vector
    TpSplit split;
    int sections;
  };
  const Want gpt2[] = {
      {"ln_1/weight", 1, 0, TpSplit::replicated, 1},  {"ln_1/bias", 1, 0, TpSplit::replicated, 1},
      {"attn/c_attn/weight", 3, 1, TpSplit::rows, 3}, {"attn/c_attn/bias", 3, 0, TpSplit::rows, 3},
      {"attn/c_proj/weight", 1, 1, TpSplit::cols, 1}, {"attn/c_proj/bias", 1, 0, TpSplit::replicated, 1},
      {"ln_2/weight", 1, 0, TpSplit::replicated, 1},  {"ln_2/bias", 1, 0, TpSplit::replicated, 1},
      {"mlp/c_fc/weight", 4, 1, TpSplit::rows, 1},    {"mlp/c_fc/bias", 4, 0, TpSplit::rows, 1},
      {"mlp/c_proj/weight", 1, 4, TpSplit::cols, 1},  {"mlp/c_proj/bias", 1, 0, TpSplit::replicated, 1}};
  for (const ModelConfig& m : {tiny(), ModelConfig{12, 768, 12, 50304, 1024}}) {
    const std::vector<BlockTensorShape> block = gpt_block_tensors(m);
    ASSERT_EQ(block.size(), std::size(gpt2));
    for (std::size_t k = 0; k < block.size(); ++k) {
      const Want& want = gpt2[k];
      std::vector<std::int64_t> shape = {want.rows_c * static_cast<std::int64_t>(m.channels)};
      if (want.cols_c > 0) shape.push_back(want.cols_c * static_cast<std::int64_t>(m.channels));
      EXPECT_EQ(block[k].suffix, want.suffix);
      EXPECT_EQ(block[k].shape, shape) << want.suffix;
      EXPECT_EQ(block[k].split, want.split) << want.suffix;
      EXPECT_EQ(block[k].sections, want.sections) << want.suffix;
      EXPECT_FALSE(block[k].packed) << want.suffix;
    }
  }
}

TEST(Architecture, GqaPacksQkvIntoOneMatrix) {
  // Under grouped-query attention c_q, c_k and c_v (and their biases) sit
  // side by side in the unit on every tp rank, so the block views them as
  // one [(H + 2 KV) hs / tp, C] matrix; the others keep their alignment.
  ModelConfig m = small_of(false);
  m.channels = 12;  // hs 3: c_k's 6 x 12 / tp floats are no multiple of the 16-float alignment
  m.heads = 4;
  m.vocab = 12;
  for (int tp : {1, 2}) {
    const ParamLayout layout = gpt_param_layout(m, {{0, 0, 1, true, true}}, tp, tp - 1, 1);
    auto find = [&](const std::string& name) -> const ParamInfo& {
      for (const ParamInfo& p : layout.params)
        if (p.name == name) return p;
      throw std::runtime_error("no " + name);
    };
    for (const char* kind : {"weight", "bias"}) {
      const std::string w = std::string("/") + kind;
      const ParamInfo &q = find("h/0/attn/c_q" + w), &k = find("h/0/attn/c_k" + w), &v = find("h/0/attn/c_v" + w);
      EXPECT_EQ(k.offset, q.offset + q.size) << kind << ", tp " << tp;
      EXPECT_EQ(v.offset, k.offset + k.size) << kind << ", tp " << tp;
    }
    EXPECT_EQ(find("h/0/attn/c_q/bias").offset % 16, 0u);
    EXPECT_EQ(find("h/0/attn/c_proj/weight").offset % 16, 0u);
    // The block's view: q | k | v rows of this rank, and the bias beside them.
    const BlockLayout view(layout, 2);  // units: wte, wpe, block 0
    std::vector<real> unit(layout.unit_size[2]);
    const BlockTensors t = view.view(unit.data(), nullptr);
    EXPECT_EQ(t.attn_w.extent(0), static_cast<std::size_t>((12 + 2 * 6) / tp));
    EXPECT_EQ(t.attn_w.extent(1), 12u);
    EXPECT_EQ(t.attn_b.extent(0), static_cast<std::size_t>((12 + 2 * 6) / tp));
    EXPECT_EQ(t.up_w.extent(0), 0u);  // gelu: no c_up
  }
}

TEST(Architecture, LlamaCountsByHand) {
  // rmsnorm, rope, swiglu, GQA, no biases, untied. Per block: ln_1 C, c_q
  // C x C, c_k and c_v (kv hs = 4) x C, c_proj C x C, ln_2 C, c_gate and c_up
  // F x C, c_proj C x F.
  const ModelConfig m = small_of(true);
  const std::int64_t block = 8 + 64 + 32 + 32 + 64 + 8 + 96 + 96 + 96;
  EXPECT_EQ(gpt_block_param_count(m), block);
  EXPECT_EQ(gpt_block_matrix_param_count(m), block - 16);
  // wte 11 x 8, ln_f 8 (no bias), lm_head 11 x 8, no wpe.
  const std::int64_t all = 88 + 8 + 88 + 2 * block;
  EXPECT_EQ(gpt_param_count(m), all);
  EXPECT_EQ(sum_of_global_tensors(m), all);
  // N: wte is a lookup (lm_head is the head's product).
  EXPECT_EQ(gpt_flops_param_count(m), all - 88);
  EXPECT_DOUBLE_EQ(gpt_flops_per_token(m), 6.0 * (all - 88) + 12.0 * 2 * 8 * 6);
  for (const char* name : {"wte", "h/0/ln_1/weight", "h/0/attn/c_q/weight", "h/0/attn/c_k/weight",
                           "h/0/attn/c_v/weight", "h/1/attn/c_proj/weight", "h/1/mlp/c_gate/weight",
                           "h/1/mlp/c_up/weight", "h/1/mlp/c_proj/weight", "ln_f/weight", "lm_head/weight"})
    EXPECT_TRUE(has_tensor(m, name)) << name;
  for (const char* name :
       {"wpe", "h/0/ln_1/bias", "h/0/attn/c_attn/weight", "h/0/attn/c_q/bias", "h/0/mlp/c_fc/weight", "ln_f/bias"})
    EXPECT_FALSE(has_tensor(m, name)) << name;
}

TEST(Architecture, GqaGeluWithBiasesTiedCountsByHand) {
  // layernorm with biases, learned positions, gelu of F = 12, kv_heads 2 of 4,
  // tied head: every linear layer has its bias.
  const ModelConfig m = small_of(false);
  const std::int64_t block = 16 + (64 + 8) + (32 + 4) + (32 + 4) + (64 + 8) + 16 + (96 + 12) + (96 + 8);
  EXPECT_EQ(gpt_block_param_count(m), block);
  const std::int64_t all = 88 + 6 * 8 + 16 + 2 * block;  // wte, wpe, ln_f weight and bias
  EXPECT_EQ(gpt_param_count(m), all);
  EXPECT_EQ(sum_of_global_tensors(m), all);
  EXPECT_EQ(gpt_flops_param_count(m), all - 48);  // all but wpe
  EXPECT_TRUE(has_tensor(m, "h/0/attn/c_k/bias"));
  EXPECT_TRUE(has_tensor(m, "h/0/mlp/c_fc/bias"));
  EXPECT_FALSE(has_tensor(m, "lm_head/weight"));
  // Multi-head attention keeps GPT-2's fused c_attn, whatever the rest.
  ModelConfig mha = small_of(true);
  mha.kv_heads = 0;
  EXPECT_TRUE(has_tensor(mha, "h/0/attn/c_attn/weight"));
  EXPECT_FALSE(has_tensor(mha, "h/0/attn/c_q/weight"));
}

TEST(Architecture, Llama3_8bIsThePublishedCount) {
  // Meta-Llama-3-8B: 8,030,261,248 parameters (Hugging Face's count of its
  // tensors, "8.03B"): by hand, 2 x 128256 x 4096 (embed_tokens, lm_head) +
  // 4096 (the final norm) + 32 x (2 x 4096^2 (q, o) + 2 x 1024 x 4096 (k, v)
  // + 3 x 14336 x 4096 (gate, up, down) + 2 x 4096 (the norms)).
  ModelConfig m{32, 4096, 32, 128256, 8192};
  m.family = ModelFamily::llama;
  m.norm = NormKind::rmsnorm;
  m.position = PositionKind::rope;
  m.mlp = MlpKind::swiglu;
  m.ffn_hidden = 14336;
  m.kv_heads = 8;
  m.bias = false;
  m.tie_embeddings = false;
  const std::int64_t C = 4096, V = 128256, F = 14336, KV = 1024;
  const std::int64_t by_hand = 2 * V * C + C + 32 * (2 * C * C + 2 * KV * C + 3 * F * C + 2 * C);
  EXPECT_EQ(by_hand, 8030261248);
  EXPECT_EQ(gpt_param_count(m), by_hand);
  EXPECT_EQ(sum_of_global_tensors(m), by_hand);
  EXPECT_EQ(gpt_flops_param_count(m), by_hand - V * C);
  // 70B: 80 layers of 8192, 64 heads, 8 kv heads, F = 28672: 70,553,706,496.
  m.layers = 80;
  m.channels = 8192;
  m.heads = 64;
  m.ffn_hidden = 28672;
  EXPECT_EQ(gpt_param_count(m), 70553706496);
}

TEST(Architecture, UntiedLayoutPutsLmHeadOnTheLastStage) {
  ModelConfig m = small_of(true);
  m.vocab = 12;  // split over tp = 2
  const std::vector<Chunk> first = {{0, 0, 1, true, false}}, last = {{1, 1, 2, false, true}};
  const ParamLayout a = gpt_param_layout(m, first, 2, 1, 1), b = gpt_param_layout(m, last, 2, 1, 1);
  // First stage: wte (no wpe under rope) and block 0; last: block 1, ln_f, lm_head.
  ASSERT_EQ(a.unit_size.size(), 2u);
  ASSERT_EQ(b.unit_size.size(), 3u);
  EXPECT_EQ(a.params.front().name, "wte");
  EXPECT_FALSE(a.params.front().tied_copy);
  EXPECT_EQ(b.params.back().name, "lm_head/weight");
  EXPECT_EQ(b.params.back().split, TpSplit::rows);
  EXPECT_EQ(b.params.back().shape, (std::vector<std::int64_t>{6, 8}));  // vocabulary-parallel
  for (const ParamInfo& p : b.params) EXPECT_NE(p.name, "wte") << "an untied head holds no copy of wte";
  const std::vector<ChunkUnits> units = gpt_chunk_units(m, last);
  EXPECT_EQ(units[0].wte, -1);
  EXPECT_EQ(units[0].ln_f, 1);
  EXPECT_EQ(units[0].lm_head, 2);
  // k and v split by kv heads over tp: 4 rows of 8 on each of 2 ranks.
  for (const ParamInfo& p : a.params)
    if (p.name == "h/0/attn/c_k/weight") EXPECT_EQ(p.shape, (std::vector<std::int64_t>{2, 8}));
}
