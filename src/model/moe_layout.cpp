// SPDX-License-Identifier: BSD-3-Clause
// Mixture-of-Experts sizes and rules (model/moe.hpp), derived from the dense
// block's tensor list so an MoE expert has the dense MLP's matrices.
#include <algorithm>
#include <sstream>

#include "core/error.hpp"
#include "model/moe.hpp"

namespace ndmini {
namespace {

const std::string kMlp = "mlp/";

bool is_mlp(const std::string& suffix) { return suffix.compare(0, kMlp.size(), kMlp) == 0; }

// The dense MLP's tensors for a hidden width `hidden`, renamed under `under`
// ("mlp/experts/": mlp/c_fc/weight -> mlp/experts/c_fc/weight).
std::vector<BlockTensorShape> mlp_tensors(const ModelConfig& m, int hidden, const std::string& under) {
  ModelConfig w = m;
  w.ffn_hidden = hidden;
  std::vector<BlockTensorShape> out;
  for (BlockTensorShape t : gpt_block_tensors(w)) {
    if (!is_mlp(t.suffix)) continue;
    t.suffix = under + t.suffix.substr(kMlp.size());
    out.push_back(std::move(t));
  }
  return out;
}

std::int64_t elements(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::int64_t count(const std::vector<BlockTensorShape>& tensors) {
  std::int64_t n = 0;
  for (const auto& t : tensors) n += elements(t.shape);
  return n;
}

// The MoE part of an MoE block: router, experts, shared expert.
std::vector<BlockTensorShape> moe_mlp_tensors(const ModelConfig& m) {
  const std::int64_t E = m.moe_experts;
  std::vector<BlockTensorShape> out = {{"mlp/router/weight", {E, m.channels}, TpSplit::replicated, 1}};
  // Sigmoid scores select with a per-expert bias (DeepSeek-V3): state, not a
  // trained parameter (its gradient is zero, so AdamW leaves it; the
  // trainer moves it after each step by train.moe_bias_rate).
  if (m.moe_score == MoeScore::sigmoid && m.moe_router == MoeRouter::learned)
    out.push_back({"mlp/router/selection_bias", {E}, TpSplit::replicated, 1});
  // Each expert whole on its ep rank: the expert index first, split over ep, not tp.
  for (BlockTensorShape t : mlp_tensors(m, m.moe_ffn(), "mlp/experts/")) {
    t.shape.insert(t.shape.begin(), E);
    t.split = TpSplit::experts;
    t.sections = 1;
    out.push_back(std::move(t));
  }
  if (m.moe_shared_hidden > 0)
    for (BlockTensorShape t : mlp_tensors(m, m.moe_shared_hidden, "mlp/shared/")) out.push_back(std::move(t));
  return out;
}

}  // namespace

std::vector<BlockTensorShape> layer_tensors(const ModelConfig& m, int layer) {
  std::vector<BlockTensorShape> dense = gpt_block_tensors(m);
  if (!m.moe_block(layer)) return dense;
  std::vector<BlockTensorShape> out;
  bool replaced = false;
  for (BlockTensorShape& t : dense) {
    if (!is_mlp(t.suffix)) {
      out.push_back(std::move(t));
    } else if (!replaced) {  // the MoE part where the dense MLP was
      for (BlockTensorShape& e : moe_mlp_tensors(m)) out.push_back(std::move(e));
      replaced = true;
    }
  }
  return out;
}

std::int64_t moe_blocks_in(const ModelConfig& m, std::int64_t first, std::int64_t end) {
  if (!m.moe()) return 0;
  first = std::max<std::int64_t>(first, m.moe_dense_first);
  if (first >= end) return 0;
  // Multiples of moe_every in [first, end).
  const std::int64_t every = m.moe_every;
  return (end - 1) / every - (first + every - 1) / every + 1;
}

int first_moe_block(const ModelConfig& m) {
  if (!m.moe()) return -1;
  const int every = m.moe_every, first = (m.moe_dense_first + every - 1) / every * every;
  return first < m.layers ? first : -1;
}

std::vector<GlobalTensor> model_global_tensors(const ModelConfig& m) { return gpt_global_tensors(m); }

MoeBlockParams moe_block_params(const ModelConfig& m) {
  MoeBlockParams p;
  p.router = static_cast<std::int64_t>(m.moe_experts) * m.channels;
  p.expert = count(mlp_tensors(m, m.moe_ffn(), kMlp));
  p.mlp = count(moe_mlp_tensors(m));
  p.shared = m.moe_shared_hidden > 0 ? count(mlp_tensors(m, m.moe_shared_hidden, kMlp)) : 0;
  p.dense_mlp = count(mlp_tensors(m, m.ffn(), kMlp));
  return p;
}

ModelCounts model_counts(const ModelConfig& m) {
  ModelCounts c;
  // The dense model's, each MoE block's MLP replaced by its MoE part (as
  // layer_tensors does); closed form: a deck may have 1e9 layers.
  const std::int64_t blocks = moe_blocks_in(m, 0, m.layers);
  c.total = gpt_param_count(m);
  if (blocks > 0) c.total += blocks * (moe_block_params(m).mlp - moe_block_params(m).dense_mlp);
  // A token meets k of the E experts of each MoE block.
  const std::int64_t idle =
      m.moe() ? static_cast<std::int64_t>(m.moe_experts - m.moe_top_k) * moe_block_params(m).expert : 0;
  c.active = c.total - blocks * idle;
  // The lookups, as gpt_flops_param_count leaves them out.
  c.flops_params = c.active - (gpt_param_count(m) - gpt_flops_param_count(m));
  c.flops_per_token = 6.0 * static_cast<double>(c.flops_params) + 12.0 * m.layers * m.channels * m.seq_len;
  return c;
}

void check_moe_split(const ModelConfig& m, const ParallelDims& s) {
  using std::to_string;
  if (!m.moe()) return;
  // Each rank routes the token rows it holds: without sequence parallelism
  // every tp rank would hold (and send) the same rows.
  require(s.tp == 1 || s.sequence_parallel,
          "parallel.tp = " + to_string(s.tp) +
              " with an MoE block needs parallel.sequence_parallel = true (each rank routes the token rows it "
              "holds); set it, or parallel.tp = 1");
  require(m.moe_shared_hidden % s.tp == 0,
          "model.moe_shared_hidden = " + to_string(m.moe_shared_hidden) + " is not divisible by parallel.tp = " +
              to_string(s.tp) + " (the shared expert splits over tp as the dense MLP); change one of them");
}

std::string describe_moe(const ModelConfig& m, const ParallelDims& s) {
  std::ostringstream os;
  os << "moe               " << m.moe_experts << " experts of width " << m.moe_ffn() << ", top-" << m.moe_top_k << " ("
     << name_of(m.moe_score) << " scores, " << name_of(m.moe_router) << " router)";
  if (m.moe_shared_hidden > 0) os << ", a shared expert of width " << m.moe_shared_hidden;
  os << "; MoE blocks:";
  for (int l = 0; l < m.layers; ++l)
    if (m.moe_block(l)) os << " " << l;
  os << " (" << m.moe_blocks() << " of " << m.layers << ")\n";
  const ModelCounts n = model_counts(m);
  os << "parameters        " << n.total << " total, " << n.active << " active per token (" << n.flops_params
     << " in MFU's N)\n";
  os << "FLOPs per token   " << n.flops_per_token << " (6N + 12 L C T, N the active parameters)\n";
  os << "experts per rank  " << m.moe_experts / s.ep << " of each MoE block per ep rank (ep = " << s.ep
     << "), FSDP-sharded over the expert fsdp group of " << s.expert_fsdp()
     << (s.expert_fsdp() == 1 ? " rank" : " ranks") << " and replicated over dp_replicate\n";
  return os.str();
}

}  // namespace ndmini
