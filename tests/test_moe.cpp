// SPDX-License-Identifier: BSD-3-Clause
// Mixture-of-Experts sizes without the MoE block's computation (model/moe.hpp):
// the tensors of an MoE block and their names, total and active parameters,
// FLOPs per token; a dense model's figures exactly as before.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/config.hpp"
#include "model/moe.hpp"

using namespace ndmini;

namespace {

Config deck(const std::string& path) { return load_config(std::string(NDMINI_SOURCE_DIR) + "/" + path); }

const GlobalTensor* find(const std::vector<GlobalTensor>& tensors, const std::string& name) {
  for (const GlobalTensor& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

}  // namespace

TEST(Moe, DenseModelsCountAsBefore) {
  for (const char* path : {"inputs/tiny.toml", "inputs/small.toml", "inputs/llama3-8b.toml"}) {
    const ModelConfig m = deck(path).model;
    const ModelCounts n = model_counts(m);
    EXPECT_EQ(n.total, gpt_param_count(m)) << path;
    EXPECT_EQ(n.active, gpt_param_count(m)) << path;
    EXPECT_EQ(n.flops_params, gpt_flops_param_count(m)) << path;
    EXPECT_DOUBLE_EQ(n.flops_per_token, gpt_flops_per_token(m)) << path;
    const auto dense = gpt_global_tensors(m), same = model_global_tensors(m);
    ASSERT_EQ(dense.size(), same.size()) << path;
    for (std::size_t i = 0; i < dense.size(); ++i) EXPECT_EQ(dense[i].name, same[i].name);
  }
}

// moe-small: small.toml (L 6, C 384, T 256, V 256, GPT-2 blocks) with blocks
// 1-5 of 8 experts of 768, top-2. By hand: a dense block 12 C^2 + 13 C =
// 1,774,464; its MLP 8 C^2 + 5 C = 1,181,568; an expert 2 x 768 x 384 + 768
// + 384 = 590,976; an MoE MLP 8 x 384 (router) + 8 experts = 4,730,880.
TEST(Moe, SmallDeckCountsByHand) {
  const ModelConfig m = deck("inputs/moe-small.toml").model;
  const std::int64_t dense = 256 * 384 + 256 * 384 + 2 * 384 + 6 * 1774464;  // small.toml: 10,844,160
  EXPECT_EQ(gpt_param_count(m), dense);
  const MoeBlockParams p = moe_block_params(m);
  EXPECT_EQ(p.expert, 590976);
  EXPECT_EQ(p.router, 8 * 384);
  EXPECT_EQ(p.mlp, 4730880);
  EXPECT_EQ(p.shared, 0);
  EXPECT_EQ(p.dense_mlp, 1181568);
  const ModelCounts n = model_counts(m);
  EXPECT_EQ(n.total, dense + 5 * (4730880 - 1181568));  // 28,590,720
  EXPECT_EQ(n.active, n.total - 5 * 6 * 590976);        // 10,861,440
  EXPECT_EQ(n.total, 28590720);
  EXPECT_EQ(n.active, 10861440);
  // MFU: 6 N + 12 L C T with N the active parameters less wpe.
  EXPECT_DOUBLE_EQ(n.flops_per_token, 6.0 * (10861440 - 256 * 384) + 12.0 * 6 * 384 * 256);
}

TEST(Moe, TensorsCarryTheGlobalExpertIndexFirst) {
  ModelConfig m = deck("inputs/moe-small.toml").model;
  m.moe_shared_hidden = 192;
  const std::vector<GlobalTensor> t = model_global_tensors(m);
  // Block 0 stays dense; block 1 is MoE: router, experts [E, rows, cols], shared expert, no dense MLP.
  EXPECT_NE(find(t, "h/0/mlp/c_fc/weight"), nullptr);
  EXPECT_EQ(find(t, "h/0/mlp/router/weight"), nullptr);
  EXPECT_EQ(find(t, "h/1/mlp/c_fc/weight"), nullptr);
  ASSERT_NE(find(t, "h/1/mlp/router/weight"), nullptr);
  EXPECT_EQ(find(t, "h/1/mlp/router/weight")->shape, (std::vector<std::int64_t>{8, 384}));
  ASSERT_NE(find(t, "h/5/mlp/experts/c_fc/weight"), nullptr);
  EXPECT_EQ(find(t, "h/5/mlp/experts/c_fc/weight")->shape, (std::vector<std::int64_t>{8, 768, 384}));
  EXPECT_EQ(find(t, "h/5/mlp/experts/c_proj/weight")->shape, (std::vector<std::int64_t>{8, 384, 768}));
  EXPECT_EQ(find(t, "h/5/mlp/experts/c_fc/bias")->shape, (std::vector<std::int64_t>{8, 768}));
  EXPECT_EQ(find(t, "h/5/mlp/shared/c_fc/weight")->shape, (std::vector<std::int64_t>{192, 384}));
  // The attention half of an MoE block is the dense block's, in the same place.
  EXPECT_NE(find(t, "h/3/attn/c_attn/weight"), nullptr);
  // The names are unique, and every block's tensors come in order.
  for (std::size_t i = 0; i < t.size(); ++i)
    for (std::size_t j = i + 1; j < t.size(); ++j) EXPECT_NE(t[i].name, t[j].name);
  // The shared expert counts as active; a SwiGLU expert has three matrices.
  const std::int64_t shared = moe_block_params(m).shared;
  EXPECT_EQ(shared, 2 * 192 * 384 + 192 + 384);
  EXPECT_EQ(model_counts(m).active, 10861440 + 5 * shared);
  ModelConfig g = m;
  g.mlp = MlpKind::swiglu;
  g.ffn_hidden = 1536;
  g.bias = false;
  EXPECT_EQ(moe_block_params(g).expert, 3 * 768 * 384);
  const std::vector<GlobalTensor> gt = model_global_tensors(g);
  EXPECT_NE(find(gt, "h/2/mlp/experts/c_gate/weight"), nullptr);
  EXPECT_EQ(layer_tensors(g, 2).size(), layer_tensors(g, 0).size() - 3 + 1 + 3 + 3);
}
