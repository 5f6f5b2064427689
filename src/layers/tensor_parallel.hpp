// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Tensor parallelism (Megatron) and sequence parallelism over the tp group:
// the layer operations the model calls where tensor parallelism splits or
// joins its data. The model says what it computes; this says how tp splits it.
//
// Splits: c_attn and c_fc are column-parallel (each rank holds its heads' q,
// k, v rows and 4C/tp rows of c_fc), both c_proj are row-parallel (partial
// products summed over tp), wte is split over the vocabulary (the embedding
// and the cross-entropy are vocabulary-parallel: the logits are never
// gathered). A block's tensor-parallel region is entered at each LayerNorm
// (its output feeds a column-parallel layer) and left at each row-parallel
// layer. With sequence parallelism the LayerNorm and residual regions hold
// only N/tp of the N rows (each tp rank a contiguous slice): entering is an
// all-gather, leaving a reduce-scatter, instead of the all-reduce on leaving.
// The all-gathered LayerNorm outputs are kept whole for the backward.
//
// Under bf16 every transfer of an activation or of its gradient is bf16 on
// the wire (half the bytes): the fp32 values are rounded to nearest even, the
// sums are bf16 sums (Communicator's bf16 all-reduce and reduce-scatter) and
// the results are widened back, so what the layers compute with stays fp32.
// The embedding's sum is exact either way (one non-zero term, a bf16 value).
// The cross-entropy statistics stay fp32 (the softmax is fp32 throughout).
//
// Rows: N = micro_batch x seq_len / cp token rows per micro-batch on this
// rank; the residual stream holds local_rows() of them. All buffers are in
// MemSpace; every collective goes through the tp Communicator.
#include <cstddef>

#include "comm/communicator.hpp"
#include "core/types.hpp"
#include "kernels/kernels.hpp"

namespace ndmini {

class TensorParallel {
 public:
  // tp: the tp group (null or size 1: no tensor parallelism; every call is
  // then the plain single-rank operation).
  // bf16: mixed precision (LayerNorm outputs entering a region are bf16,
  // and every activation and activation gradient travels in bf16).
  TensorParallel(Communicator* tp, bool sequence_parallel, std::size_t rows, int channels, int vocab,
                 bool bf16 = false);

  // The floats of the buffers a TensorParallel allocates (its constructor
  // and the memory estimate use these): partial products and cross-entropy
  // statistics with tp > 1, the sequence-parallel slices with SP, and under
  // bf16 the wire buffers (bf16 values) of every N-row and local-row transfer.
  struct Buffers {
    std::size_t partial = 0, xent_max = 0, xent_stats = 0;   // tp > 1
    std::size_t ln_local = 0, dres_full = 0, dln_local = 0;  // sequence parallelism (ln_local: bf16 values under bf16)
    std::size_t wire_full = 0, wire_local = 0;               // bf16 values: bf16 and tp > 1 (wire_local: with SP)
    bool bf16 = false;
    std::size_t bytes() const {
      return (partial + xent_max + xent_stats + dres_full + dln_local) * sizeof(real) +
             ln_local * (bf16 ? sizeof(ndmini::bf16) : sizeof(real)) + (wire_full + wire_local) * sizeof(ndmini::bf16);
    }
  };
  static Buffers buffer_sizes(int tp, bool sequence_parallel, std::size_t rows, int channels, bool bf16 = false);

  int size() const { return size_; }
  int rank() const { return rank_; }
  bool sequence_parallel() const { return sp_; }
  std::size_t rows() const { return rows_; }              // N
  std::size_t local_rows() const { return local_rows_; }  // residual rows here: N/tp with SP, else N
  std::size_t first_local_row() const { return sp_ ? rank_ * local_rows_ : 0; }
  int vocab_start() const { return rank_ * (vocab_ / size_); }
  int local_vocab() const { return vocab_ / size_; }

  // Enters a region: the norm (LayerNorm or RMSNorm: `norm`) of the
  // residual rows `x` into `full` [N, C] (in place without SP; with SP this
  // rank's rows, then all-gathered). mean and rstd: the statistics of the
  // residual rows (mean unused under RMSNorm). T: real, or bf16 under mixed
  // precision (`full` rounded to bf16, and gathered as bf16: half the bytes).
  template <class T>
  void norm_enter(Matrix<T> full, Slice1D mean, Slice1D rstd, ConstSlice2D x, ConstSlice1D weight, ConstSlice1D bias,
                  const kernels::Norm& norm);
  // Leaves it: y [local rows, C] = residual + in W^T + bias for a
  // row-parallel layer: the partial products summed over tp (all-reduce; a
  // reduce-scatter with SP). Without tp a plain linear layer. With bf16
  // operands (T = bf16) y stays fp32, the partial products are summed in
  // bf16 and the residual and bias added after.
  template <class T>
  void row_parallel_forward(Slice2D y, named_t<ConstMatrix<T>> in, named_t<ConstMatrix<T>> weight, ConstSlice1D bias,
                            ConstSlice2D residual);
  // Backward of entering: `partial` [N, C] holds this rank's part of the
  // gradient of the LayerNorm output (the input of column-parallel layers);
  // returns the sum over tp, this rank's local rows of it.
  ConstSlice2D reduce_input_grad(Slice2D partial);
  // Backward of leaving: the gradient of all N rows of a row-parallel
  // layer's output, from this rank's local rows `dres` (itself without SP).
  ConstSlice2D gather_output_grad(ConstSlice2D dres);
  // dbias of a row-parallel layer from dy over all N rows (dy_full) or, with
  // SP, over this rank's rows (dres): the bias sits in the sequence-parallel
  // region, so its gradient is partial until sum_replicated_grads. An empty
  // dbias (model.bias = false) is left alone.
  void row_parallel_bias_backward(Slice1D dbias, ConstSlice2D dy_full, ConstSlice2D dres);

  // Vocabulary-parallel embedding of this rank's residual rows: wte rows of
  // the local vocabulary, summed over tp, plus wpe at `positions` (one per
  // residual row: the absolute position of the token, see context_parallel).
  // An empty wpe (RoPE: no position table) adds nothing, nor does dwpe below.
  void embedding_forward(Slice2D out, ConstTokenView tokens, ConstSlice2D wte, ConstSlice2D wpe,
                         ConstTokenView positions);
  // dwte (local vocabulary) from all N rows' gradients, dwpe from this rank's rows.
  void embedding_backward(Slice2D dwte, Slice2D dwpe, ConstSlice2D dres, ConstTokenView tokens,
                          ConstTokenView positions);
  // Vocabulary-parallel softmax cross-entropy of logits [N, V/tp]: returns
  // the sum of the N rows' losses (the same on every tp rank). When
  // grad_scale != 0 the logits become dlogits * grad_scale in place.
  double cross_entropy(Slice2D logits, Slice1D losses, ConstTokenView targets, real grad_scale);

  // With SP each tp rank saw only its rows, so the gradients of tp-replicated
  // tensors (LayerNorms, row-parallel biases, wpe) are partial: sums n floats
  // of them over tp (nothing to do without SP), in the wire format of
  // comm.reduce_dtype (layers/grad_reduction.hpp).
  void sum_replicated_grads(real* grads, std::size_t n, Precision wire);

 private:
  // The three transfers of N-row activations and their gradients, in bf16 on
  // the wire under bf16: sum[N, C] over tp in place (all-reduce); the sum of
  // full[N, C] over tp, this rank's local rows into local (reduce-scatter);
  // every rank's local rows into full (all-gather).
  void sum(real* full);
  void sum_scatter(const real* full, real* local);
  void gather(const real* local, real* full);

  Communicator* tp_ = nullptr;
  int size_ = 1, rank_ = 0;
  bool sp_ = false, bf16_ = false;
  std::size_t rows_ = 0, local_rows_ = 0;
  int channels_ = 0, vocab_ = 0;
  View1D partial_, ln_local_, dres_full_, dln_local_, xent_max_, xent_stats_;
  Bf16View1D ln_local_bf16_;           // bf16 with SP: this rank's LayerNorm rows before the gather
  Bf16View1D wire_full_, wire_local_;  // bf16: N rows and local rows on the wire
};

}  // namespace ndmini
