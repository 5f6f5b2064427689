// SPDX-License-Identifier: BSD-3-Clause
#include "layers/tensor_parallel.hpp"

#include <string>
#include <type_traits>

#include "core/error.hpp"
#include "kernels/kernels.hpp"
#include "layers/grad_reduction.hpp"

namespace ndmini {
namespace {

// A zeroed buffer of n floats; none when n is 0.
View1D buffer(const std::string& label, std::size_t n) { return n > 0 ? View1D(label, n) : View1D(); }

}  // namespace

TensorParallel::TensorParallel(Communicator* tp, bool sequence_parallel, std::size_t rows, int channels, int vocab,
                               bool bf16)
    : rows_(rows), channels_(channels), vocab_(vocab) {
  if (tp != nullptr && tp->size() > 1) {
    tp_ = tp;
    size_ = tp->size();
    rank_ = tp->rank();
    sp_ = sequence_parallel;
    bf16_ = bf16;
  }
  if (vocab % size_ != 0 || channels % size_ != 0 || (sp_ && rows % size_ != 0))
    throw InternalError("the model does not divide over tp (the layout check should have refused it)");
  local_rows_ = sp_ ? rows / size_ : rows;
  const Buffers b = buffer_sizes(size_, sp_, rows_, channels_, bf16);
  partial_ = buffer("ndmini::tp_partial", b.partial);
  xent_max_ = buffer("ndmini::xent_max", b.xent_max);
  xent_stats_ = buffer("ndmini::xent_stats", b.xent_stats);
  if (bf16 && b.ln_local > 0)
    ln_local_bf16_ = Bf16View1D("ndmini::sp_ln_local_bf16", b.ln_local);
  else
    ln_local_ = buffer("ndmini::sp_ln_local", b.ln_local);
  dres_full_ = buffer("ndmini::sp_dres_full", b.dres_full);
  dln_local_ = buffer("ndmini::sp_dln_local", b.dln_local);
  if (b.wire_full > 0) wire_full_ = uninitialized_bf16("ndmini::tp_wire_full", b.wire_full);
  if (b.wire_local > 0) wire_local_ = uninitialized_bf16("ndmini::tp_wire_local", b.wire_local);
}

TensorParallel::Buffers TensorParallel::buffer_sizes(int tp, bool sequence_parallel, std::size_t rows, int channels,
                                                     bool bf16) {
  Buffers b;
  b.bf16 = bf16;
  const std::size_t N = rows, C = channels;
  if (tp > 1) {
    b.partial = N * C;
    b.xent_max = N;
    b.xent_stats = 2 * N;
  }
  if (tp > 1 && sequence_parallel) {
    b.ln_local = N / tp * C;
    b.dres_full = N * C;
    b.dln_local = N / tp * C;
  }
  if (tp > 1 && bf16) {
    b.wire_full = N * C;
    if (sequence_parallel) b.wire_local = N / tp * C;
  }
  return b;
}

template <class T>
void TensorParallel::norm_enter(Matrix<T> full, Slice1D mean, Slice1D rstd, ConstSlice2D x, ConstSlice1D weight,
                                ConstSlice1D bias, const kernels::Norm& norm) {
  if (!sp_) {
    kernels::norm_forward(full, mean, rstd, x, weight, bias, norm);
    return;
  }
  Buffer<T> local;
  if constexpr (std::is_same_v<T, bf16>)
    local = ln_local_bf16_;
  else
    local = ln_local_;
  kernels::norm_forward(as_matrix(local, local_rows_, channels_), mean, rstd, x, weight, bias, norm);
  tp_->all_gather(local.data(), full.data(), local_rows_ * channels_);
}

template <class T>
void TensorParallel::row_parallel_forward(Slice2D y, named_t<ConstMatrix<T>> in, named_t<ConstMatrix<T>> weight,
                                          ConstSlice1D bias, ConstSlice2D residual) {
  if (size_ == 1) {
    kernels::linear_forward<T>(y, in, weight, bias, residual);
  } else if (!sp_ && !bf16_) {
    // Rank 0 seeds the residual and the bias; the all-reduce adds every rank's partial product.
    if (rank_ == 0)
      kernels::linear_forward<T>(y, in, weight, bias, residual);
    else
      kernels::linear_forward<T>(y, in, weight, ConstSlice1D());
    sum(y.data());
  } else if (!sp_) {
    // bf16 sums only the partial products: the residual stream never passes through bf16.
    kernels::linear_forward<T>(y, in, weight, ConstSlice1D());
    sum(y.data());
    kernels::add_residual_bias(y, residual, bias);
  } else {
    kernels::linear_forward<T>(as_matrix(partial_, rows_, channels_), in, weight, ConstSlice1D());
    sum_scatter(partial_.data(), y.data());
    kernels::add_residual_bias(y, residual, bias);
  }
}

template void TensorParallel::norm_enter<real>(Slice2D, Slice1D, Slice1D, ConstSlice2D, ConstSlice1D, ConstSlice1D,
                                               const kernels::Norm&);
template void TensorParallel::norm_enter<bf16>(Bf16Slice2D, Slice1D, Slice1D, ConstSlice2D, ConstSlice1D, ConstSlice1D,
                                               const kernels::Norm&);
template void TensorParallel::row_parallel_forward<real>(Slice2D, ConstSlice2D, ConstSlice2D, ConstSlice1D,
                                                         ConstSlice2D);
template void TensorParallel::row_parallel_forward<bf16>(Slice2D, ConstBf16Slice2D, ConstBf16Slice2D, ConstSlice1D,
                                                         ConstSlice2D);

void TensorParallel::sum(real* full) {
  const std::size_t n = rows_ * channels_;
  if (!bf16_) {
    tp_->all_reduce(full, n);
    return;
  }
  kernels::round_to_bf16(Bf16Slice1D(wire_full_.data(), n), ConstSlice1D(full, n));
  tp_->all_reduce(wire_full_.data(), n);
  kernels::widen_bf16(Slice1D(full, n), wire_full_);
}

void TensorParallel::sum_scatter(const real* full, real* local) {
  const std::size_t n = local_rows_ * channels_;
  if (!bf16_) {
    tp_->reduce_scatter(full, local, n);
    return;
  }
  kernels::round_to_bf16(wire_full_, ConstSlice1D(full, rows_ * channels_));
  tp_->ireduce_scatter(wire_full_.data(), wire_local_.data(), n).wait();
  kernels::widen_bf16(Slice1D(local, n), wire_local_);
}

void TensorParallel::gather(const real* local, real* full) {
  const std::size_t n = local_rows_ * channels_;
  if (!bf16_) {
    tp_->all_gather(local, full, n);
    return;
  }
  kernels::round_to_bf16(wire_local_, ConstSlice1D(local, n));
  tp_->all_gather(wire_local_.data(), wire_full_.data(), n);
  kernels::widen_bf16(Slice1D(full, rows_ * channels_), wire_full_);
}

ConstSlice2D TensorParallel::reduce_input_grad(Slice2D partial) {
  if (size_ == 1) return partial;
  if (!sp_) {
    sum(partial.data());
    return partial;
  }
  sum_scatter(partial.data(), dln_local_.data());
  return as_matrix(dln_local_, local_rows_, channels_);
}

ConstSlice2D TensorParallel::gather_output_grad(ConstSlice2D dres) {
  if (!sp_) return dres;
  gather(dres.data(), dres_full_.data());
  return as_matrix(dres_full_, rows_, channels_);
}

void TensorParallel::row_parallel_bias_backward(Slice1D dbias, ConstSlice2D dy_full, ConstSlice2D dres) {
  if (dbias.extent(0) == 0) return;
  kernels::bias_backward(dbias, sp_ ? dres : dy_full);
}

void TensorParallel::embedding_forward(Slice2D out, ConstTokenView tokens, ConstSlice2D wte, ConstSlice2D wpe,
                                       ConstTokenView positions) {
  if (size_ == 1) {
    kernels::embedding_forward(out, tokens, wte, wpe, positions);
    return;
  }
  // Vocabulary-parallel lookup: each rank fills the rows of its tokens, zeros
  // elsewhere; the sum over tp is the embedding (exact: one non-zero term).
  const ConstTokenView none;
  if (sp_) {
    kernels::embedding_forward(as_matrix(partial_, rows_, channels_), tokens, wte, ConstSlice2D(), none, vocab_start());
    sum_scatter(partial_.data(), out.data());
  } else {
    kernels::embedding_forward(out, tokens, wte, ConstSlice2D(), none, vocab_start());
    sum(out.data());
  }
  if (wpe.extent(0) > 0) kernels::position_embedding_forward(out, wpe, positions);
}

void TensorParallel::embedding_backward(Slice2D dwte, Slice2D dwpe, ConstSlice2D dres, ConstTokenView tokens,
                                        ConstTokenView positions) {
  if (dwpe.extent(0) > 0) kernels::position_embedding_backward(dwpe, dres, positions);
  kernels::token_embedding_backward(dwte, gather_output_grad(dres), tokens, vocab_start());
}

double TensorParallel::cross_entropy(Slice2D logits, Slice1D losses, ConstTokenView targets, real grad_scale) {
  if (size_ == 1)
    return grad_scale != 0 ? kernels::softmax_cross_entropy(logits, losses, targets, grad_scale)
                           : kernels::cross_entropy_loss(logits, targets);
  const std::size_t N = logits.extent(0);
  kernels::row_max(Slice1D(xent_max_.data(), N), logits);
  tp_->all_reduce(xent_max_.data(), N, ReduceOp::max);
  kernels::vocab_parallel_xent_partials(Slice1D(xent_stats_.data(), 2 * N), logits, Slice1D(xent_max_.data(), N),
                                        targets, vocab_start());
  tp_->all_reduce(xent_stats_.data(), 2 * N);
  return kernels::vocab_parallel_xent_finish(logits, losses, Slice1D(xent_max_.data(), N),
                                             Slice1D(xent_stats_.data(), 2 * N), targets, vocab_start(), grad_scale);
}

void TensorParallel::sum_replicated_grads(real* grads, std::size_t n, Precision wire) {
  if (sp_) all_reduce_grads(*tp_, grads, n, wire);
}

}  // namespace ndmini
