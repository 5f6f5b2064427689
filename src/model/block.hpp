// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// One transformer block: x -> res2 = x + attn(ln_1(x)) -> res3 = res2 +
// mlp(ln_2(res2)), forward and backward of one micro-batch, for GPT-2 and
// the Llama family alike (docs/model.md): the norm is LayerNorm or RMSNorm,
// RoPE rotates q and k or the embedding adds learned positions, the MLP is
// GELU or SwiGLU, k and v have model.kv_heads heads, biases are optional.
// Where tensor parallelism splits the work (the norms entering a region,
// the row-parallel projections leaving it) the block calls TensorParallel;
// the attention itself is ContextParallelAttention (a ring over cp when cp > 1).
// An MoE block (model/moe.hpp) computes its MLP as the shared expert (the
// dense MLP's code at the shared width; none at width 0) plus the routed
// experts of ExpertParallel over the expert group.
#include <algorithm>
#include <array>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "config/config.hpp"
#include "core/types.hpp"
#include "kernels/kernels.hpp"
#include "layers/context_parallel.hpp"
#include "layers/expert_parallel.hpp"
#include "layers/tensor_parallel.hpp"
#include "model/param_layout.hpp"

namespace ndmini {

// A block's tensors (its parameters, or their gradients) as views into its
// unit; kBlockTensors maps their names to these members. A tensor the
// architecture lacks (a bias without model.bias, a norm's bias under
// rmsnorm, c_up under gelu) is an empty view.
struct BlockTensors {
  Slice1D ln1_w, ln1_b;
  // This rank's q, k and v rows [(H + 2 kv_heads) hs / tp, C]: GPT-2's
  // c_attn, or c_q, c_k and c_v, which the layout places side by side so
  // that one product computes the row q | k | v the attention reads.
  Slice2D attn_w;
  Slice1D attn_b;
  Slice2D attn_proj_w;  // attn/c_proj [C, C/tp]
  Slice1D attn_proj_b;
  Slice1D ln2_w, ln2_b;
  Slice2D fc_w;  // c_fc [F/tp, C]; under swiglu c_gate
  Slice1D fc_b;
  Slice2D up_w;  // swiglu: c_up [F/tp, C]
  Slice1D up_b;
  Slice2D mlp_proj_w;  // mlp/c_proj [C, F/tp]
  Slice1D mlp_proj_b;
  // An MoE block: the router [E, C] and the routed experts' matrices, each
  // [E, rows, cols] seen as [E rows, cols], and biases [E, rows] seen as
  // [E rows] (expert_tensors() hands them to the layer). Its shared expert
  // (mlp/shared/...) takes the dense MLP's members above.
  Slice2D router_w;
  Slice1D selection_bias;  // [E]: sigmoid scores' selection bias
  Slice2D expert_fc_w, expert_up_w, expert_proj_w;
  Slice1D expert_fc_b, expert_up_b, expert_proj_b;
};
ExpertTensors expert_tensors(const BlockTensors& t);

// The operands of a block's matrix products in element type T: the fp32
// weights, or under bf16 mixed precision their bf16 working copy.
template <class T>
struct BlockMatrices {
  ConstMatrix<T> attn_w, attn_proj_w, fc_w, up_w, mlp_proj_w;
  ConstMatrix<T> expert_fc_w, expert_up_w, expert_proj_w;  // an MoE block's routed experts
  ExpertMatrices<T> experts() const { return {expert_fc_w, expert_up_w, expert_proj_w}; }
};
using BlockMatricesBf16 = BlockMatrices<bf16>;

// A block's weights as its compute reads them: `w` (fp32; under bf16 the
// masters rounded to bf16) and, under bf16, `bf16` the same matrices in bf16.
struct BlockWeights {
  BlockTensors w;
  BlockMatricesBf16 bf16;
};

// Which member of BlockTensors views the tensor named `suffix` (after
// "h/<layer>/"): a 1-D or a 2-D one; a matrix also has its member in
// BlockMatricesBf16. Tensors that share a member (c_q, c_k and c_v; their
// biases) follow each other in the unit without a gap, and the member views
// them as one (BlockLayout checks it).
struct BlockTensorSpec {
  const char* suffix;
  // Member pointers through aliases: nvcc's front end rewrites a plain
  // `T C::*name` member with parentheses that g++ then warns about.
  using VectorMember = Slice1D BlockTensors::*;
  using MatrixMember = Slice2D BlockTensors::*;
  using Bf16MatrixMember = ConstBf16Slice2D BlockMatricesBf16::*;
  VectorMember vector;
  MatrixMember matrix;
  Bf16MatrixMember bf16_matrix;
};
// Every block tensor of every architecture by name. Which of them a block
// has, their order and shapes: layer_tensors (model/moe.hpp: a dense
// block's gpt_block_tensors, or an MoE block's), which the parameter
// layout, the checkpoint and BlockLayout all walk.
extern const std::array<BlockTensorSpec, 40> kBlockTensors;

// Where a block's tensors sit in its unit, and an MoE block's routed
// experts in theirs (ParamLayout::experts_unit): the same for every block of
// a kind (dense, or MoE).
class BlockLayout {
 public:
  BlockLayout() = default;
  // From the parameters of one block unit `unit` of `layout` and of its
  // experts' unit, by name (InternalError for a name kBlockTensors lacks, or
  // tensors of one member that are not side by side).
  BlockLayout(const ParamLayout& layout, int unit);
  // experts_base: the experts' unit (an MoE block; ignored by a dense one).
  BlockTensors view(real* unit_base, real* experts_base) const;
  // The matrices of a bf16 copy of the units (same offsets).
  BlockMatricesBf16 view_bf16(const bf16* unit_base, const bf16* experts_base) const;

 private:
  struct Place {
    const BlockTensorSpec* spec = nullptr;
    bool in_experts_unit = false;
    std::size_t offset = 0;  // from its unit's start
    std::size_t rows = 0, cols = 0;
  };
  template <class P>
  static P* base_of(const Place& p, P* unit_base, P* experts_base);
  std::vector<Place> places_;
};

// The sizes of one block's buffers for one micro-batch: N token rows, Nr of
// them residual rows here, C channels split over tp. `attention` is this
// rank's part of the attention; `bf16` means mixed precision. The widths
// after it are the architecture's (set_widths). TransformerBlock allocates
// exactly these; the memory estimate adds them up (GptModel::block_sizes_of).
struct BlockSizes {
  std::size_t channels, rows, local_rows;
  int tp;
  kernels::AttentionShape attention;
  bool bf16 = false;
  std::size_t qkv_width = 0;  // q, k and v of all heads: (H + 2 kv_heads) hs; GPT-2: 3C
  std::size_t kv_width = 0;   // k (or v) of all key/value heads: kv_heads hs; GPT-2: C
  std::size_t ffn = 0;        // F: the MLP's hidden width; GPT-2: 4C
  bool gated = false;         // swiglu: the MLP keeps gate and up outputs and their product
  bool rms = false;           // rmsnorm: one statistic per row (rstd; no mean)
  // An MoE block: ffn is the shared expert's width (0: none), and the
  // routed experts keep moe_kept bytes per micro-batch (MoeActivations;
  // with recomputation only its routing, on the host).
  bool moe = false;
  std::size_t moe_kept = 0;
  // The widths of the architecture of `m`.
  void set_widths(const ModelConfig& m) {
    kv_width = static_cast<std::size_t>(m.kv()) * m.head_size();
    qkv_width = static_cast<std::size_t>(m.channels) + 2 * kv_width;
    ffn = static_cast<std::size_t>(m.ffn());
    gated = m.gated();
    rms = m.norm == NormKind::rmsnorm;
  }
  // An MoE block of `m` whose routed experts keep `experts` (ExpertParallel::sizes_of).
  void set_moe_widths(const ModelConfig& m, const MoeSizes& experts) {
    set_widths(m);
    ffn = static_cast<std::size_t>(m.moe_shared_hidden);
    moe = true;
    moe_kept = experts.kept_bytes();
  }
  std::size_t full() const { return rows * channels; }                  // [N, C]: LayerNorm outputs, dln
  std::size_t residual() const { return local_rows * channels; }        // [Nr, C]: res2, res3
  std::size_t stats() const { return local_rows; }                      // LayerNorm mean or rstd
  std::size_t attention_out() const { return rows * (channels / tp); }  // [N, C/tp]: atty, datty
  std::size_t qkv() const { return rows * (qkv_width / tp); }           // [N, (H + 2KV) hs/tp]: qkv, dqkv
  std::size_t hidden() const { return rows * (ffn / tp); }              // [N, F/tp]: fch, fch_gelu, dfc
  std::size_t kv_part() const { return attention.kv_part_size(); }      // one of k, v here: the ring's unit
  // Head-major q of H/tp heads, then k and v of kv_heads/tp heads.
  std::size_t qkvh() const { return ContextParallelAttention::qkvh_size(attention); }
  std::size_t lse() const { return ContextParallelAttention::lse_size(attention); }  // log-sum-exp per query row
  // Which of kBlockKept's conditional tensors the architecture has.
  bool layernorm() const { return !rms; }
  bool gelu() const { return !gated; }
  bool swiglu() const { return gated; }
  // Bytes of one block's activations (BlockActivations): all of them, or
  // only the output res3 (output_only, with recomputation).
  std::size_t activation_bytes(bool output_only) const;
  // The same, tensor by tensor (named as in BlockActivations): what
  // activation_bytes adds up, for a term-by-term account (ndmini plan --json).
  struct Kept {
    const char* name;
    std::size_t bytes;
  };
  std::vector<Kept> kept_tensors(bool output_only) const;
  // Bytes of the scratch one TransformerBlock holds (shared by all blocks).
  // Under bf16 this also holds the fp32 attention output for its backward
  // and the bf16 rounding of a product's output gradient. Under swiglu one
  // [N, F/tp] more: the gradients of gate and up both live at once.
  std::size_t scratch_bytes() const;
  std::size_t largest_output() const { return std::max({full(), qkv(), hidden()}); }
};

// What one block keeps from its forward for its backward. The operands are
// bf16 under mixed precision; statistics and residuals stay fp32.
struct BlockActivations {
  KeptOperand ln1;            // ln1, all N rows (gathered with SP)
  View1D ln1_mean, ln1_rstd;  // stats of the residual rows
  KeptOperand qkvh;           // what the attention keeps: head-major q, k, v ...
  View1D lse;                 // ... and the log-sum-exp
  KeptOperand atty;           // attention output, [N, C/tp], the input of c_proj
  View1D res2;                // residual after attention, residual rows
  KeptOperand ln2;
  View1D ln2_mean, ln2_rstd;
  KeptOperand fch, fch_gelu;  // MLP hidden before and after GELU, [N, F/tp] (swiglu: fch is the gate's output)
  KeptOperand fch_up;         // swiglu: the up product's output, [N, F/tp]
  KeptOperand fch_swiglu;     // swiglu: silu(gate) x up, the input of the down product, [N, F/tp]
  View1D res3;                // the block's output, residual rows
  MoeActivations moe;         // an MoE block: its routing and the routed experts' operands
};

// Recomputation keeps an MoE block's routing per micro-batch (small, on the
// host) so that the recomputed forward replays it rather than routing again:
// moves the routing of `from` into `to` (from's becomes to's old one).
void swap_routing(MoeActivations& to, MoeActivations& from);

// One tensor a block keeps: its name (its label, and its line of ndmini plan
// --json), its size, and whether recomputation keeps it too (only the
// block's output). Exactly one member pointer is set: an fp32 tensor or an
// operand. `applies`, when set, says which architectures keep it (the
// LayerNorm's mean, GELU's output, SwiGLU's up output and product).
// TransformerBlock::allocate and BlockSizes::kept_tensors both walk
// kBlockKept, so what is allocated is what the memory estimate counts.
struct BlockKeptSpec {
  enum class Kept { always, without_recompute };
  const char* name;
  std::size_t (BlockSizes::*elements)() const;
  Kept kept;
  using Fp32Member = View1D BlockActivations::*;
  using OperandMember = KeptOperand BlockActivations::*;
  Fp32Member fp32;
  OperandMember operand;
  bool (BlockSizes::*applies)() const = nullptr;
  // Whether a block of `sizes` keeps this tensor (output_only: with recomputation).
  bool kept_by(const BlockSizes& sizes, bool output_only) const {
    return (!output_only || kept == Kept::always) && (applies == nullptr || (sizes.*applies)());
  }
};
extern const std::array<BlockKeptSpec, 15> kBlockKept;

class TransformerBlock {
 public:
  // Shared by every block of a stage; owns the scratch buffers one forward
  // or backward needs (valid across blocks and micro-batches). The
  // architecture is m's (norm, RoPE, MLP, key/value heads, biases).
  // positions: under RoPE the global position of each of the N rows the
  // block computes on (with cp its chunks' true positions, with SP the rows
  // gathered over tp); unused under learned positions.
  // bf16: mixed precision (BlockWeights carry bf16 matrices).
  // experts: MoE blocks' routed experts (null: dense blocks); the MLP is
  // then the shared expert, of width model.moe_shared_hidden.
  TransformerBlock(const ModelConfig& m, TensorParallel& tp, ContextParallelAttention& attention,
                   ConstTokenView positions, bool bf16, ExpertParallel* experts = nullptr);
  const BlockSizes& sizes() const { return sizes_; }

  // Activations of one block for one micro-batch: all of them, or (output_only,
  // with recomputation) just the block output res3 (and an MoE block's routing, kept by the caller).
  BlockActivations allocate(bool output_only) const;

  // x: the block input, residual rows [Nr, C]. Fills `a` (a.res3 = output).
  // An MoE block routes unless a.moe.routed (a recompute replays the routing);
  // returns what it routed (empty in a dense block).
  MoeRouteStats forward(const BlockWeights& w, ConstSlice2D x, BlockActivations& a);
  // dres: d(output) on entry, d(input) on exit (residual rows). Parameter
  // gradients are ADDED into g (an MoE block's routed experts: only this ep
  // rank's). loss_scale: the main loss's weight of a token, at which the
  // MoE auxiliary losses add their gradients (0: none).
  void backward(const BlockWeights& w, const BlockTensors& g, ConstSlice2D x, const BlockActivations& a, Slice2D dres,
                real loss_scale = 0);

 private:
  // forward and backward, written once for the operands' element type T:
  // real, or bf16 under mixed precision.
  template <class T>
  MoeRouteStats forward_as(const BlockWeights& w, ConstSlice2D x, BlockActivations& a);
  template <class T>
  void backward_as(const BlockWeights& w, const BlockTensors& g, ConstSlice2D x, const BlockActivations& a,
                   Slice2D dres, real loss_scale);
  // The dense MLP (or an MoE block's shared expert): res3 = res2 + mlp(ln2),
  // and its backward into dln_ (d(ln2), before the sum over tp).
  template <class T>
  void mlp_forward(const BlockWeights& w, BlockActivations& a);
  template <class T>
  void mlp_backward(const BlockWeights& w, const BlockTensors& g, const BlockActivations& a, Slice2D dres);
  // The rows of an [N, C] operand this rank routes: its residual rows.
  template <class T>
  ConstMatrix<T> routed_rows(const KeptOperand& full) const;
  // Where a product's dy is rounded for both of its products: under bf16
  // the dy_bf16_ scratch as [N, cols]; nothing in fp32.
  template <class T>
  Matrix<T> dy_rounded(std::size_t cols) const;
  // The attention output as its backward reads it: the kept fp32 one, or
  // under bf16 the kept bf16 one widened into atty_.
  template <class T>
  ConstSlice2D attention_output(const KeptOperand& atty) const;

  TensorParallel& tp_;
  ContextParallelAttention& attention_;
  ExpertParallel* experts_;
  BlockSizes sizes_;
  kernels::Norm norm_;
  bool rope_;
  real rope_theta_;
  ConstTokenView positions_;  // RoPE: the position of each of the N rows
  int head_size_;
  // Channels; per tp rank: attention width (q heads), k heads' width, MLP
  // width, q+k+v width.
  std::size_t C_, Cl_, KVl_, F_, Q_;
  View1D qkv_, dln_, dfc_, dqkv_, datty_;
  View1D dup_;          // swiglu: d(up), beside d(gate) in dfc_
  View1D atty_;         // bf16: the attention output widened back for the attention's backward
  Bf16View1D dy_bf16_;  // bf16: a product's output gradient rounded for its two products
};

}  // namespace ndmini
