// SPDX-License-Identifier: BSD-3-Clause
// The model's sizes and rules, computed without building it: parameter
// counts, FLOPs, the layout rules for a split, the global tensor list and the
// parameter layout of one pipeline stage.
#include <numeric>
#include <sstream>

#include "core/error.hpp"
#include "model/block.hpp"
#include "model/gpt.hpp"
#include "model/moe.hpp"

namespace ndmini {
namespace {

// Parameter offsets are rounded up to 16 floats (64 bytes) so every tensor
// starts on a cache line (and a SIMD boundary) of the flat buffer.
constexpr std::size_t kAlign = 16;

std::size_t round_up(std::size_t n, std::size_t multiple) { return (n + multiple - 1) / multiple * multiple; }

std::string block_prefix(int layer) { return "h/" + std::to_string(layer) + "/"; }

}  // namespace

std::string architecture_text(const ModelConfig& m) {
  std::ostringstream os;
  os << name_of(m.family) << ": " << name_of(m.norm) << " (eps " << m.norm_eps << "), ";
  if (m.learned_positions())
    os << "learned positions";
  else
    os << "rope (theta " << m.rope_theta << ")";
  os << ", " << name_of(m.mlp) << " MLP of " << (m.ffn() == 4 * m.channels ? "4C = " : "") << m.ffn() << ", ";
  if (m.kv() == m.heads)
    os << m.heads << " heads";
  else
    os << m.heads << " query heads sharing " << m.kv() << " key/value heads";
  os << ", " << (m.bias ? "biases" : "no biases") << ", "
     << (m.tie_embeddings ? "head tied to wte" : "untied head (lm_head)");
  return os.str();
}

std::vector<BlockTensorShape> gpt_block_tensors(const ModelConfig& m) {
  const std::int64_t C = m.channels, F = m.ffn(), KV = static_cast<std::int64_t>(m.kv()) * m.head_size();
  const bool layernorm_bias = m.norm == NormKind::layernorm && m.bias;
  std::vector<BlockTensorShape> out;
  auto norm = [&](const std::string& name) {
    out.push_back({name + "/weight", {C}, TpSplit::replicated, 1});
    if (layernorm_bias) out.push_back({name + "/bias", {C}, TpSplit::replicated, 1});
  };
  // A linear layer [out, in]: column-parallel ones split their rows (and
  // bias), row-parallel ones their columns (their bias is replicated).
  auto weight = [&](const std::string& name, std::int64_t rows, std::int64_t cols, TpSplit split, int sections,
                    bool packed) {
    out.push_back({name + "/weight", {rows, cols}, split, sections, packed});
  };
  auto bias = [&](const std::string& name, std::int64_t rows, TpSplit split, int sections, bool packed) {
    if (m.bias)
      out.push_back({name + "/bias",
                     {rows},
                     split == TpSplit::rows ? TpSplit::rows : TpSplit::replicated,
                     split == TpSplit::rows ? sections : 1,
                     packed});
  };
  auto linear = [&](const std::string& name, std::int64_t rows, std::int64_t cols, TpSplit split, int sections) {
    weight(name, rows, cols, split, sections, false);
    bias(name, rows, split, sections, false);
  };
  norm("ln_1");
  if (m.kv() == m.heads) {
    linear("attn/c_attn", 3 * C, C, TpSplit::rows, 3);  // q, k, v stacked: each tp rank its heads' rows of all three
  } else {
    // Grouped-query attention: k and v have kv_heads heads; tp splits each
    // by heads. The three weights side by side (no padding between them),
    // then the three biases, so that on every tp rank they are its heads'
    // q | k | v rows of one matrix (and one bias): one product computes the
    // row the attention reads, as c_attn does.
    weight("attn/c_q", C, C, TpSplit::rows, 1, false);
    weight("attn/c_k", KV, C, TpSplit::rows, 1, true);
    weight("attn/c_v", KV, C, TpSplit::rows, 1, true);
    bias("attn/c_q", C, TpSplit::rows, 1, false);
    bias("attn/c_k", KV, TpSplit::rows, 1, true);
    bias("attn/c_v", KV, TpSplit::rows, 1, true);
  }
  linear("attn/c_proj", C, C, TpSplit::cols, 1);
  norm("ln_2");
  if (m.gated()) {
    linear("mlp/c_gate", F, C, TpSplit::rows, 1);
    linear("mlp/c_up", F, C, TpSplit::rows, 1);
  } else {
    linear("mlp/c_fc", F, C, TpSplit::rows, 1);
  }
  linear("mlp/c_proj", C, F, TpSplit::cols, 1);
  return out;
}

namespace {
std::int64_t elements(const std::vector<std::int64_t>& shape) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}
}  // namespace

std::int64_t gpt_block_param_count(const ModelConfig& m) {
  std::int64_t n = 0;
  for (const BlockTensorShape& t : gpt_block_tensors(m)) n += elements(t.shape);
  return n;
}

std::int64_t gpt_block_matrix_param_count(const ModelConfig& m) {
  std::int64_t n = 0;
  for (const BlockTensorShape& t : gpt_block_tensors(m))
    if (t.shape.size() == 2) n += elements(t.shape);
  return n;
}

std::int64_t gpt_param_count(const ModelConfig& m) {
  // wte [V, C], wpe [T, C] (learned positions), ln_f (C, and C of bias for a
  // LayerNorm with biases), lm_head [V, C] (untied), and the blocks' (GPT-2:
  // 12 C^2 + 13 C each, see gpt_block_tensors).
  const std::int64_t C = m.channels, V = m.vocab, T = m.seq_len, L = m.layers;
  const std::int64_t ln_f = m.norm == NormKind::layernorm && m.bias ? 2 * C : C;
  return V * C + (m.learned_positions() ? T * C : 0) + ln_f + (m.tie_embeddings ? 0 : V * C) +
         L * gpt_block_param_count(m);
}

std::int64_t gpt_flops_param_count(const ModelConfig& m) {
  const std::int64_t C = m.channels;
  return gpt_param_count(m) - (m.learned_positions() ? static_cast<std::int64_t>(m.seq_len) * C : 0) -
         (m.tie_embeddings ? 0 : static_cast<std::int64_t>(m.vocab) * C);
}

double gpt_flops_per_token(const ModelConfig& m) {
  return 6.0 * gpt_flops_param_count(m) + 12.0 * m.layers * m.channels * m.seq_len;
}

void check_model_split(const ModelConfig& m, const ParallelDims& s) {
  using std::to_string;
  // Tensor parallelism splits heads, the MLP's hidden 4C and the vocabulary
  // (the embedding and logits) over tp: each must split evenly.
  const int tp = s.tp;
  const std::string by_tp = " is not divisible by parallel.tp = " + to_string(tp);
  require(m.heads % tp == 0, "model.heads = " + to_string(m.heads) + by_tp +
                                 "; choose a tp that divides the heads, or change model.heads");
  // Grouped-query attention: each tp rank holds whole key/value heads (no
  // replicated kv heads), so tp must divide them too.
  require(m.kv() % tp == 0, "model.kv_heads = " + to_string(m.kv()) + by_tp +
                                " (each tensor-parallel rank holds whole key/value heads); choose a tp that "
                                "divides model.kv_heads, or change it");
  if (m.ffn_hidden > 0)
    require(m.ffn() % tp == 0, "model.ffn_hidden = " + to_string(m.ffn()) + by_tp +
                                   " (the MLP's hidden width splits over tp); choose a tp that divides it, or "
                                   "change model.ffn_hidden");
  else
    require((4 * static_cast<long long>(m.channels)) % tp == 0,
            "model.channels = " + to_string(m.channels) + ": the MLP width 4 x " + to_string(m.channels) + by_tp +
                "; choose a tp that divides it, or change model.channels");
  if (m.vocab % tp != 0) {
    // Suggest a GPU-friendly size too: a multiple of 64 per tp rank is what GPT-2 uses (50257 -> 50304).
    const long long step = std::lcm(tp, 64);
    const long long padded = (static_cast<long long>(m.vocab) + step - 1) / step * step;
    throw Error("model.vocab = " + to_string(m.vocab) + by_tp + "; pad it (e.g. " + to_string(padded) + ")");
  }
  // Context parallelism cuts each sequence into 2 cp chunks (two per cp rank).
  const int cp = s.cp;
  require(m.seq_len % (2 * cp) == 0 || cp == 1,
          "model.seq_len = " + to_string(m.seq_len) + " is not divisible by 2 x parallel.cp = " + to_string(2 * cp) +
              " (context parallelism gives each cp rank two chunks of every sequence); change one of them");
  if (s.sequence_parallel && tp > 1) {
    const int local = m.seq_len / cp;
    const std::string what = cp > 1 ? "model.seq_len / parallel.cp = " + to_string(m.seq_len) + " / " + to_string(cp) +
                                          " = " + to_string(local)
                                    : "model.seq_len = " + to_string(m.seq_len);
    require(local % tp == 0, what + by_tp +
                                 " (parallel.sequence_parallel splits the sequence over tp); change one, "
                                 "or set parallel.sequence_parallel = false");
  }
}

std::vector<GlobalTensor> gpt_global_tensors(const ModelConfig& m) {
  const std::int64_t C = m.channels;
  std::vector<GlobalTensor> out = {{"wte", {m.vocab, C}}};
  if (m.learned_positions()) out.push_back({"wpe", {m.seq_len, C}});
  for (int l = 0; l < m.layers; ++l)
    for (const BlockTensorShape& t : layer_tensors(m, l)) out.push_back({block_prefix(l) + t.suffix, t.shape});
  out.push_back({"ln_f/weight", {C}});
  if (m.norm == NormKind::layernorm && m.bias) out.push_back({"ln_f/bias", {C}});
  if (!m.tie_embeddings) out.push_back({"lm_head/weight", {m.vocab, C}});
  return out;
}

ParamLayout gpt_param_layout(const ModelConfig& m, const std::vector<Chunk>& chunks, int tp, int tp_rank, int shards,
                             const ExpertSplit& experts) {
  const std::int64_t C = m.channels, V = m.vocab, T = m.seq_len;
  ParamLayout layout;
  layout.tp_rank = tp_rank;
  layout.tp_size = tp;
  layout.shards = shards;
  layout.expert_shards = experts.shards;
  std::size_t offset = 0, unit_begin = 0;
  int unit = 0;
  std::size_t end = 0;  // where the tensor added last ends (before its padding)
  // packed: right after the tensor before, without its padding (c_k and c_v after c_q).
  auto add = [&](std::string name, std::vector<std::int64_t> global, TpSplit split, int sections, bool tied_copy,
                 bool packed = false) {
    if (packed) offset = end;
    std::vector<std::int64_t> local = global;
    if (split == TpSplit::rows) local[0] /= tp;
    if (split == TpSplit::cols) local[1] /= tp;
    if (split == TpSplit::experts) local[0] /= experts.ep;
    std::size_t size = 1;
    for (auto d : local) size *= static_cast<std::size_t>(d);
    // Matrices decay: 2-D weights, and an MoE block's stacks of expert
    // matrices [E, rows, cols]; never a bias (an expert's [E, rows] neither).
    const bool is_bias = name.size() >= 5 && name.compare(name.size() - 5, 5, "/bias") == 0;
    const bool decay = global.size() >= 2 && !is_bias;
    const std::int64_t first_expert = split == TpSplit::experts ? experts.ep_rank * local[0] : 0;
    layout.params.push_back({std::move(name), std::move(global), std::move(local), split, sections, unit, offset, size,
                             decay, tied_copy, first_expert});
    end = offset + size;
    offset = round_up(end, kAlign);
  };
  // Every unit padded so that it splits into equal FSDP shards over its group.
  auto close_unit = [&](bool holds_experts = false) {
    offset = unit_begin + round_up(offset - unit_begin, (holds_experts ? experts.shards : shards) * kAlign);
    layout.unit_offset.push_back(unit_begin);
    layout.unit_size.push_back(offset - unit_begin);
    layout.experts_unit.push_back(-1);
    layout.holds_experts.push_back(holds_experts);
    unit_begin = offset;
    ++unit;
  };
  for (const Chunk& chunk : chunks) {
    if (chunk.embedding || (chunk.head && m.tie_embeddings)) {
      // The LM head's copy on the last stage is the tied copy; the embedding's is the owner.
      add("wte", {V, C}, TpSplit::rows, 1, !chunk.embedding);
      close_unit();
    }
    if (chunk.embedding && m.learned_positions()) {
      add("wpe", {T, C}, TpSplit::replicated, 1, false);
      close_unit();
    }
    for (int l = chunk.first_layer; l < chunk.end_layer; ++l) {
      const std::string prefix = block_prefix(l);
      const std::vector<BlockTensorShape> tensors = layer_tensors(m, l);
      bool routed = false;
      for (const BlockTensorShape& t : tensors) {
        routed = routed || t.split == TpSplit::experts;
        if (t.split != TpSplit::experts) add(prefix + t.suffix, t.shape, t.split, t.sections, false, t.packed);
      }
      close_unit();
      if (!routed) continue;
      layout.experts_unit.back() = unit;
      for (const BlockTensorShape& t : tensors)
        if (t.split == TpSplit::experts) add(prefix + t.suffix, t.shape, t.split, t.sections, false, t.packed);
      close_unit(true);
    }
    if (chunk.head) {
      add("ln_f/weight", {C}, TpSplit::replicated, 1, false);
      if (m.norm == NormKind::layernorm && m.bias) add("ln_f/bias", {C}, TpSplit::replicated, 1, false);
      close_unit();
    }
    if (chunk.head && !m.tie_embeddings) {  // vocabulary-parallel, as wte
      add("lm_head/weight", {V, C}, TpSplit::rows, 1, false);
      close_unit();
    }
  }
  layout.total = offset;
  return layout;
}

std::vector<ChunkUnits> gpt_chunk_units(const ModelConfig& m, const std::vector<Chunk>& chunks) {
  // The order gpt_param_layout closes its units in.
  std::vector<ChunkUnits> out;
  int unit = 0;
  for (const Chunk& c : chunks) {
    ChunkUnits u;
    if (c.embedding || (c.head && m.tie_embeddings)) u.wte = unit++;
    if (c.embedding && m.learned_positions()) u.wpe = unit++;
    for (int l = c.first_layer; l < c.end_layer; ++l) {
      u.blocks.push_back(unit++);
      u.experts.push_back(m.moe_block(l) ? unit++ : -1);  // the routed experts' unit follows its block's
    }
    if (c.head) u.ln_f = unit++;
    if (c.head && !m.tie_embeddings) u.lm_head = unit++;
    out.push_back(std::move(u));
  }
  return out;
}

std::vector<ChunkUnits> gpt_chunk_units(const std::vector<Chunk>& chunks) {
  return gpt_chunk_units(ModelConfig{}, chunks);
}

}  // namespace ndmini
