// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// GPT-2 and Llama forward and backward kernels on Kokkos Views in ExecSpace's memory.
//
// Conventions: activations are row-major [rows, channels] with rows = B*T
// (sequence-major within a micro-batch). Weights follow PyTorch Linear:
// [out, in]. Every backward ACCUMULATES into parameter gradients (so
// micro-batches add up) and, where noted, into input gradients (so residual
// branches add up). Matrix products go through gemm() below (gemm.cpp:
// cuBLAS in a CUDA build, KokkosBlas::gemm on the host); the rest are fused
// Kokkos kernels.
#include "core/types.hpp"

namespace ndmini::kernels {

// ---- dense layers ---------------------------------------------------------
// y[N, out] = residual + x[N, in] W^T + bias. bias and residual may be empty;
// the residual add costs no extra pass (it seeds GEMM's C).
// T is the operands' element type: real, or bf16 under mixed precision (x
// and W bf16, fp32 accumulation; y, dx and the gradients stay fp32). fp32 is
// the default; a bf16 caller names it: linear_forward<bf16>(...).
template <class T = real>
void linear_forward(Slice2D y, named_t<ConstMatrix<T>> x, named_t<ConstMatrix<T>> weight, ConstSlice1D bias,
                    ConstSlice2D residual = {});
// dW += dy^T x, db += column sums of dy, dx = dx_beta * dx + dy W (dx may be
// empty). dy is fp32; under bf16 it is rounded once into dy_rounded (as
// large as dy) for both products, and the bias sums the fp32 dy. fp32 reads
// dy itself and leaves dy_rounded empty.
template <class T = real>
void linear_backward(Slice2D dx, Slice2D dweight, Slice1D dbias, ConstSlice2D dy, named_t<ConstMatrix<T>> x,
                     named_t<ConstMatrix<T>> weight, named_t<Matrix<T>> dy_rounded = {}, real dx_beta = 0);
// C = alpha * op(A) op(B) + beta * C, op = "N" or "T". Asynchronous on
// ExecSpace (in order with the kernels around it).
void gemm(const char* transa, const char* transb, real alpha, ConstSlice2D a, ConstSlice2D b, real beta, Slice2D c);
// `count` products of one shape at once: C_i = alpha op(A_i) op(B_i) + beta C_i,
// where a, b and c are the first matrices and matrix i of an operand starts
// `stride` floats after matrix i - 1 (e.g. one attention head after another).
// One cublasGemmStridedBatchedEx on CUDA; a loop of gemm on the host.
void gemm_strided_batched(const char* transa, const char* transb, real alpha, ConstSlice2D a, std::size_t stride_a,
                          ConstSlice2D b, std::size_t stride_b, real beta, Slice2D c, std::size_t stride_c, int count);

// bf16 products: bf16 A and B, fp32 accumulation, C in fp32 or bf16 (rounded
// once, at the end); alpha and beta as above. Through cuBLAS in a CUDA build
// (CUDA_R_16BF, CUBLAS_COMPUTE_32F), through oneDNN on the host where the
// build has it (AMX or AVX512-BF16 where the CPU has them); elsewhere
// emulated exactly: the bf16 inputs widened to fp32 (lossless) and multiplied
// by the fp32 route.
void gemm_bf16(const char* transa, const char* transb, real alpha, ConstBf16Slice2D a, ConstBf16Slice2D b, real beta,
               Slice2D c);
void gemm_bf16(const char* transa, const char* transb, real alpha, ConstBf16Slice2D a, ConstBf16Slice2D b, real beta,
               Bf16Slice2D c);
void gemm_bf16_strided_batched(const char* transa, const char* transb, real alpha, ConstBf16Slice2D a,
                               std::size_t stride_a, ConstBf16Slice2D b, std::size_t stride_b, real beta, Slice2D c,
                               std::size_t stride_c, int count);
void gemm_bf16_strided_batched(const char* transa, const char* transb, real alpha, ConstBf16Slice2D a,
                               std::size_t stride_a, ConstBf16Slice2D b, std::size_t stride_b, real beta, Bf16Slice2D c,
                               std::size_t stride_c, int count);

// Which library runs the host's fp32 products (a CUDA build always uses
// cuBLAS). by_shape, the default, takes the route per class of products that
// the start-up calibration chose (gemm_library.hpp, set_gemm_library); the
// others force one library, for benchmarks and tests. onednn needs a build
// with oneDNN (else: blas).
enum class HostGemmRoute { by_shape, blas, onednn };
void set_host_gemm_route(HostGemmRoute route);

// ---- embeddings -----------------------------------------------------------
// Positions: one per row, the absolute position of that row's token in its
// sequence (with context parallelism a rank holds two chunks of each
// sequence, so rows are not simply t = row mod seq_len).
//
// out[row, :] = wte[tokens[row], :] + wpe[positions[row], :]
// With a vocabulary-parallel wte (rows [vocab_start, vocab_start + V_local)),
// tokens outside the local range contribute zeros; pass an empty wpe to add
// the positions later (after the vocabulary all-reduce).
void embedding_forward(Slice2D out, ConstTokenView tokens, ConstSlice2D wte, ConstSlice2D wpe, ConstTokenView positions,
                       int vocab_start = 0);
// out[row, :] += wpe[positions[row], :]
void position_embedding_forward(Slice2D out, ConstSlice2D wpe, ConstTokenView positions);
// dwte[tok - vocab_start] += dout rows of local tokens. Deterministic: each
// thread owns a column, so repeated tokens add in a fixed order.
void token_embedding_backward(Slice2D dwte, ConstSlice2D dout, ConstTokenView tokens, int vocab_start = 0);
// dwpe[positions[row]] += dout[row], deterministic in the same way.
void position_embedding_backward(Slice2D dwpe, ConstSlice2D dout, ConstTokenView positions);
// Both of the above.
void embedding_backward(Slice2D dwte, Slice2D dwpe, ConstSlice2D dout, ConstTokenView tokens, ConstTokenView positions);

// y += residual + bias (either may be empty): the epilogue of a row-parallel
// linear layer whose partial sums were just reduce-scattered.
void add_residual_bias(Slice2D y, ConstSlice2D residual, ConstSlice1D bias);
// dbias += column sums of dy.
void bias_backward(Slice1D dbias, ConstSlice2D dy);

// ---- layer norm ------------------------------------------------------------
// out = (x - mean) * rstd * weight + bias per row, rstd = 1 / sqrt(var + eps);
// eps is the deck's model.norm_eps (GPT-2's 1e-5 by default). An empty bias
// (extent 0) means a layer norm without bias (model.bias = false).
void layernorm_forward(Slice2D out, Slice1D mean, Slice1D rstd, ConstSlice2D x, ConstSlice1D weight, ConstSlice1D bias,
                       real eps = real(1e-5));
// Mixed precision: out rounded to bf16 (statistics fp32).
void layernorm_forward(Bf16Slice2D out, Slice1D mean, Slice1D rstd, ConstSlice2D x, ConstSlice1D weight,
                       ConstSlice1D bias, real eps = real(1e-5));
// dx += ..., dweight += ..., dbias += ... (an empty dbias is left alone).
// eps is not needed: rstd carries it.
void layernorm_backward(Slice2D dx, Slice1D dweight, Slice1D dbias, ConstSlice2D dout, ConstSlice2D x,
                        ConstSlice1D weight, ConstSlice1D mean, ConstSlice1D rstd);

// ---- RMSNorm (Llama), llama_kernels.cpp ---------------------------------------
// out = x * rstd * weight per row, rstd = 1 / sqrt(mean(x^2) + eps); no mean
// is subtracted and there is no bias. rstd [N] is kept for the backward.
void rmsnorm_forward(Slice2D out, Slice1D rstd, ConstSlice2D x, ConstSlice1D weight, real eps);
// Mixed precision: out rounded to bf16 (rstd fp32).
void rmsnorm_forward(Bf16Slice2D out, Slice1D rstd, ConstSlice2D x, ConstSlice1D weight, real eps);
// dx += ..., dweight += ... (both ACCUMULATE, as layernorm_backward).
void rmsnorm_backward(Slice2D dx, Slice1D dweight, ConstSlice2D dout, ConstSlice2D x, ConstSlice1D weight,
                      ConstSlice1D rstd);

// ---- a model's norm: LayerNorm or RMSNorm ----------------------------------------
// model.norm and model.norm_eps: norm_forward and norm_backward call the
// layernorm or the rmsnorm kernels (RMSNorm reads neither mean nor bias).
struct Norm {
  bool rms = false;
  real eps = real(1e-5);
};
void norm_forward(Slice2D out, Slice1D mean, Slice1D rstd, ConstSlice2D x, ConstSlice1D weight, ConstSlice1D bias,
                  const Norm& norm);
void norm_forward(Bf16Slice2D out, Slice1D mean, Slice1D rstd, ConstSlice2D x, ConstSlice1D weight, ConstSlice1D bias,
                  const Norm& norm);
void norm_backward(Slice2D dx, Slice1D dweight, Slice1D dbias, ConstSlice2D dout, ConstSlice2D x, ConstSlice1D weight,
                   ConstSlice1D mean, ConstSlice1D rstd, const Norm& norm);

// ---- SwiGLU (Llama's MLP), llama_kernels.cpp -----------------------------------
// out = silu(gate) * up, silu(g) = g / (1 + exp(-g)); gate, up, out [N, F].
void swiglu_forward(Slice2D out, ConstSlice2D gate, ConstSlice2D up);
void swiglu_forward(Bf16Slice2D out, ConstSlice2D gate, ConstSlice2D up);  // out rounded to bf16
// dgate = dout * up * silu'(gate), dup = dout * silu(gate), both OVERWRITTEN
// (as gelu_backward's dx). Each element reads its inputs before writing, so
// dgate or dup may alias gate, up or dout (never each other).
void swiglu_backward(Slice2D dgate, Slice2D dup, ConstSlice2D gate, ConstSlice2D up, ConstSlice2D dout);
void swiglu_backward(Slice2D dgate, Slice2D dup, ConstBf16Slice2D gate, ConstBf16Slice2D up,
                     ConstSlice2D dout);  // gate, up kept in bf16

// ---- rotary positions (RoPE), llama_kernels.cpp ---------------------------------
// Hugging Face transformers' Llama rotation (rotate_half): in every row r of
// x, the first `rotated_columns` columns are consecutive heads of head_size
// columns; in each head, for i < head_size/2 with x1 = x[i],
// x2 = x[i + head_size/2] and angle a = positions(r) * theta^(-2i/head_size):
//   x[i] = x1 cos a - x2 sin a,  x[i + head_size/2] = x2 cos a + x1 sin a.
// Columns past rotated_columns are untouched. In place. positions: one
// global position per row (context parallelism hands its chunks' true
// positions). The angle is computed as HF does, in fp32:
// inv_freq = 1 / theta^(float(2i) / head_size), a = float(pos) * inv_freq.
// head_size must be even and divide rotated_columns <= x.extent(1)
// (InternalError otherwise).
void rope_forward(Slice2D x, ConstTokenView positions, int rotated_columns, int head_size, real theta);
// Rotated in fp32, rounded to bf16.
void rope_forward(Bf16Slice2D x, ConstTokenView positions, int rotated_columns, int head_size, real theta);
// The backward is the transpose (the inverse rotation), in place on dx.
void rope_backward(Slice2D dx, ConstTokenView positions, int rotated_columns, int head_size, real theta);

// ---- GELU, tanh approximation ---------------------------------------------
void gelu_forward(Slice2D out, ConstSlice2D x);
void gelu_forward(Bf16Slice2D out, ConstSlice2D x);  // mixed precision: out rounded to bf16
// dx = dout * gelu'(x); dx may alias dout.
void gelu_backward(Slice2D dx, ConstSlice2D x, ConstSlice2D dout);
void gelu_backward(Slice2D dx, ConstBf16Slice2D x, ConstSlice2D dout);  // x kept in bf16

// ---- softmax cross-entropy over the vocabulary ------------------------------
// Fused forward and backward, in place: logits [N, V] become
// dlogits = (softmax - onehot(target)) * grad_scale; losses[i] = -log p(target).
// Returns the sum of losses. One read and one write of the logits.
double softmax_cross_entropy(Slice2D logits, Slice1D losses, ConstTokenView targets, real grad_scale);
// Forward only (logits untouched): the sum of losses.
double cross_entropy_loss(ConstSlice2D logits, ConstTokenView targets);

// Vocabulary-parallel cross-entropy, in three steps around two reductions
// over the tp group (the full logits are never gathered). Each rank holds
// logits [N, V_local] for vocabulary ids [vocab_start, vocab_start + V_local).
//  1. row_max: local row maxima -> all-reduce MAX gives the global maxima.
void row_max(Slice1D out, ConstSlice2D logits);
//  2. partials: stats[i] = sum_j exp(l_ij - max_i), stats[N + i] = the target's
//     logit if this rank owns it, else 0 -> all-reduce SUM.
void vocab_parallel_xent_partials(Slice1D stats, ConstSlice2D logits, ConstSlice1D row_max, ConstTokenView targets,
                                  int vocab_start);
//  3. loss and, when grad_scale != 0, dlogits in place (as softmax_cross_entropy).
//     Returns the sum of losses.
double vocab_parallel_xent_finish(Slice2D logits, Slice1D losses, ConstSlice1D row_max, ConstSlice1D stats,
                                  ConstTokenView targets, int vocab_start, real grad_scale);

// ---- optimizer ------------------------------------------------------------
struct AdamWStep {
  real lr, beta1, beta2, eps, weight_decay;
  real grad_scale;  // gradient clipping factor, 1 when not clipped
  int t;            // step number, from 1, for the bias correction
};
// One AdamW update of a tensor; zeroes the gradient in the same pass so the
// next step's accumulation needs no separate fill.
void adamw_update(Slice1D param, Slice1D grad, Slice1D exp_avg, Slice1D exp_avg_sq, const AdamWStep& step, bool decay);

// Sum of squares of a buffer: float sums over blocks of 4096, added in double.
double sum_squares(ConstSlice1D x);

// Fills a parameter with its deterministic init: std * N(0,1) drawn from the
// counter-based RNG at (key, global index offset + i), or a constant.
void init_normal(Slice1D x, std::uint64_t key, std::uint64_t index_offset, real stddev);
void fill(Slice1D x, real value);

// ---- precision conversions ------------------------------------------------
// out = bf16(in), rounded to nearest even (core/bf16.hpp).
void round_to_bf16(Bf16Slice1D out, ConstSlice1D in);
// out = float(in): exact.
void widen_bf16(Slice1D out, ConstBf16Slice1D in);
// x = float(bf16(x)) in place: the value a bf16 copy of x holds.
void round_through_bf16(Slice1D x);

// ---- Mixture-of-Experts: moving token rows (moe_kernels.cpp) --------------
// Rows of [rows, C] matrices picked by index; the element type converts on
// the way (rounded to nearest even into bf16, widened exactly out of it).
// `position[r k + j]` is where slot j of row r sits among the rows it was
// dispatched as; the slots of a row are summed in slot order (no atomics).
using IndexView = Kokkos::View<const int*, MemSpace>;
// dst row i = src row index[i].
template <class Dst, class Src>
void gather_rows(Matrix<Dst> dst, ConstMatrix<Src> src, IndexView index);
// out[r] += sum_j weight[r k + j] rows[position[r k + j]].
template <class T>
void combine_rows(Slice2D out, ConstMatrix<T> rows, ConstSlice1D weight, IndexView position, int k);
// dweight[r k + j] = dout[r] . rows[position[r k + j]].
template <class T>
void slot_dots(Slice1D dweight, ConstSlice2D dout, ConstMatrix<T> rows, IndexView position, int k);
// dst[position[r k + j]] = weight[r k + j] dout[r] (every row of dst written once).
template <class T>
void scatter_weighted(Matrix<T> dst, ConstSlice2D dout, ConstSlice1D weight, IndexView position, int k);
// dx[r] += sum_j rows[position[r k + j]].
template <class T>
void sum_slots(Slice2D dx, ConstMatrix<T> rows, IndexView position, int k);

}  // namespace ndmini::kernels
