// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// GPT-2 and the Llama family (docs/model.md) as a stack of chunks. A chunk
// holds an embedding unit, transformer blocks, and a head unit (final norm,
// the LM head: tied to wte, or lm_head; the loss). GptModel computes the forward and backward of each
// unit of the chunks one rank holds. It works over parameters, gradients and
// activations it is GIVEN; it owns no parameter and keeps nothing between
// micro-batches.
//
// This file says WHAT is computed. The layers it calls split the work inside
// a unit: tensor and sequence parallelism (layers/tensor_parallel.hpp) and
// context-parallel attention (layers/context_parallel.hpp). Which rank holds
// which parameters (FSDP, data parallelism), the activations of micro-batches
// in flight and the gradient reductions live above, in the stage runtime
// (parallel/stage_runtime.hpp).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "config/config.hpp"
#include "core/types.hpp"
#include "layers/context_parallel.hpp"
#include "layers/expert_parallel.hpp"
#include "layers/moe_routing.hpp"
#include "layers/tensor_parallel.hpp"
#include "mesh/dims.hpp"
#include "model/block.hpp"
#include "model/chunk.hpp"
#include "model/param_layout.hpp"

namespace ndmini {

// ---- sizes and rules (no allocation) ----------------------------------------

// The architecture in one line, e.g. "gpt2: layernorm (eps 1e-05), learned
// positions, gelu MLP of 4C = 3072, 12 heads, biases, head tied to wte".
std::string architecture_text(const ModelConfig& m);

// One tensor of a transformer block as the parameter layout and the
// checkpoint hold it: its name after "h/<layer>/", its global shape, how tp
// splits it and the q/k/v sections of a rows split. packed: in the unit it
// starts right where the tensor before it ends, without the padding that
// aligns the others (c_k and c_v after c_q: one matrix for one product).
struct BlockTensorShape {
  std::string suffix;
  std::vector<std::int64_t> shape;
  TpSplit split = TpSplit::replicated;
  int sections = 1;
  bool packed = false;
};
// The tensors of one block of `m`, in unit (and checkpoint) order
// (docs/checkpoint-format.md): GPT-2's fused attn/c_attn when kv_heads =
// heads, else attn/c_q, c_k, c_v (the three weights, then their biases);
// mlp/c_fc under gelu, mlp/c_gate and c_up under swiglu; attn/c_proj and
// mlp/c_proj; a bias for every linear layer and LayerNorm with model.bias,
// none under rmsnorm. The block's compute views them by name
// (kBlockTensors, model/block.cpp).
std::vector<BlockTensorShape> gpt_block_tensors(const ModelConfig& m);
// Parameters of one block: all of them, and those of its matrices.
std::int64_t gpt_block_param_count(const ModelConfig& m);
std::int64_t gpt_block_matrix_param_count(const ModelConfig& m);

// All parameters; and N for MFU: all but the lookup tables (wpe, and wte
// when the head is untied: then lm_head is the head's product; tied, wte is
// both the lookup and the head's product and counts once).
std::int64_t gpt_param_count(const ModelConfig& m);
std::int64_t gpt_flops_param_count(const ModelConfig& m);
// Model FLOPs per trained token: 6N + 12 L C T (forward and backward; the
// attention's Q K^T and its product with V do not shrink under grouped-query
// attention: each of the H query heads still meets T keys of hs channels).
double gpt_flops_per_token(const ModelConfig& m);

// The model's rules for a split over the mesh (mesh/dims.hpp): tp divides the heads, kv_heads, the MLP's
// hidden width and the vocabulary;
// 2 cp divides seq_len; with sequence parallelism tp divides seq_len / cp.
// Throws Error naming the key and the fix.
void check_model_split(const ModelConfig& m, const ParallelDims& split);

// The global tensors of the model, in checkpoint order: names and shapes.
// wte, wpe (learned positions only), each block's (layer_tensors in
// model/moe.hpp: gpt_block_tensors, an MoE block's MLP replaced),
// ln_f/weight, ln_f/bias (LayerNorm with model.bias), lm_head/weight
// (untied head only).
struct GlobalTensor {
  std::string name;
  std::vector<std::int64_t> shape;
};
std::vector<GlobalTensor> gpt_global_tensors(const ModelConfig& m);

// Parameter layout of the chunks one pipeline stage holds, for tp rank
// `tp_rank` of `tp`; every tensor starts on a 64-byte boundary and every
// unit is padded to split into `shards` equal FSDP shards.
// Units, per chunk in order: wte (embedding chunk, and the head chunk when
// the head is tied: a unit of its own, so the embedding's and the head's
// copies shard alike), wpe (embedding chunk, learned positions), one per
// block, ln_f (head chunk), lm_head (head chunk, untied head: a unit of its
// own, like wte). An MoE block's routed experts follow its unit in one of
// their own: this rank's E/ep experts, padded for `experts.shards` (the
// expert fsdp group) instead of `shards`.
struct ExpertSplit {
  int ep = 1, ep_rank = 0, shards = 1;
};
ParamLayout gpt_param_layout(const ModelConfig& m, const std::vector<Chunk>& chunks, int tp = 1, int tp_rank = 0,
                             int shards = 1, const ExpertSplit& experts = {});

// The units of one chunk in that layout (-1: not in this chunk).
// A block's parameters and gradients: its unit's, and an MoE block's routed
// experts' (a unit of their own; none for a dense block).
struct BlockParams {
  UnitWeights unit, experts;
};
struct BlockGrads {
  real* unit = nullptr;
  real* experts = nullptr;
};

struct ChunkUnits {
  int wte = -1, wpe = -1, ln_f = -1, lm_head = -1;
  std::vector<int> blocks;
  std::vector<int> experts;  // per block: the unit of its routed experts (-1: a dense block)
};
std::vector<ChunkUnits> gpt_chunk_units(const ModelConfig& m, const std::vector<Chunk>& chunks);
// GPT-2's units (tied head, learned positions).
std::vector<ChunkUnits> gpt_chunk_units(const std::vector<Chunk>& chunks);

// Deterministic init: global element i of parameter `p` is drawn from the
// counter-based RNG at (seed, name, i), so every layout builds the same
// global model. Fills `data`: p's elements [local_begin, + size) on tp rank tp_rank.
void gpt_init_param(const ModelConfig& m, const ParamInfo& p, int tp_rank, std::size_t local_begin, Slice1D data,
                    std::uint64_t seed);

// How a stage's MoE blocks split their routed experts: whether the stage
// holds an MoE block, the expert group's size ep and train.moe_max_load.
struct MoeSplit {
  bool blocks = false;
  int ep = 1;
  double max_load = 0;
};
// Whether `chunks` hold an MoE block of `m`.
bool has_moe_block(const ModelConfig& m, const std::vector<Chunk>& chunks);

// The sizes of both kinds of block for one split (what GptModel allocates
// per layer): dense blocks, and MoE blocks (`moe`, set when m has any).
struct LayerSizes {
  BlockSizes dense, moe;
  std::vector<bool> is_moe;  // per layer of the model
  const BlockSizes& of(int layer) const { return is_moe[layer] ? moe : dense; }
};

// ---- the units of one rank's chunks ------------------------------------------

class GptModel {
 public:
  // The chunks `chunks` of the model, for micro-batches of `micro_batch`
  // sequences; tp and cp: the groups its layers split over (null: none).
  // `precision`: bf16 runs the matrix products on bf16 operands (UnitWeights
  // then carry bf16 values) and keeps their inputs in bf16. experts: the
  // expert group of the MoE blocks (null: ep = 1); moe_max_load: train.moe_max_load.
  GptModel(const ModelConfig& m, int micro_batch, std::vector<Chunk> chunks, Communicator* tp = nullptr,
           bool sequence_parallel = false, Communicator* cp = nullptr, Precision precision = Precision::fp32,
           Communicator* experts = nullptr, double moe_max_load = 0, double moe_z_loss = 0, double moe_seq_aux = 0);
  // Releases the emulated bf16 products' buffer (kernels/gemm.cpp): it lives as long as the model.
  ~GptModel();
  GptModel(const GptModel&) = delete;
  GptModel& operator=(const GptModel&) = delete;

  const ModelConfig& config() const { return cfg_; }
  Precision precision() const { return precision_; }
  const std::vector<Chunk>& chunks() const { return chunks_; }
  const std::vector<ChunkUnits>& units() const { return units_; }
  // The parameter layout of these chunks on this tp rank and ep rank: units
  // padded to `shards`, the routed experts' units to `expert_shards`.
  ParamLayout param_layout(int shards, int expert_shards) const;
  int tp_rank() const { return tp_.rank(); }
  // Which tokens of each sequence this rank holds (context parallelism).
  const CpLayout& cp_layout() const { return attention_.layout(); }
  // Token rows of a micro-batch here (N) and the residual rows this rank holds (Nr).
  std::size_t rows() const { return tp_.rows(); }
  std::size_t local_rows() const { return tp_.local_rows(); }
  // Floats of the activations between chunks: Nr x C.
  std::size_t activation_elements() const { return tp_.local_rows() * cfg_.channels; }
  // The sizes of one dense block's buffers on a rank of this split.
  static BlockSizes block_sizes_of(const ModelConfig& m, int micro_batch, int tp, bool sequence_parallel, int cp,
                                   Precision precision = Precision::fp32);
  // Both kinds of block (what block_sizes(layer) returns); `moe` only for a model with MoE blocks.
  static LayerSizes layer_sizes_of(const ModelConfig& m, int micro_batch, int tp, bool sequence_parallel, int cp,
                                   Precision precision = Precision::fp32, const MoeSplit& moe = {});
  static std::size_t activation_elements_of(const ModelConfig& m, int micro_batch, int tp, bool sequence_parallel,
                                            int cp) {
    return block_sizes_of(m, micro_batch, tp, sequence_parallel, cp).residual();
  }
  const BlockSizes& block_sizes(int layer) const { return block(layer).sizes(); }
  // The sizes of both kinds of block as this model allocates them.
  LayerSizes layer_sizes() const;
  // One block's activations for one micro-batch (all, or only its output).
  BlockActivations allocate_block(int layer, bool output_only) const { return block(layer).allocate(output_only); }

  // ---- forward and backward of one unit, one micro-batch ----
  // Parameters and gradients are the full (tp-local) units, indexed like the
  // parameter layout from the unit's start. Gradients are ADDED.
  // The embedding of `tokens` ([N]) into out [Nr, C]; wpe null under RoPE.
  void embedding_forward(Slice2D out, ConstTokenView tokens, real* wte, real* wpe);
  void embedding_backward(real* dwte, real* dwpe, ConstSlice2D dres, ConstTokenView tokens);
  // x: the input [Nr, C] of block `layer`; fills a (a.res3 = output).
  // An MoE block routes unless a.moe.routed (a recompute: replays the
  // routing) and returns what it routed; a dense block returns nothing.
  MoeRouteStats block_forward(int layer, const BlockParams& params, ConstSlice2D x, BlockActivations& a);
  // Tests: record or replay the MoE blocks' routing (layers/moe_routing.hpp);
  // block_forward names the block in log->next, the caller the rest of the token.
  void set_moe_routing_log(MoeRoutingLog* log);
  // dres: d(output) on entry, d(input) on exit.
  // loss_scale: the forward's (the MoE auxiliary losses' gradients use it).
  void block_backward(int layer, const BlockParams& params, const BlockGrads& grads, ConstSlice2D x,
                      const BlockActivations& a, Slice2D dres, real loss_scale = 0);
  // The head: final norm, LM head, loss of `targets`; returns the sum of
  // the per-token losses. `head` is the LM head's unit: wte's (tied) or
  // lm_head's (untied), both [V/tp, C] alone in their unit. With grad_scale
  // != 0 it keeps d(logits) for head_backward, which must follow before the
  // next head_forward.
  double head_forward(real* ln_f, UnitWeights head, ConstSlice2D x, ConstTokenView targets, real grad_scale);
  // Writes d(x) into dx [Nr, C]; adds to the gradients of ln_f and of the head's matrix (dhead).
  void head_backward(real* ln_f, UnitWeights head, real* dln_f, real* dhead, ConstSlice2D x, Slice2D dx);

  // With SP, sums the partial gradients of tp-replicated tensors over tp.
  void sum_replicated_grads(real* grads, std::size_t n, Precision wire) { tp_.sum_replicated_grads(grads, n, wire); }

  // The floats the emulated bf16 products widen at most (0 where bf16 runs on a library of its own).
  static std::size_t emulated_bf16_floats(const ModelConfig& m, const BlockSizes& block, bool has_head);
  static std::size_t emulated_bf16_floats(const ModelConfig& m, const LayerSizes& blocks, const MoeSizes& experts,
                                          bool has_head);
  // The buffers a GptModel allocates for itself (its constructor allocates
  // these; the memory estimate adds them up): the layers' scratch, the
  // positions, and on the head stage the head's, in floats.
  struct Buffers {
    // TensorParallel, ContextParallelAttention, the TransformerBlocks (an MoE
    // block's too) and ExpertParallel, the GEMM's ones
    std::size_t layers_bytes = 0;
    std::size_t emulated_bf16 = 0;  // floats of the emulated bf16 products' widened operands (in layers_bytes)
    std::size_t positions = 0;      // tokens
    // Head stage only; lnf_stats: the final norm's rstd, lnf_mean its mean (LayerNorm only).
    std::size_t lnf = 0, lnf_stats = 0, lnf_mean = 0, logits = 0, losses = 0, head_dln = 0;
    std::size_t lnf_bf16 = 0, dlogits_bf16 = 0;  // head stage under bf16: the LM head's operands
    std::size_t bytes() const {
      return layers_bytes + positions * sizeof(token_t) +
             (lnf + lnf_stats + lnf_mean + logits + losses + head_dln) * sizeof(real) +
             (lnf_bf16 + dlogits_bf16) * sizeof(bf16);
    }
  };
  static Buffers buffer_sizes(const ModelConfig& m, int micro_batch, bool has_head, int tp, bool sequence_parallel,
                              int cp, Precision precision = Precision::fp32, const MoeSplit& moe = {});

 private:
  Slice2D wte(real* unit_base) const;       // wte or lm_head: alone in its unit, [V/tp, C]
  Slice2D wpe(real* unit_base) const;       // empty for a null unit (RoPE: no wpe)
  Slice1D lnf_bias(real* unit_base) const;  // ln_f/bias in ln_f's unit; empty without one
  // wte as the LM head's operand: the fp32 values, or under bf16 the bf16 copy.
  template <class T>
  ConstMatrix<T> wte_operand(UnitWeights params) const;
  // Block `layer`'s compute and tensors: a dense block's, or an MoE block's.
  bool is_moe(int layer) const;  // InternalError for an MoE block of another stage
  const TransformerBlock& block(int layer) const;
  TransformerBlock& block(int layer);
  BlockWeights block_weights(int layer, const BlockParams& params) const;
  std::vector<int> routed_sequences() const;  // each routed row's sequence in its micro-batch
  const BlockLayout& layout_of(int layer) const { return cfg_.moe_block(layer) ? moe_layout_ : block_layout_; }
  // The head, written once for the operands' element type T (real or bf16).
  template <class T>
  double head_forward_as(real* ln_f, UnitWeights wte, ConstSlice2D x, ConstTokenView targets, real grad_scale);
  template <class T>
  void head_backward_as(real* ln_f, UnitWeights wte, real* dln_f, real* dwte, ConstSlice2D x, Slice2D dx);

  ModelConfig cfg_;
  Precision precision_;
  std::vector<Chunk> chunks_;
  std::vector<ChunkUnits> units_;
  TensorParallel tp_;
  ContextParallelAttention attention_;
  TokenView positions_;  // absolute position of each row (row_positions in gpt.cpp: residual rows, or all N under RoPE)
  TransformerBlock block_;
  // The stage's MoE blocks: their routed experts and their block (null: none here).
  std::unique_ptr<ExpertParallel> experts_;
  std::unique_ptr<TransformerBlock> moe_block_;
  MoeRoutingLog* moe_log_ = nullptr;  // set_moe_routing_log
  kernels::Norm norm_;                // the final norm's kind and eps
  BlockLayout block_layout_, moe_layout_;
  std::size_t lnf_bias_offset_ = 0;  // ln_f/bias in its unit (ln_f/weight starts it); 0: none
  KeptOperand lnf_;                  // the final LayerNorm's output: the LM head's operand
  View1D lnf_mean_, lnf_rstd_, logits_, losses_, dln_;
  Bf16View1D dlogits_bf16_;  // bf16 only: d(logits) rounded for the LM head's two products
};

}  // namespace ndmini
