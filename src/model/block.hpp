// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// One GPT-2 transformer block: x -> res2 = x + attn(ln_1(x)) -> res3 = res2 +
// mlp(ln_2(res2)), forward and backward of one micro-batch. Where tensor
// parallelism splits the work (the LayerNorms entering a region, the
// row-parallel projections leaving it) the block calls TensorParallel; the
// attention itself is ContextParallelAttention (a ring over cp when cp > 1).
#include <array>
#include <cstddef>

#include "core/types.hpp"
#include "layers/context_parallel.hpp"
#include "layers/tensor_parallel.hpp"
#include "model/param_layout.hpp"

namespace ndmini {

// A block's twelve tensors (its parameters, or their gradients) as views
// into its unit; kBlockTensors gives their order.
struct BlockTensors {
  Slice1D ln1_w, ln1_b;
  Slice2D attn_w;  // c_attn [3C/tp, C]: this rank's heads' q, k, v rows
  Slice1D attn_b;
  Slice2D attn_proj_w;  // attn/c_proj [C, C/tp]
  Slice1D attn_proj_b;
  Slice1D ln2_w, ln2_b;
  Slice2D fc_w;  // c_fc [4C/tp, C]
  Slice1D fc_b;
  Slice2D mlp_proj_w;  // mlp/c_proj [C, 4C/tp]
  Slice1D mlp_proj_b;
};

// One tensor of a block: its name, global shape, tensor-parallel split and
// the member of BlockTensors that views it (a 1-D or a 2-D one).
struct BlockTensorSpec {
  const char* suffix;  // after "h/<layer>/"
  int rows_c, cols_c;  // shape in multiples of C (cols 0: a 1-D tensor)
  TpSplit split;
  int sections;  // q/k/v sections of a rows split
  Slice1D BlockTensors::*vector;
  Slice2D BlockTensors::*matrix;
};
// The tensors of a block in unit (and checkpoint) order: the one place that
// order is written; the parameter layout, the global tensor list and
// BlockLayout::view all walk it.
extern const std::array<BlockTensorSpec, 12> kBlockTensors;

// Where those tensors sit in a block's unit: the same for every block.
class BlockLayout {
 public:
  BlockLayout() = default;
  // From the parameters of one block unit `unit` of `layout`.
  BlockLayout(const ParamLayout& layout, int unit);
  BlockTensors view(real* unit_base) const;

 private:
  struct Place {
    std::size_t offset = 0;  // from the unit's start
    std::size_t rows = 0, cols = 0;
  };
  std::array<Place, kBlockTensors.size()> places_{};
};

// What one block keeps from its forward for its backward.
struct BlockActivations {
  View1D ln1, ln1_mean, ln1_rstd;  // ln1 all N rows (gathered with SP), stats of the residual rows
  View1D qkvh, lse;                // what the attention keeps: head-major q, k, v and the log-sum-exp
  View1D atty;                     // attention output, [N, C/tp], the input of c_proj
  View1D res2;                     // residual after attention, residual rows
  View1D ln2, ln2_mean, ln2_rstd;
  View1D fch, fch_gelu;  // MLP hidden before and after GELU, [N, 4C/tp]
  View1D res3;           // the block's output, residual rows
};

// The sizes of one block's buffers for one micro-batch: N token rows, Nr of
// them residual rows here, C channels split over tp; `attention` is this
// rank's part of the attention. TransformerBlock allocates exactly these
// (in floats); the memory estimate adds them up.
struct BlockSizes {
  std::size_t channels, rows, local_rows;
  int tp;
  kernels::AttentionShape attention;
  std::size_t full() const { return rows * channels; }                  // [N, C]: LayerNorm outputs, dln
  std::size_t residual() const { return local_rows * channels; }        // [Nr, C]: res2, res3
  std::size_t stats() const { return local_rows; }                      // LayerNorm mean or rstd
  std::size_t attention_out() const { return rows * (channels / tp); }  // [N, C/tp]: atty, datty
  std::size_t qkv() const { return rows * (3 * channels / tp); }        // [N, 3C/tp]: qkv, dqkv
  std::size_t hidden() const { return rows * (4 * channels / tp); }     // [N, 4C/tp]: fch, fch_gelu, dfc
  // Floats of one block's activations (BlockActivations): all of them, or
  // only the output res3 (output_only, with recomputation).
  std::size_t activation_floats(bool output_only) const;
  // Floats of the scratch one TransformerBlock holds (shared by all blocks).
  std::size_t scratch_floats() const { return 2 * qkv() + full() + hidden() + attention_out(); }
};

class TransformerBlock {
 public:
  // Shared by every block of a stage; owns the scratch buffers one forward
  // or backward needs (valid across blocks and micro-batches).
  TransformerBlock(int channels, TensorParallel& tp, ContextParallelAttention& attention);
  const BlockSizes& sizes() const { return sizes_; }

  // Activations of one block for one micro-batch: all of them, or (output_only,
  // with recomputation) just the block output res3.
  BlockActivations allocate(bool output_only) const;

  // x: the block input, residual rows [Nr, C]. Fills `a` (a.res3 = output).
  void forward(const BlockTensors& w, ConstSlice2D x, BlockActivations& a);
  // dres: d(output) on entry, d(input) on exit (residual rows). Parameter
  // gradients are ADDED into g.
  void backward(const BlockTensors& w, const BlockTensors& g, ConstSlice2D x, const BlockActivations& a, Slice2D dres);

 private:
  TensorParallel& tp_;
  ContextParallelAttention& attention_;
  BlockSizes sizes_;
  std::size_t C_, Cl_, F_, Q_;  // channels; per tp rank: attention width, MLP width, q+k+v width
  View1D qkv_, dln_, dfc_, dqkv_, datty_;
};

}  // namespace ndmini
